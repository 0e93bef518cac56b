"""Guest fixtures: containerd with runc's systemd driver on cgroup v2, kubelet's slices, koordnode.

Runs only inside the VM lane's guest (KOORDNODE_VM_GUEST=1, set by tests/vm/guest/run.py).
"""

from __future__ import annotations

import os
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from support.koordnode_runner import KoordnodeProcess
from testbed.systemd_bed import KUBEPODS_SLICE, SystemdBed, kubelet_tiers

IN_GUEST = os.environ.get("KOORDNODE_VM_GUEST") == "1"
CG = Path("/sys/fs/cgroup")
SCRATCH_DISK = "vdb"  # the VM's second virtio disk


# On the host these files are not collected: tests/test_vm_lane.py reports their guest results.
collect_ignore_glob = [] if IN_GUEST else ["test_*.py"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def disk_dev(name: str = SCRATCH_DISK) -> str:
    return Path(f"/sys/block/{name}/dev").read_text().strip()


def wait_for(check, timeout_s: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval)


class GuestKoordnode(KoordnodeProcess):
    metrics_port: int = 0

    def metrics(self) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()

    def metric(self, name: str, **labels: str) -> float:
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        prefix = f"{name}{{{want}}}" if labels else name
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith(prefix + " ") or (labels and line.startswith(prefix)):
                total += float(line.rsplit(" ", 1)[1])
        return total


RECONCILE_S = 3.0


@pytest.fixture(scope="session")
def systemd_bed(tmp_path_factory):
    kubelet_tiers(os.cpu_count() or 1)
    bed = SystemdBed(tmp_path_factory.mktemp("bed"))
    bed.start()
    yield bed
    bed.stop()


@pytest.fixture(scope="session")
def guest_koordnode(systemd_bed, tmp_path_factory):
    port = free_port()
    extra = (
        f'[cgroup]\ndriver = "systemd"\nreconcile_interval_s = {RECONCILE_S}\n'
        f'[node]\nblkio_devices = ["{disk_dev()}"]\n'
    )
    kn = GuestKoordnode(tmp_path_factory.mktemp("kn"), str(systemd_bed.socket), extra_toml=extra,
                        metrics_listen=f"127.0.0.1:{port}", kubepods="/" + KUBEPODS_SLICE)
    kn.metrics_port = port
    kn.start()
    yield kn
    kn.stop()
