"""Guest fixtures: containerd with runc's systemd driver on cgroup v2, kubelet's slices, koordnode.

Runs only inside the VM lane's guest (KOORDNODE_VM_GUEST=1, set by tests/vm/guest/run.py).
"""

from __future__ import annotations

import json
import os

import pytest

from guestlib import RECONCILE_S, GuestKoordnode, disk_dev, free_port
from testbed.systemd_bed import KUBEPODS_SLICE, SystemdBed, kubelet_tiers

IN_GUEST = os.environ.get("KOORDNODE_VM_GUEST") == "1"


# On the host these files are not collected: tests/test_vm_lane.py reports their guest results.
collect_ignore_glob = [] if IN_GUEST else ["test_*.py"]


PROGRESS = "/results/progress.jsonl"


def pytest_runtest_logreport(report):
    """Each result as soon as it is known, so a guest stopped by the time bound still reports."""
    if not IN_GUEST or not os.path.isdir("/results"):
        return
    if report.when != "call" and not (report.failed or report.skipped):
        return
    entry = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
             "seconds": round(report.duration, 1)}
    if report.failed or report.skipped:
        entry["message"] = str(report.longrepr)[-4000:]
    if report.capstdout:
        entry["stdout"] = report.capstdout[-2000:]
    with open(PROGRESS, "a") as handle:
        handle.write(json.dumps(entry) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


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
        # These tests check BE pods in kubelet's besteffort slice; the idle BE group (on by
        # default) has its own test, test_be_group_systemd_v2.py.
        f'[cgroup]\ndriver = "systemd"\nreconcile_interval_s = {RECONCILE_S}\nbe_idle_group_systemd = false\n'
        f'[node]\nblkio_devices = ["{disk_dev()}"]\n'
    )
    kn = GuestKoordnode(tmp_path_factory.mktemp("kn"), str(systemd_bed.socket), extra_toml=extra,
                        metrics_listen=f"127.0.0.1:{port}", kubepods="/" + KUBEPODS_SLICE)
    kn.metrics_port = port
    kn.start()
    yield kn
    kn.stop()
