"""The HTTP/2 relay's protocol core: one client connection relayed to one backend connection,
fed bytes and emitting bytes through the senders it is given (no sockets, no event loop).

Why a frame relay and not a gRPC server + client: a pass-through call is relayed as the very
bytes both ends wrote, so status codes, metadata, deadlines, streaming, unknown methods and the
old v1alpha2 API behave exactly as with containerd, and the cost is one parse of each frame
header plus one HPACK decode per header block. Only the request body of intercepted methods is
held back, handed to the handler's hooks, and re-sent (possibly changed). Responses are never
changed: the core copies the response of an intercepted call for the Post hooks as it passes.

Invariants kept here:
- Header blocks are forwarded in order and unchanged, so both HPACK dynamic tables stay in sync
  with the real endpoints; they are decoded read-only (proxy/hpack_view.py).
- Flow control: held bodies cost the client no window and the bodies the core sends cost it
  none either (proxy/flow_ledger.py); a body goes out as the backend's windows allow.
- A frame the core cannot make sense of costs one connection, never the process; a hostile
  client's frames cost bounded memory (held bodies, header blocks, frame sizes).
- PING is hop-by-hop: each end's pings are answered here, not carried to the other end (gRPC
  pings after every response to estimate the link's bandwidth-delay product; relaying them and
  their answers cost two wake-ups of all three processes per call). Once either end has sent
  GOAWAY, pings and their answers cross again: a graceful close pings to learn that the other
  end has seen its GOAWAY, which only that end can say.

proxy/relay.py runs it over asyncio transports; the tests drive it with hand-built frames.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from koordnode.cri.grpc_wire import Status, unescape_grpc_message
from koordnode.proxy import h2wire as w
from koordnode.proxy.call_handler import BeforeResult, CallHandler
from koordnode.proxy.flow_ledger import MAX_INTERCEPTED_BODY, FlowLedger
from koordnode.proxy.held_call import HeldCall, Phase
from koordnode.proxy.hpack_view import MAX_HEADER_BLOCK, HeaderBlock, HeaderDecoder

log = structlog.get_logger("koordnode.proxy")

Send = Callable[[bytes], None]
Spawn = Callable[[Coroutine[Any, Any, None]], None]
# A frame handler: (flags, stream id, payload, length) -> None to forward the frame as it came,
# bytes to send instead (b"" drops it).
FrameHandler = Callable[[int, int, memoryview, int], "bytes | None"]
# Indexed by frame type (one byte): other types are forwarded without a look.
DispatchTable = list[FrameHandler | None]


def _dispatch_table(handlers: dict[int, FrameHandler]) -> DispatchTable:
    return [handlers.get(ftype) for ftype in range(256)]


class RelayCore:
    """One relayed connection's protocol state.

    `to_client` sends bytes to the client; bytes for the backend are queued until
    `backend_connected` hands over its sender. `spawn` runs the handler's `before` (a coroutine)
    concurrently; `on_close` closes both connections (called once, by `close`).
    """

    def __init__(self, handler: CallHandler, *, to_client: Send, spawn: Spawn,
                 on_close: Callable[[], None]) -> None:
        self.handler = handler
        self._send_client = to_client
        self._backend_queue: list[bytes] = []
        self._send_backend: Send = self._backend_queue.append
        self._spawn = spawn
        self._on_close = on_close
        self.closed = False
        self.flow = FlowLedger()
        self._cbuf = bytearray()
        self._bbuf = bytearray()
        self._preface_done = False
        self._opaque = False  # not HTTP/2 prior knowledge: relay bytes blindly
        self._c2s_hpack = HeaderDecoder()
        self._s2c_hpack = HeaderDecoder()
        self._c2s_block: HeaderBlock | None = None
        self._s2c_block: HeaderBlock | None = None
        self._hpack_broken = False  # after a decode error we stop intercepting new streams
        self._pings_end_to_end = False  # set by the first GOAWAY from either end
        self.streams: dict[int, HeldCall] = {}  # intercepted calls
        self._sending: dict[int, HeldCall] = {}  # those whose body waits for the backend's window
        self._seen_streams_hwm = 0  # highest client stream id seen (new-stream detection)
        # Every call in flight, intercepted or not: stream id -> (method path, start time).
        self.open_streams: dict[int, tuple[str, float]] = {}
        # Intercepted calls whose answer is in the bytes being relayed: handed to the handler
        # once those bytes are on their way to the client (the client does not wait for it).
        self._answered: list[tuple[Any, bytes, int | None, str]] = []
        # While the bytes of one read are relayed, what goes to each end is held and sent as one
        # write at the end: a frame answered here (PING) splits the relayed bytes, and every
        # write is a syscall and a wake-up of the peer, kubelet's or the runtime's.
        self._corked = False
        self._held_client: list[bytes] = []
        self._held_backend: list[bytes] = []
        self._client_handlers = _dispatch_table({
            w.DATA: self._client_data, w.HEADERS: self._client_headers_frame,
            w.CONTINUATION: self._client_continuation, w.RST_STREAM: self._client_reset,
            w.SETTINGS: self._client_settings, w.PING: self._client_ping, w.GOAWAY: self._goaway,
        })
        self._backend_handlers = _dispatch_table({
            w.DATA: self._backend_data, w.HEADERS: self._backend_headers_frame,
            w.CONTINUATION: self._backend_continuation, w.RST_STREAM: self._backend_reset,
            w.SETTINGS: self._backend_settings, w.WINDOW_UPDATE: self._backend_window_update,
            w.PING: self._backend_ping, w.GOAWAY: self._goaway,
        })

    # ---- lifecycle ----------------------------------------------------------------------------

    def connection_made(self) -> None:
        self.handler.opened()

    def backend_connected(self, to_backend: Send) -> None:
        """The backend connection is up: what the client sent meanwhile goes first."""
        for chunk in self._backend_queue:
            to_backend(chunk)
        self._backend_queue.clear()
        self._send_backend = to_backend

    def close(self) -> None:
        if self.closed:
            return
        if self._corked:
            self._uncork()  # what was relayed before (a GOAWAY) still goes out
        self.closed = True
        for st in self.streams.values():
            st.cancelled = True
            st.outgoing = b""
        self._sending.clear()
        self._backend_queue.clear()
        self._on_close()
        self.handler.closed()

    @property
    def busy(self) -> bool:
        """True while a call on this connection is unfinished."""
        return bool(self.open_streams) or bool(self.streams)

    def go_away(self) -> None:
        """Tell the client to open no new streams here (graceful shutdown)."""
        if not self.closed and self._preface_done and not self._opaque:
            self._to_client(w.goaway(self._seen_streams_hwm, w.ERROR_NO_ERROR))

    def _to_backend(self, data: bytes) -> None:
        if data and not self.closed:
            if self._corked:
                self._held_backend.append(data)
            else:
                self._send_backend(data)

    def _to_client(self, data: bytes) -> None:
        if data and not self.closed:
            if self._corked:
                self._held_client.append(data)
            else:
                self._send_client(data)

    def _uncork(self) -> None:
        """The end of one read's relaying: what it held for each end goes out, one write each."""
        self._corked = False
        held_backend, held_client = self._held_backend, self._held_client
        if held_backend:
            self._held_backend = []
            self._to_backend(held_backend[0] if len(held_backend) == 1 else b"".join(held_backend))
        if held_client:
            self._held_client = []
            self._to_client(held_client[0] if len(held_client) == 1 else b"".join(held_client))

    # ---- byte streams -------------------------------------------------------------------------

    def client_data(self, data: bytes) -> None:
        if self._opaque:
            self._to_backend(data)
            return
        if self.closed:
            return
        self._cbuf += data
        self._corked = True
        try:
            start = 0 if self._preface_done else self._read_preface()
            if start is not None:
                self._walk(self._cbuf, start, self._client_handlers, self._to_backend, True)
        except Exception:  # a parsing bug must cost one connection, never the daemon
            log.exception("relay_failed_on_client_data", detail="closing the connection")
            self.close()
        finally:
            self._uncork()

    def backend_data(self, data: bytes) -> None:
        if self._opaque:
            self._to_client(data)
            return
        self._bbuf += data
        self._corked = True
        try:
            self._walk(self._bbuf, 0, self._backend_handlers, self._to_client, False)
        except Exception:
            log.exception("relay_failed_on_runtime_data", detail="closing the connection")
            self.close()
        finally:
            self._uncork()  # the answers are on their way before the handler looks at them
            self._hand_over_answers()

    def _hand_over_answers(self) -> None:
        """The handler's `after` for the calls answered in what was just relayed: still before
        the loop reads the client's next call, so their Post hooks are scheduled before that."""
        answered, self._answered = self._answered, []
        for ctx, body, status, message in answered:
            try:
                self.handler.after(ctx, body, status, message)
            except Exception:
                log.exception("post_call_handling_failed")

    def _read_preface(self) -> int | None:
        """Where the frames start once the client's preface is whole; None until then, or when
        the client does not speak HTTP/2 with prior knowledge (then bytes are relayed blindly)."""
        buf = self._cbuf
        if len(buf) < len(w.PREFACE):
            if not w.PREFACE.startswith(bytes(buf)):
                self._go_opaque()
            return None
        if bytes(buf[: len(w.PREFACE)]) != w.PREFACE:
            self._go_opaque()
            return None
        self._preface_done = True
        return len(w.PREFACE)

    def _walk(self, buf: bytearray, pos: int, handlers: DispatchTable, forward: Send,
              client: bool) -> None:
        """Hand each whole frame in `buf` from `pos` on to its handler and forward the bytes
        between replaced frames unchanged (the client's preface too); what is left is a partial
        frame, kept for the next bytes."""
        out_start = 0
        n = len(buf)
        # Frames the runtime did not agree to receive are refused; any 24-bit length may come back.
        limit = self.flow.max_frame if client else 0xFFFFFF
        data_type = w.DATA
        while n - pos >= 9:
            length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
            if length > limit:
                # Refused at the header, before buffering it: larger than the runtime announced.
                if pos > out_start:
                    forward(bytes(buf[out_start:pos]))
                self._connection_error(w.ERROR_FRAME_SIZE, f"frame of {length} bytes larger than "
                                       f"SETTINGS_MAX_FRAME_SIZE {self.flow.max_frame}")
                return
            end = pos + 9 + length
            if end > n:
                break
            ftype = buf[pos + 3]
            handle = handlers[ftype]
            if handle is not None:
                if ftype == data_type and client and pos > out_start and self.streams:
                    # A held call's frame may make us write to the backend (a refusal's
                    # RST_STREAM): what came before it must reach the backend first.
                    forward(bytes(buf[out_start:pos]))
                    out_start = pos
                sid = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
                replacement = handle(buf[pos + 4], sid, memoryview(buf)[pos + 9 : end], length)
                if replacement is not None:
                    if pos > out_start:
                        forward(bytes(buf[out_start:pos]))
                    if replacement:
                        forward(replacement)
                    out_start = end
            pos = end
        if pos > out_start:
            forward(bytes(buf[out_start:pos]))
        del buf[:pos]

    def _connection_error(self, code: int, reason: str) -> None:
        """A client frame HTTP/2 makes a connection error: GOAWAY with `code`, then close."""
        log.warning("client_http2_protocol_error", detail="closing the client connection", reason=reason,
                    error_code=code)
        self._cbuf.clear()
        self._to_client(w.goaway(self._seen_streams_hwm, code))
        self.close()

    def _go_opaque(self) -> None:
        log.warning("no_http2_preface", detail="relaying bytes unparsed")
        self._opaque = True
        data = bytes(self._cbuf)
        self._cbuf.clear()
        self._to_backend(data)

    # ---- client frames ------------------------------------------------------------------------

    def _client_data(self, flags: int, sid: int, payload: memoryview, length: int) -> bytes | None:
        st = self.streams.get(sid)
        if st is None or st.phase is not Phase.HOLDING:
            self.flow.conn_window -= length  # FlowLedger.forwarded, inlined: most DATA frames pass here
            return None
        try:
            chunk = w.frame_payload(w.DATA, flags, payload)
        except ValueError:
            # Malformed padding: stop holding this call and let the runtime answer the
            # frame itself, so the client gets exactly the runtime's protocol error.
            self._forget(st)
            self.flow.forwarded(length)
            return None
        st.add_request_chunk(chunk)
        st.held += length
        # Give the client back the window it spent: the backend won't, it never sees it.
        updates = self.flow.hold(sid, length)
        if updates:
            self._to_client(updates)
        if st.req_bytes > MAX_INTERCEPTED_BODY or (st.declared or 0) > MAX_INTERCEPTED_BODY:
            self._refuse_oversized(st, max(st.declared or 0, st.req_bytes - 5))
        elif flags & w.FLAG_END_STREAM:
            st.phase = Phase.HOOKS
            self._spawn(self._run_hooks(st))
        return b""

    def _client_headers_frame(self, flags: int, sid: int, payload: memoryview, length: int) -> None:
        try:
            fragment = w.frame_payload(w.HEADERS, flags, payload)
        except ValueError:
            return None  # the runtime answers it (its protocol error); we decode nothing
        block = HeaderBlock(sid, flags, fragment)
        if flags & w.FLAG_END_HEADERS:
            self._request_headers(block)
        else:
            self._c2s_block = block
        return None

    def _client_continuation(self, flags: int, sid: int, payload: memoryview, length: int) -> None:
        pending = self._c2s_block
        if pending is None or pending.sid != sid:
            return None
        if not pending.add(payload):
            self._c2s_block = None
            self._give_up_decoding(f"request header block larger than {MAX_HEADER_BLOCK} bytes")
        elif flags & w.FLAG_END_HEADERS:
            self._c2s_block = None
            self._request_headers(pending)
        return None

    def _client_reset(self, flags: int, sid: int, payload: memoryview, length: int) -> None:
        self._call_done(sid, Status.CANCELLED)
        st = self.streams.get(sid)
        if st is not None:
            self._forget(st)
        return None

    # ---- PING and GOAWAY (both ends) -----------------------------------------------------------

    def _client_ping(self, flags: int, sid: int, payload: memoryview, length: int) -> bytes | None:
        return self._ping(flags, sid, payload, length, self._to_client)

    def _backend_ping(self, flags: int, sid: int, payload: memoryview, length: int) -> bytes | None:
        return self._ping(flags, sid, payload, length, self._to_backend)

    def _ping(self, flags: int, sid: int, payload: memoryview, length: int, answer: Send) -> bytes | None:
        """A ping is answered to its sender and not relayed (b""); an answer, which can only
        be to a ping never relayed, is dropped. Relayed as it came: malformed (the other end
        judges it, as without koordnode), or once the connection is closing."""
        if self._pings_end_to_end or sid != 0 or length != 8:
            return None
        if not flags & w.FLAG_ACK:
            answer(w.frame(w.PING, w.FLAG_ACK, 0, bytes(payload)))
        return b""

    def _goaway(self, flags: int, sid: int, payload: memoryview, length: int) -> None:
        self._pings_end_to_end = True
        return None

    def _client_settings(self, flags: int, sid: int, payload: memoryview, length: int) -> None:
        if not flags & w.FLAG_ACK:
            table = w.parse_settings(payload).get(w.SETTINGS_HEADER_TABLE_SIZE)
            if table is not None:
                self._s2c_hpack.set_max_table_size(table)
        return None

    def _request_headers(self, block: HeaderBlock) -> None:
        if self._hpack_broken:
            return
        fragments = block.fragments  # most blocks are one HEADERS frame: no join
        try:
            headers = self._c2s_hpack.decode(fragments[0] if len(fragments) == 1 else b"".join(fragments))
        except Exception as exc:  # any HPACK failure: stay a blind relay for new streams
            self._decoding_failed("request_headers_undecodable", exc)
            return
        sid = block.sid
        if sid <= self._seen_streams_hwm:
            return  # trailers of an existing stream
        self._seen_streams_hwm = sid
        for name, value in headers:
            if name == ":path":
                path = value
                break
        else:
            return
        self.open_streams[sid] = (path, time.monotonic())
        if block.flags & w.FLAG_END_STREAM:
            return  # no body to intercept
        spec = self.handler.lookup(path)
        if spec is not None:
            self.streams[sid] = HeldCall(sid, spec, self.flow.initial_window)

    def _decoding_failed(self, event: str, exc: Exception) -> None:
        self._hpack_broken = True
        log.error(event, detail="interception disabled on this connection", error=repr(exc))

    def _give_up_decoding(self, reason: str) -> None:
        self._hpack_broken = True
        log.warning("interception_disabled", detail="relaying the connection unchanged", reason=reason)

    # ---- held calls ---------------------------------------------------------------------------

    def _forget(self, st: HeldCall) -> None:
        """Stop tracking a held call: what it holds is dropped, later frames pass through."""
        self.streams.pop(st.sid, None)
        self._sending.pop(st.sid, None)
        st.cancelled = st.cancelled or st.phase is not Phase.SENT
        st.req_chunks = []
        st.outgoing = b""
        self._release(st)

    def _release(self, st: HeldCall) -> None:
        """A held body left memory: return the window withheld while over the budget."""
        if st.held:
            held, st.held = st.held, 0
            updates = self.flow.release(held, self.streams)
            if updates:
                self._to_client(updates)

    def _answer_client(self, st: HeldCall, code: int, message: str, trailer: bytes = b"") -> None:
        """End a held call without the runtime: reset its stream there, answer the client."""
        self._to_backend(w.rst_stream(st.sid))
        self._to_client(w.grpc_error_trailers(st.sid, code, message) + trailer)
        self._call_done(st.sid, code)

    def _refuse_oversized(self, st: HeldCall, size: int) -> None:
        """Answer as containerd does, as soon as the gRPC length prefix is known: a trailers-only
        RESOURCE_EXHAUSTED with grpc-go's message, then RST_STREAM(NO_ERROR)."""
        self._forget(st)
        self._answer_client(st, Status.RESOURCE_EXHAUSTED,
                            f"grpc: received message larger than max ({size} vs. {MAX_INTERCEPTED_BODY})",
                            w.rst_stream(st.sid, w.ERROR_NO_ERROR))
        log.warning("oversized_request_refused", method=getattr(st.spec, "name", "?"),
                    size=size, limit=MAX_INTERCEPTED_BODY)

    async def _run_hooks(self, st: HeldCall) -> None:
        body = st.take_request()
        try:
            result = await self.handler.before(st.spec, body)
        except Exception as exc:  # the handler is fail-open itself; this is a last resort
            log.exception("interception_failed", detail="forwarding the original request", error=repr(exc))
            result = BeforeResult(body=body)
        try:
            self._after_hooks(st, result)
        except Exception:
            log.exception("relay_failed_after_hooks", detail="closing the connection")
            self.close()

    def _after_hooks(self, st: HeldCall, result: BeforeResult) -> None:
        st.ctx = result.ctx
        if st.cancelled or self.closed or st.response_done:
            self._forget(st)
            return
        if result.fail is not None:
            code, message = result.fail
            st.phase = Phase.SENT
            self._answer_client(st, code, message)
            self._forget(st)
            self.handler.after(st.ctx, b"", code, message)
            return
        st.phase = Phase.SENDING
        st.outgoing = result.body
        self._sending[st.sid] = st
        self._pump(st)

    def _pump(self, st: HeldCall) -> None:
        """Send as much of a held call's body as the backend's windows allow; the rest goes
        when its WINDOW_UPDATE or SETTINGS come."""
        body = st.outgoing
        flow = self.flow
        while True:
            remaining = len(body) - st.out_pos
            size = min(remaining, flow.max_frame, flow.conn_window, st.server_window)
            if remaining and size <= 0:
                return
            size = max(size, 0)
            end = st.out_pos + size
            last = end == len(body)
            self._to_backend(w.frame(w.DATA, w.FLAG_END_STREAM if last else 0, st.sid, body[st.out_pos:end]))
            st.out_pos = end
            st.server_window -= size
            flow.sent(size)
            if last:
                break
        st.phase = Phase.SENT
        st.outgoing = b""
        self._sending.pop(st.sid, None)
        self._release(st)
        if st.response_done:
            self._forget(st)

    def _pump_all(self) -> None:
        for st in list(self._sending.values()):
            self._pump(st)

    # ---- backend frames -----------------------------------------------------------------------

    def _backend_data(self, flags: int, sid: int, payload: memoryview, length: int) -> None:
        if flags & w.FLAG_END_STREAM:
            self._call_done(sid, None)  # ended without trailers
        st = self.streams.get(sid)
        if st is not None and not st.response_done:
            try:
                st.resp_chunks.append(w.frame_payload(w.DATA, flags, payload))
            except ValueError:
                pass
            if flags & w.FLAG_END_STREAM:
                self._finish_response(st, None, "stream ended without trailers")
        return None

    def _backend_headers_frame(self, flags: int, sid: int, payload: memoryview, length: int) -> None:
        try:
            fragment = w.frame_payload(w.HEADERS, flags, payload)
        except ValueError:
            return None
        block = HeaderBlock(sid, flags, fragment)
        if flags & w.FLAG_END_HEADERS:
            self._response_headers(block)
        else:
            self._s2c_block = block
        return None

    def _backend_continuation(self, flags: int, sid: int, payload: memoryview, length: int) -> None:
        pending = self._s2c_block
        if pending is None or pending.sid != sid:
            return None
        if not pending.add(payload):
            self._s2c_block = None
            self._give_up_decoding(f"response header block larger than {MAX_HEADER_BLOCK} bytes")
        elif flags & w.FLAG_END_HEADERS:
            self._s2c_block = None
            self._response_headers(pending)
        return None

    def _backend_window_update(self, flags: int, sid: int, payload: memoryview, length: int) -> bytes | None:
        if length != 4:
            return None
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if sid == 0:
            if not self.flow.debt and not self._sending:  # the usual case: nothing to adjust
                self.flow.conn_window += increment
                return None
            passed = self.flow.backend_conn_update(increment)
            if self._sending:
                self._pump_all()
            if passed == increment:
                return None
            # Part of it returns window for bodies we sent: the client never spent it.
            return w.window_update(0, passed) if passed else b""
        st = self.streams.get(sid)
        if st is not None:
            st.server_window += increment
            if st.phase is Phase.SENDING:
                self._pump(st)
        return None

    def _backend_settings(self, flags: int, sid: int, payload: memoryview, length: int) -> None:
        if flags & w.FLAG_ACK:
            return None
        settings = w.parse_settings(payload)
        delta = self.flow.backend_settings(settings)
        if delta:
            for st in self.streams.values():
                st.server_window += delta
        if w.SETTINGS_HEADER_TABLE_SIZE in settings:
            self._c2s_hpack.set_max_table_size(settings[w.SETTINGS_HEADER_TABLE_SIZE])
        if self._sending:
            self._pump_all()
        return None

    def _backend_reset(self, flags: int, sid: int, payload: memoryview, length: int) -> None:
        self._call_done(sid, Status.CANCELLED)
        st = self.streams.get(sid)
        if st is not None:
            st.cancelled = True
            self._finish_response(st, None, "stream reset by the runtime")
        return None

    def _response_headers(self, block: HeaderBlock) -> None:
        if self._hpack_broken:
            return
        fragments = block.fragments
        try:
            headers = self._s2c_hpack.decode(fragments[0] if len(fragments) == 1 else b"".join(fragments))
        except Exception as exc:
            self._decoding_failed("response_headers_undecodable", exc)
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

    def _finish_response(self, st: HeldCall, status: int | None, message: str) -> None:
        if st.response_done:
            return
        st.response_done = True
        # A call whose body is still held, in the hooks or going out is forgotten when that ends.
        if st.cancelled or st.phase is Phase.SENT:
            self._forget(st)
        body = st.take_response()
        if st.ctx is not None:
            self._answered.append((st.ctx, body, status, message))
