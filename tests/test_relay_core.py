"""The relay's protocol core (koordnode/proxy/relay_core.py) driven with hand-built frames: no
sockets, no event loop. The handler's `before` coroutines are run by hand, so each test decides
what happens between a request being held and its hooks returning."""

from __future__ import annotations

import ast
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import hpack
import pytest
from structlog.testing import capture_logs

from koordnode.cri.grpc_wire import Status, encode_grpc_message
from koordnode.proxy import flow_ledger
from koordnode.proxy import h2wire as w
from koordnode.proxy.call_handler import BeforeResult
from koordnode.proxy.hpack_view import MAX_HEADER_BLOCK
from koordnode.proxy.relay_core import RelayCore
from support.h2raw import RS, parse_frames, request_headers

CREATE = RS + "CreateContainer"
START = w.PREFACE + w.frame(w.SETTINGS, 0, 0)


class Handler:
    """Holds CreateContainer; `before` answers with `result` (or the body unchanged)."""

    def __init__(self) -> None:
        self.result: BeforeResult | None = None
        self.raise_in_before = False
        self.held_bodies: list[bytes] = []
        self.after_calls: list[tuple[Any, bytes, int | None, str]] = []
        self.completed_calls: list[tuple[str, int | None]] = []
        self.open = 0

    def lookup(self, path: str) -> Any | None:
        return "spec" if path == CREATE else None

    async def before(self, spec: Any, body: bytes) -> BeforeResult:
        self.held_bodies.append(body)
        if self.raise_in_before:
            raise RuntimeError("hook bug")
        return self.result or BeforeResult(body=body, ctx="ctx")

    def after(self, ctx: Any, body: bytes, grpc_status: int | None, grpc_message: str) -> None:
        self.after_calls.append((ctx, body, grpc_status, grpc_message))

    def completed(self, path: str, grpc_status: int | None, seconds: float) -> None:
        self.completed_calls.append((path, grpc_status))

    def opened(self) -> None:
        self.open += 1

    def closed(self) -> None:
        self.open -= 1


class Wire:
    """A RelayCore with both sides recorded."""

    def __init__(self, handler: Handler | None = None) -> None:
        self.handler = handler or Handler()
        self.to_client = bytearray()
        self.to_backend = bytearray()
        self.hooks: list[Coroutine[Any, Any, None]] = []
        self.closes = 0
        self.core = RelayCore(self.handler, to_client=self.to_client.extend, spawn=self.hooks.append,
                              on_close=self._closed)
        self.core.connection_made()
        self.core.backend_connected(self.to_backend.extend)

    def _closed(self) -> None:
        self.closes += 1

    def client(self, *data: bytes) -> None:
        self.core.client_data(b"".join(data))

    def backend(self, *data: bytes) -> None:
        self.core.backend_data(b"".join(data))

    def run_hooks(self) -> None:
        """Let every spawned `before` finish (the test handler never waits)."""
        hooks = list(self.hooks)
        self.hooks.clear()
        for coro in hooks:
            with pytest.raises(StopIteration):
                coro.send(None)

    def client_frames(self) -> list[tuple[int, int, int, bytes]]:
        frames = parse_frames(bytes(self.to_client))
        self.to_client.clear()
        return frames

    def backend_frames(self) -> list[tuple[int, int, int, bytes]]:
        data = bytes(self.to_backend)
        if data.startswith(w.PREFACE):
            data = data[len(w.PREFACE):]
        frames = parse_frames(data)
        self.to_backend.clear()
        return frames

    def open_held_call(self, sid: int, body: bytes, end: bool = True) -> None:
        self.client(w.frame(w.HEADERS, w.FLAG_END_HEADERS, sid, request_headers(CREATE)),
                    w.frame(w.DATA, w.FLAG_END_STREAM if end else 0, sid, body))


def window_updates(frames: list[tuple[int, int, int, bytes]]) -> list[tuple[int, int]]:
    return [(sid, int.from_bytes(p, "big")) for t, _f, sid, p in frames if t == w.WINDOW_UPDATE]


def trailers(sid: int, status: int, message: str = "", encoder: hpack.Encoder | None = None) -> bytes:
    block = (encoder or hpack.Encoder()).encode([("grpc-status", str(status)), ("grpc-message", message)])
    return w.frame(w.HEADERS, w.FLAG_END_HEADERS | w.FLAG_END_STREAM, sid, block)


