"""A small ttrpc (containerd's RPC over a byte stream) client and server, unary calls only.

A message is a 10-byte header — payload length (uint32), stream id (uint32), type (1 request,
2 response, 3 data), flags — all big-endian, then a protobuf payload: a `ttrpc.Request`
(service, method, payload, timeout) or a `ttrpc.Response` (status, payload). The client picks
odd stream ids; a response carries the id of its request. NRI needs nothing else (no
streaming), so streams and data messages are refused.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from collections.abc import Awaitable, Callable

import structlog
from google.protobuf.message import DecodeError

from koordnode.nri import ttrpc_pb2
from koordnode.nri.mux import MuxClosed, MuxConn

log = structlog.get_logger("koordnode.nri")

_HEADER = struct.Struct(">IIBB")
MESSAGE_REQUEST = 1
MESSAGE_RESPONSE = 2
MAX_MESSAGE = 4 << 20

# gRPC status codes used on the wire.
OK = 0
DEADLINE_EXCEEDED = 4
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
RESOURCE_EXHAUSTED = 8
INVALID_ARGUMENT = 3

Handler = Callable[[bytes], Awaitable[bytes]]


class TtrpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"ttrpc status {code}: {message}")
        self.code = code
        self.message = message


async def _read_message(conn: MuxConn) -> tuple[int, int, bytes]:
    length, stream_id, msg_type, _flags = _HEADER.unpack(await conn.read_exactly(_HEADER.size))
    if length > MAX_MESSAGE:
        raise MuxClosed(f"ttrpc message of {length} bytes exceeds {MAX_MESSAGE}")
    return stream_id, msg_type, await conn.read_exactly(length)


async def _send(conn: MuxConn, stream_id: int, msg_type: int, payload: bytes) -> None:
    await conn.write(_HEADER.pack(len(payload), stream_id, msg_type, 0) + payload)


class TtrpcServer:
    """Answers requests on one logical connection; each request is handled in its own task."""

    def __init__(self, conn: MuxConn, handlers: dict[tuple[str, str], Handler]) -> None:
        self.conn = conn
        self.handlers = handlers
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self) -> None:
        try:
            while True:
                stream_id, msg_type, payload = await _read_message(self.conn)
                if msg_type != MESSAGE_REQUEST:
                    log.warning("unexpected_ttrpc_message_ignored", type=msg_type, stream_id=stream_id)
                    continue
                task = asyncio.get_running_loop().create_task(self._handle(stream_id, payload))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            for task in list(self._tasks):
                task.cancel()

    async def _handle(self, stream_id: int, payload: bytes) -> None:
        response = ttrpc_pb2.Response()
        try:
            request = ttrpc_pb2.Request.FromString(payload)
        except DecodeError:
            response.status.code, response.status.message = INVALID_ARGUMENT, "malformed ttrpc request"
        else:
            handler = self.handlers.get((request.service, request.method))
            if handler is None:
                response.status.code = UNIMPLEMENTED
                response.status.message = f"method {request.service}.{request.method} not served"
            else:
                try:
                    response.payload = await handler(request.payload)
                except TtrpcError as exc:
                    response.status.code, response.status.message = exc.code, exc.message
                except DecodeError as exc:
                    response.status.code, response.status.message = INVALID_ARGUMENT, f"malformed payload: {exc}"
                except Exception as exc:  # a bug must cost one call, not the connection
                    log.exception("nri_handler_failed", method=request.method)
                    response.status.code, response.status.message = INTERNAL, repr(exc)
        try:
            await _send(self.conn, stream_id, MESSAGE_RESPONSE, response.SerializeToString())
        except MuxClosed:
            pass


class TtrpcClient:
    """Unary calls on one logical connection."""

    def __init__(self, conn: MuxConn) -> None:
        self.conn = conn
        self._ids = itertools.count(1, 2)
        self._pending: dict[int, asyncio.Future[bytes]] = {}

    async def receive(self) -> None:
        """Dispatch responses until the connection closes; then fail what is still waiting."""
        reason = "stopped"
        try:
            while True:
                stream_id, msg_type, payload = await _read_message(self.conn)
                future = self._pending.pop(stream_id, None)
                if msg_type != MESSAGE_RESPONSE or future is None or future.done():
                    continue
                future.set_result(payload)
        except MuxClosed as exc:
            reason = str(exc)
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(MuxClosed("connection closed before the answer"))
            self._pending.clear()
        log.debug("ttrpc_client_stopped", reason=reason)

    async def call(self, service: str, method: str, payload: bytes, timeout_s: float) -> bytes:
        stream_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[stream_id] = future
        request = ttrpc_pb2.Request(service=service, method=method, payload=payload,
                                    timeout_nano=int(timeout_s * 1e9))
        try:
            await _send(self.conn, stream_id, MESSAGE_REQUEST, request.SerializeToString())
            raw = await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise TtrpcError(DEADLINE_EXCEEDED, f"{method}: no answer within {timeout_s} s") from None
        finally:
            self._pending.pop(stream_id, None)
        response = ttrpc_pb2.Response.FromString(raw)
        if response.status.code != OK:
            raise TtrpcError(response.status.code, response.status.message)
        return response.payload
