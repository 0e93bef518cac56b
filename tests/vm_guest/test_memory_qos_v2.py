"""[strategy.memory_qos] on real cgroup v2 files (VM lane guest): the QoS manager keeps the hooks'
memory.min/low of a running container applied, also with the engine's reconcile pass off.

The daemon's components are built in-process (koordnode.daemon.Daemon, not a `koordnode run`:
Python start-up takes tens of seconds under TCG); kubelet's part is reproduced by its records in
NodeState (what the proxy records from its CRI calls) and its own write of memory.min.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from koordnode.config import Config, from_dict
from koordnode.cri import api_pb2 as pb
from koordnode.daemon import Daemon
from koordnode.model.state import CONTAINER_RUNNING, POD_READY, ContainerRecord, PodRecord

CG = Path("/sys/fs/cgroup")
GIB = 1 << 30
PAGE = 4096


def _mkdirs(top: str, cgroup: str) -> None:
    """Create the cgroup and its ancestors below `top`, with the memory controller enabled."""
    path = CG
    for part in cgroup.strip("/").split("/"):
        (path / "cgroup.subtree_control").write_text("+memory")
        path = path / part
        path.mkdir(exist_ok=True)


def _rmdirs(top: Path) -> None:
    for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        directory.rmdir()
    top.rmdir()


@pytest.fixture
def tree():
    top = f"koordnode-mq-{uuid.uuid4().hex[:8]}"
    yield top
    if (CG / top).exists():
        _rmdirs(CG / top)


def test_memory_qos_keeps_container_memory_min_on_v2(tree, tmp_path):
    pod = f"/{tree}/kubepods/burstable/podls1"
    cid = "d" * 64
    _mkdirs(tree, f"{pod}/{cid}")
    config = from_dict(Config, {
        "cgroup": {"driver": "cgroupfs", "reconcile_interval_s": 0},  # the engine's pass off
        "admin": {"socket": str(tmp_path / "run" / "admin.sock")},
        "qos_manager": {"reconcile_interval_s": 1, "kubepods_cgroup": f"/{tree}/kubepods"},
        "strategy": {"cpu_suppress": {"enable": False}},
    })
    daemon = Daemon(config)
    assert daemon.qos_manager is not None, daemon.qos_error
    daemon.state.put_pod(PodRecord("ls1", "web", "default", "uid-ls1", {"koordinator.sh/qosClass": "LS"}, {},
                                   pod, qos_class="LS", state=POD_READY))
    res = pb.LinuxContainerResources(cpu_shares=1024, memory_limit_in_bytes=2 * GIB,
                                     unified={"memory.min": str(GIB)})  # kubelet's Memory QoS request
    daemon.state.put_container(ContainerRecord(cid, "ls1", "app", {}, {}, res, state=CONTAINER_RUNNING))
    container = CG / pod.strip("/") / cid
    manager = daemon.qos_manager

    manager.tick()
    wanted = GIB * 50 // 100  # LS: memory.min = 50 % of the request, in whole pages
    assert abs(int((container / "memory.min").read_text()) - wanted) < PAGE
    assert abs(int((container / "memory.low").read_text()) - GIB * 80 // 100) < PAGE

    (container / "memory.min").write_text("0")  # kubelet or an operator
    clock = manager._clock
    manager._measure._clock = lambda: clock() + 2.0  # the reconcile interval passed
    manager.tick()
    assert abs(int((container / "memory.min").read_text()) - wanted) < PAGE
