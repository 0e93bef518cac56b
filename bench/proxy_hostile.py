#!/usr/bin/env python3
"""What hostile or bursty CRI clients cost koordnode: memory and failed calls.

Starts a private containerd (the test bed) and `koordnode run` in front of it, then measures:

- RSS of koordnode while `--hostile` connections each announce a 16 MiB DATA frame and push all
  of it but the last byte (a peer holding partial large frames);
- a burst of `--burst` concurrent connects, each then making one Version call: connects refused
  (EAGAIN) and calls failed, through koordnode and directly against containerd;
- RSS and /metrics size after `--methods` calls to made-up method names (metric labels).

    sudo python3 -m bench.proxy_hostile [--hostile 10] [--burst 500] [--methods 20000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from koordnode.cri.grpc_wire import encode_grpc_message
from koordnode.proxy import h2wire as w
from tests.support.h2raw import RS, RawConnection, frame_header, request_headers
from tests.support.koordnode_runner import KoordnodeProcess
from tests.testbed.containerd_bed import ContainerdBed

MiB = 1024 * 1024


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def connect(path: str, tries: int = 200) -> RawConnection:
    for _ in range(tries):
        try:
            return RawConnection(path)
        except BlockingIOError:
            time.sleep(0.01)
    raise RuntimeError("cannot connect")


def version_call(conn_sock: socket.socket, sid: int = 1) -> bytes:
    return (w.frame(w.HEADERS, w.FLAG_END_HEADERS, sid, request_headers(RS + "Version"))
            + w.frame(w.DATA, w.FLAG_END_STREAM, sid, encode_grpc_message(b"")))


def hostile_frames(path: str, pid: int, n: int) -> dict:
    before = rss_mib(pid)
    conns, closed_early = [], 0
    for _ in range(n):
        c = connect(path)
        c.send(w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, request_headers(RS + "CreateContainer"))
               + frame_header(16 * MiB - 1, w.DATA, 0, 1))
        chunk = bytes(MiB)
        for i in range(16):
            if not c.send(chunk[: MiB - 2] if i == 15 else chunk):
                closed_early += 1
                break
        conns.append(c)
    time.sleep(1.0)
    peak = rss_mib(pid)
    for c in conns:
        c.close()
    return {"connections": n, "rss_before_mib": round(before, 1), "rss_holding_mib": round(peak, 1),
            "connections_closed_by_koordnode": closed_early}


def burst(path: str, n: int) -> dict:
    socks, refused = [], 0
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError:
            refused += 1
            s.close()
            continue
        socks.append(s)
    failed = 0
    started = time.monotonic()
    for s in socks:
        s.setblocking(True)
        s.settimeout(30)
        try:
            s.sendall(w.PREFACE + w.frame(w.SETTINGS, 0, 0) + version_call(s))
        except OSError:
            pass
    for s in socks:
        conn = RawConnection.__new__(RawConnection)
        conn.sock, conn.received, conn.closed = s, b"", False
        answer = conn.read_until(lambda a: any(e[0] == "HEADERS" and e[2] is not None for e in a.events), 30)
        if not any(e[0] == "HEADERS" and e[2] == "0" for e in answer.events):
            failed += 1
        s.close()
    return {"connects": n, "refused": refused, "calls_failed": refused + failed,
            "seconds": round(time.monotonic() - started, 2)}


def made_up_methods(path: str, pid: int, metrics_url: str, n: int) -> dict:
    before = rss_mib(pid)
    c = connect(path)
    answered = [0]

    def drain() -> None:  # responses are only counted, never kept
        c.sock.settimeout(5)
        while True:
            try:
                data = c.sock.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            answered[0] += data.count(b"grpc-status")

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    sid = 1
    for i in range(n):
        c.sock.sendall(w.frame(w.HEADERS, w.FLAG_END_HEADERS, sid, request_headers(RS + f"Made{i}Up"))
                       + w.frame(w.DATA, w.FLAG_END_STREAM, sid, encode_grpc_message(b"")))
        sid += 2
    reader.join(timeout=30)
    c.close()
    body = urllib.request.urlopen(metrics_url, timeout=30).read()
    series = sum(1 for line in body.splitlines() if line.startswith(b"koordnode_cri_requests_total{"))
    return {"methods": n, "rss_before_mib": round(before, 1), "rss_after_mib": round(rss_mib(pid), 1),
            "metrics_bytes": len(body), "cri_requests_series": series}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hostile", type=int, default=10)
    ap.add_argument("--burst", type=int, default=500)
    ap.add_argument("--methods", type=int, default=20000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kn-hostile-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out: dict = {"machine": {"cpus": len(__import__("os").sched_getaffinity(0)),
                             "kernel": platform.release(), "python": platform.python_version()}}
    with ContainerdBed(work / "bed") as bed:
        kn = KoordnodeProcess(work / "kn", str(bed.socket), metrics_listen=f"127.0.0.1:{port}").start()
        try:
            pid = kn.proc.pid
            time.sleep(1.0)
            out["hostile_frames"] = hostile_frames(kn.listen, pid, args.hostile)
            out["burst_direct"] = burst(str(bed.socket), args.burst)
            out["burst_koordnode"] = burst(kn.listen, args.burst)
            out["made_up_methods"] = made_up_methods(kn.listen, pid, f"http://127.0.0.1:{port}/metrics",
                                                     args.methods)
        finally:
            kn.stop()
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
