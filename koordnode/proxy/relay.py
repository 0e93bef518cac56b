"""A transparent HTTP/2 relay between one CRI client connection and one backend connection.

Why a frame relay and not a gRPC server + client: a pass-through call is relayed as the very
bytes both ends wrote, so status codes, metadata, deadlines, streaming, unknown methods and the
old v1alpha2 API behave exactly as with containerd, and the cost is one parse of each frame
header plus one HPACK decode per header block. Only the request body of intercepted methods is
held back, handed to the hooks, and re-sent (possibly changed). Responses are never changed:
the relay copies the response of an intercepted call for the Post hooks as it passes.

Invariants kept here:
- Header blocks are forwarded in order and unchanged, so both HPACK dynamic tables stay in sync
  with the real endpoints; we decode them (read-only) with decoders of our own.
- Flow control: the backend never sees a held request body, so it would never return the
  window the client spent on it, and a body larger than the window would stall. We return that
  window to the client ourselves as we hold each frame. When we then send the (possibly
  changed) body, the backend will return window for it that the client never spent: we
  withhold that much from the backend's connection-level WINDOW_UPDATEs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, cast

import hpack
import structlog

from koordnode.cri.grpc_wire import Status, unescape_grpc_message
from koordnode.proxy import h2wire as w

log = structlog.get_logger("koordnode.proxy")

# Header lists are only observed; a generous bound avoids rejecting what the endpoints accept.
_MAX_HEADER_LIST = 16 * 1024 * 1024
# Largest request body held for the hooks: containerd's own receive limit (16 MiB), so a
# larger request is refused as containerd would refuse it, and memory stays bounded.
MAX_INTERCEPTED_BODY = 16 * 1024 * 1024
# Request bytes one connection may have held for the hooks before we stop returning the
# client's flow-control window: the client then waits, as it would for a slow runtime.
MAX_HELD_PER_CONNECTION = 2 * MAX_INTERCEPTED_BODY
# A header block is collected whole to be decoded; CRI metadata is a few hundred bytes. A
# larger block is relayed undecoded (the runtime judges it) and the connection stops being
# intercepted, rather than collecting an unbounded block.
MAX_HEADER_BLOCK = 1024 * 1024


@dataclasses.dataclass
class BeforeResult:
    body: bytes  # gRPC-framed request body to send to the backend
    ctx: Any = None  # handed back to CallHandler.after
    fail: tuple[int, str] | None = None  # (grpc code, message): answer the client with this instead


class CallHandler(Protocol):
    def lookup(self, path: str) -> Any | None: ...

    async def before(self, spec: Any, body: bytes) -> BeforeResult: ...

    def after(self, ctx: Any, body: bytes, grpc_status: int | None, grpc_message: str) -> None: ...

    def completed(self, path: str, grpc_status: int | None, seconds: float) -> None: ...

    def opened(self) -> None: ...

    def closed(self) -> None: ...


# A header block made only of one-byte "indexed header field" representations (index 1..126).
# Decoding it reads the tables but cannot change them.
_ONLY_INDEXED = re.compile(rb"[\x81-\xfe]+")


class _HeaderDecoder:
    """hpack's decoder plus a cache for the blocks that repeat call after call.

    Once both ends have indexed their usual headers, most blocks (a response's ":status 200",
    its "grpc-status 0" trailers, a request without a deadline) are a few indexed bytes, the same
    every time. Their meaning only changes when the dynamic table does, so they are cached until a
    block that changes the table comes by.
    """

    __slots__ = ("decoder", "cache")

    def __init__(self) -> None:
        self.decoder = hpack.Decoder(max_header_list_size=_MAX_HEADER_LIST)
        self.cache: dict[bytes, list[tuple[str, str]]] = {}

    def set_max_table_size(self, size: int) -> None:
        self.decoder.max_allowed_table_size = size

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        if _ONLY_INDEXED.fullmatch(block):
            headers = self.cache.get(block)
            if headers is None:
                headers = self.cache[block] = cast("list[tuple[str, str]]", self.decoder.decode(block, raw=False))
                if len(self.cache) > 256:  # bounded: a peer cannot grow it without end
                    self.cache.clear()
            return headers
        table = self.decoder.header_table.dynamic_entries
        before = tuple(table)
        headers = cast("list[tuple[str, str]]", self.decoder.decode(block, raw=False))
        if self.cache and tuple(table) != before:
            self.cache.clear()
        return headers


class _Intercepted:
    __slots__ = (
        "sid", "spec", "req_chunks", "req_bytes", "buffering", "cancelled", "ctx",
        "server_window", "resp_chunks", "resp_end_stream", "response_done", "window_event",
        "held", "declared",
    )

    def __init__(self, sid: int, spec: Any, server_window: int) -> None:
        self.sid = sid
        self.spec = spec
        self.req_chunks: list[bytes] = []
        self.req_bytes = 0
        self.buffering = True
        self.cancelled = False
        self.ctx: Any = None
        self.server_window = server_window
        self.resp_chunks: list[bytes] = []
        self.resp_end_stream = False
        self.response_done = False
        self.window_event = asyncio.Event()
        self.held = 0  # frame bytes of the request counted against the connection's budget
        self.declared: int | None = None  # length in the gRPC message prefix, once held


class _HeaderBlock:
    """Accumulates a header block across CONTINUATION frames."""

    __slots__ = ("sid", "flags", "fragments", "size")

    def __init__(self, sid: int, flags: int, fragment: bytes) -> None:
        self.sid = sid
        self.flags = flags
        self.fragments = [fragment]
        self.size = len(fragment)


class Relay:
    """One client connection, relayed to its own backend connection."""

    def __init__(self, handler: CallHandler, backend_path: str, registry: set[Relay]) -> None:
        self.handler = handler
        self.backend_path = backend_path
        self.registry = registry
        self.loop = asyncio.get_running_loop()
        self.client: asyncio.Transport | None = None
        self.backend: asyncio.Transport | None = None
        self._pending_to_backend: list[bytes] = []
        self._cbuf = bytearray()
        self._bbuf = bytearray()
        self._preface_done = False
        self._opaque = False  # not HTTP/2 prior knowledge: relay bytes blindly
        self._c2s_hpack = _HeaderDecoder()
        self._s2c_hpack = _HeaderDecoder()
        self._c2s_block: _HeaderBlock | None = None
        self._s2c_block: _HeaderBlock | None = None
        self._hpack_broken = False  # after a decode error we stop intercepting new streams
        self.streams: dict[int, _Intercepted] = {}
        self._seen_streams_hwm = 0  # highest client stream id seen (new-stream detection)
        # Every call in flight, intercepted or not: stream id -> (method path, start time).
        self.open_streams: dict[int, tuple[str, float]] = {}
        self.server_conn_window = w.DEFAULT_WINDOW
        self.server_initial_window = w.DEFAULT_WINDOW
        self.server_max_frame = w.DEFAULT_MAX_FRAME
        self._conn_debt = 0  # window the backend will return that the client never spent
        self._conn_window_event = asyncio.Event()
        self._held = 0  # request bytes held for the hooks on this connection
        self._withheld: list[tuple[int, int]] = []  # (stream, bytes) of window not yet returned
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    # ---- connection lifecycle -------------------------------------------------------------

    def client_connected(self, transport: asyncio.Transport) -> None:
        self.client = transport
        self.registry.add(self)
        self.handler.opened()
        self._spawn(self._connect_backend())

    async def _connect_backend(self) -> None:
        try:
            transport, _ = await self.loop.create_unix_connection(
                lambda: _BackendProtocol(self), self.backend_path
            )
        except OSError as exc:
            # As if the runtime itself were down: the client sees its connection closed and
            # reports UNAVAILABLE, exactly what it would see against a stopped containerd.
            log.warning("backend_unreachable", backend=self.backend_path, error=str(exc))
            self.close()
            return
        if self._closed:
            transport.close()
            return
        self.backend = transport
        for chunk in self._pending_to_backend:
            transport.write(chunk)
        self._pending_to_backend.clear()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.registry.discard(self)
        for st in self.streams.values():
            st.cancelled = True
            st.window_event.set()
        self._conn_window_event.set()
        if self.client is not None:
            self.client.close()
        if self.backend is not None:
            self.backend.close()
        self.handler.closed()

    @property
    def busy(self) -> bool:
        """True while a call on this connection is unfinished."""
        return bool(self.open_streams) or bool(self.streams)

    def go_away(self) -> None:
        """Tell the client to open no new streams here (graceful shutdown)."""
        if self.client is not None and not self._closed and self._preface_done and not self._opaque:
            payload = (self._seen_streams_hwm & 0x7FFFFFFF).to_bytes(4, "big") + bytes(4)
            self._to_client(w.frame(w.GOAWAY, 0, 0, payload))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _to_backend(self, data: bytes) -> None:
        if self.backend is not None:
            self.backend.write(data)
        elif not self._closed:
            self._pending_to_backend.append(data)

    def _to_client(self, data: bytes) -> None:
        if self.client is not None and not self._closed:
            self.client.write(data)

    # ---- client -> backend ----------------------------------------------------------------

    def from_client(self, data: bytes) -> None:
        try:
            self._from_client(data)
        except Exception:  # a parsing bug must cost one connection, never the daemon
            log.exception("relay_failed_on_client_data", detail="closing the connection")
            self.close()

    def _from_client(self, data: bytes) -> None:
        if self._opaque or self._closed:
            if self._opaque:
                self._to_backend(data)
            return
        buf = self._cbuf
        buf += data
        pos = 0
        if not self._preface_done:
            if len(buf) < len(w.PREFACE):
                if not w.PREFACE.startswith(bytes(buf)):
                    self._go_opaque_client()
                return
            if bytes(buf[: len(w.PREFACE)]) != w.PREFACE:
                self._go_opaque_client()
                return
            self._preface_done = True
            pos = len(w.PREFACE)
        out_start = 0
        n = len(buf)
        while n - pos >= 9:
            length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
            if length > self.server_max_frame:
                # Refused at the header, before buffering it: larger than the runtime announced.
                if pos > out_start:
                    self._to_backend(bytes(buf[out_start:pos]))
                self._connection_error(w.ERROR_FRAME_SIZE, f"frame of {length} bytes larger than "
                                       f"SETTINGS_MAX_FRAME_SIZE {self.server_max_frame}")
                return
            end = pos + 9 + length
            if end > n:
                break
            ftype = buf[pos + 3]
            if ftype == w.DATA and pos > out_start and self.streams:
                # A held call's frame may make us write to the backend (a refusal's RST_STREAM):
                # what came before it must reach the backend first.
                self._to_backend(bytes(buf[out_start:pos]))
                out_start = pos
            replacement = self._client_frame(
                buf[pos + 3], buf[pos + 4], int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF,
                memoryview(buf)[pos + 9 : end], length,
            )
            if replacement is not None:
                if pos > out_start:
                    self._to_backend(bytes(buf[out_start:pos]))
                if replacement:
                    self._to_backend(replacement)
                out_start = end
            pos = end
        if pos > out_start:
            self._to_backend(bytes(buf[out_start:pos]))
        del buf[:pos]

    def _connection_error(self, code: int, reason: str) -> None:
        """A client frame HTTP/2 makes a connection error: GOAWAY with `code`, then close."""
        log.warning("client_http2_protocol_error", detail="closing the client connection", reason=reason,
                    error_code=code)
        self._cbuf.clear()
        self._to_client(w.goaway(self._seen_streams_hwm, code))
        self.close()

    def _go_opaque_client(self) -> None:
        log.warning("no_http2_preface", detail="relaying bytes unparsed")
        self._opaque = True
        data = bytes(self._cbuf)
        self._cbuf.clear()
        self._to_backend(data)

    def _client_frame(self, ftype: int, flags: int, sid: int, payload: memoryview, length: int) -> bytes | None:
        """Handle one client frame; None forwards it as is, bytes replace it (b"" drops it)."""
        if ftype == w.DATA:
            st = self.streams.get(sid)
            if st is None or not st.buffering:
                self.server_conn_window -= length
                return None
            try:
                chunk = w.frame_payload(ftype, flags, payload)
            except ValueError:
                # Malformed padding: stop holding this call and let the runtime answer the
                # frame itself, so the client gets exactly the runtime's protocol error.
                self._drop_intercepted(st)
                self.server_conn_window -= length
                return None
            if chunk:
                st.req_chunks.append(chunk)
                st.req_bytes += len(chunk)
            st.held += length
            self._held += length
            if length:
                # Give the client back the window it spent: the backend won't, it never sees it.
                if self._held <= MAX_HELD_PER_CONNECTION:
                    self._to_client(w.window_update(0, length) + w.window_update(sid, length))
                else:
                    self._withheld.append((sid, length))
            if st.declared is None and st.req_bytes >= 5:
                st.declared = _declared_length(st.req_chunks)
            if st.req_bytes > MAX_INTERCEPTED_BODY or (st.declared or 0) > MAX_INTERCEPTED_BODY:
                self._refuse_oversized(st, max(st.declared or 0, st.req_bytes - 5))
            elif flags & w.FLAG_END_STREAM:
                st.buffering = False
                self._spawn(self._run_before(st))
            return b""
        if ftype == w.HEADERS:
            try:
                fragment = w.frame_payload(ftype, flags, payload)
            except ValueError:
                return None  # the runtime answers it (its protocol error); we decode nothing
            block = _HeaderBlock(sid, flags, fragment)
            if flags & w.FLAG_END_HEADERS:
                self._client_headers(block)
            else:
                self._c2s_block = block
            return None
        if ftype == w.CONTINUATION:
            pending = self._c2s_block
            if pending is not None and pending.sid == sid:
                pending.size += length
                if pending.size > MAX_HEADER_BLOCK:
                    self._c2s_block = None
                    self._give_up_decoding("request header block larger than "
                                           f"{MAX_HEADER_BLOCK} bytes")
                    return None
                pending.fragments.append(bytes(payload))
                if flags & w.FLAG_END_HEADERS:
                    self._c2s_block = None
                    self._client_headers(pending)
            return None
        if ftype == w.RST_STREAM:
            self._call_done(sid, 1)  # CANCELLED by the client
            st = self.streams.pop(sid, None)
            if st is not None:
                st.cancelled = True
                st.window_event.set()
                self._release_held(st)
            return None
        if ftype == w.SETTINGS and not flags & w.FLAG_ACK:
            table = w.parse_settings(payload).get(w.SETTINGS_HEADER_TABLE_SIZE)
            if table is not None:
                self._s2c_hpack.set_max_table_size(table)
            return None
        return None

    def _client_headers(self, block: _HeaderBlock) -> None:
        if self._hpack_broken:
            return
        try:
            headers = self._c2s_hpack.decode(b"".join(block.fragments))
        except Exception as exc:  # any HPACK failure: stay a blind relay for new streams
            self._hpack_broken = True
            log.error("request_headers_undecodable", detail="interception disabled on this connection",
                      error=repr(exc))
            return
        sid = block.sid
        if sid <= self._seen_streams_hwm:
            return  # trailers of an existing stream
        self._seen_streams_hwm = sid
        path = None
        for name, value in headers:
            if name == ":path":
                path = value
                break
        if path is None:
            return
        self.open_streams[sid] = (path, time.monotonic())
        if block.flags & w.FLAG_END_STREAM:
            return  # no body to intercept
        spec = self.handler.lookup(path)
        if spec is not None:
            self.streams[sid] = _Intercepted(sid, spec, self.server_initial_window)

    def _give_up_decoding(self, reason: str) -> None:
        self._hpack_broken = True
        log.warning("interception_disabled", detail="relaying the connection unchanged", reason=reason)

    def _drop_intercepted(self, st: _Intercepted) -> None:
        """Stop holding a call: what is held is dropped, later frames go to the runtime."""
        self.streams.pop(st.sid, None)
        st.cancelled = True
        st.req_chunks = []
        st.window_event.set()
        self._release_held(st)

    def _release_held(self, st: _Intercepted) -> None:
        """A held body left memory: return the window we withheld while over the budget."""
        if not st.held:
            return
        self._held -= st.held
        st.held = 0
        while self._withheld and self._held <= MAX_HELD_PER_CONNECTION:
            sid, n = self._withheld.pop(0)
            update = w.window_update(0, n)
            if sid in self.streams:
                update += w.window_update(sid, n)
            self._to_client(update)

    def _refuse_oversized(self, st: _Intercepted, size: int) -> None:
        """Answer as containerd does, as soon as the gRPC length prefix is known: a trailers-only
        RESOURCE_EXHAUSTED with grpc-go's message, then RST_STREAM(NO_ERROR)."""
        self._drop_intercepted(st)
        self._to_backend(w.rst_stream(st.sid))
        self._to_client(w.grpc_error_trailers(
            st.sid, Status.RESOURCE_EXHAUSTED,
            f"grpc: received message larger than max ({size} vs. {MAX_INTERCEPTED_BODY})",
        ) + w.rst_stream(st.sid, w.ERROR_NO_ERROR))
        log.warning("oversized_request_refused", method=getattr(st.spec, "name", "?"),
                    size=size, limit=MAX_INTERCEPTED_BODY)

    async def _run_before(self, st: _Intercepted) -> None:
        body = b"".join(st.req_chunks)
        st.req_chunks = []
        try:
            await self._hooks_and_send(st, body)
        finally:
            self._release_held(st)

    async def _hooks_and_send(self, st: _Intercepted, body: bytes) -> None:
        try:
            result = await self.handler.before(st.spec, body)
        except Exception as exc:  # the handler is fail-open itself; this is a last resort
            log.exception("interception_failed", detail="forwarding the original request", error=repr(exc))
            result = BeforeResult(body=body)
        st.ctx = result.ctx
        if st.cancelled or self._closed or st.response_done:
            self.streams.pop(st.sid, None)
            return
        if result.fail is not None:
            code, message = result.fail
            self._to_backend(w.rst_stream(st.sid))
            self._to_client(w.grpc_error_trailers(st.sid, code, message))
            self.streams.pop(st.sid, None)
            self.handler.after(st.ctx, b"", code, message)
            return
        await self._send_body(st, result.body)

    async def _send_body(self, st: _Intercepted, body: bytes) -> None:
        sent = 0
        remaining = body
        while True:
            chunk_len = min(len(remaining), self.server_max_frame)
            while chunk_len > 0 and (self.server_conn_window < chunk_len or st.server_window < chunk_len):
                # Wait for the backend's flow control window; send what fits first.
                fit = min(self.server_conn_window, st.server_window)
                if fit > 0:
                    chunk_len = fit
                    break
                self._conn_window_event.clear()
                st.window_event.clear()
                waits = [asyncio.ensure_future(self._conn_window_event.wait()),
                         asyncio.ensure_future(st.window_event.wait())]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for fut in waits:
                    fut.cancel()
                if st.cancelled or self._closed:
                    self._conn_debt += sent
                    return
            chunk, remaining = remaining[:chunk_len], remaining[chunk_len:]
            last = not remaining
            self._to_backend(w.frame(w.DATA, w.FLAG_END_STREAM if last else 0, st.sid, chunk))
            self.server_conn_window -= len(chunk)
            st.server_window -= len(chunk)
            sent += len(chunk)
            if last:
                break
        self._conn_debt += sent
        if st.response_done:
            self.streams.pop(st.sid, None)

    # ---- backend -> client ----------------------------------------------------------------

    def from_backend(self, data: bytes) -> None:
        try:
            self._from_backend(data)
        except Exception:
            log.exception("relay_failed_on_runtime_data", detail="closing the connection")
            self.close()

    def _from_backend(self, data: bytes) -> None:
        if self._opaque:
            self._to_client(data)
            return
        buf = self._bbuf
        buf += data
        pos = 0
        out_start = 0
        n = len(buf)
        while n - pos >= 9:
            length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
            end = pos + 9 + length
            if end > n:
                break
            replacement = self._backend_frame(
                buf[pos + 3], buf[pos + 4], int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF,
                memoryview(buf)[pos + 9 : end],
            )
            if replacement is not None:
                if pos > out_start:
                    self._to_client(bytes(buf[out_start:pos]))
                if replacement:
                    self._to_client(replacement)
                out_start = end
            pos = end
        if pos > out_start:
            self._to_client(bytes(buf[out_start:pos]))
        del buf[:pos]

    def _backend_frame(self, ftype: int, flags: int, sid: int, payload: memoryview) -> bytes | None:
        if ftype == w.DATA:
            if flags & w.FLAG_END_STREAM:
                self._call_done(sid, None)  # ended without trailers
            st = self.streams.get(sid)
            if st is not None and not st.response_done:
                try:
                    st.resp_chunks.append(w.frame_payload(ftype, flags, payload))
                except ValueError:
                    pass
                if flags & w.FLAG_END_STREAM:
                    self._finish_response(st, None, "stream ended without trailers")
            return None
        if ftype in (w.HEADERS, w.CONTINUATION):
            if ftype == w.HEADERS:
                try:
                    fragment = w.frame_payload(ftype, flags, payload)
                except ValueError:
                    return None
                block = _HeaderBlock(sid, flags, fragment)
                if flags & w.FLAG_END_HEADERS:
                    self._backend_headers(block)
                else:
                    self._s2c_block = block
            else:
                pending = self._s2c_block
                if pending is not None and pending.sid == sid:
                    pending.fragments.append(bytes(payload))
                    if flags & w.FLAG_END_HEADERS:
                        self._s2c_block = None
                        self._backend_headers(pending)
            return None
        if ftype == w.WINDOW_UPDATE:
            if len(payload) != 4:
                return None
            inc = int.from_bytes(payload, "big") & 0x7FFFFFFF
            if sid == 0:
                self.server_conn_window += inc
                self._conn_window_event.set()
                if self._conn_debt:
                    take = min(self._conn_debt, inc)
                    self._conn_debt -= take
                    inc -= take
                    return w.window_update(0, inc) if inc else b""
                return None
            st = self.streams.get(sid)
            if st is not None:
                st.server_window += inc
                st.window_event.set()
            return None
        if ftype == w.SETTINGS and not flags & w.FLAG_ACK:
            settings = w.parse_settings(payload)
            if w.SETTINGS_INITIAL_WINDOW_SIZE in settings:
                new = settings[w.SETTINGS_INITIAL_WINDOW_SIZE]
                delta = new - self.server_initial_window
                self.server_initial_window = new
                for st in self.streams.values():
                    st.server_window += delta
                    st.window_event.set()
            if w.SETTINGS_MAX_FRAME_SIZE in settings:
                self.server_max_frame = settings[w.SETTINGS_MAX_FRAME_SIZE]
            if w.SETTINGS_HEADER_TABLE_SIZE in settings:
                self._c2s_hpack.set_max_table_size(settings[w.SETTINGS_HEADER_TABLE_SIZE])
            return None
        if ftype == w.RST_STREAM:
            self._call_done(sid, 1)
            st = self.streams.get(sid)
            if st is not None:
                st.cancelled = True
                st.window_event.set()
                self._finish_response(st, None, "stream reset by the runtime")
            return None
        return None

    def _backend_headers(self, block: _HeaderBlock) -> None:
        if self._hpack_broken:
            return
        try:
            headers = self._s2c_hpack.decode(b"".join(block.fragments))
        except Exception as exc:
            self._hpack_broken = True
            log.error("response_headers_undecodable", detail="interception disabled on this connection",
                      error=repr(exc))
            return
        if not block.flags & w.FLAG_END_STREAM:
            return
        status: int | None = None
        message = ""
        for name, value in headers:
            if name == "grpc-status":
                try:
                    status = int(value)
                except ValueError:
                    status = None
            elif name == "grpc-message":
                message = value
        self._call_done(block.sid, status)
        st = self.streams.get(block.sid)
        if st is not None:
            self._finish_response(st, status, unescape_grpc_message(message))

    def _call_done(self, sid: int, status: int | None) -> None:
        call = self.open_streams.pop(sid, None)
        if call is not None:
            self.handler.completed(call[0], status, time.monotonic() - call[1])

    def _finish_response(self, st: _Intercepted, status: int | None, message: str) -> None:
        if st.response_done:
            return
        st.response_done = True
        if not st.buffering and st.ctx is not None or st.cancelled:
            self.streams.pop(st.sid, None)
        body = b"".join(st.resp_chunks)
        st.resp_chunks = []
        if st.ctx is not None:
            try:
                self.handler.after(st.ctx, body, status, message)
            except Exception:
                log.exception("post_call_handling_failed")


def _declared_length(chunks: list[bytes]) -> int:
    """The length a gRPC message prefix announces (its first 5 bytes must be in `chunks`)."""
    head = b""
    for chunk in chunks:  # non-empty chunks: at most five are read
        head += chunk[: 5 - len(head)]
        if len(head) == 5:
            break
    return int.from_bytes(head[1:5], "big")


class _ClientProtocol(asyncio.Protocol):
    def __init__(self, handler: CallHandler, backend_path: str, registry: set[Relay]) -> None:
        self.relay = Relay(handler, backend_path, registry)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.relay.client_connected(transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        self.relay.from_client(data)

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
        self.relay.from_backend(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.close()

    def pause_writing(self) -> None:
        if self.relay.client is not None:
            self.relay.client.pause_reading()

    def resume_writing(self) -> None:
        if self.relay.client is not None:
            self.relay.client.resume_reading()


def client_protocol_factory(handler: CallHandler, backend_path: str,
                            registry: set[Relay]) -> Callable[[], asyncio.Protocol]:
    return lambda: _ClientProtocol(handler, backend_path, registry)
