"""The one copy of gRPC's wire format the proxy and the client share (koordnode.cri.grpc_wire)."""

from __future__ import annotations

import hpack
import pytest

from koordnode.cri import grpc_wire
from koordnode.cri.grpc_wire import (
    GrpcFramingError,
    Status,
    decode_grpc_message,
    encode_grpc_message,
    escape_grpc_message,
    grpc_timeout,
    status_name,
    unescape_grpc_message,
    unframe_grpc_message,
)
from koordnode.proxy import h2wire


def test_message_framing_round_trips() -> None:
    for message in (b"", b"x", bytes(range(256)) * 300):
        body = encode_grpc_message(message)
        assert body[:5] == b"\x00" + len(message).to_bytes(4, "big")
        assert unframe_grpc_message(body) == message
        assert decode_grpc_message(body) == message


@pytest.mark.parametrize(("body", "problem"), [
    (b"", "carries no message"),
    (b"\x00\x00\x00", "carries no message"),
    (b"\x01\x00\x00\x00\x01x", "compressed"),
    (b"\x00\x00\x00\x00\x02x", "not exactly one message"),
    (b"\x00\x00\x00\x00\x01xy", "not exactly one message"),
])
def test_bad_bodies_say_what_is_wrong(body: bytes, problem: str) -> None:
    with pytest.raises(GrpcFramingError, match=problem):
        unframe_grpc_message(body)
    assert decode_grpc_message(body) is None


def test_status_names() -> None:
    assert status_name(0) == "OK"
    assert status_name(12) == "UNIMPLEMENTED"
    assert status_name(16) == "UNAUTHENTICATED"
    assert status_name(17) == "UNKNOWN"
    assert status_name(-1) == "UNKNOWN"
    assert len(grpc_wire.STATUS_NAMES) == 17


def test_grpc_message_escaping_round_trips() -> None:
    text = "koordnode: bad % value \u00e9\n\x7f"
    escaped = escape_grpc_message(text)
    assert escaped.isascii() and "\n" not in escaped and "%25" in escaped
    assert unescape_grpc_message(escaped) == text
    assert unescape_grpc_message("plain text") == "plain text"
    assert unescape_grpc_message("%FF") == "\ufffd"


def test_grpc_timeout() -> None:
    assert grpc_timeout(0.0001) == "1m"
    assert grpc_timeout(2) == "2000m"
    assert grpc_timeout(10**6) == "1000000S"


def test_the_proxy_uses_the_same_copy() -> None:
    from koordnode.proxy import handler

    assert handler.decode_grpc_message is grpc_wire.decode_grpc_message
    assert handler.encode_grpc_message is grpc_wire.encode_grpc_message
    # HTTP/2 helpers only: no second name for gRPC's framing or status codes.
    assert not any(hasattr(h2wire, name) for name in ("decode_grpc_message", "encode_grpc_message",
                                                      "GRPC_OK", "GRPC_INTERNAL"))
    frame = h2wire.grpc_error_trailers(1, Status.INTERNAL, "bad\n100%")
    headers = dict(hpack.Decoder().decode(frame[h2wire.FRAME_HEADER_LEN:]))
    assert headers["grpc-status"] == "13"
    assert unescape_grpc_message(headers["grpc-message"]) == "bad\n100%"
