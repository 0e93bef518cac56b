"""gRPC on the wire, the one copy the proxy (koordnode.proxy) and the client (koordnode.cri.client)
share: status codes, length-prefixed message framing, grpc-message escaping, grpc-timeout.

Facts from the gRPC over HTTP/2 protocol description: a message is a 1-byte compressed flag,
a 4-byte big-endian length and the bytes; grpc-message is percent-encoded UTF-8; grpc-timeout
is at most 8 digits and a unit.
"""

from __future__ import annotations

import enum
import struct
import urllib.parse

__all__ = [
    "GrpcFramingError",
    "STATUS_NAMES",
    "Status",
    "decode_grpc_message",
    "encode_grpc_message",
    "escape_grpc_message",
    "grpc_timeout",
    "status_name",
    "unescape_grpc_message",
    "unframe_grpc_message",
]


class Status(enum.IntEnum):
    """gRPC status codes, by the wire value of grpc-status."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


STATUS_NAMES: frozenset[str] = frozenset(status.name for status in Status)


_STATUS_NAMES_BY_CODE: dict[int, str] = {status.value: status.name for status in Status}


def status_name(code: int) -> str:
    """The name of a grpc-status number; "UNKNOWN" for a number gRPC does not define."""
    return _STATUS_NAMES_BY_CODE.get(code, "UNKNOWN")  # a dict, not Status(code): once per call


_HEADER = struct.Struct(">BL")


class GrpcFramingError(ValueError):
    """A body that is not exactly one uncompressed length-prefixed message."""


def encode_grpc_message(message: bytes) -> bytes:
    """One uncompressed length-prefixed message."""
    return _HEADER.pack(0, len(message)) + message


def unframe_grpc_message(body: bytes) -> bytes:
    """The single uncompressed message of a unary gRPC body; GrpcFramingError says what is wrong."""
    if len(body) < _HEADER.size:
        raise GrpcFramingError("carries no message")
    compressed, length = _HEADER.unpack_from(body)
    if compressed:
        raise GrpcFramingError("is compressed, but no compression was offered")
    if len(body) != _HEADER.size + length:
        raise GrpcFramingError("is not exactly one message")
    return body[_HEADER.size:]


def decode_grpc_message(body: bytes) -> bytes | None:
    """The single uncompressed message of a unary gRPC body, or None if it is not exactly that."""
    try:
        return unframe_grpc_message(body)
    except GrpcFramingError:
        return None


# Printable ASCII except "%" travels as it is; everything else is percent-encoded.
_GRPC_MESSAGE_SAFE = " !#$&'()*+,/:;=?@[]~"


def escape_grpc_message(text: str) -> str:
    """The grpc-message header value of a status message."""
    return urllib.parse.quote(text, safe=_GRPC_MESSAGE_SAFE)


def unescape_grpc_message(value: str) -> str:
    """A status message from its grpc-message header value (invalid UTF-8 replaced)."""
    if "%" not in value:
        return value
    return urllib.parse.unquote(value, errors="replace")


def grpc_timeout(seconds: float) -> str:
    """The grpc-timeout header value: at most 8 digits and a unit."""
    millis = max(1, int(seconds * 1000 + 0.999))
    if millis < 100_000_000:
        return f"{millis}m"
    return f"{min(int(seconds + 0.999), 99_999_999)}S"
