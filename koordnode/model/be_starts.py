"""BE pod starts in flight: the runtime creating or starting a BE pod's sandbox or container.

While BE is suppressed to its floor and LS keeps every CPU busy, such a start gets almost no CPU
(the idle BE group's weight and a 2 ms quota) and can outlast kubelet's runtime request timeout.
The hooks note each start here (proxy: the CRI call from request to answer; NRI: from
CreateContainer to the container's start) and the QoS manager's cpu_suppress lifts BE for a
bounded allowance meanwhile. A start that never ends (a lost answer) stops counting after
`max_s`. Any thread may call; the listeners run in the caller's thread and must not block.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# Keys are bounded: a runaway caller cannot grow the table without limit.
MAX_STARTS = 4096


class BeStarts:
    def __init__(self, max_s: Callable[[], float] = lambda: 120.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`max_s()`: [strategy.cpu_suppress] pod_start_max_s as configured now (it reloads)."""
        self.max_s = max_s
        self._clock = clock
        self._lock = threading.Lock()
        self._began: dict[str, float] = {}
        self._listeners: list[Callable[[str], None]] = []
        self.total = 0  # starts noted since the daemon started (koordnode status)

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """`listener(why)` after a start begins or ends ("be_start", "be_start_end")."""
        self._listeners.append(listener)

    def begin(self, key: str) -> None:
        with self._lock:
            now = self._clock()
            self._expire(now)
            if key in self._began or len(self._began) >= MAX_STARTS:
                return
            self._began[key] = now
            self.total += 1
        self._notify("be_start")

    def end(self, key: str) -> None:
        with self._lock:
            if self._began.pop(key, None) is None:
                return
        self._notify("be_start_end")

    def in_flight(self) -> int:
        """Starts begun and not ended, none older than `max_s`."""
        with self._lock:
            self._expire(self._clock())
            return len(self._began)

    def oldest_age_s(self) -> float:
        """How long the oldest start in flight has run, seconds (0 with none)."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            return now - min(self._began.values()) if self._began else 0.0

    def _expire(self, now: float) -> None:
        if not self._began:
            return
        max_s = self.max_s()
        for key in [k for k, began in self._began.items() if now - began > max_s]:
            del self._began[key]

    def _notify(self, why: str) -> None:
        for listener in self._listeners:
            listener(why)
