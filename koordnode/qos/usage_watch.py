"""Wake the QoS manager the moment LS pods start using CPU, from kernel events, without polling.

With BE in an idle group, an LS pod that gets busy is not stalled (BE yields at once), so
its CPU pressure does not rise and PSI cannot tell the manager that BE's quota should shrink.
The event the kernel does offer is CPU time itself: a perf software event (cpu-clock) bound
to a cgroup counts the time that cgroup's tasks (and its descendants') run on one CPU, and
with a sample period it signals (POLLIN on its fd) each time that much time has been used.

Per watched cgroup there is one event per online CPU. An event that fires after `period_ns`
of LS CPU time on its CPU at a rate of at least `min_rate` (CPU time / wall time since it was
armed) wakes the manager; slower use (an idle pod's housekeeping) only re-arms it. After a
wake the cgroup's events stay disabled until the tick that follows re-arms them, so a busy LS
costs at most one wake-up per tick, and an idle node none. Events that did not wake are left
counting (no re-arm per tick): their rate is measured since they were armed or last fired.

The watched cgroups are the LS pressure targets (the burstable tier, then each Guaranteed
pod), up to MAX_EVENTS events in all: on a node with many CPUs and Guaranteed pods the last ones are
listed as not watched, and the tick still sees them.

Needs perf events for cgroups: the perf_event controller (v1) or the cgroup2 hierarchy (v2, or
the hybrid `unified` mount), and perf_event_open allowed (CAP_PERFMON / CAP_SYS_ADMIN, or
perf_event_paranoid <= 0). Where that fails the watch says why in `mode` and stays off.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from koordnode.executor.perf_events import PerfEvent
from koordnode.model.cpulist import parse_cpu_list

log = structlog.get_logger("koordnode.qos.usage")

# Each event is an fd and two mapped pages: at most this many (4 MiB of mappings).
MAX_EVENTS = 512

MODE_EVENTS = "perf-events"
MODE_OFF = "off"


def online_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0) | _parse_online())
    except OSError:
        return list(range(os.cpu_count() or 1))


def _parse_online() -> set[int]:
    with open("/sys/devices/system/cpu/online") as f:
        return set(parse_cpu_list(f.read()))


class UsageWatch:
    """Calls `on_wake(name)` on the event loop when a watched cgroup starts using CPU.

    `set_targets({name: absolute cgroup directory in the perf hierarchy})` at any time;
    `rearm()` after a tick when `needs_rearm` (a wake disabled events).
    """

    def __init__(self, *, period_ns: int, min_rate: float, on_wake: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic, cpus: list[int] | None = None) -> None:
        self.period_ns = period_ns
        self.min_rate = min_rate
        self._on_wake = on_wake
        self._clock = clock
        self._cpus = cpus if cpus is not None else online_cpus()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._targets: dict[str, str] = {}
        self._events: dict[str, list[PerfEvent]] = {}
        self._problem: str | None = None if period_ns > 0 else "disabled in the configuration"
        self._missing: dict[str, str] = {}
        self.wakeups = 0
        self.rearms = 0  # slow-use re-arms (fired below min_rate)
        self.last_wake: tuple[float, str] | None = None
        # A wake disabled some events; a plain bool so the tick thread may read it.
        self.needs_rearm = False

    @property
    def mode(self) -> str:
        return MODE_EVENTS if self._problem is None else f"{MODE_OFF} ({self._problem})"

    @property
    def active(self) -> bool:
        return self._problem is None and bool(self._events)

    def status(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "cpu_ms_to_wake": self.period_ns / 1e6,
            "min_rate_cpus": self.min_rate,
            "targets": dict(sorted(self._targets.items())),
            "armed": sorted(n for n, evs in self._events.items() if any(e.enabled for e in evs)),
            "missing": dict(sorted(self._missing.items())),
            "wakeups": self.wakeups,
            "slow_rearms": self.rearms,
        }

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._open()

    def stop(self) -> None:
        for name in list(self._events):
            self._close(name)
        self._loop = None

    def set_targets(self, targets: Mapping[str, str]) -> None:
        if dict(targets) == self._targets and not self._missing:
            return
        self._targets = dict(targets)
        if self._loop is not None:
            self._open()

    @property
    def needs_retry(self) -> bool:
        """Some target could not be watched: set_targets() with the same targets tries again."""
        return bool(self._missing)

    def rearm(self) -> None:
        """Enable the events a wake disabled, counting from now (the others keep counting)."""
        self.needs_rearm = False
        now = self._clock()
        for events in self._events.values():
            for event in events:
                if event.enabled:
                    continue
                try:
                    event.arm(now)
                except OSError:
                    self.needs_rearm = True  # try again after the next tick

    # ------------------------------------------------------------------ internals

    def _open(self) -> None:
        for name in [n for n in self._events if n not in self._targets]:
            self._close(name)
        if self._problem is not None:
            return
        self._missing = {}
        now = self._clock()
        for name, path in self._targets.items():
            if name in self._events:
                continue
            if (sum(len(e) for e in self._events.values()) + len(self._cpus)) > MAX_EVENTS:
                self._missing[name] = f"not watched: {MAX_EVENTS} events ({len(self._cpus)} CPUs per cgroup) in use"
                continue
            try:
                cgroup_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as err:
                self._missing[name] = f"{path}: {err.strerror}"
                continue
            events: list[PerfEvent] = []
            try:
                for cpu in self._cpus:
                    events.append(PerfEvent(cgroup_fd, cpu, self.period_ns))
            except OSError as err:
                for event in events:
                    event.close()
                if err.errno in (errno.ENOENT, errno.ENODEV) and not os.path.isdir(path):
                    self._missing[name] = f"{path}: gone"
                    continue
                self._problem = f"perf_event_open on {path}: {os.strerror(err.errno or 0)}"
                log.warning("usage_watch_unavailable", reason=self._problem)
                self.stop_all()
                return
            finally:
                os.close(cgroup_fd)
            self._events[name] = events
            assert self._loop is not None
            for event in events:
                event.arm(now)
                self._loop.add_reader(event.fd, self._on_ready, name, event)

    def stop_all(self) -> None:
        for name in list(self._events):
            self._close(name)

    def _close(self, name: str) -> None:
        for event in self._events.pop(name, []):
            if self._loop is not None:
                self._loop.remove_reader(event.fd)
            event.close()

    def _on_ready(self, name: str, event: PerfEvent) -> None:
        now = self._clock()
        try:
            event.consume()
        except (OSError, ValueError):
            return
        elapsed = now - event.armed_at
        if elapsed > 0 and self.period_ns / 1e9 / elapsed < self.min_rate:
            # Slow use (housekeeping of an idle pod): count on from here.
            self.rearms += 1
            event.armed_at = now
            return
        # Busy: one wake; this cgroup's events rest until the tick re-arms them.
        for other in self._events.get(name, []):
            try:
                other.disarm()
                other.consume()
            except OSError:
                continue
        self.needs_rearm = True
        self.wakeups += 1
        self.last_wake = (now, name)
        try:
            self._on_wake(name)
        except Exception:  # noqa: BLE001 - a broken callback must not kill the watch
            log.exception("usage_wake_callback_failed", target=name)
