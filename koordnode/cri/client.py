"""A small asyncio client for unary gRPC calls to the CRI runtime over its unix socket.

koordnode asks the runtime only a handful of unary questions (the state rebuild, a new pod's
network status, evictions). grpcio would cost ~12 MB of resident memory for that, so this speaks
gRPC directly over one HTTP/2 connection (the `h2` state machine), shared by sequential and
concurrent calls and re-opened on demand once it is gone.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import structlog
from google.protobuf.message import DecodeError, Message

from koordnode.cri import api_pb2 as pb
from koordnode.cri.grpc_wire import (
    GrpcFramingError,
    Status,
    encode_grpc_message,
    grpc_timeout,
    status_name,
    unescape_grpc_message,
    unframe_grpc_message,
)
from koordnode.cri.methods import RUNTIME_SERVICE
from koordnode.model.network import pod_network_from_status

__all__ = ["CriClient", "CriError", "RuntimeBackend"]

log = structlog.get_logger("koordnode")

OK, CANCELLED, UNKNOWN, DEADLINE_EXCEEDED, INTERNAL, UNAVAILABLE = (
    Status.OK, Status.CANCELLED, Status.UNKNOWN, Status.DEADLINE_EXCEEDED, Status.INTERNAL,
    Status.UNAVAILABLE,
)

# What a stream reset by the server means for the call (gRPC's HTTP/2 error mapping).
_RESET_STATUS: dict[int, int] = {
    h2.errors.ErrorCodes.REFUSED_STREAM: UNAVAILABLE,
    h2.errors.ErrorCodes.CANCEL: CANCELLED,
    h2.errors.ErrorCodes.ENHANCE_YOUR_CALM: Status.RESOURCE_EXHAUSTED,
    h2.errors.ErrorCodes.INADEQUATE_SECURITY: Status.PERMISSION_DENIED,
}
# An HTTP status other than 200 (a server that is not speaking gRPC), as gRPC maps it.
_HTTP_STATUS: dict[int, int] = {400: INTERNAL, 401: Status.UNAUTHENTICATED, 403: Status.PERMISSION_DENIED,
                404: Status.UNIMPLEMENTED, 429: UNAVAILABLE, 502: UNAVAILABLE,
                503: UNAVAILABLE, 504: UNAVAILABLE}

# Large receive windows: a ListContainers answer of a busy node arrives without waiting for
# a WINDOW_UPDATE every 64 KiB.
_RECEIVE_WINDOW = 4 * 1024 * 1024
_READ_SIZE = 65536

M = TypeVar("M", bound=Message)


class CriError(Exception):
    """A call that did not end with grpc-status OK."""

    def __init__(self, code: int, code_name: str, details: str) -> None:
        super().__init__(f"{code_name}: {details}")
        self.code = code
        self.code_name = code_name
        self.details = details

    @classmethod
    def of(cls, code: int, details: str) -> CriError:
        return cls(int(code), status_name(code), details)


class _Call:
    """One stream's answer as it arrives."""

    __slots__ = ("headers", "body", "trailers", "ended", "done")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.headers: dict[bytes, bytes] | None = None
        self.body = bytearray()
        self.trailers: dict[bytes, bytes] | None = None
        self.ended = False  # the server ended its side of the stream
        self.done: asyncio.Future[None] = loop.create_future()

    def fail(self, error: CriError) -> None:
        if not self.done.done():
            self.done.set_exception(error)

    def finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