def data_payloads(frames: list[tuple[int, int, int, bytes]], sid: int) -> list[tuple[bytes, bool]]:
    return [(p, bool(f & w.FLAG_END_STREAM)) for t, f, s, p in frames if t == w.DATA and s == sid]


def decoded_trailers(frames: list[tuple[int, int, int, bytes]], sid: int) -> dict[str, str]:
    [block] = [p for t, _f, s, p in frames if t == w.HEADERS and s == sid]
    return dict(hpack.Decoder().decode(block, raw=False))


# ---- pass-through ------------------------------------------------------------------------------


def test_pass_through_calls_are_relayed_byte_for_byte_and_reported():
    wire = Wire()
    request = w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, request_headers(RS + "Version")) + \
        w.frame(w.DATA, w.FLAG_END_STREAM, 1, encode_grpc_message(b"v1"))
    wire.client(START, request[:20])  # a frame split across reads is kept until whole
    wire.client(request[20:])
    assert bytes(wire.to_backend) == START + request
    response = w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, hpack.Encoder().encode([(":status", "200")])) + \
        w.frame(w.DATA, 0, 1, encode_grpc_message(b"answer")) + trailers(1, 0)
    wire.backend(response)
    assert bytes(wire.to_client) == response
    assert wire.handler.completed_calls == [(RS + "Version", 0)]
    assert wire.hooks == [] and not wire.core.busy


def test_what_the_client_sends_before_the_backend_is_up_goes_first_and_in_order():
    handler = Handler()
    sent = bytearray()
    core = RelayCore(handler, to_client=lambda data: None, spawn=lambda coro: None, on_close=lambda: None)
    request = w.frame(w.HEADERS, w.FLAG_END_HEADERS | w.FLAG_END_STREAM, 1, request_headers(RS + "Version"))
    core.client_data(START)
    core.client_data(request)
    assert sent == b""
    core.backend_connected(sent.extend)
    update = w.window_update(0, 1000)
    core.client_data(update)
    assert bytes(sent) == START + request + update


def test_pings_are_answered_to_their_sender_and_not_relayed_until_a_goaway():
    """gRPC pings after each response (its bandwidth-delay estimate): answered here, they no
    longer wake the other end, nor the proxy again for the answer."""
    wire = Wire()
    wire.client(START)
    wire.backend(w.frame(w.SETTINGS, 0, 0))
    wire.backend_frames(), wire.client_frames()
    bdp = bytes([2, 4, 16, 16, 9, 14, 7, 7])
    update = w.window_update(0, 100)
    wire.client(update, w.frame(w.PING, 0, 0, bdp))
    assert wire.backend_frames() == [(w.WINDOW_UPDATE, 0, 0, (100).to_bytes(4, "big"))]  # the update goes on
    assert wire.client_frames() == [(w.PING, w.FLAG_ACK, 0, bdp)]
    wire.backend(w.frame(w.PING, 0, 0, b"12345678"))
    assert wire.backend_frames() == [(w.PING, w.FLAG_ACK, 0, b"12345678")] and wire.client_frames() == []
    # An answer can only be to a ping never relayed: dropped, either way.
    wire.backend(w.frame(w.PING, w.FLAG_ACK, 0, bdp))
    wire.client(w.frame(w.PING, w.FLAG_ACK, 0, b"12345678"))
    assert wire.client_frames() == [] and wire.backend_frames() == []
    # Malformed: relayed as it came, the other end judges it as without koordnode.
    odd = w.frame(w.PING, 0, 0, b"1234567")
    wire.client(odd)
    assert bytes(wire.to_backend) == odd and wire.client_frames() == []
    wire.backend_frames()
    # The runtime closes gracefully: its GOAWAY, then a ping only the client can answer.
    goaway = w.goaway(1, w.ERROR_NO_ERROR)
    wire.backend(goaway, w.frame(w.PING, 0, 0, b"goaway!!"))
    assert bytes(wire.to_client) == goaway + w.frame(w.PING, 0, 0, b"goaway!!")
    assert wire.backend_frames() == []
    wire.client_frames()
    wire.client(w.frame(w.PING, w.FLAG_ACK, 0, b"goaway!!"))
    assert wire.backend_frames() == [(w.PING, w.FLAG_ACK, 0, b"goaway!!")]


