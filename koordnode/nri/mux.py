"""NRI's connection multiplexing: several logical byte streams over one unix socket.

Every frame on the socket is an 8-byte header — the logical connection id and the payload
length, both big-endian uint32 — followed by the payload. NRI uses connection 1 for the plugin
service (the runtime calls the plugin) and connection 2 for the runtime service (the plugin
calls the runtime); each carries ordinary ttrpc. Opening a connection sends nothing: both ends
simply agree on the ids.

Frames are written at most 4096 bytes long: Go's ttrpc reads a logical connection through a
4096-byte buffer, and its multiplexer refuses a read whose frame does not fit the caller's
buffer, so larger frames could break the runtime's side.
"""

from __future__ import annotations

import asyncio
import struct

PLUGIN_SERVICE_CONN = 1
RUNTIME_SERVICE_CONN = 2

_HEADER = struct.Struct(">II")
MAX_WRITE_FRAME = 4096
# ttrpc header (10 bytes) + its 4 MiB message limit: nothing legitimate is larger.
MAX_READ_FRAME = 10 + (4 << 20)
# Bytes a logical connection may hold unread before the peer is considered hostile.
MAX_BUFFERED = 2 * MAX_READ_FRAME


class MuxClosed(ConnectionError):
    """The trunk is gone (peer closed, protocol error); every logical connection with it."""


class MuxConn:
    """One logical connection: a byte stream the ttrpc layer reads exact counts from."""

    def __init__(self, mux: Mux, conn_id: int) -> None:
        self.mux = mux
        self.conn_id = conn_id
        self._buffer = bytearray()
        self._changed = asyncio.Event()

    def _feed(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) > MAX_BUFFERED:
            raise MuxClosed(f"connection {self.conn_id}: peer sent {len(self._buffer)} unread bytes")
        self._changed.set()

    def _wake(self) -> None:
        self._changed.set()

    async def read_exactly(self, count: int) -> bytes:
        while len(self._buffer) < count:
            if self.mux.closed:
                raise MuxClosed(self.mux.close_reason)
            self._changed.clear()
            await self._changed.wait()
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data

    async def write(self, data: bytes) -> None:
        await self.mux.write(self.conn_id, data)


class Mux:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._write_lock = asyncio.Lock()
        self._conns: dict[int, MuxConn] = {}
        self.closed = False
        self.close_reason = "connection closed"

    def open(self, conn_id: int) -> MuxConn:
        if conn_id == 0:
            raise ValueError("connection id 0 is reserved")
        conn = self._conns.get(conn_id)
        if conn is None:
            conn = self._conns[conn_id] = MuxConn(self, conn_id)
        return conn

    async def run(self) -> None:
        """Read frames until the trunk closes; returns (never raises) when it does."""
        try:
            while True:
                header = await self._reader.readexactly(_HEADER.size)
                conn_id, length = _HEADER.unpack(header)
                if length > MAX_READ_FRAME:
                    raise MuxClosed(f"frame of {length} bytes on connection {conn_id} exceeds {MAX_READ_FRAME}")
                payload = await self._reader.readexactly(length) if length else b""
                conn = self._conns.get(conn_id)
                if conn is not None:  # frames for connections nobody opened are dropped, as upstream
                    conn._feed(payload)
        except asyncio.IncompleteReadError:
            self.close("peer closed the connection")
        except MuxClosed as exc:
            self.close(str(exc))
        except (ConnectionError, OSError) as exc:
            self.close(f"connection error: {exc}")
        except asyncio.CancelledError:
            self.close("stopped")
            raise

    async def write(self, conn_id: int, data: bytes) -> None:
        if self.closed:
            raise MuxClosed(self.close_reason)
        async with self._write_lock:  # frames of one message must not interleave with another's
            try:
                view = memoryview(data)
                for start in range(0, max(len(view), 1), MAX_WRITE_FRAME):
                    chunk = view[start:start + MAX_WRITE_FRAME]
                    self._writer.write(_HEADER.pack(conn_id, len(chunk)) + bytes(chunk))
                await self._writer.drain()
            except (ConnectionError, OSError) as exc:
                self.close(f"write failed: {exc}")
                raise MuxClosed(self.close_reason) from exc

    def close(self, reason: str = "closed") -> None:
        if not self.closed:
            self.closed = True
            self.close_reason = reason
            self._writer.close()
        for conn in self._conns.values():
            conn._wake()