class _Connection:
    """One HTTP/2 connection to the runtime and the calls in flight on it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 receive_window: int) -> None:
        self.reader, self.writer = reader, writer
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.calls: dict[int, _Call] = {}
        self.closed = False  # no new streams (lost, GOAWAY, or closed by us)
        self._changed = asyncio.Event()  # window or stream capacity may have grown
        self.h2.initiate_connection()
        if receive_window > 65535:
            self.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: receive_window})
            self.h2.increment_flow_control_window(receive_window - 65535)
        self.flush()
        self.reader_task = asyncio.get_running_loop().create_task(self._read_loop())

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    async def open_stream(self, headers: list[tuple[bytes, bytes]], body: bytes) -> tuple[int, _Call]:
        while self.h2.open_outbound_streams >= self.h2.remote_settings.max_concurrent_streams:
            await self._wait_for_change()
        stream_id = self.h2.get_next_available_stream_id()
        call = _Call(asyncio.get_running_loop())
        self.calls[stream_id] = call
        self.h2.send_headers(stream_id, headers)
        try:
            await self._send_body(stream_id, body)
        except BaseException:
            self.forget(stream_id, reset=True)
            raise
        return stream_id, call

    async def _send_body(self, stream_id: int, body: bytes) -> None:
        view = memoryview(body)
        while True:
            if self.closed:
                raise CriError.of(UNAVAILABLE, "connection to the runtime lost")
            window = min(self.h2.local_flow_control_window(stream_id), self.h2.max_outbound_frame_size)
            if window <= 0 and view:
                self.flush()
                await self._wait_for_change()
                continue
            chunk, view = view[:window], view[window:]
            self.h2.send_data(stream_id, bytes(chunk), end_stream=not view)
            self.flush()
            if not view:
                await self.writer.drain()
                return

    async def _wait_for_change(self) -> None:
        self._changed.clear()
        await self._changed.wait()
        if self.closed:
            raise CriError.of(UNAVAILABLE, "connection to the runtime lost")

    def forget(self, stream_id: int, *, reset: bool) -> None:
        call = self.calls.pop(stream_id, None)
        if reset and call is not None and not self.closed:
            try:
                self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                self.flush()
            except h2.exceptions.H2Error:
                pass  # already closed on the server's side
        self._changed.set()

    async def _read_loop(self) -> None:
        reason = "connection to the runtime closed"
        try:
            while True:
                data = await self.reader.read(_READ_SIZE)
                if not data:
                    break
                events = self.h2.receive_data(data)
                for event in events:
                    self._on_event(event)
                self.flush()
        except (OSError, h2.exceptions.H2Error) as exc:
            reason = f"connection to the runtime lost: {exc}"
        finally:
            self._lost(reason)

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            if call := self.calls.get(event.stream_id):
                call.headers = dict(event.headers)
        elif isinstance(event, h2.events.DataReceived):
            # Hand the window back at once: the whole answer is buffered here anyway.
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if call := self.calls.get(event.stream_id):
                call.body += event.data
        elif isinstance(event, h2.events.TrailersReceived):
            if call := self.calls.get(event.stream_id):
                call.trailers = dict(event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            if call := self.calls.get(event.stream_id):
                call.ended = True
                call.finish()
            self._changed.set()
        elif isinstance(event, h2.events.StreamReset):
            if call := self.calls.get(event.stream_id):
                code = _RESET_STATUS.get(event.error_code, INTERNAL)
                call.fail(CriError.of(code, f"stream reset by the runtime: {event.error_code!r}"))
            self._changed.set()
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self._changed.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            # GOAWAY: streams above last_stream_id were never processed; the others may finish.
            self.closed = True
            last = event.last_stream_id if event.last_stream_id is not None else 0
            for stream_id, call in self.calls.items():
                if stream_id > last:
                    call.fail(CriError.of(UNAVAILABLE, f"runtime closed the connection ({event.error_code!r})"))
            self._changed.set()

    def _lost(self, reason: str) -> None:
        self.closed = True
        for call in self.calls.values():
            call.fail(CriError.of(UNAVAILABLE, reason))
        self._changed.set()
        self.writer.close()

    async def close(self) -> None:
        self.closed = True
        if not self.writer.is_closing():
            try:
                self.h2.close_connection()
                self.flush()
            except h2.exceptions.H2Error:
                pass
        self.reader_task.cancel()
        await asyncio.gather(self.reader_task, return_exceptions=True)
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass


class CriClient:
    """Unary gRPC calls on one reused HTTP/2 connection to a unix socket."""

    def __init__(self, socket_path: str, *, receive_window: int = _RECEIVE_WINDOW) -> None:
        self.socket_path = socket_path.removeprefix("unix://").removeprefix("unix:")
        self.receive_window = receive_window
        self._conn: _Connection | None = None
        self._connecting = asyncio.Lock()

    async def _connection(self) -> _Connection:
        async with self._connecting:
            if self._conn is None or self._conn.closed:
                if self._conn is not None:
                    old, self._conn = self._conn, None
                    if not old.calls:
                        await old.close()
                try:
                    reader, writer = await asyncio.open_unix_connection(self.socket_path)
                except OSError as exc:
                    raise CriError.of(
                        UNAVAILABLE, f"cannot connect to unix:{self.socket_path}: {exc.strerror or exc}"
                    ) from None
                self._conn = _Connection(reader, writer, self.receive_window)
            return self._conn

    async def call(self, path: str, request: Message, response_cls: type[M], timeout: float) -> M:
        """Call `path` ("/runtime.v1.RuntimeService/Version") and return its answer.

        Raises CriError for any outcome but grpc-status OK, the runtime being unreachable
        (UNAVAILABLE) and the deadline passing (DEADLINE_EXCEEDED) included.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        payload = request.SerializeToString()
        body = encode_grpc_message(payload)
        headers = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path.encode()),
            (b":authority", b"localhost"),
            (b"te", b"trailers"),
            (b"content-type", b"application/grpc"),
            (b"user-agent", b"koordnode-cri-client"),
            (b"grpc-timeout", grpc_timeout(timeout).encode()),
        ]
        conn: _Connection | None = None
        stream_id = None
        try:
            async with asyncio.timeout_at(deadline):
                conn = await self._connection()
                stream_id, pending = await conn.open_stream(headers, body)
                await pending.done
        except TimeoutError:
            raise CriError.of(DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        except h2.exceptions.H2Error as exc:
            raise CriError.of(INTERNAL, f"HTTP/2 error: {exc}") from None
        finally:
            if conn is not None and stream_id is not None:
                # Reset a stream the server has not ended (timeout, cancelled caller).
                conn.forget(stream_id, reset=not pending.ended)
        return _response(pending, response_cls)

    async def close(self) -> None:
        async with self._connecting:
            conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()


def _response(call: _Call, response_cls: type[M]) -> M:
    headers = call.headers or {}
    status_headers = call.trailers if call.trailers is not None else headers  # trailers-only
    http_status = headers.get(b":status", b"")
    if http_status != b"200":
        code = _HTTP_STATUS.get(int(http_status or 0), UNKNOWN)
        raise CriError.of(code, f"HTTP status {http_status.decode(errors='replace') or 'missing'}")
    raw_status = status_headers.get(b"grpc-status")
    if raw_status is None:
        raise CriError.of(INTERNAL, "the runtime's answer carries no grpc-status")
    try:
        code = int(raw_status)
    except ValueError:
        raise CriError.of(UNKNOWN, f"malformed grpc-status {raw_status!r}") from None
    if code != OK:
        message = unescape_grpc_message(status_headers.get(b"grpc-message", b"").decode("utf-8", "replace"))
        raise CriError.of(code, message)
    try:
        message_bytes = unframe_grpc_message(bytes(call.body))
    except GrpcFramingError as exc:
        raise CriError.of(INTERNAL, f"the runtime's answer {exc}") from None
    try:
        return response_cls.FromString(message_bytes)
    except DecodeError as exc:
        raise CriError.of(INTERNAL, f"cannot parse the answer: {exc}") from None


class RuntimeBackend:
    """The runtime koordnode itself calls (health probes, pod status, evictions): one client,
    made at the first call and replaced when [proxy] backend changes. On the event loop."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._client: CriClient | None = None

    async def call(self, path: str, request: Message, response_cls: type[M], timeout: float) -> M:
        if self._client is None:
            self._client = CriClient(self.address)
        return await self._client.call(path, request, response_cls, timeout)

    async def stop_container(self, container_id: str, timeout_s: int) -> None:
        """Stop a container (BE evictions without the Eviction API); CriError when it fails."""
        await self.call(RUNTIME_SERVICE + "StopContainer",
                        pb.StopContainerRequest(container_id=container_id, timeout=timeout_s),
                        pb.StopContainerResponse, timeout=timeout_s + 20)

    async def pod_network(self, sandbox_id: str) -> tuple[tuple[str, ...], bool] | None:
        """A pod's IPs and whether it uses the node's network; None (logged) when unreadable."""
        try:
            resp = await self.call(RUNTIME_SERVICE + "PodSandboxStatus",
                                   pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id),
                                   pb.PodSandboxStatusResponse, timeout=2)
        except CriError as exc:
            log.warning("pod_network_status_unreadable", sandbox_id=sandbox_id, error=str(exc))
            return None
        return pod_network_from_status(resp.status)

    async def reconfigure(self, address: str) -> None:
        if address != self.address:
            await self.close()
            self.address = address

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()
