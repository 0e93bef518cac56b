"""The relay over asyncio: each client connection accepted on the CRI socket gets its own
backend connection, and a RelayCore (proxy/relay_core.py) between the two transports.

This module only moves bytes and back-pressure: what a frame means is the core's business.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog

from koordnode.proxy.call_handler import CallHandler
from koordnode.proxy.relay_core import RelayCore

log = structlog.get_logger("koordnode.proxy")

ProtocolFactory = Callable[[], asyncio.Protocol]
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

    def __init__(self, handler: CallHandler, open_backend: BackendOpener, registry: set[Relay]) -> None:
        self.open_backend = open_backend
        self.registry = registry
        self.client: asyncio.Transport | None = None
        self.backend: asyncio.Transport | None = None
        self._pending_to_backend: list[bytes] = []  # what the client sent before the backend was up
        self._tasks: set[asyncio.Task[None]] = set()
        self.core = RelayCore(handler, to_client=self._write_client, to_backend=self._write_backend,
                              spawn=self._spawn, on_close=self._close_transports)

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

    def client_connected(self, transport: asyncio.Transport) -> None:
        self.client = transport
        self.registry.add(self)
        self.core.connection_made()
        self._spawn(self._connect_backend())

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
        for chunk in self._pending_to_backend:
            transport.write(chunk)
        self._pending_to_backend.clear()

    def _close_transports(self) -> None:
        self.registry.discard(self)
        self._pending_to_backend.clear()
        if self.client is not None:
            self.client.close()
        if self.backend is not None:
            self.backend.close()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _write_backend(self, data: bytes) -> None:
        if self.backend is not None:
            self.backend.write(data)
        else:
            self._pending_to_backend.append(data)

    def _write_client(self, data: bytes) -> None:
        if self.client is not None:
            self.client.write(data)


class _ClientProtocol(asyncio.Protocol):
    def __init__(self, handler: CallHandler, open_backend: BackendOpener, registry: set[Relay]) -> None:
        self.relay = Relay(handler, open_backend, registry)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.relay.client_connected(transport)

    def data_received(self, data: bytes) -> None:
        self.relay.core.client_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.close()

    def pause_writing(self) -> None:
        if self.relay.backend is not None:
            self.relay.backend.pause_reading()

    def resume_writing(self) -> None:
        if self.relay.backend is not None:
            self.relay.backend.resume_reading()


class _BackendProtocol(asyncio.Protocol):
    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    def data_received(self, data: bytes) -> None:
        self.relay.core.backend_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.close()

    def pause_writing(self) -> None:
        if self.relay.client is not None:
            self.relay.client.pause_reading()

    def resume_writing(self) -> None:
        if self.relay.client is not None:
            self.relay.client.resume_reading()


def client_protocol_factory(handler: CallHandler, open_backend: BackendOpener,
                            registry: set[Relay]) -> ProtocolFactory:
    return lambda: _ClientProtocol(handler, open_backend, registry)
