"""PSI triggers: wake the QoS manager the moment LS CPU pressure crosses a threshold.

A kernel trigger is a pressure file (/proc/pressure/cpu or a cgroup2 `cpu.pressure`) opened
O_RDWR|O_NONBLOCK with "some <stall_us> <window_us>" written to it; the kernel then signals
POLLPRI (at most once per window) whenever the stall time within the window exceeds the
threshold.

asyncio integration: `loop.add_reader` waits for EPOLLIN only, and a pressure file never
reports EPOLLIN, so it cannot be registered directly. Each trigger gets its own epoll
instance holding the pressure fd with EPOLLPRI, and that epoll fd - which *is* readable when
its trigger fired - is what the loop watches. One epoll per trigger keeps the identity of
the target: polling a nested epoll from the outer loop already consumes the PSI event (the
kernel's trigger poll clears it), so a shared epoll would say "something fired" but not
what. No thread is needed.

The kernel only accepts windows that are multiples of 2 s without CAP_SYS_RESOURCE (and
those unprivileged triggers are evaluated by the 2 s averaging worker, so they react in up
to ~2 s). When a trigger is refused (EINVAL / EPERM / EACCES, or no PSI at all) the watch
falls back to polling the pressure files' `some total` every `poll_interval_s` and firing
when the stall within the window exceeds the same threshold - the trigger's rule evaluated
in user space - and says so in `mode`.

Layering: registering a trigger is a write to a kernel file, and this module is the one
documented exception to "kernel writes only in executor/" (tests/test_layers.py allows it by
name): the write creates no state to plan, compare or undo - it is a subscription that lives
exactly as long as the file descriptor the watch then polls, so it belongs with its poller.
Dry run registers no trigger (the manager polls instead).
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from koordnode.qos.collect import StatReader
from koordnode.qos.parse import ParseError, pressure_total_some

log = structlog.get_logger("koordnode.qos.psi")

MODE_TRIGGER = "psi-trigger"
MODE_POLLING = "polling"
MODE_OFF = "off"

# errnos by which the kernel says "no trigger for you"; anything else is a per-file problem.
_REFUSALS = (errno.EINVAL, errno.EPERM, errno.EACCES, errno.EOPNOTSUPP, errno.ENOTSUP)
_GONE = (errno.ENOENT, errno.ENODEV, errno.ENOTDIR)


NOT_POLLABLE = "not a kernel pressure file (cannot be polled for POLLPRI)"


class TriggerRefused(OSError):
    """The kernel would not create the trigger (window or capability, or PSI disabled)."""


class TriggerFileMissing(OSError):
    """The pressure file does not exist (cgroup not there, or no cgroup2 PSI)."""


def describe_refusal(err: OSError, window_us: int) -> str:
    name = errno.errorcode.get(err.errno or 0, str(err.errno))
    if err.strerror == NOT_POLLABLE:
        return f"{name}: {NOT_POLLABLE}"
    if err.errno in (errno.EINVAL, errno.EPERM) and window_us % 2_000_000:
        return (f"{name}: the kernel refused a {window_us} us window (windows that are not a "
                f"multiple of 2 s need CAP_SYS_RESOURCE)")
    if err.errno == errno.EOPNOTSUPP or err.errno == errno.ENOTSUP:
        return f"{name}: PSI is disabled on this kernel (psi=0)"
    return f"{name}: {err.strerror}"


class PsiTrigger:
    """One kernel PSI trigger on a pressure file."""

    def __init__(self, path: str, stall_us: int, window_us: int, kind: str = "some") -> None:
        if kind not in ("some", "full"):
            raise ValueError(f"trigger kind must be 'some' or 'full', got {kind!r}")
        if not 0 < stall_us <= window_us:
            raise ValueError(f"stall ({stall_us} us) must be in (0, window ({window_us} us)]")
        self.path = path
        self.spec = f"{kind} {stall_us} {window_us}"
        self._fd = -1
        self._epoll: select.epoll | None = None
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as err:
            if err.errno in _GONE:
                raise TriggerFileMissing(err.errno, f"{path}: {err.strerror}") from None
            if err.errno in _REFUSALS:
                raise TriggerRefused(err.errno, err.strerror) from None
            raise
        # A pressure file without a trigger polls as EPOLLERR|EPOLLPRI; a plain file (a fake
        # tree) never reports POLLPRI and must not get a trigger spec written into it.
        probe = select.poll()
        probe.register(self._fd, select.POLLPRI)
        if not any(mask & select.POLLPRI for _fd, mask in probe.poll(0)):
            self.close()
            raise TriggerRefused(errno.EPERM, NOT_POLLABLE)
        try:
            # The one kernel write outside executor/ (see the module docstring). The kernel
            # parses the buffer as a C string: include the terminating NUL.
            os.write(self._fd, self.spec.encode() + b"\0")
        except OSError as err:
            self.close()
            if err.errno in _REFUSALS:
                raise TriggerRefused(err.errno, err.strerror) from None
            if err.errno in _GONE:
                raise TriggerFileMissing(err.errno, f"{path}: {err.strerror}") from None
            raise
        # Registered only now: epoll hooks into the trigger's wait queue, which exists once
        # the trigger does.
        self._epoll = select.epoll(1)
        self._epoll.register(self._fd, select.EPOLLPRI | select.EPOLLERR)

    def fileno(self) -> int:
        return self._fd

    def epoll(self) -> select.epoll:
        """An epoll holding this trigger with EPOLLPRI; its own fd is readable on an event."""
        if self._epoll is None:
            raise ValueError(f"trigger on {self.path} is closed")
        return self._epoll

    def wait(self, timeout_s: float) -> bool:
        """Block until the trigger fires (True) or the timeout passes (False)."""
        poller = select.poll()
        poller.register(self._fd, select.POLLPRI)
        events = poller.poll(max(0, int(timeout_s * 1000)))
        for _fd, mask in events:
            if mask & (select.POLLERR | select.POLLHUP):
                raise OSError(errno.ENODEV, f"{self.path}: trigger went away")
            if mask & select.POLLPRI:
                return True
        return False

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _PolledTarget:
    """The user-space version of a trigger: stall growth within the window from `total`."""

    __slots__ = ("path", "samples", "last_fired")

    def __init__(self, path: str, depth: int) -> None:
        self.path = path
        self.samples: deque[tuple[float, int]] = deque(maxlen=depth)
        self.last_fired = float("-inf")


class PressureWatch:
    """Calls `on_wake(target_name)` on the event loop when a watched cgroup's CPU pressure
    exceeds `stall_us` within `window_us`, through kernel triggers or, when refused, polling.

    `set_targets({name: pressure_file_path})` may be called at any time (each tick); files
    that do not exist are skipped and retried on the next call.
    """

    def __init__(
        self,
        *,
        stall_us: int,
        window_us: int,
        poll_interval_s: float,
        on_wake: Callable[[str], None],
        use_triggers: bool = True,
        triggers_off_reason: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``triggers_off_reason``: why triggers are off when ``use_triggers`` is False (shown
        in the mode; default: disabled in the configuration)."""
        self.stall_us = stall_us
        self.window_us = window_us
        self.poll_interval_s = poll_interval_s
        self._on_wake = on_wake
        self._use_triggers = use_triggers
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._targets: dict[str, str] = {}
        self._triggers: dict[str, PsiTrigger] = {}
        self._polled: dict[str, _PolledTarget] = {}
        self._reader = StatReader()
        self._poll_handle: asyncio.TimerHandle | None = None
        self._refusal: str | None = None if use_triggers else (
            triggers_off_reason or "PSI triggers disabled in the configuration")
        self._missing: dict[str, str] = {}
        self.wakeups = 0
        self.last_wake: tuple[float, str] | None = None

    # ------------------------------------------------------------------ state

    @property
    def mode(self) -> str:
        if self._refusal is None:
            if self._targets and not self._triggers:
                return f"{MODE_TRIGGER} (none armed: no LS pressure file found)"
            return MODE_TRIGGER
        if self.poll_interval_s > 0:
            return f"{MODE_POLLING} ({self._refusal})"
        return f"{MODE_OFF} ({self._refusal}; polling disabled, ticks only)"

    @property
    def uses_triggers(self) -> bool:
        return self._refusal is None

    def status(self) -> dict[str, Any]:
        armed = sorted(self._triggers) if self.uses_triggers else sorted(self._polled)
        return {
            "mode": self.mode,
            "trigger": f"some {self.stall_us} {self.window_us}",
            "poll_interval_ms": round(self.poll_interval_s * 1000) if not self.uses_triggers else None,
            "targets": dict(sorted(self._targets.items())),
            "armed": armed,
            "missing": dict(sorted(self._missing.items())),
            "wakeups": self.wakeups,
            "last_wake": {"target": self.last_wake[1], "monotonic": round(self.last_wake[0], 3)}
            if self.last_wake else None,
        }

    # ------------------------------------------------------------------ lifecycle

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._arm()

    def stop(self) -> None:
        if self._poll_handle is not None:
            self._poll_handle.cancel()
            self._poll_handle = None
        for name in list(self._triggers):
            self._disarm(name)
        self._polled.clear()
        self._reader.close()
        self._loop = None

    @property
    def needs_retry(self) -> bool:
        """Some target could not be armed: set_targets() with the same targets tries again."""
        return bool(self._missing)

    def set_targets(self, targets: Mapping[str, str]) -> None:
        if dict(targets) == self._targets and not self._missing:
            return
        self._targets = dict(targets)
        if self._loop is not None:
            self._arm()

    # ------------------------------------------------------------------ arming

    def _arm(self) -> None:
        for name in [n for n in self._triggers if self._targets.get(n) != self._triggers[n].path]:
            self._disarm(name)
        for name in [n for n in self._polled if self._targets.get(n) != self._polled[n].path]:
            del self._polled[name]
        self._missing = {}
        if self.uses_triggers:
            for name, path in self._targets.items():
                if name in self._triggers:
                    continue
                try:
                    trigger = PsiTrigger(path, self.stall_us, self.window_us)
                except TriggerFileMissing as err:
                    self._missing[name] = str(err)
                    continue
                except TriggerRefused as err:
                    self._fall_back(describe_refusal(err, self.window_us), path)
                    break
                except OSError as err:
                    self._missing[name] = f"{path}: {err.strerror}"
                    continue
                self._triggers[name] = trigger
                assert self._loop is not None
                self._loop.add_reader(trigger.epoll().fileno(), self._on_trigger_ready, name)
        if not self.uses_triggers:
            depth = max(2, int(self.window_us / 1e6 / max(self.poll_interval_s, 1e-3)) + 2)
            for name, path in self._targets.items():
                if name not in self._polled:
                    self._polled[name] = _PolledTarget(path, depth)
            # No targets, no timer: polling costs nothing while nothing needs watching.
            if self._poll_handle is None and self.poll_interval_s > 0 and self._loop is not None and self._polled:
                self._poll_handle = self._loop.call_later(self.poll_interval_s, self._poll)

    def _fall_back(self, reason: str, path: str) -> None:
        self._refusal = reason
        log.warning("psi_trigger_refused", path=path, reason=reason,
                    fallback=f"polling every {self.poll_interval_s * 1000:.0f} ms"
                    if self.poll_interval_s > 0 else "ticks only")
        for name in list(self._triggers):
            self._disarm(name)

    def _disarm(self, name: str) -> None:
        trigger = self._triggers.pop(name, None)
        if trigger is None:
            return
        if self._loop is not None and trigger._epoll is not None:
            self._loop.remove_reader(trigger._epoll.fileno())
        trigger.close()

    # ------------------------------------------------------------------ events

    def _on_trigger_ready(self, name: str) -> None:
        trigger = self._triggers.get(name)
        if trigger is None:
            return
        # Clear the epoll's ready list; EPOLLERR means the cgroup (and its file) went away.
        try:
            events = trigger.epoll().poll(0)
        except OSError:
            events = [(trigger.fileno(), select.EPOLLERR)]
        if any(mask & (select.EPOLLERR | select.EPOLLHUP) for _fd, mask in events):
            self._disarm(name)
            self._missing[name] = f"{trigger.path}: trigger went away (cgroup removed?)"
            return
        self._fire(name)

    def _fire(self, name: str) -> None:
        self.wakeups += 1
        self.last_wake = (self._clock(), name)
        try:
            self._on_wake(name)
        except Exception:  # noqa: BLE001 - a broken callback must not kill the watch
            log.exception("psi_wake_callback_failed", target=name)

    def _poll(self) -> None:
        self._poll_handle = None
        if self._loop is None:
            return
        self.poll_once()
        self._reader.sweep()
        if self._polled:
            self._poll_handle = self._loop.call_later(self.poll_interval_s, self._poll)

    def poll_once(self) -> list[str]:
        """One polling round (public for tests): returns the targets that fired."""
        now = self._clock()
        window_s = self.window_us / 1e6
        fired = []
        for name, target in self._polled.items():
            try:
                text = self._reader.read(target.path)
                total = pressure_total_some(text) if text is not None else None
            except (OSError, ParseError):
                total = None
            if total is None:
                target.samples.clear()
                continue
            samples = target.samples
            samples.append((now, total))
            # Keep the previous sample even when polls are further apart than the window.
            while len(samples) > 2 and now - samples[0][0] > window_s:
                samples.popleft()
            if len(samples) < 2 or now - target.last_fired < window_s:
                continue
            if total - samples[0][1] >= self.stall_us:
                target.last_fired = now
                fired.append(name)
        for name in fired:
            self._fire(name)
        return fired
