"""The systemd notify protocol (sd_notify), without a dependency on libsystemd.

Under ``Type=notify`` systemd passes ``$NOTIFY_SOCKET``: a unix datagram socket, given as a
path or, when it starts with ``@``, as an abstract name. Each datagram is newline-separated
``KEY=VALUE`` assignments (``READY=1``, ``WATCHDOG=1``, ``STATUS=...``). Outside systemd the
variable is unset and every call here is a no-op returning False, so the daemon never needs
to know how it was started.

Sending never raises: a notification that cannot be delivered is not a reason to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable, Mapping

__all__ = [
    "notify",
    "ready",
    "reloading",
    "status",
    "stopping",
    "watchdog",
    "watchdog_interval_s",
    "watchdog_loop",
]

# systemd reads the socket at once; a bound keeps a stuck manager from stalling our loop.
_SEND_TIMEOUT_S = 1.0


def _socket_address(value: str) -> str | bytes | None:
    if value.startswith("@"):
        # Abstract namespace: a leading NUL instead of the '@', no terminating NUL.
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    return None  # e.g. "vsock:..." (systemd >= 254): not needed on a node, not supported


def notify(state: str, *, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (``"KEY=VALUE"`` lines) to systemd; True if it was delivered."""
    env = os.environ if environ is None else environ
    address = _socket_address(env.get("NOTIFY_SOCKET", ""))
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(_SEND_TIMEOUT_S)
            sock.sendto(state.encode(), address)
    except (OSError, UnicodeEncodeError):
        return False
    return True


def _one_line(text: str) -> str:
    # A newline would start a new assignment in the datagram.
    return " ".join(text.splitlines())


def ready(status_text: str | None = None) -> bool:
    """Startup (or a reload) is complete: systemd considers the unit active."""
    state = "READY=1"
    if status_text:
        state += f"\nSTATUS={_one_line(status_text)}"
    return notify(state)


def reloading(status_text: str | None = None) -> bool:
    """A configuration reload started; send :func:`ready` when it is over (even if it failed)."""
    # MONOTONIC_USEC lets systemd >= 253 match the reload to its request; older ones ignore it.
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    state = f"RELOADING=1\nMONOTONIC_USEC={usec}"
    if status_text:
        state += f"\nSTATUS={_one_line(status_text)}"
    return notify(state)


def stopping(status_text: str | None = None) -> bool:
    """Shutdown started."""
    state = "STOPPING=1"
    if status_text:
        state += f"\nSTATUS={_one_line(status_text)}"
    return notify(state)


def status(text: str) -> bool:
    """Free-form status shown by ``systemctl status``."""
    return notify(f"STATUS={_one_line(text)}")


def watchdog() -> bool:
    """Tell the watchdog we are alive."""
    return notify("WATCHDOG=1")


def watchdog_interval_s(environ: Mapping[str, str] | None = None) -> float | None:
    """The watchdog timeout (WatchdogSec=) in seconds, or None if no watchdog is expected.

    None also when ``$WATCHDOG_PID`` names another process: the variables were inherited
    and are not meant for us.
    """
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    try:
        value = int(usec)
    except ValueError:
        return None
    if value <= 0:
        return None
    return value / 1_000_000


async def watchdog_loop(
    stop_event: asyncio.Event,
    *,
    interval_s: float | None = None,
    healthy: Callable[[], bool] | None = None,
) -> None:
    """Send WATCHDOG=1 every half watchdog interval until ``stop_event`` is set.

    ``interval_s`` defaults to :func:`watchdog_interval_s`; without a watchdog this returns at
    once. Running in the event loop is the point: if the loop is blocked, the pings stop and
    systemd restarts the daemon. ``healthy``, if given, is asked before each ping; a False
    answer skips it, so a daemon that stays unhealthy for a whole interval is restarted.
    """
    timeout = watchdog_interval_s() if interval_s is None else interval_s
    if timeout is None or timeout <= 0:
        return
    period = timeout / 2
    while not stop_event.is_set():
        if _is_healthy(healthy):
            watchdog()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop_event.wait(), timeout=period)


def _is_healthy(healthy: Callable[[], bool] | None) -> bool:
    if healthy is None:
        return True
    try:
        return bool(healthy())
    except Exception:  # a broken health check counts as unhealthy, not as a dead loop
        return False
