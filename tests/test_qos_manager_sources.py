"""One source of truth: the QoS manager finds pods' cgroups by `[cgroup] driver` as the QoS
engine does, and resolves `[node] reserved_cpus` given as a count as the CPU allocator does
(whole cores first). Fake v1 tree and sysfs (the topology must have SMT siblings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_qos_manager import BESTEFFORT, BURSTABLE, FakeNode

from koordnode.config import Config, ManagerSettings, from_dict
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.executor.paths import UnsafePathError, container_cgroup_path
from koordnode.model.cpu_topology import read_cpu_topology
from koordnode.policy.cpuset import reserved_cpus_from_config
from koordnode.qos.manager import QoSManager


def _config(fake: FakeNode, tmp_path: Path, **sections) -> Config:
    return from_dict(Config, {
        "cgroup": {"root": str(fake.root), **sections.pop("cgroup", {})},
        "procfs": {"root": str(fake.proc)},
        "sysfs": {"root": str(tmp_path / "sys")},
        "admin": {"socket": str(tmp_path / "admin.sock")},
        **sections,
    })


def _smt_sysfs(root: Path) -> None:
    """4 CPUs, 2 cores x 2 threads, siblings spread as on x86: core 0 = CPUs 0 and 2."""
    cpu_root = root / "devices" / "system" / "cpu"
    (cpu_root).mkdir(parents=True)
    (cpu_root / "online").write_text("0-3\n")
    for cpu in range(4):
        topo = cpu_root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text("0\n")
        (topo / "core_id").write_text(f"{cpu % 2}\n")
        (topo / "thread_siblings_list").write_text(f"{cpu % 2},{cpu % 2 + 2}\n")


def test_reserved_cpu_count_takes_whole_cores_like_the_allocator(tmp_path):
    node = FakeNode(tmp_path, "v1")
    node.ls = node.add_pod("ls1", "LS", BURSTABLE)
    node.be = node.add_pod("be1", "BE", BESTEFFORT)
    _smt_sysfs(tmp_path / "sys")
    allocator_rule, _ = reserved_cpus_from_config(2, read_cpu_topology(str(tmp_path / "sys")))
    assert allocator_rule == {0, 2}  # one whole core, not CPUs 0 and 1

    config = _config(node, tmp_path, node={"reserved_cpus": 2},
                     strategy={"cpu_suppress": {"policy": "cpuset"}})
    manager = QoSManager(ManagerSettings.of(config), node.state, CgroupExecutor(node.root), procfs_root=node.proc, clock=node.clock)
    manager.tick()
    node.advance(1.0, {node.ls: 0.5, node.be: 0.5})
    inputs = manager.tick().results["cpu_suppress"].explanation.inputs
    assert inputs["excluded"] == "0,2"
    assert inputs["pool"] == "1,3"


def test_inventory_follows_the_configured_cgroup_driver(tmp_path):
    node = FakeNode(tmp_path, "v1")
    # A cgroupfs parent whose last name ends in ".slice": "auto" would take it for systemd's
    # (the engine, honouring the driver, manages the pod; a manager on "auto" skipped it).
    parent = f"{BURSTABLE}/podls1.slice"
    node.add_pod("ls1.slice", "LS", BURSTABLE, containers={"app": 50_000})
    engine_path = container_cgroup_path(parent, "ls1.sliceapp", "cgroupfs")
    assert engine_path == f"{parent}/ls1.sliceapp"
    with pytest.raises(UnsafePathError):  # "auto" reads it as systemd's and refuses it
        container_cgroup_path(parent, "ls1.sliceapp", "auto")

    config = _config(node, tmp_path, cgroup={"driver": "cgroupfs"},
                     strategy={"cpu_burst": {"enable": True}, "cpu_suppress": {"enable": False}})
    manager = QoSManager(ManagerSettings.of(config), node.state, CgroupExecutor(node.root), procfs_root=node.proc, clock=node.clock)
    report = manager.tick()
    burst_cgroups = {r.write.cgroup for r in report.writes if r.write.resource == "cpu.cfs_burst_us"}
    assert burst_cgroups == {engine_path, parent}
    assert all(r.ok for r in report.writes if r.write.resource == "cpu.cfs_burst_us")
    assert not manager.status()["ticks"]["last"]["skipped_pods"]
