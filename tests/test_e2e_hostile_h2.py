"""Hostile HTTP/2 input against the real containerd, direct and through a real `koordnode run`:
koordnode must answer every malformed or oversized frame as containerd does, at the same point
(at the frame header, at the gRPC length prefix), never crash, and keep its memory bounded.
"""

from __future__ import annotations

import socket
import struct
import time

import grpc
import pytest

from koordnode.cri import api_pb2 as pb
from support import api_pb2_grpc as pb_grpc
from koordnode.cri.grpc_wire import encode_grpc_message
from koordnode.proxy import h2wire as w
from support.h2raw import RS, RawConnection, frame_header, request_headers, unary_call

MiB = 1024 * 1024
HDRS = request_headers(RS + "CreateContainer")  # an intercepted method: koordnode holds its body
VERSION_HDRS = request_headers(RS + "Version")
CREATE_NOPE = encode_grpc_message(b"\x0a\x04nope")  # CreateContainerRequest{pod_sandbox_id: "nope"}


def _data_prefix(declared: int, size: int = 16384) -> bytes:
    """A first DATA frame whose gRPC prefix announces `declared` bytes; the stream stays open."""
    body = b"\x00" + struct.pack(">L", declared)
    return w.frame(w.DATA, 0, 1, body + b"\x00" * (size - len(body)))


CASES = {
    "headers-padded-empty-payload": w.frame(w.HEADERS, w.FLAG_END_HEADERS | w.FLAG_PADDED, 1, b""),
    "headers-pad-longer-than-payload": w.frame(w.HEADERS, w.FLAG_END_HEADERS | w.FLAG_PADDED, 1, b"\x05ab"),
    "headers-priority-flag-short-payload": w.frame(w.HEADERS, w.FLAG_END_HEADERS | w.FLAG_PRIORITY, 1, b"ab"),
    "headers-padding-eats-priority": w.frame(
        w.HEADERS, w.FLAG_END_HEADERS | w.FLAG_PADDED | w.FLAG_PRIORITY, 1, b"\x04" + bytes(5)),
    "headers-padded-and-priority-valid": w.frame(
        w.HEADERS, w.FLAG_END_HEADERS | w.FLAG_PADDED | w.FLAG_PRIORITY, 1,
        b"\x03" + bytes(5) + VERSION_HDRS + b"\x00\x00\x00") + w.frame(w.DATA, w.FLAG_END_STREAM, 1,
                                                                         encode_grpc_message(b"")),
    "continuation-without-headers": w.frame(w.CONTINUATION, w.FLAG_END_HEADERS, 1, b"\x82"),
    "continuation-on-another-stream": w.frame(w.HEADERS, 0, 1, HDRS[:10])
    + w.frame(w.CONTINUATION, w.FLAG_END_HEADERS, 3, HDRS[10:]),
    "headers-interrupted-by-data": w.frame(w.HEADERS, 0, 1, HDRS[:10]) + w.frame(w.DATA, 0, 1, b"x"),
    "intercepted-data-padded-empty": w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, HDRS)
    + w.frame(w.DATA, w.FLAG_PADDED, 1, b""),
    "intercepted-data-pad-longer-than-payload": w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, HDRS)
    + w.frame(w.DATA, w.FLAG_PADDED, 1, b"\x09abc"),
    "intercepted-data-padded-valid": w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, HDRS)
    + w.frame(w.DATA, w.FLAG_PADDED | w.FLAG_END_STREAM, 1, b"\x04" + CREATE_NOPE + b"\x00" * 4),
    "frame-header-announcing-16MiB": w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, HDRS)
    + frame_header(16 * MiB - 1, w.DATA, 0, 1),
    "frame-of-16385-bytes": w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, HDRS)
    + w.frame(w.DATA, 0, 1, bytes(16385)),
    "settings-frame-over-max": frame_header(20000, w.SETTINGS, 0, 0),
    "request-announcing-20MiB": w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, HDRS) + _data_prefix(20 * MiB),
    "request-announcing-16MiB-plus-1": w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, HDRS)
    + _data_prefix(16 * MiB + 1),
    "request-announcing-16MiB-exactly": w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, HDRS)
    + _data_prefix(16 * MiB),
}


def _answer(path: str, payload: bytes):
    conn = RawConnection(path)
    try:
        conn.send(payload)
        return conn.read_for(1.5)
    finally:
        conn.close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_and_oversized_frames_are_answered_as_containerd_answers_them(
        containerd_bed, koordnode, case):
    direct = _answer(str(containerd_bed.socket), CASES[case])
    proxied = _answer(koordnode.listen, CASES[case])
    assert (proxied.events, proxied.closed) == (direct.events, direct.closed), case
    # The relay survived it: other clients are served, and nothing crashed in koordnode.
    assert unary_call(koordnode.listen, "Version").events[-1][2] == "0"
    log = koordnode.log_text()
    assert "Traceback" not in log and "IndexError" not in log, log[-3000:]


