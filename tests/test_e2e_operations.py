"""Operating a real `koordnode run`: reload on SIGHUP, metrics, the systemd notify protocol."""

from __future__ import annotations

import os
import signal
import socket
import time
import urllib.request

import grpc
import pytest

from koordnode.cri import api_pb2 as pb
from support.cri import Cri
from support.koordnode_runner import KoordnodeProcess

pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout_s: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_sighup_applies_a_valid_config_and_keeps_the_old_one_when_invalid(containerd_bed, tmp_path):
    kn = KoordnodeProcess(tmp_path / "kn", str(containerd_bed.socket)).start()
    try:
        kn.wait_rebuilt()
        original = kn.config_path.read_text()
        kn.config_path.write_text(original + "[qos.LS]\ncpu_shares_per_cpu = 2048\n")
        kn.proc.send_signal(signal.SIGHUP)
        st = wait_for(lambda: (s := kn.status())["config"]["last_reload"]["result"] == "applied" and s,
                      what="reload applied")
        assert st["config"]["source"] == str(kn.config_path)

        kn.config_path.write_text(original + "[qos.LS]\ncpu_shares_per_cpu = \"lots\"\nbogus = 1\n")
        kn.proc.send_signal(signal.SIGHUP)
        st = wait_for(lambda: (s := kn.status())["config"]["last_reload"]["result"] == "rejected" and s,
                      what="reload rejected")
        errors = st["config"]["last_reload"]["errors"]
        assert any("qos.LS.cpu_shares_per_cpu" in e for e in errors)
        assert any("qos.LS.bogus" in e for e in errors)
        assert kn.proc.poll() is None  # still serving
        cri = Cri(kn.listen)
        try:
            assert cri.rt.Version(pb.VersionRequest(), timeout=10).runtime_name == "containerd"
        finally:
            cri.close()
    finally:
        kn.stop()


def test_metrics_count_cri_calls_by_method_and_code(containerd_bed, tmp_path):
    port = free_port()
    kn = KoordnodeProcess(tmp_path / "kn", str(containerd_bed.socket), metrics_listen=f"127.0.0.1:{port}").start()
    cri = Cri(kn.listen)
    try:
        for _ in range(3):
            cri.rt.Version(pb.VersionRequest(), timeout=10)
        with pytest.raises(grpc.RpcError):
            cri.rt.ContainerStatus(pb.ContainerStatusRequest(container_id="nope"), timeout=10)
        body = wait_for(lambda: (b := urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
                                 .read().decode()) and "Version" in b and b, what="metrics")
        lines = [line for line in body.splitlines() if line.startswith("koordnode_cri_requests_total")]
        assert any("Version" in line and 'code="OK"' in line and line.endswith(" 3.0") for line in lines), lines
        assert any("ContainerStatus" in line and 'code="NOT_FOUND"' in line for line in lines), lines
        assert "koordnode_cri_request_duration_seconds_bucket" in body
    finally:
        cri.close()
        kn.stop()


def test_notify_ready_and_stopping_over_notify_socket(containerd_bed, tmp_path, monkeypatch):
    sock_path = tmp_path / "notify.sock"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(sock_path))
    receiver.settimeout(15)
    monkeypatch.setenv("NOTIFY_SOCKET", str(sock_path))
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    kn = KoordnodeProcess(tmp_path / "kn", str(containerd_bed.socket))
    try:
        kn.start()
        monkeypatch.setenv("WATCHDOG_PID", str(kn.proc.pid))
        messages = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not any("READY=1" in m for m in messages):
            messages.append(receiver.recv(4096).decode())
        assert any("READY=1" in m for m in messages)
        # The socket listens and the state is rebuilt by the time READY arrives.
        assert kn.status()["rebuilt_at"]
        watchdog = receiver.recv(4096).decode()
        assert "WATCHDOG=1" in watchdog
        kn.stop()
        rest = []
        receiver.settimeout(2)
        try:
            while True:
                rest.append(receiver.recv(4096).decode())
        except TimeoutError:
            pass
        assert any("STOPPING=1" in m for m in rest)
    finally:
        receiver.close()
        kn.stop()
        os.environ.pop("WATCHDOG_PID", None)
