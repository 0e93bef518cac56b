"""[strategy.memory_qos] enable keeps the pods' memory values applied: the daemon hands the
hooks' memory plan to the QoS manager (before, it passed none and the switch did nothing for
pods). The daemon is built in-process on a fake cgroup v2 tree (this host is cgroup v1, whose
kernel has no memory.min/low/high; the VM lane has the real files). kubelet is reproduced by its
records in NodeState and its own write of memory.min, which the pass must undo.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from faketree import add_cgroup, make_cgroup_tree, read_cgroup_file, write_cgroup_file

from koordnode.config import Config, from_dict
from koordnode.cri import api_pb2 as pb
from koordnode.daemon import Daemon
from support.fakeproc import make_procfs
from koordnode.model.state import CONTAINER_RUNNING, POD_READY, ContainerRecord, PodRecord

GIB = 1 << 30
POD = "/kubepods/burstable/podls1"


def _daemon(tmp_path: Path, memory_qos: bool) -> tuple[Daemon, Path, str]:
    root = make_cgroup_tree(tmp_path, "v2", cgroups=["/kubepods/burstable", "/kubepods/besteffort"])
    proc = make_procfs(tmp_path, cpus=4)
    config = from_dict(Config, {
        "cgroup": {"root": str(root), "driver": "cgroupfs", "reconcile_interval_s": 0},  # the engine's pass off
        "procfs": {"root": str(proc)},
        "admin": {"socket": str(tmp_path / "run" / "admin.sock")},
        "qos_manager": {"reconcile_interval_s": 1},
        "strategy": {"memory_qos": {"enable": memory_qos}, "cpu_suppress": {"enable": False}},
    })
    daemon = Daemon(config)
    assert daemon.qos_manager is not None, daemon.qos_error
    cid = "c" * 64
    add_cgroup(root, f"{POD}/{cid}")
    daemon.state.put_pod(PodRecord("ls1", "web", "default", "uid-ls1", {"koordinator.sh/qosClass": "LS"}, {},
                                   POD, qos_class="LS", state=POD_READY))
    # kubelet's Memory QoS puts the request into unified (memory.min); the limit is 2 GiB.
    res = pb.LinuxContainerResources(cpu_shares=1024, memory_limit_in_bytes=2 * GIB, unified={"memory.min": str(GIB)})
    daemon.state.put_container(ContainerRecord(cid, "ls1", "app", {}, {}, res, state=CONTAINER_RUNNING))
    return daemon, root, f"{POD}/{cid}"


@pytest.mark.parametrize("enable", [True, False])
def test_memory_qos_switch_keeps_pod_memory_values(tmp_path, enable):
    daemon, root, container = _daemon(tmp_path, enable)
    manager = daemon.qos_manager
    manager.tick()
    planned = str(GIB * 50 // 100)  # LS: memory.min = 50 % of the request
    if not enable:
        assert read_cgroup_file(root, container, "memory.min") == "0"  # nobody applies it
        assert "planned" not in (manager.status()["strategies"]["memory_qos"]["decision"] or {}).get("inputs", {})
        return
    assert read_cgroup_file(root, container, "memory.min") == planned
    assert read_cgroup_file(root, container, "memory.low") == str(GIB * 80 // 100)
    status = manager.status()["strategies"]["memory_qos"]
    assert status["decision"]["inputs"]["planner"] == "hooks"
    assert status["decision"]["inputs"]["planned"]["memory.min"] >= 2  # the container and its pod

    # kubelet (or an operator) writes memory.min back; the next pass restores the hooks' value.
    write_cgroup_file(root, container, "memory.min", "0")
    manager.tick()  # within the reconcile interval: left alone
    assert read_cgroup_file(root, container, "memory.min") == "0"
    clock = manager._clock
    manager._measure._clock = lambda: clock() + 2.0  # the interval passed
    manager.tick()
    assert read_cgroup_file(root, container, "memory.min") == planned
    assert manager.status()["strategies"]["memory_qos"]["last_write"]["cgroup"] == container


def test_a_node_watermark_write_does_not_fail_the_daemons_tick_observer(tmp_path):
    """The daemon's metrics observer reads the tick's writes, cgroup and sysctl alike: a
    successful vm.min_free_kbytes write beside cpu_suppress's decision must not fail the tick."""
    root = make_cgroup_tree(tmp_path, "v2", cgroups=["/kubepods/burstable", "/kubepods/besteffort"])
    proc = make_procfs(tmp_path, cpus=4)
    config = from_dict(Config, {
        "cgroup": {"root": str(root), "driver": "cgroupfs", "reconcile_interval_s": 0},
        "procfs": {"root": str(proc)},
        "admin": {"socket": str(tmp_path / "run" / "admin.sock")},
        "strategy": {"memory_qos": {"enable": True, "min_free_kbytes": 70000}},
    })
    daemon = Daemon(config)
    assert daemon.qos_manager is not None, daemon.qos_error
    report = daemon.qos_manager.tick()
    assert "cpu_suppress" in report.results
    assert (proc / "sys" / "vm" / "min_free_kbytes").read_text().strip() == "70000"
    ticks = daemon.qos_manager.status()["ticks"]
    assert ticks["errors"] == 0, ticks["last_error"]