def test_what_one_read_relays_goes_to_each_end_as_one_write():
    """The runtime's window update, its ping and the answer arrive in one read: the client gets
    the update and the answer in one write (one wake-up), the runtime its ping's answer."""
    wire = Wire()
    client_writes: list[bytes] = []
    backend_writes: list[bytes] = []
    wire.core._send_client = client_writes.append
    wire.core.backend_connected(backend_writes.append)
    wire.client(START, w.frame(w.HEADERS, w.FLAG_END_HEADERS | w.FLAG_END_STREAM, 1, request_headers(RS + "Version")))
    assert len(backend_writes) == 1
    update, ping = w.window_update(0, 7), w.frame(w.PING, 0, 0, bytes(8))
    answer = w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, hpack.Encoder().encode([(":status", "200")])) + \
        w.frame(w.DATA, 0, 1, encode_grpc_message(b"v")) + trailers(1, 0)
    wire.backend(update, ping, answer)
    assert client_writes == [update + answer]
    assert backend_writes[1:] == [w.frame(w.PING, w.FLAG_ACK, 0, bytes(8))]
    assert wire.handler.completed_calls == [(RS + "Version", 0)]
    # A connection error in the middle of a read: what came before it, then the GOAWAY.
    client_writes.clear()
    wire.client(w.window_update(0, 5), w.frame(w.PING, 0, 0, bytes(8)), b"\xff\xff\xff" + bytes(6))
    assert len(client_writes) == 1
    assert [t for t, *_ in parse_frames(client_writes[0])] == [w.PING, w.GOAWAY] and wire.closes == 1


