"""The relay over asyncio: each client connection accepted on the CRI socket gets its own
backend connection, and a RelayCore (proxy/relay_core.py) between the two transports.

This module only moves bytes and back-pressure: what a frame means is the core's business.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog

from koordnode.proxy.call_handler import CallHandler
from koordnode.proxy.relay_core import RelayCore

log = structlog.get_logger("koordnode.proxy")

ProtocolFactory = Callable[[], asyncio.BaseProtocol]
# Opens the backend connection with the given protocol: the runtime's socket in production.
BackendOpener = Callable[[ProtocolFactory], Awaitable[asyncio.Transport]]


class UnixBackend:
    """Opens connections to the runtime's unix socket."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def __call__(self, protocol_factory: ProtocolFactory) -> asyncio.Transport:
        transport, _ = await asyncio.get_running_loop().create_unix_connection(protocol_factory, self.path)
        return transport

    def __str__(self) -> str:
        return self.path


class Relay:
    """One client connection, relayed to its own backend connection."""

    def __init__(self, handler: CallHandler, client: asyncio.Transport, open_backend: BackendOpener,
                 registry: set[Relay]) -> None:
        self.client = client
        self.backend: asyncio.Transport | None = None
        self.open_backend = open_backend
        self.registry = registry
        self._tasks: set[asyncio.Task[None]] = set()
        self.core = RelayCore(handler, to_client=client.write, spawn=self._spawn, on_close=self._close_transports)
        registry.add(self)
        self.core.connection_made()
        self._spawn(self._connect_backend())

    @property
    def open_streams(self) -> dict[int, tuple[str, float]]:
        return self.core.open_streams

    @property
    def busy(self) -> bool:
        return self.core.busy

    def go_away(self) -> None:
        self.core.go_away()

    def close(self) -> None:
        self.core.close()

    async def _connect_backend(self) -> None:
        try:
            transport = await self.open_backend(lambda: _BackendProtocol(self))
        except OSError as exc:
            # As if the runtime itself were down: the client sees its connection closed and
            # reports UNAVAILABLE, exactly what it would see against a stopped containerd.
            log.warning("backend_unreachable", backend=str(self.open_backend), error=str(exc))
            self.close()
            return
        if self.core.closed:
            transport.close()
            return
        self.backend = transport
        self.core.backend_connected(transport.write)

    def _close_transports(self) -> None:
        self.registry.discard(self)
        self.client.close()
        if self.backend is not None:
            self.backend.close()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


# Bytes read at once from either socket (asyncio's own default for a stream transport).
READ_SIZE = 256 * 1024


class _ReadBuffer(threading.local):
    """The buffer the relay's sockets are read into: one per event loop thread, shared by every
    connection on it (each read is copied out before the next can happen). A plain
    asyncio.Protocol is handed a new bytes object per read, allocated at the full read size:
    above glibc's mmap threshold, so every read of a few hundred bytes cost an mmap and a munmap."""

    def __init__(self) -> None:
        self.view = memoryview(bytearray(READ_SIZE))

    def take(self, nbytes: int) -> bytes:
        # A copy: the core keeps or forwards what it is given, and the buffer is read into again.
        return bytes(self.view[:nbytes])


_READ = _ReadBuffer()


class _RelayReads(asyncio.BufferedProtocol):
    """Either end of a relayed connection: reads go through _READ to the core's `_received`."""

    _received: Callable[[bytes], None]  # the core's, once connected

    def get_buffer(self, sizehint: int) -> memoryview:
        return _READ.view

    def buffer_updated(self, nbytes: int) -> None:
        self._received(_READ.take(nbytes))


class _ClientProtocol(_RelayReads):
    def __init__(self, handler: CallHandler, open_backend: BackendOpener, registry: set[Relay]) -> None:
        self.handler = handler
        self.open_backend = open_backend
        self.registry = registry
        self.relay: Relay | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # a stream socket's
        self.relay = Relay(self.handler, transport, self.open_backend, self.registry)
        self._received = self.relay.core.client_data

    def connection_lost(self, exc: Exception | None) -> None:
        if self.relay is not None:
            self.relay.close()

    def pause_writing(self) -> None:
        if self.relay is not None and self.relay.backend is not None:
            self.relay.backend.pause_reading()

    def resume_writing(self) -> None:
        if self.relay is not None and self.relay.backend is not None:
            self.relay.backend.resume_reading()


class _BackendProtocol(_RelayReads):
    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self._received = relay.core.backend_data

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.close()

    def pause_writing(self) -> None:
        self.relay.client.pause_reading()

    def resume_writing(self) -> None:
        self.relay.client.resume_reading()


def client_protocol_factory(handler: CallHandler, open_backend: BackendOpener,
                            registry: set[Relay]) -> ProtocolFactory:
    return lambda: _ClientProtocol(handler, open_backend, registry)
