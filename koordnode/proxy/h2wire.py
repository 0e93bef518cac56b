"""HTTP/2 wire helpers used by the relay.

Only what the relay needs: frame header constants and building the few frames the proxy itself
emits. Header blocks the proxy emits are encoded as literals *without indexing* so that they
never touch the peer's HPACK dynamic table, which belongs to the real endpoint on the other side
of the relay. gRPC itself (status codes, message framing) is koordnode.cri.grpc_wire, shared with
the client.
"""

from __future__ import annotations

import struct

from koordnode.cri.grpc_wire import escape_grpc_message

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER_LEN = 9

DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20

SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5

DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME = 16384
DEFAULT_HEADER_TABLE = 4096

ERROR_NO_ERROR = 0x0
ERROR_PROTOCOL = 0x1
ERROR_FRAME_SIZE = 0x6
ERROR_CANCEL = 0x8


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return struct.pack(">BHBBL", n >> 16, n & 0xFFFF, ftype, flags, stream_id & 0x7FFFFFFF) + payload


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">L", increment & 0x7FFFFFFF))


def rst_stream(stream_id: int, error_code: int = ERROR_CANCEL) -> bytes:
    return frame(RST_STREAM, 0, stream_id, struct.pack(">L", error_code))


def data_frames(stream_id: int, payload: bytes, max_frame: int, end_stream: bool) -> list[bytes]:
    """Split payload into DATA frames no larger than max_frame; END_STREAM on the last."""
    frames = []
    chunks = [payload[i : i + max_frame] for i in range(0, len(payload), max_frame)] or [b""]
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        frames.append(frame(DATA, FLAG_END_STREAM if (last and end_stream) else 0, stream_id, chunk))
    return frames


def goaway(last_stream_id: int, error_code: int) -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">LL", last_stream_id & 0x7FFFFFFF, error_code))


def frame_payload(ftype: int, flags: int, payload: bytes | memoryview) -> bytes:
    """The frame's content without padding and priority fields (DATA / HEADERS).

    Raises ValueError when the flags announce fields the payload is too short to hold."""
    start, end = 0, len(payload)
    if flags & FLAG_PADDED and ftype in (DATA, HEADERS):
        if not end:
            raise ValueError("padded frame without a pad length")
        pad = payload[0]
        start = 1
        end -= pad
    if ftype == HEADERS and flags & FLAG_PRIORITY:
        start += 5
    if end < start:
        raise ValueError("padding exceeds frame payload")
    return bytes(payload[start:end])


def parse_settings(payload: bytes | memoryview) -> dict[int, int]:
    settings = {}
    for i in range(0, len(payload) - len(payload) % 6, 6):
        ident, value = struct.unpack_from(">HL", payload, i)
        settings[ident] = value
    return settings


def _hpack_int(value: int, prefix_bits: int, first_byte_flags: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first_byte_flags | value])
    out = bytearray([first_byte_flags | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_literal_headers(headers: list[tuple[str, str]]) -> bytes:
    """HPACK block of 'literal header field without indexing — new name', no Huffman."""
    out = bytearray()
    for name, value in headers:
        n, v = name.encode(), value.encode()
        out.append(0x00)
        out += _hpack_int(len(n), 7, 0x00) + n
        out += _hpack_int(len(v), 7, 0x00) + v
    return bytes(out)


def grpc_error_trailers(stream_id: int, code: int, message: str) -> bytes:
    """A trailers-only gRPC response ending the stream with `code`."""
    block = encode_literal_headers(
        [
            (":status", "200"),
            ("content-type", "application/grpc"),
            ("grpc-status", str(int(code))),
            ("grpc-message", escape_grpc_message(message)),
        ]
    )
    return frame(HEADERS, FLAG_END_HEADERS | FLAG_END_STREAM, stream_id, block)