def test_bytes_that_are_not_http2_are_relayed_unparsed_both_ways():
    wire = Wire()
    with capture_logs() as logs:
        wire.client(b"GET / HTTP/1.1\r\n\r\n")
    wire.backend(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    assert bytes(wire.to_backend) == b"GET / HTTP/1.1\r\n\r\n"
    assert bytes(wire.to_client) == b"HTTP/1.1 400 Bad Request\r\n\r\n"
    assert [e["event"] for e in logs] == ["no_http2_preface"]
    wire.core.go_away()  # nothing HTTP/2 to say on such a connection
    assert bytes(wire.to_client) == b"HTTP/1.1 400 Bad Request\r\n\r\n"


# ---- held calls and window debt ----------------------------------------------------------------


def test_held_body_returns_the_clients_window_and_sends_the_hooks_body():
    wire = Wire()
    body = encode_grpc_message(b"x" * 100)
    wire.client(START)
    wire.open_held_call(1, body)
    # The backend saw the headers, not the body; the client got its window back.
    assert [f[0] for f in wire.backend_frames()] == [w.SETTINGS, w.HEADERS]
    assert window_updates(wire.client_frames()) == [(0, len(body)), (1, len(body))]
    changed = encode_grpc_message(b"y" * 300)
    wire.handler.result = BeforeResult(body=changed, ctx="ctx")
    wire.run_hooks()
    assert wire.handler.held_bodies == [body]
    assert data_payloads(wire.backend_frames(), 1) == [(changed, True)]
    # The response is copied for the Post hooks as it passes, unchanged.
    response = w.frame(w.DATA, 0, 1, encode_grpc_message(b"resp")) + trailers(1, 0)
    wire.backend(response)
    assert bytes(wire.to_client) == response
    assert wire.handler.after_calls == [("ctx", encode_grpc_message(b"resp"), 0, "")]
    assert not wire.core.busy


def test_window_the_backend_returns_for_our_body_is_withheld_from_the_client():
    wire = Wire()
    wire.client(START)
    wire.open_held_call(1, encode_grpc_message(b"a"))
    changed = encode_grpc_message(b"b" * 995)  # 1,000 bytes sent that the client never spent
    wire.handler.result = BeforeResult(body=changed, ctx="ctx")
    wire.run_hooks()
    wire.client_frames()
    wire.backend(w.window_update(0, 600))
    assert wire.client_frames() == []  # all of it was debt
    wire.backend(w.window_update(0, 500))
    assert window_updates(wire.client_frames()) == [(0, 100)]  # 400 debt left, 100 passes
    wire.backend(w.window_update(0, 700))
    assert window_updates(wire.client_frames()) == [(0, 700)]  # no debt: relayed as is
    wire.backend(w.window_update(1, 50))  # stream-level updates are never withheld
    assert window_updates(wire.client_frames()) == [(1, 50)]


def test_body_goes_out_as_the_backends_stream_and_connection_windows_allow():
    wire = Wire()
    wire.client(START)
    wire.backend(w.frame(w.SETTINGS, 0, 0, (w.SETTINGS_INITIAL_WINDOW_SIZE).to_bytes(2, "big")
                         + (10).to_bytes(4, "big")))
    wire.open_held_call(1, encode_grpc_message(b"a"))
    body = bytes(range(25))
    wire.handler.result = BeforeResult(body=body, ctx="ctx")
    wire.run_hooks()
    assert data_payloads(wire.backend_frames(), 1) == [(body[:10], False)]
    assert wire.core.busy
    wire.backend(w.window_update(1, 4))
    assert data_payloads(wire.backend_frames(), 1) == [(body[10:14], False)]
    # A larger initial window grows every open stream's window: the rest goes.
    wire.backend(w.frame(w.SETTINGS, 0, 0, (w.SETTINGS_INITIAL_WINDOW_SIZE).to_bytes(2, "big")
                         + (100).to_bytes(4, "big")))
    assert data_payloads(wire.backend_frames(), 1) == [(body[14:], True)]
    # The connection window: a body past 65,535 bytes waits for a connection WINDOW_UPDATE.
    wire.open_held_call(3, encode_grpc_message(b"a"))
    big = bytes(70_000)
    wire.backend(w.window_update(3, 100_000))
    wire.handler.result = BeforeResult(body=big, ctx="ctx")
    wire.run_hooks()
    sent = data_payloads(wire.backend_frames(), 3)
    assert sum(len(p) for p, _ in sent) == w.DEFAULT_WINDOW - 25
    assert all(len(p) <= w.DEFAULT_MAX_FRAME for p, _ in sent) and not any(end for _, end in sent)
    wire.client_frames()
    wire.backend(w.window_update(0, 10_000))
    rest = data_payloads(wire.backend_frames(), 3)
    assert b"".join(p for p, _ in sent + rest) == big and rest[-1][1]
    assert wire.client_frames() == []  # that update returned our bytes: not the client's


def test_held_bytes_past_the_connection_budget_stop_returning_window(monkeypatch):
    monkeypatch.setattr(flow_ledger, "MAX_HELD_PER_CONNECTION", 100)
    wire = Wire()
    wire.client(START)
    wire.client(w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, request_headers(CREATE)),
                w.frame(w.DATA, 0, 1, b"\x00\x00\x00\x00\x90" + bytes(75)))
    assert window_updates(wire.client_frames()) == [(0, 80), (1, 80)]
    wire.client(w.frame(w.DATA, 0, 1, bytes(30)), w.frame(w.DATA, 0, 1, bytes(20)))
    assert wire.client_frames() == []  # 130 held > 100: the client waits
    wire.client(w.frame(w.HEADERS, w.FLAG_END_HEADERS, 3, request_headers(CREATE)),
                w.frame(w.DATA, 0, 3, bytes(7)))
    assert wire.client_frames() == []
    # The client cancels call 1: its 130 bytes leave, the withheld window comes back, and
    # only the still-open stream 3 gets a stream-level update.
    wire.client(w.rst_stream(1))
    assert window_updates(wire.client_frames()) == [(0, 57), (3, 7)]
    assert wire.handler.completed_calls == [(CREATE, Status.CANCELLED)]
    assert wire.hooks == []


# ---- refusals and failures ---------------------------------------------------------------------