def test_the_memory_pass_leaves_pod_values_to_a_reconcile_pass_that_runs_as_often(tmp_path):
    """With the engine's reconcile pass on at least as often ([cgroup] reconcile_interval_s <=
    [qos_manager] reconcile_interval_s), it already reads and restores every pod's values, memory
    included: the manager's memory pass plans no pod (counted) and says why; the node
    watermarks stay the manager's."""
    root = make_cgroup_tree(tmp_path, "v2", cgroups=["/kubepods/burstable", "/kubepods/besteffort"])
    proc = make_procfs(tmp_path, cpus=4)
    config = from_dict(Config, {
        "cgroup": {"root": str(root), "driver": "cgroupfs", "reconcile_interval_s": 10},
        "procfs": {"root": str(proc)},
        "admin": {"socket": str(tmp_path / "run" / "admin.sock")},
        "qos_manager": {"reconcile_interval_s": 10},
        "strategy": {"memory_qos": {"enable": True, "min_free_kbytes": 70000}, "cpu_suppress": {"enable": False}},
    })
    daemon = Daemon(config)
    assert daemon.qos is not None and daemon.qos_manager is not None, daemon.qos_error
    planned: list[object] = []
    plan = daemon.qos.memory_plan
    daemon.qos.memory_plan = lambda *a: planned.append(a) or plan(*a)  # type: ignore[method-assign]
    daemon.qos_manager.tick()
    assert planned == []
    decision = daemon.qos_manager.status()["strategies"]["memory_qos"]["decision"]
    assert "reconcile pass" in decision["inputs"]["planner"]
    assert (proc / "sys" / "vm" / "min_free_kbytes").read_text().strip() == "70000"

    # The reconcile pass slower than the memory pass: the manager plans the pods again.
    config_slow = from_dict(Config, {**{"cgroup": {"root": str(root), "driver": "cgroupfs", "reconcile_interval_s": 60}},
                                     "procfs": {"root": str(proc)},
                                     "admin": {"socket": str(tmp_path / "run2" / "admin.sock")},
                                     "qos_manager": {"reconcile_interval_s": 10},
                                     "strategy": {"cpu_suppress": {"enable": False}}})
    daemon = Daemon(config_slow)
    assert daemon.qos is not None and daemon.qos_manager is not None
    plan = daemon.qos.memory_plan
    daemon.qos.memory_plan = lambda *a: planned.append(a) or plan(*a)  # type: ignore[method-assign]
    daemon.qos_manager.tick()
    assert len(planned) == 1
    assert daemon.qos_manager.status()["strategies"]["memory_qos"]["decision"]["inputs"]["planner"] == "hooks"