def test_oversized_frame_is_refused_at_its_header_with_frame_size_error(containerd_bed, koordnode):
    answer = _answer(koordnode.listen, CASES["frame-header-announcing-16MiB"])
    assert answer.closed and answer.goaway_codes == [w.ERROR_FRAME_SIZE]


def test_request_over_16MiB_is_refused_at_its_prefix_like_containerd(containerd_bed, koordnode):
    for path in (str(containerd_bed.socket), koordnode.listen):
        answer = _answer(path, CASES["request-announcing-20MiB"])
        assert answer.events == [
            ("HEADERS", 1, "8", f"grpc: received message larger than max ({20 * MiB} vs. {16 * MiB})"),
            ("RST_STREAM", 1, 0)], path
        assert not answer.closed


def test_a_20MiB_request_from_a_grpc_client_fails_as_it_does_direct(containerd_bed, koordnode):
    req = pb.CreateContainerRequest(pod_sandbox_id="nope")
    req.config.annotations["a"] = "x" * (20 * MiB)
    details = []
    for path in (str(containerd_bed.socket), koordnode.listen):
        with grpc.insecure_channel(f"unix://{path}", options=[("grpc.max_send_message_length", 64 * MiB)]) as ch:
            with pytest.raises(grpc.RpcError) as err:
                pb_grpc.RuntimeServiceStub(ch).CreateContainer(req, timeout=30)
            details.append((err.value.code(), err.value.details()))
    assert details[0] == details[1]
    assert details[0][0] == grpc.StatusCode.RESOURCE_EXHAUSTED


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_rss_stays_bounded_under_many_connections_holding_partial_frames(containerd_bed, koordnode):
    """200 connections each hold a legal frame missing its last byte, 20 more announce a 16 MiB
    frame and push 4 MiB of it: koordnode holds at most one legal frame per connection."""
    pid = koordnode.proc.pid
    assert unary_call(koordnode.listen, "Version").events[-1][2] == "0"
    before = _rss_kib(pid)
    conns = []
    try:
        for _ in range(200):
            c = RawConnection(koordnode.listen)
            c.send(w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, HDRS) + frame_header(16384, w.DATA, 0, 1)
                   + bytes(16383))
            conns.append(c)
        hostile = []
        for _ in range(20):
            c = RawConnection(koordnode.listen)
            c.send(w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, HDRS) + frame_header(16 * MiB - 1, w.DATA, 0, 1))
            chunk = bytes(256 * 1024)
            for _ in range(16):
                if not c.send(chunk):
                    break
            hostile.append(c)
            conns.append(c)
        time.sleep(1.0)
        # Still serving while they hold on.
        assert unary_call(koordnode.listen, "Version").events[-1][2] == "0"
        grown_mib = (_rss_kib(pid) - before) / 1024
        print(f"RSS grew {grown_mib:.1f} MiB with 220 connections holding partial frames")
        assert grown_mib < 40, f"RSS grew {grown_mib:.1f} MiB"
        assert all(c.read_for(0.2).closed for c in hostile)
    finally:
        for c in conns:
            c.close()


def test_a_burst_of_500_concurrent_connects_all_succeed_and_are_served(containerd_bed, koordnode):
    """What a burst of clients sees: containerd (Go: listen backlog = somaxconn) accepts all."""
    for path in (str(containerd_bed.socket), koordnode.listen):
        socks, refused = [], 0
        try:
            for _ in range(500):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.setblocking(False)
                try:
                    s.connect(path)
                except BlockingIOError:  # EAGAIN: the listen backlog is full
                    refused += 1
                    s.close()
                    continue
                socks.append(s)
            assert refused == 0, f"{refused} of 500 connects refused by {path}"
            failed = 0
            for s in socks:
                s.setblocking(True)
                s.settimeout(20)
                s.sendall(w.PREFACE + w.frame(w.SETTINGS, 0, 0)
                          + w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, VERSION_HDRS)
                          + w.frame(w.DATA, w.FLAG_END_STREAM, 1, encode_grpc_message(b"")))
            for s in socks:
                conn = RawConnection.__new__(RawConnection)
                conn.sock, conn.received, conn.closed = s, b"", False
                answer = conn.read_until(lambda a: any(e[0] == "HEADERS" and e[2] is not None
                                                       for e in a.events), 20)
                if not any(e[0] == "HEADERS" and e[2] == "0" for e in answer.events):
                    failed += 1
            assert failed == 0, f"{failed} of 500 Version calls failed through {path}"
        finally:
            for s in socks:
                s.close()