def test_a_declared_body_over_the_limit_is_refused_as_containerd_does():
    wire = Wire()
    wire.client(START)
    prefix = b"\x00" + (flow_ledger.MAX_INTERCEPTED_BODY + 1).to_bytes(4, "big")
    with capture_logs() as logs:
        wire.open_held_call(1, prefix + bytes(10), end=False)
    backend = wire.backend_frames()
    assert backend[-1] == (w.RST_STREAM, 0, 1, w.ERROR_CANCEL.to_bytes(4, "big"))
    client = wire.client_frames()
    assert decoded_trailers(client, 1)["grpc-status"] == str(Status.RESOURCE_EXHAUSTED)
    assert client[-1] == (w.RST_STREAM, 0, 1, bytes(4))
    assert [e["event"] for e in logs] == ["oversized_request_refused"]
    assert not wire.core.busy and wire.hooks == []
    # Later frames of that stream are the runtime's to judge.
    more = w.frame(w.DATA, w.FLAG_END_STREAM, 1, bytes(5))
    wire.client(more)
    assert bytes(wire.to_backend) == more


def test_a_policy_failure_answers_the_client_and_resets_the_backend_stream():
    wire = Wire()
    wire.client(START)
    wire.open_held_call(1, encode_grpc_message(b"a"))
    wire.handler.result = BeforeResult(body=b"", ctx="ctx", fail=(Status.FAILED_PRECONDITION, "no 100%"))
    wire.client_frames()
    wire.run_hooks()
    assert wire.backend_frames()[-1] == (w.RST_STREAM, 0, 1, w.ERROR_CANCEL.to_bytes(4, "big"))
    assert decoded_trailers(wire.client_frames(), 1) == {
        ":status": "200", "content-type": "application/grpc",
        "grpc-status": str(Status.FAILED_PRECONDITION), "grpc-message": "no 100%25"}
    assert wire.handler.after_calls == [("ctx", b"", Status.FAILED_PRECONDITION, "no 100%")]
    # The runtime will say nothing more of that stream: the call is over here too.
    assert wire.handler.completed_calls == [(CREATE, Status.FAILED_PRECONDITION)]
    assert not wire.core.busy


def test_a_failing_before_forwards_the_original_request():
    wire = Wire()
    wire.handler.raise_in_before = True
    wire.client(START)
    body = encode_grpc_message(b"original")
    wire.open_held_call(1, body)
    wire.backend_frames()
    with capture_logs() as logs:
        wire.run_hooks()
    assert data_payloads(wire.backend_frames(), 1) == [(body, True)]
    assert [e["event"] for e in logs] == ["interception_failed"]


def test_malformed_padding_on_a_held_call_lets_the_runtime_answer_it():
    wire = Wire()
    wire.client(START)
    wire.client(w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, request_headers(CREATE)))
    wire.backend_frames()
    bad = w.frame(w.DATA, w.FLAG_PADDED | w.FLAG_END_STREAM, 1, b"\x09abc")  # pad 9 > 3 bytes
    wire.client(bad)
    assert bytes(wire.to_backend) == bad
    assert wire.hooks == [] and 1 not in wire.core.streams


def test_a_handler_bug_costs_the_connection_not_the_caller():
    wire = Wire()
    wire.handler.lookup = lambda path: 1 / 0  # type: ignore[method-assign]
    with capture_logs() as logs:
        wire.client(START, w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, request_headers(CREATE)))
    assert wire.core.closed and wire.closes == 1 and wire.handler.open == 0
    assert [e["event"] for e in logs] == ["relay_failed_on_client_data"]
    wire.client(w.frame(w.PING, 0, 0, bytes(8)))  # nothing goes anywhere after close
    wire.core.close()
    assert wire.closes == 1


# ---- RST_STREAM ------------------------------------------------------------------------------


def test_client_reset_during_the_hooks_sends_nothing_afterwards():
    wire = Wire()
    wire.client(START)
    wire.open_held_call(1, encode_grpc_message(b"a"))
    wire.client(w.rst_stream(1))
    wire.backend_frames()
    wire.run_hooks()  # the hooks still finish; their result goes nowhere
    assert wire.backend_frames() == []
    assert wire.handler.after_calls == [] and not wire.core.busy


