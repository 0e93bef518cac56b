"""The CRI socket kubelet talks to: accept connections and relay each one to the backend."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import time
from pathlib import Path

import structlog

from koordnode.proxy.call_handler import CallHandler
from koordnode.proxy.relay import Relay, UnixBackend, client_protocol_factory

log = structlog.get_logger("koordnode.proxy")


class SocketInUseError(RuntimeError):
    pass


def listen_backlog() -> int:
    """The kernel's accept-queue limit (net.core.somaxconn), which Go, hence containerd, also
    asks for: a burst of clients connecting at once is queued as containerd would queue it
    instead of refused with EAGAIN (asyncio's default is 100)."""
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            value = int(f.read().strip())
    except (OSError, ValueError):
        return socket.SOMAXCONN
    # Go caps it at 65535 on kernels that store it in 16 bits; listen() clamps it anyway.
    return max(1, min(value, 65535))


def prepare_socket_path(path: str) -> None:
    """Create the socket's directory and remove a stale socket; refuse to clobber anything else."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketInUseError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(str(p))
    except OSError:
        p.unlink()  # nobody answers: left over from a previous run
        log.info("stale_socket_removed", path=path)
        return
    finally:
        probe.close()
    raise SocketInUseError(f"{path} is in use by another process (is koordnode already running?)")


class ProxyServer:
    def __init__(self, listen: str, backend: str, handler: CallHandler) -> None:
        self.listen = listen
        self.backend = backend
        self.handler = handler
        self.relays: set[Relay] = set()
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        prepare_socket_path(self.listen)
        loop = asyncio.get_running_loop()
        # The backend is read per connection: a config reload may change it.
        self._server = await loop.create_unix_server(
            lambda: client_protocol_factory(self.handler, UnixBackend(self.backend), self.relays)(), self.listen,
            backlog=listen_backlog(),
        )
        os.chmod(self.listen, 0o660)
        log.info("serving_cri", listen=self.listen, backend=self.backend)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let intercepted calls in flight finish (bounded), then close."""
        if self._server is None:
            return
        self._server.close()
        for relay in list(self.relays):
            relay.go_away()
        deadline = time.monotonic() + grace_s
        while any(r.busy for r in self.relays) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        unfinished = sum(len(r.open_streams) for r in self.relays)
        if unfinished:
            log.warning("closing_with_calls_in_flight", calls=unfinished, grace_s=grace_s)
        for relay in list(self.relays):
            relay.close()
        try:
            await asyncio.wait_for(self._server.wait_closed(), timeout=1.0)
        except TimeoutError:
            pass
        try:
            if stat.S_ISSOCK(os.lstat(self.listen).st_mode):
                os.unlink(self.listen)
        except FileNotFoundError:
            pass
        self._server = None
        log.info("stopped_serving_cri", listen=self.listen)
