"""A raw HTTP/2 client for tests: sends exactly the frames a test writes (hostile ones too) and
reads back what the server answered, so koordnode's answer can be compared with containerd's."""

from __future__ import annotations

import dataclasses
import socket
import struct
import time

import hpack

from koordnode.cri.grpc_wire import encode_grpc_message
from koordnode.proxy import h2wire as w

RS = "/runtime.v1.RuntimeService/"


def request_headers(path: str = RS + "CreateContainer") -> bytes:
    return w.encode_literal_headers([
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
        ("content-type", "application/grpc"), ("te", "trailers"),
    ])


def frame_header(length: int, ftype: int, flags: int, sid: int) -> bytes:
    return struct.pack(">BHBBL", length >> 16, length & 0xFFFF, ftype, flags, sid)


@dataclasses.dataclass
class Answer:
    """What a server sent back, without the frames that vary between connections (SETTINGS,
    PING, WINDOW_UPDATE, GOAWAY): responses and resets in order, and whether it closed."""

    events: list[tuple]
    closed: bool
    goaway_codes: list[int]


def parse_frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out, pos = [], 0
    while len(data) - pos >= 9:
        length = int.from_bytes(data[pos:pos + 3], "big")
        if len(data) - pos - 9 < length:
            break
        out.append((data[pos + 3], data[pos + 4], int.from_bytes(data[pos + 5:pos + 9], "big") & 0x7FFFFFFF,
                    bytes(data[pos + 9:pos + 9 + length])))
        pos += 9 + length
    return out


def summarize(data: bytes, closed: bool) -> Answer:
    decoder = hpack.Decoder()
    events: list[tuple] = []
    goaways: list[int] = []
    for ftype, _flags, sid, payload in parse_frames(data):
        if ftype == w.HEADERS:
            headers = dict(decoder.decode(payload, raw=False))
            events.append(("HEADERS", sid, headers.get("grpc-status"), headers.get("grpc-message")))
        elif ftype == w.RST_STREAM:
            events.append(("RST_STREAM", sid, int.from_bytes(payload, "big")))
        elif ftype == w.DATA:
            events.append(("DATA", sid))
        elif ftype == w.GOAWAY:
            goaways.append(int.from_bytes(payload[4:8], "big"))
    return Answer(events, closed, goaways)


class RawConnection:
    def __init__(self, path: str, timeout_s: float = 5.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        self.sock.connect(path)
        self.sock.sendall(w.PREFACE + w.frame(w.SETTINGS, 0, 0))
        self.received = b""
        self.closed = False

    def send(self, data: bytes) -> bool:
        """False if the peer has closed the connection meanwhile."""
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            self.closed = True
            return False

    def read_for(self, seconds: float) -> Answer:
        """Everything the server sends within `seconds` (or until it closes)."""
        deadline = time.monotonic() + seconds
        while not self.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                self.closed = True
                break
            if not data:
                self.closed = True
                break
            self.received += data
        return summarize(self.received, self.closed)

    def read_until(self, predicate, timeout_s: float = 10.0) -> Answer:
        deadline = time.monotonic() + timeout_s
        answer = summarize(self.received, self.closed)
        while not predicate(answer) and not self.closed and time.monotonic() < deadline:
            answer = self.read_for(0.05)
        return answer

    def close(self) -> None:
        self.sock.close()


def unary_call(path: str, method: str, message: bytes = b"", timeout_s: float = 10.0) -> Answer:
    """One gRPC unary call over a fresh raw connection; the answer once the trailers came."""
    conn = RawConnection(path, timeout_s)
    try:
        conn.send(w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, request_headers(RS + method))
                  + w.frame(w.DATA, w.FLAG_END_STREAM, 1, encode_grpc_message(message)))
        return conn.read_until(lambda a: any(e[0] == "HEADERS" and e[2] is not None for e in a.events),
                               timeout_s)
    finally:
        conn.close()