def test_backend_reset_while_sending_stops_the_body_and_tells_the_post_hooks():
    wire = Wire()
    wire.client(START)
    wire.backend(w.frame(w.SETTINGS, 0, 0, (w.SETTINGS_INITIAL_WINDOW_SIZE).to_bytes(2, "big")
                         + (4).to_bytes(4, "big")))
    wire.open_held_call(1, encode_grpc_message(b"a"))
    wire.handler.result = BeforeResult(body=bytes(20), ctx="ctx")
    wire.run_hooks()
    assert data_payloads(wire.backend_frames(), 1) == [(bytes(4), False)]
    reset = w.rst_stream(1, w.ERROR_PROTOCOL)
    wire.backend(reset)
    assert bytes(wire.to_client).endswith(reset)  # relayed to the client as it came
    assert wire.handler.after_calls == [("ctx", b"", None, "stream reset by the runtime")]
    assert wire.handler.completed_calls == [(CREATE, Status.CANCELLED)]
    wire.backend(w.window_update(1, 100), w.window_update(0, 100))
    assert data_payloads(wire.backend_frames(), 1) == []
    assert not wire.core.busy


def test_a_response_before_the_body_is_complete_waits_for_the_body():
    # Trailers from the runtime while the request is still held (its deadline passed).
    wire = Wire()
    wire.client(START)
    wire.open_held_call(1, encode_grpc_message(b"a")[:3], end=False)
    wire.backend(trailers(1, Status.DEADLINE_EXCEEDED))
    assert wire.handler.completed_calls == [(CREATE, Status.DEADLINE_EXCEEDED)]
    wire.client(w.frame(w.DATA, w.FLAG_END_STREAM, 1, encode_grpc_message(b"a")[3:]))
    wire.backend_frames()
    wire.run_hooks()
    assert wire.backend_frames() == []  # answered already: the body is not sent
    assert wire.handler.after_calls == [] and not wire.core.busy


# ---- GOAWAY ----------------------------------------------------------------------------------


def test_go_away_names_the_last_stream_seen():
    wire = Wire()
    wire.core.go_away()
    assert wire.to_client == b""  # no HTTP/2 yet
    wire.client(START, w.frame(w.HEADERS, w.FLAG_END_HEADERS | w.FLAG_END_STREAM, 5, request_headers(RS + "Version")))
    wire.core.go_away()
    assert wire.client_frames() == [(w.GOAWAY, 0, 0, (5).to_bytes(4, "big") + bytes(4))]
    assert not wire.core.closed  # graceful: calls in flight finish


def test_a_frame_over_the_runtimes_max_size_is_a_connection_error():
    wire = Wire()
    before = w.frame(w.HEADERS, w.FLAG_END_HEADERS | w.FLAG_END_STREAM, 3, request_headers(RS + "Version"))
    huge_header = (w.DEFAULT_MAX_FRAME + 1).to_bytes(3, "big") + bytes([w.DATA, 0]) + (3).to_bytes(4, "big")
    with capture_logs() as logs:
        wire.client(START, before, huge_header)
    assert bytes(wire.to_backend) == START + before  # what came before it still went
    assert wire.client_frames() == [(w.GOAWAY, 0, 0, (3).to_bytes(4, "big")
                                     + w.ERROR_FRAME_SIZE.to_bytes(4, "big"))]
    assert wire.core.closed and [e["event"] for e in logs] == ["client_http2_protocol_error"]
    # The backend may announce larger frames: then they pass.
    wire = Wire()
    wire.backend(w.frame(w.SETTINGS, 0, 0, (w.SETTINGS_MAX_FRAME_SIZE).to_bytes(2, "big")
                         + (1 << 20).to_bytes(4, "big")))
    large = w.frame(w.DATA, 0, 3, bytes(w.DEFAULT_MAX_FRAME + 1))
    wire.client(START, large)
    assert bytes(wire.to_backend) == START + large and not wire.core.closed


def test_goaway_from_either_side_is_relayed_unchanged():
    wire = Wire()
    wire.client(START)
    client_goaway = w.goaway(0, w.ERROR_NO_ERROR)
    wire.client(client_goaway)
    backend_goaway = w.goaway(7, w.ERROR_PROTOCOL) + b"debug data"[:0]
    wire.backend(backend_goaway)
    assert bytes(wire.to_backend).endswith(client_goaway)
    assert bytes(wire.to_client) == backend_goaway
    assert not wire.core.closed


# ---- HPACK -----------------------------------------------------------------------------------


