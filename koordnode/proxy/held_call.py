"""The state of one intercepted call: its request held for the hooks, then sent, and its
response copied for the Post hooks as it passes."""

from __future__ import annotations

import enum
from typing import Any


class Phase(enum.Enum):
    HOLDING = "holding"  # collecting the request body
    HOOKS = "hooks"  # the body is complete; the handler's `before` runs
    SENDING = "sending"  # the (possibly changed) body goes out as the backend's windows allow
    SENT = "sent"  # the whole body went out (or the call was answered without it)


class HeldCall:
    __slots__ = (
        "sid", "spec", "phase", "req_chunks", "req_bytes", "held", "declared", "cancelled", "ctx",
        "server_window", "outgoing", "out_pos", "resp_chunks", "response_done",
    )

    def __init__(self, sid: int, spec: Any, server_window: int) -> None:
        self.sid = sid
        self.spec = spec
        self.phase = Phase.HOLDING
        self.req_chunks: list[bytes] = []
        self.req_bytes = 0
        self.held = 0  # frame bytes of the request counted against the connection's budget
        self.declared: int | None = None  # length in the gRPC message prefix, once held
        self.cancelled = False
        self.ctx: Any = None
        self.server_window = server_window  # the backend's window for this stream
        self.outgoing = b""  # the body being sent, from out_pos on
        self.out_pos = 0
        self.resp_chunks: list[bytes] = []
        self.response_done = False

    def add_request_chunk(self, chunk: bytes) -> None:
        if chunk:
            self.req_chunks.append(chunk)
            self.req_bytes += len(chunk)
        if self.declared is None and self.req_bytes >= 5:
            self.declared = declared_length(self.req_chunks)

    def take_request(self) -> bytes:
        body = b"".join(self.req_chunks)
        self.req_chunks = []
        return body

    def take_response(self) -> bytes:
        body = b"".join(self.resp_chunks)
        self.resp_chunks = []
        return body


def declared_length(chunks: list[bytes]) -> int:
    """The length a gRPC message prefix announces (its first 5 bytes must be in `chunks`)."""
    head = b""
    for chunk in chunks:  # non-empty chunks: at most five are read
        head += chunk[: 5 - len(head)]
        if len(head) == 5:
            break
    return int.from_bytes(head[1:5], "big")
