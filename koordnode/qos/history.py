"""Bounded in-memory history: a fixed-size ring of (time, value) per series.

Each ring preallocates two `array('d')` of its capacity, so its memory is fixed from the
first sample on and independent of uptime. Series belonging to a pod are dropped with the
pod (`drop_prefix`), so the number of series follows the pods on the node.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Iterable


class Ring:
    """Last `capacity` (time, value) samples of one series."""

    __slots__ = ("_times", "_values", "_next", "_count")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"ring capacity must be >= 1, got {capacity}")
        self._times = array("d", bytes(8 * capacity))
        self._values = array("d", bytes(8 * capacity))
        self._next = 0
        self._count = 0

    @property
    def capacity(self) -> int:
        return len(self._values)

    def __len__(self) -> int:
        return self._count

    def append(self, at: float, value: float) -> None:
        i = self._next
        self._times[i] = at
        self._values[i] = value
        self._next = (i + 1) % len(self._values)
        if self._count < len(self._values):
            self._count += 1

    def last(self) -> tuple[float, float] | None:
        if not self._count:
            return None
        i = (self._next - 1) % len(self._values)
        return self._times[i], self._values[i]

    def items(self) -> list[tuple[float, float]]:
        """Oldest first."""
        cap = len(self._values)
        start = (self._next - self._count) % cap
        return [(self._times[(start + k) % cap], self._values[(start + k) % cap]) for k in range(self._count)]

    def values_since(self, since: float) -> list[float]:
        return [v for t, v in self.items() if t >= since]

    def summary(self) -> dict[str, float | int]:
        values = [v for _, v in self.items()]
        if not values:
            return {"samples": 0}
        return {
            "samples": len(values),
            "last": values[-1],
            "min": min(values),
            "max": max(values),
            "avg": sum(values) / len(values),
        }


class History:
    """Named rings, created on first append. Thread-safe."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._series: dict[str, Ring] = {}
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        return len(self._series)

    def __contains__(self, name: str) -> bool:
        return name in self._series

    def append(self, name: str, at: float, value: float) -> None:
        ring = self._series.get(name)
        if ring is None:
            with self._lock:
                ring = self._series.setdefault(name, Ring(self._capacity))
        ring.append(at, value)

    def get(self, name: str) -> Ring | None:
        return self._series.get(name)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._series)

    def drop(self, names: Iterable[str]) -> None:
        with self._lock:
            for name in names:
                self._series.pop(name, None)

    def drop_prefix(self, prefix: str) -> int:
        with self._lock:
            gone = [name for name in self._series if name.startswith(prefix)]
            for name in gone:
                del self._series[name]
        return len(gone)

    def keep_only(self, prefix: str, keep: set[str]) -> int:
        """Drop series under `prefix` whose next path component is not in `keep`
        (e.g. prefix "pod/" and the sandbox ids still present)."""
        with self._lock:
            gone = [
                name for name in self._series
                if name.startswith(prefix) and name[len(prefix):].split("/", 1)[0] not in keep
            ]
            for name in gone:
                del self._series[name]
        return len(gone)

    def resize(self, capacity: int) -> None:
        """New capacity for all series (keeps the newest samples)."""
        with self._lock:
            self._capacity = capacity
            for name, ring in list(self._series.items()):
                fresh = Ring(capacity)
                for at, value in ring.items()[-capacity:]:
                    fresh.append(at, value)
                self._series[name] = fresh

    def summaries(self, names: Iterable[str] | None = None) -> dict[str, dict[str, float | int]]:
        with self._lock:
            selected = list(self._series.items()) if names is None else [
                (n, self._series[n]) for n in names if n in self._series
            ]
        return {name: ring.summary() for name, ring in sorted(selected)}