def test_request_paths_indexed_in_the_dynamic_table_are_still_recognised():
    wire = Wire()
    wire.client(START)
    encoder = hpack.Encoder()
    headers = [(":method", "POST"), (":path", CREATE), ("content-type", "application/grpc")]
    for sid in (1, 3):  # the second block is all table references
        block = encoder.encode(headers)
        wire.client(w.frame(w.HEADERS, w.FLAG_END_HEADERS, sid, block))
        assert sid in wire.core.streams
    assert len(block) == 3
    # A block split over CONTINUATION frames is decoded once whole.
    block = encoder.encode([*headers, ("x-big", "v" * 300)])
    wire.client(w.frame(w.HEADERS, 0, 5, block[:100]), w.frame(w.CONTINUATION, 0, 5, block[100:200]))
    assert 5 not in wire.core.streams
    wire.client(w.frame(w.CONTINUATION, w.FLAG_END_HEADERS, 5, block[200:]))
    assert 5 in wire.core.streams


def test_response_trailers_are_decoded_across_table_updates():
    wire = Wire()
    wire.client(START)
    encoder = hpack.Encoder()
    for sid, message in ((1, "first: 100%"), (3, "second")):
        wire.open_held_call(sid, encode_grpc_message(b"a"))
        wire.run_hooks()
        wire.backend(trailers(sid, Status.INVALID_ARGUMENT, message.replace("%", "%25"), encoder))
    assert [c[2:] for c in wire.handler.after_calls] == [
        (Status.INVALID_ARGUMENT, "first: 100%"), (Status.INVALID_ARGUMENT, "second")]


def test_the_peers_header_table_size_reaches_the_decoder_of_the_other_direction():
    wire = Wire()
    # The backend allows the client's encoder a 0-byte table; a client that indexes anyway
    # breaks decoding, and interception stops rather than guessing.
    wire.backend(w.frame(w.SETTINGS, 0, 0, (w.SETTINGS_HEADER_TABLE_SIZE).to_bytes(2, "big")
                         + bytes(4)))
    assert wire.core._c2s_hpack.decoder.max_allowed_table_size == 0
    wire.client(START)
    wire.client(w.frame(w.SETTINGS, 0, 0, (w.SETTINGS_HEADER_TABLE_SIZE).to_bytes(2, "big")
                        + (256).to_bytes(4, "big")))
    assert wire.core._s2c_hpack.decoder.max_allowed_table_size == 256
    with capture_logs() as logs:
        block = hpack.Encoder().encode([(":path", CREATE)])  # indexes: over the 0-byte limit
        wire.client(w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, block))
    assert [e["event"] for e in logs] == ["request_headers_undecodable"]
    assert 1 not in wire.core.streams
    # Relayed unchanged, and later streams pass through unheld.
    wire.open_held_call(3, encode_grpc_message(b"a"))
    assert wire.hooks == [] and bytes(wire.to_backend).endswith(encode_grpc_message(b"a"))


def test_an_oversized_header_block_is_relayed_undecoded_and_interception_stops():
    wire = Wire()
    wire.client(START)
    fragment = bytes(w.DEFAULT_MAX_FRAME)
    frames = [w.frame(w.HEADERS, 0, 1, request_headers(CREATE))]
    frames += [w.frame(w.CONTINUATION, 0, 1, fragment)] * (MAX_HEADER_BLOCK // len(fragment) + 1)
    frames.append(w.frame(w.CONTINUATION, w.FLAG_END_HEADERS, 1, b""))
    with capture_logs() as logs:
        wire.client(*frames)
    assert bytes(wire.to_backend) == START + b"".join(frames)
    assert wire.core._c2s_block is None and 1 not in wire.core.streams
    assert [e["event"] for e in logs] == ["interception_disabled"]
    wire.open_held_call(3, encode_grpc_message(b"a"))
    assert wire.hooks == []


def test_the_protocol_modules_do_no_io_of_their_own():
    # What lets these tests run without sockets: only proxy/relay.py may reach for the loop.
    proxy = Path(__file__).resolve().parents[1] / "koordnode" / "proxy"
    for name in ("relay_core.py", "flow_ledger.py", "held_call.py", "hpack_view.py", "call_handler.py"):
        imported = set()
        for node in ast.walk(ast.parse((proxy / name).read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module.split(".")[0])
        assert not imported & {"asyncio", "socket", "selectors", "threading", "os"}, name
