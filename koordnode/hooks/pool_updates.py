"""Pool updates: cpusets of running containers that the runtime must apply, not koordnode.

When an LSE/LSR container takes or gives back CPUs, the running containers of the share and BE
pools move. In proxy mode the QoS engine writes their `cpuset.cpus` itself. In NRI mode the
runtime owns the containers' resources, so the engine publishes the moves here instead and the
NRI plugin sends them as NRI container updates (in its next answer, or as UpdateContainers).

The composition root creates one `PoolUpdates` in NRI mode and hands it to both constructors:
the engine publishes, the plugin subscribes and takes. Thread-safe: the engine publishes from
worker threads, the plugin takes on the event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping


class PoolUpdates:
    """Pending moves (container id -> cpuset, the latest per container) and who wants to know."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, str] = {}
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, listener: Callable[[], None]) -> None:
        """`listener()` runs after each publish, in the publisher's thread: keep it short."""
        with self._lock:
            self._listeners.append(listener)

    def publish(self, moves: Mapping[str, str]) -> None:
        if not moves:
            return
        with self._lock:
            self._pending.update(moves)
            listeners = list(self._listeners)
        for listener in listeners:
            listener()

    def take(self) -> dict[str, str]:
        """Everything published since the last take; the caller now owns delivering it."""
        with self._lock:
            moves, self._pending = self._pending, {}
        return moves
