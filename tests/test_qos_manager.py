"""The QoS manager on fake v1 and v2 trees: ticks, writes through the executor, status,
reconfigure, pressure wake-ups, evictions, and forgetting pods that went away."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
from faketree import add_cgroup, make_cgroup_tree, read_cgroup_file, write_cgroup_file

from koordnode.config import CgroupConfig, from_dict
from koordnode.cri import api_pb2 as pb
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.policy.plan import CgroupWrite
from koordnode.model.qos_class import QoSClass
from koordnode.config.components import ManagerSettings
from koordnode.qos.manager import QoSManager
from koordnode.config.qos_manager import QoSManagerConfig
from koordnode.config.strategies import BeEvictConfig, BeMemoryConfig, CpuBurstConfig, CpuSuppressConfig, StrategyConfig
from support.fakeproc import format_pressure, make_procfs, write_meminfo, write_proc_stat
from koordnode.model.kubelet_layout import paths_of
from koordnode.qos.inventory import build_inventory
from koordnode.model.state import CONTAINER_EXITED, CONTAINER_RUNNING, ContainerRecord, NodeState, PodRecord

CPUS = 4
BURSTABLE = "/kubepods/burstable"
BESTEFFORT = "/kubepods/besteffort"


class FakeNode:
    """A fake kernel tree plus NodeState, and a clock that advances the counters."""

    def __init__(self, tmp_path: Path, version: str = "v1", anolis: bool = False) -> None:
        self.version = version
        self.root = make_cgroup_tree(tmp_path, version, anolis=anolis, cgroups=[BURSTABLE, BESTEFFORT])
        self.proc = make_procfs(tmp_path, cpus=CPUS)
        self.state = NodeState()
        self.now = 0.0
        self.usage_ns: dict[str, int] = {}
        self.pressure_us: dict[str, int] = {}
        self.busy = self.idle = 0
        self.add_psi("/kubepods/burstable")

    def clock(self) -> float:
        return self.now

    # ---- layout
    def add_pod(self, sid: str, qos: str | None, parent: str, containers: dict[str, int] | None = None,
                labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> str:
        cgroup = f"{parent}/pod{sid}"
        add_cgroup(self.root, cgroup)
        self.state.put_pod(PodRecord(sid, f"pod-{sid}", "default", f"uid-{sid}", labels or {}, annotations or {},
                                     cgroup, qos_class=qos))
        for name, quota in (containers or {"app": 0}).items():
            cid = f"{sid}{name}"
            add_cgroup(self.root, f"{cgroup}/{cid}")
            res = pb.LinuxContainerResources(cpu_quota=quota, cpu_period=100_000 if quota else 0)
            self.state.put_container(ContainerRecord(cid, sid, name, {}, {}, res, state=CONTAINER_RUNNING))
        return cgroup

    def add_psi(self, cgroup: str) -> None:
        if self.version == "v1":
            directory = self.root / "unified" / cgroup.strip("/")
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "cgroup.procs").write_text("")
        self.pressure_us[cgroup] = 0
        self._write_pressure(cgroup)

    def _write_pressure(self, cgroup: str) -> None:
        text = format_pressure(self.pressure_us[cgroup])
        if self.version == "v1":
            (self.root / "unified" / cgroup.strip("/") / "cpu.pressure").write_text(text)
        else:
            write_cgroup_file(self.root, cgroup, "cpu.pressure", text)

    # ---- time passes
    def advance(self, seconds: float, usage: dict[str, float], node_busy: float | None = None,
                pressure: dict[str, float] | None = None) -> None:
        """`usage`: pod cgroup -> CPUs used during the interval; pressure: cgroup -> stall fraction."""
        self.now += seconds
        totals: dict[str, float] = {}
        for cgroup, cpus in usage.items():
            # a pod's usage counts in every ancestor, as cpuacct is hierarchical
            parts = cgroup.strip("/").split("/")
            for depth in range(1, len(parts) + 1):
                ancestor = "/" + "/".join(parts[:depth])
                totals[ancestor] = totals.get(ancestor, 0.0) + cpus
        for cgroup, cpus in totals.items():
            self.usage_ns[cgroup] = self.usage_ns.get(cgroup, 0) + int(cpus * seconds * 1e9)
            self._write_usage(cgroup, self.usage_ns[cgroup])
        busy = node_busy if node_busy is not None else sum(usage.values()) + 0.2
        # per-CPU jiffies (USER_HZ = 100), the busy time spread evenly
        self.busy += round(busy / CPUS * seconds * 100)
        self.idle += round((CPUS - busy) / CPUS * seconds * 100)
        write_proc_stat(self.proc, [[self.busy, 0, 0, self.idle, 0]] * CPUS)
        for cgroup, fraction in (pressure or {}).items():
            self.pressure_us[cgroup] += int(fraction * seconds * 1e6)
            self._write_pressure(cgroup)

    def _write_usage(self, cgroup: str, ns: int) -> None:
        if self.version == "v1":
            write_cgroup_file(self.root, cgroup, "cpuacct.usage", str(ns), controller="cpuacct")
        else:
            write_cgroup_file(self.root, cgroup, "cpu.stat",
                              f"usage_usec {ns // 1000}\nuser_usec 0\nsystem_usec 0\nnr_periods 0\n"
                              f"nr_throttled 0\nthrottled_usec 0\n")

    def be_quota(self) -> int:
        if self.version == "v1":
            return int(read_cgroup_file(self.root, BESTEFFORT, "cpu.cfs_quota_us"))
        quota = read_cgroup_file(self.root, BESTEFFORT, "cpu.max").split()[0]
        return -1 if quota == "max" else int(quota)


def settings(**changes) -> ManagerSettings:
    strategy = StrategyConfig(**{k: v for k, v in changes.items() if k in {f.name for f in dataclasses.fields(StrategyConfig)}})
    manager = QoSManagerConfig(**{k: v for k, v in changes.items() if k in {f.name for f in dataclasses.fields(QoSManagerConfig)}})
    return ManagerSettings(strategy, manager)


def make_manager(node: FakeNode, config=None, **kwargs) -> QoSManager:
    return QoSManager(config or settings(), node.state, CgroupExecutor(node.root), procfs_root=node.proc,
                      clock=node.clock, **kwargs)


@pytest.fixture(params=["v1", "v2"])
def node(request, tmp_path) -> FakeNode:
    fake = FakeNode(tmp_path, request.param)
    fake.ls = fake.add_pod("ls1", "LS", BURSTABLE)
    fake.be = fake.add_pod("be1", "BE", BESTEFFORT)
    return fake


# ------------------------------------------------------------------------ the BE tier quota


def test_be_tier_quota_follows_ls_load(node):
    manager = make_manager(node)
    first = manager.tick()
    assert "warming up" in first.results["cpu_suppress"].explanation.reason
    assert node.be_quota() == -1

    # LS busy with 2 CPUs: 4 x 65% - 2.0 - 0.2 (system) = 0.4 CPU for BE
    node.advance(1.0, {node.ls: 2.0, node.be: 1.0})
    manager.tick()
    assert node.be_quota() == 40_000
    # LS busier: shrinks at once to the floor
    node.advance(1.0, {node.ls: 2.6, node.be: 0.5})
    manager.tick()
    assert node.be_quota() == 2000
    # LS idles: BE comes back by at most 10% of the node (0.4 CPU) per tick, up to the budget
    seen = []
    for _ in range(8):
        node.advance(1.0, {node.ls: 0.0, node.be: 0.6})
        manager.tick()
        seen.append(node.be_quota())
    assert seen[:5] == [42_000, 82_000, 122_000, 162_000, 202_000]
    # grown to its target (2.6 - 0.2 system) with LS quiet: the quota is lifted, and stays so
    assert seen[5:] == [-1, -1, -1]


def test_pressure_on_ls_shrinks_be_further(node):
    manager = make_manager(node, settings(cpu_suppress=CpuSuppressConfig(ls_quiet_percent=0)))
    manager.tick()
    node.advance(1.0, {node.ls: 0.5, node.be: 1.1})
    manager.tick()
    calm = node.be_quota()
    assert calm == 190_000  # 2.6 - 0.5 - 0.2
    node.advance(1.0, {node.ls: 0.5, node.be: 1.1}, pressure={BURSTABLE: 0.9})
    report = manager.tick()
    inputs = report.results["cpu_suppress"].explanation.inputs
    assert inputs["ls_pressure_percent"] == pytest.approx(90.0)
    assert inputs["pressure_ratio"] == pytest.approx(0.3 - 0.2 * 10 / 15, abs=1e-3)  # 80 -> 0.3, 95 -> 0.1
    assert node.be_quota() == round(1.9 * (0.3 - 0.2 * 10 / 15) * 100_000)


def test_status_explains_the_last_decision_and_write(node):
    manager = make_manager(node)
    manager.tick()
    node.advance(1.0, {node.ls: 2.0, node.be: 1.0})
    manager.tick()
    status = manager.status()
    suppress = status["strategies"]["cpu_suppress"]
    assert suppress["enabled"] and suppress["policy"] == "cfs_quota"
    assert suppress["decision"]["inputs"]["ls_used_cpus"] == pytest.approx(2.0)
    assert suppress["decision"]["inputs"]["node_cpus"] == CPUS
    assert "BE budget 0.40 CPUs" in suppress["decision"]["reason"]
    assert suppress["last_write"]["value"] == 40_000
    assert suppress["last_write"]["cgroup"] == BESTEFFORT and suppress["last_write"]["status"] == "written"
    assert suppress["last_write"]["at"] > 0
    assert status["trigger_mode"] == "not running"
    assert status["ticks"]["count"] == 2
    assert status["be_tier"] == BESTEFFORT
    assert status["node"]["node/ls_used_cpus"]["last"] == pytest.approx(2.0)
    assert status["collector"]["errors"] == 0
    json.dumps(status)  # the admin socket sends it as JSON


def test_disabling_restores_the_quota(node):
    manager = make_manager(node)
    manager.tick()
    node.advance(1.0, {node.ls: 2.0, node.be: 1.0})
    manager.tick()
    assert node.be_quota() == 40_000
    manager.reconfigure(settings(cpu_suppress=CpuSuppressConfig(enable=False)))
    node.advance(1.0, {node.ls: 2.0, node.be: 1.0})
    report = manager.tick()
    assert node.be_quota() == -1
    assert "cpu_suppress" not in report.results and "cpu_suppress.restore" in report.results
    node.advance(1.0, {node.ls: 2.0, node.be: 1.0})
    assert manager.tick().writes == []  # restored once, then left alone
    assert manager.status()["strategies"]["cpu_suppress"]["enabled"] is False


def test_cpuset_policy_writes_tier_pods_and_containers(tmp_path):
    node = FakeNode(tmp_path, "v1")
    ls = node.add_pod("ls1", "LS", BURSTABLE)
    be = node.add_pod("be1", "BE", BESTEFFORT)
    # A BE-labelled Burstable pod, outside the tier: the strategy is the one writer of every BE
    # cpuset while it confines BE (the engine only carries the set in CRI requests).
    labelled = node.add_pod("be2", "BE", BURSTABLE)
    manager = make_manager(node, settings(cpu_suppress=CpuSuppressConfig(policy="cpuset")))
    manager.tick()
    node.advance(1.0, {ls: 1.5, be: 1.0})
    manager.tick()
    # budget 2.6 - 1.5 - 0.2 = 0.9 -> ceil 1, min 2 CPUs: the highest two
    for cgroup in (BESTEFFORT, be, f"{be}/be1app", labelled, f"{labelled}/be2app"):
        assert read_cgroup_file(node.root, cgroup, "cpuset.cpus") == "2-3"
    assert manager.be_cpuset() == frozenset({2, 3})
    manager.reconfigure(settings(cpu_suppress=CpuSuppressConfig(policy="cpuset", enable=False)))
    manager.tick()
    assert read_cgroup_file(node.root, BESTEFFORT, "cpuset.cpus") == "0-3"
    assert manager.be_cpuset() is None


# ------------------------------------------------------------------------ other strategies


def test_cpu_burst_through_the_manager(tmp_path):
    node = FakeNode(tmp_path, "v1")
    ls = node.add_pod("ls1", "LS", BURSTABLE, containers={"app": 100_000})
    manager = make_manager(node, settings(cpu_suppress=CpuSuppressConfig(enable=False),
                                          cpu_burst=CpuBurstConfig(enable=True)))
    container = f"{ls}/ls1app"
    write_cgroup_file(node.root, container, "cpu.stat", "nr_periods 10\nnr_throttled 0\nthrottled_time 0\n")
    manager.tick()
    assert read_cgroup_file(node.root, container, "cpu.cfs_burst_us") == "100000"
    assert read_cgroup_file(node.root, ls, "cpu.cfs_burst_us") == "100000"
    node.advance(1.0, {ls: 1.0})
    write_cgroup_file(node.root, container, "cpu.stat", "nr_periods 20\nnr_throttled 6\nthrottled_time 900\n")
    manager.tick()
    assert read_cgroup_file(node.root, container, "cpu.cfs_quota_us") == "120000"
    assert read_cgroup_file(node.root, ls, "cpu.cfs_quota_us") == "120000"
    decision = manager.status()["strategies"]["cpu_burst"]["decision"]
    assert decision["inputs"]["throttled_pods"] == 1
    manager.reconfigure(settings(cpu_suppress=CpuSuppressConfig(enable=False)))
    manager.tick()
    assert read_cgroup_file(node.root, container, "cpu.cfs_quota_us") == "100000"
    assert read_cgroup_file(node.root, container, "cpu.cfs_burst_us") == "0"


def test_memory_qos_reconciles_the_hooks_plan_and_node_watermarks(tmp_path):
    node = FakeNode(tmp_path, "v2")
    ls = node.add_pod("ls1", "LS", BURSTABLE)
    plan = [CgroupWrite(ls, "memory.min", 64 << 20, "LS pod"), CgroupWrite(ls, "memory.high", 1 << 30, "LS pod")]
    config = settings(cpu_suppress=CpuSuppressConfig(enable=False),
                      memory_qos=dataclasses.replace(StrategyConfig().memory_qos, min_free_kbytes=90000),
                      reconcile_interval_s=10.0)
    manager = make_manager(node, config, memory_plan=lambda: plan)
    manager.tick()
    assert read_cgroup_file(node.root, ls, "memory.min") == str(64 << 20)
    assert (node.proc / "sys" / "vm" / "min_free_kbytes").read_text().strip() == "90000"
    write_cgroup_file(node.root, ls, "memory.min", "0")  # someone changed it
    node.advance(5.0, {})
    manager.tick()
    assert read_cgroup_file(node.root, ls, "memory.min") == "0"  # not due yet
    node.advance(5.0, {})
    manager.tick()
    assert read_cgroup_file(node.root, ls, "memory.min") == str(64 << 20)
    assert manager.status()["strategies"]["memory_qos"]["writes"]["written"] >= 3


def test_be_eviction_calls_the_runtime(tmp_path):
    node = FakeNode(tmp_path, "v1")
    node.add_pod("ls1", "LS", BURSTABLE)
    be_small = node.add_pod("be1", "BE", BESTEFFORT)
    be_big = node.add_pod("be2", "BE", BESTEFFORT)
    for cgroup, cid, size in ((be_small, "be1app", 1 << 30), (be_big, "be2app", 3 << 30)):
        write_cgroup_file(node.root, f"{cgroup}/{cid}", "memory.usage_in_bytes", str(size))
        write_cgroup_file(node.root, f"{cgroup}/{cid}", "memory.stat",
                          f"total_rss {size}\ntotal_cache 0\ntotal_inactive_file 0\n")
    write_meminfo(node.proc, total_kb=16 << 20, available_kb=4 << 20)  # 75% used
    stopped: list[tuple[str, str]] = []

    async def evict(container_id: str, reason: str) -> None:
        stopped.append((container_id, reason))

    config = settings(cpu_suppress=CpuSuppressConfig(enable=False), be_evict=BeEvictConfig(enable=True),
                      tick_ms=50, psi_triggers=False, psi_poll_ms=0)
    manager = make_manager(node, config, evict=evict)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(manager.run(stop))
        for _ in range(100):
            await asyncio.sleep(0.02)
            if stopped:
                break
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())
    # release 75% - 68% of 16 GiB = 1.12 GiB: the biggest BE container is enough
    assert [cid for cid, _ in stopped] == ["be2app"]
    assert "node memory 75.0% >= 70%" in stopped[0][1]
    evictions = manager.status()["strategies"]["be_evict"]["evictions"]
    assert evictions["total"] == 1 and evictions["by_cause"] == {"memory": 1}
    assert evictions["recent"][0]["ok"] is True


# ------------------------------------------------------------------------ BE memory budget


def test_be_memory_bounds_the_be_tier_and_unlimited_be_pods(node):
    gib = 1 << 30
    usage = "memory.current" if node.version == "v2" else "memory.usage_in_bytes"
    for cgroup, size in (("/kubepods", 6 * gib), (BESTEFFORT, 2 * gib)):
        write_cgroup_file(node.root, cgroup, usage, str(size))
        write_cgroup_file(node.root, cgroup, "memory.stat",
                          f"anon {size}\nfile 0\ninactive_file 0\n" if node.version == "v2"
                          else f"total_rss {size}\ntotal_cache 0\ntotal_inactive_file 0\n")
    write_meminfo(node.proc, total_kb=16 << 20, available_kb=9 << 20)  # 7 GiB used
    manager = make_manager(node, settings(be_memory=BeMemoryConfig(budget_percent=50)))
    manager.tick()
    budget = 8 * gib - 4 * gib - gib  # 50% - LS (6 - 2 GiB) - the system (7 - 6 GiB)
    pod = node.be
    if node.version == "v2":
        assert read_cgroup_file(node.root, BESTEFFORT, "memory.high") == str(budget)
        assert read_cgroup_file(node.root, BESTEFFORT, "memory.max") == str(budget)
        assert read_cgroup_file(node.root, pod, "memory.high") == str(budget * 70 // 100)
    else:
        assert read_cgroup_file(node.root, BESTEFFORT, "memory.soft_limit_in_bytes") == str(budget)
        assert read_cgroup_file(node.root, BESTEFFORT, "memory.limit_in_bytes") == str(budget)
        assert read_cgroup_file(node.root, pod, "memory.soft_limit_in_bytes") == str(budget * 70 // 100)
    status = manager.status()["strategies"]["be_memory"]
    assert status["budget_bytes"] == budget and status["pod_bounds"] == {"be1": budget * 70 // 100}
    # Disabled by a reload: the bounds go.
    manager.reconfigure(settings(be_memory=BeMemoryConfig(enable=False)))
    node.advance(1.0, {node.ls: 0.1})
    manager.tick()
    cap = "memory.max" if node.version == "v2" else "memory.limit_in_bytes"
    assert read_cgroup_file(node.root, BESTEFFORT, cap) in ("max", "-1", str(2**63 - 4096))


# ------------------------------------------------------------------------ the loop


def test_run_ticks_and_wakes_on_pressure(tmp_path):
    node = FakeNode(tmp_path, "v1")
    node.add_pod("ls1", "LS", BURSTABLE)
    node.add_pod("be1", "BE", BESTEFFORT)
    # A long tick: any tick after the first ones must have been woken by pressure.
    config = settings(tick_ms=30_000, psi_poll_ms=20)
    manager = QoSManager(config, node.state, CgroupExecutor(node.root), procfs_root=node.proc)

    async def scenario() -> dict:
        stop = asyncio.Event()
        task = asyncio.create_task(manager.run(stop))
        await asyncio.sleep(0.3)
        status = manager.status()
        assert status["ticks"]["count"] == 1
        # fake files are not kernel pressure files: the watch polls instead, and says why
        assert status["trigger_mode"].startswith("polling (EPERM: not a kernel pressure file")
        assert status["pressure_watch"]["armed"] == [BURSTABLE]
        node.pressure_us[BURSTABLE] += 300_000  # 300 ms of LS stall
        node._write_pressure(BURSTABLE)
        for _ in range(50):
            await asyncio.sleep(0.02)
            if manager.status()["ticks"]["count"] > 1:
                break
        status = manager.status()
        stop.set()
        await asyncio.wait_for(task, 5)
        return status

    status = asyncio.run(scenario())
    assert status["ticks"]["count"] == 2
    assert status["ticks"]["woken_by_pressure"] == 1
    assert status["ticks"]["last"]["woken_by"] == f"pressure:{BURSTABLE}"
    assert status["pressure_watch"]["wakeups"] == 1


def test_pods_that_go_away_are_forgotten(node):
    manager = make_manager(node)
    manager.tick()
    node.advance(1.0, {node.ls: 1.0, node.be: 1.0})
    manager.tick()
    assert "pod/be1/cpu" in manager.history
    open_before = manager.collector.reader.open_count
    node.state.set_container_state("be1app", CONTAINER_EXITED)
    node.state.remove_pod("be1")
    node.advance(1.0, {node.ls: 1.0})
    manager.tick()
    assert "pod/be1/cpu" not in manager.history
    assert manager.forgets(node.be)
    # descriptors are released by the sweep (every reconcile interval) once a whole interval
    # passed without reading them
    for _ in range(2):
        node.advance(10.0, {node.ls: 1.0})
        manager.tick()
    assert manager.collector.reader.open_count < open_before


def test_a_malformed_file_does_not_stop_the_tick(node):
    manager = make_manager(node)
    manager.tick()
    node.advance(1.0, {node.ls: 2.0, node.be: 1.0})
    if node.version == "v1":
        write_cgroup_file(node.root, node.be, "cpuacct.usage", "garbage", controller="cpuacct")
    else:
        write_cgroup_file(node.root, node.be, "cpu.stat", "garbage")
    manager.tick()
    assert node.be_quota() == 40_000
    assert manager.status()["collector"]["errors"] == 1


# ------------------------------------------------------------------------ inventory and config


def test_inventory_classes_and_tiers(tmp_path):
    state = NodeState()
    state.put_pod(PodRecord("g", "g", "ns", "u1", {}, {}, "/kubepods/podg"))
    state.put_pod(PodRecord("b", "b", "ns", "u2", {}, {}, "kubepods-besteffort-podb.slice"))
    state.put_pod(PodRecord("l", "l", "ns", "u3", {"koordinator.sh/qosClass": "LSE"}, {}, "/kubepods/burstable/podl"))
    state.put_pod(PodRecord("x", "x", "ns", "u4", {}, {}, ""))
    inventory = build_inventory(state)
    classes = {p.sandbox_id: p.qos_class for p in inventory.pods}
    assert classes == {"g": QoSClass.LSR, "b": QoSClass.BE, "l": QoSClass.LSE}
    assert {p.sandbox_id: p.cgroup for p in inventory.pods}["b"] == \
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podb.slice"
    assert len(inventory.skipped) == 1 and inventory.skipped[0].startswith("ns/x")
    assert paths_of("auto", "/kubepods").tiers == {"besteffort": BESTEFFORT, "burstable": BURSTABLE,
                                                   "be_group": "/kubepods/koordnode_be"}
    assert paths_of("auto", "/kubepods.slice").besteffort == "/kubepods.slice/kubepods-besteffort.slice"
    assert paths_of("cgroupfs", "/koordnode-test-ab/kubepods").burstable == "/koordnode-test-ab/kubepods/burstable"


def test_configured_kubepods_root(tmp_path):
    node = FakeNode(tmp_path, "v1")
    prefix = "/koordnode-test-x1/kubepods"
    for tier in ("besteffort", "burstable"):
        add_cgroup(node.root, f"{prefix}/{tier}")
    node.add_psi(f"{prefix}/burstable")
    ls = node.add_pod("ls1", "LS", f"{prefix}/burstable")
    be = node.add_pod("be1", "BE", f"{prefix}/besteffort")
    manager = make_manager(node, settings(kubepods_cgroup=prefix))
    assert manager.be_tier == f"{prefix}/besteffort"
    manager.tick()
    node.advance(1.0, {ls: 2.0, be: 1.0})
    manager.tick()
    assert read_cgroup_file(node.root, f"{prefix}/besteffort", "cpu.cfs_quota_us") == "40000"
    assert read_cgroup_file(node.root, BESTEFFORT, "cpu.cfs_quota_us") == "-1"


def test_config_sections_load_from_toml_tables():
    loaded = from_dict(ManagerSettings, {
        "strategy": {
            "cpu_suppress": {"policy": "cpuset", "threshold_percent": 70,
                             "pressure_curve": [[30, 1.0], [90, 0.2]]},
            "be_evict": {"enable": True, "memory_threshold_percent": 80},
        },
        "qos_manager": {"tick_ms": 500, "kubepods_cgroup": "/kubepods.slice", "psi_window_us": 2_000_000},
    })
    assert loaded.strategy.cpu_suppress.policy == "cpuset"
    assert loaded.strategy.cpu_suppress.pressure_curve == ((30.0, 1.0), (90.0, 0.2))
    assert loaded.strategy.be_evict.memory_threshold_percent == 80.0
    assert loaded.strategy.cpu_burst == CpuBurstConfig()
    assert loaded.qos_manager.tick_ms == 500


@pytest.mark.parametrize("raw, error", [
    ({"strategy": {"cpu_suppress": {"policy": "quota"}}}, "strategy.cpu_suppress.policy"),
    ({"strategy": {"cpu_suppress": {"pressure_curve": [[80, 0.3], [40, 1.0]]}}}, "pressures must increase"),
    ({"strategy": {"cpu_suppress": {"pressure_curve": [[40, 1.5]]}}}, "ratio 1.5 is outside [0, 1]"),
    ({"strategy": {"cpu_burst": {"enabled": True}}}, 'did you mean "enable"'),
    ({"qos_manager": {"tick_ms": 10}}, "qos_manager.tick_ms"),
    ({"qos_manager": {"psi_stall_us": 900_000, "psi_window_us": 500_000}}, "psi_stall_us: must not exceed"),
    ({"qos_manager": {"kubepods_cgroup": "kubepods"}}, "absolute cgroup path"),
])
def test_config_errors_name_their_key(raw, error):
    from koordnode.config import ConfigError

    with pytest.raises(ConfigError) as problem:
        from_dict(ManagerSettings, raw)
    assert error in str(problem.value)


def test_a_pressure_tick_sees_the_load_as_it_is_now(tmp_path):
    node = FakeNode(tmp_path, "v1")
    ls = node.add_pod("ls1", "LS", BURSTABLE)
    be = node.add_pod("be1", "BE", BESTEFFORT)

    def sleep(seconds: float) -> None:  # the wake sample: LS is spinning on 3 CPUs by now
        node.advance(seconds, {ls: 3.0, be: 0.2}, pressure={BURSTABLE: 0.5})

    manager = make_manager(node, settings(cpu_suppress=CpuSuppressConfig(ls_quiet_percent=0)), sleep=sleep)
    manager.tick()
    node.advance(1.0, {ls: 0.2, be: 1.0})
    manager.tick()
    assert node.be_quota() == 220_000
    node.advance(0.5, {ls: 0.2, be: 1.0})  # calm since the last tick...
    report = manager.tick(woken_by=f"pressure:{BURSTABLE}")  # ...until the step that woke us
    inputs = report.results["cpu_suppress"].explanation.inputs
    assert inputs["ls_used_cpus"] == pytest.approx(3.0, abs=0.01)
    assert inputs["ls_pressure_percent"] == pytest.approx(50.0, abs=0.5)
    assert node.be_quota() == 2000
    assert manager.status()["ticks"]["woken_by_pressure"] == 1
    # a regular tick does not sample
    node.advance(1.0, {ls: 3.0, be: 0.0})
    calls = []
    manager._measure.sleep = calls.append
    manager.tick()
    assert calls == []


def test_kubepods_cgroup_follows_the_driver(tmp_path):
    node = FakeNode(tmp_path, "v1")
    executor = CgroupExecutor(node.root)

    def manager_for(driver: str | None, kubepods: str = "") -> QoSManager:
        base = settings(kubepods_cgroup=kubepods)
        config = base if driver is None else dataclasses.replace(base, cgroup=CgroupConfig(driver=driver))
        return QoSManager(config, node.state, executor, procfs_root=node.proc, clock=node.clock)

    assert manager_for(None).be_tier == BESTEFFORT  # auto, no kubepods.slice: cgroupfs layout
    assert manager_for("systemd").be_tier == "/kubepods.slice/kubepods-besteffort.slice"
    assert manager_for("systemd", "/custom/kubepods").be_tier == "/custom/kubepods/besteffort"
    auto = manager_for(None)
    add_cgroup(node.root, "/kubepods.slice/kubepods-besteffort.slice")
    auto.tick()  # kubelet created its slice after we started: followed
    assert auto.kubepods == "/kubepods.slice"
    assert auto.be_tier == "/kubepods.slice/kubepods-besteffort.slice"


def test_started_with_suppression_off_a_leftover_quota_is_lifted(node):
    # An earlier run (suppression on) left the BE tier at its floor; this one starts with it off.
    if node.version == "v1":
        write_cgroup_file(node.root, BESTEFFORT, "cpu.cfs_quota_us", "2000")
    else:
        write_cgroup_file(node.root, BESTEFFORT, "cpu.max", "2000 100000")
    assert node.be_quota() == 2000
    manager = make_manager(node, settings(cpu_suppress=CpuSuppressConfig(enable=False)))
    manager.tick()
    assert node.be_quota() == -1


def test_be_quota_goes_to_the_idle_group_only_while_every_be_pod_is_in_it(tmp_path):
    """The idle BE group exists (the hooks made it), but a BE pod in kubelet's besteffort tier
    (created while koordnode was away, or where the group could not be used) is out of its reach:
    the quota stays on the tier until every BE pod is in the group."""
    node = FakeNode(tmp_path, "v1")
    group = "/kubepods/koordnode_be"
    add_cgroup(node.root, group)
    ls = node.add_pod("ls1", "LS", BURSTABLE)
    be = node.add_pod("be1", "BE", BESTEFFORT)
    config = dataclasses.replace(settings(), cgroup=CgroupConfig(be_idle_group=True))
    manager = make_manager(node, config)
    manager.tick()
    assert manager.be_tier == BESTEFFORT
    node.advance(1.0, {ls: 2.0, be: 1.0})
    manager.tick()
    assert node.be_quota() == 40_000
    assert read_cgroup_file(node.root, group, "cpu.cfs_quota_us") == "-1"
    # The BE pod goes (kubelet removed it); a new one starts in the group: the quota follows it.
    node.state.remove_pod("be1")
    node.add_pod("be2", "BE", group)
    manager.tick()
    assert manager.be_tier == group


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_an_idle_be_group_gets_the_idle_group_threshold(tmp_path, version):
    """Every BE pod in koordnode's BE group (cpu.idle = 1, as the hooks make it): the budget
    uses idle_group_threshold_percent (95%), not threshold_percent (65%); an LS step still
    pulls the group's quota down at once; a group someone made not idle (and not at the lowest
    weight) gets 65% and is left to the reconcile pass. (The quiet state is off here.)"""
    node = FakeNode(tmp_path, version)
    group = "/kubepods/koordnode_be"
    add_cgroup(node.root, group)
    write_cgroup_file(node.root, group, "cpu.idle", "1")
    ls = node.add_pod("ls1", "LS", BURSTABLE)
    be = node.add_pod("be1", "BE", group)
    config = dataclasses.replace(settings(cpu_suppress=CpuSuppressConfig(ls_quiet_percent=0)),
                                 cgroup=CgroupConfig(be_idle_group=True))
    manager = make_manager(node, config)

    def group_quota() -> int:
        if version == "v1":
            return int(read_cgroup_file(node.root, group, "cpu.cfs_quota_us"))
        quota = read_cgroup_file(node.root, group, "cpu.max").split()[0]
        return -1 if quota == "max" else int(quota)

    manager.tick()
    assert manager.be_tier == group
    # LS 0.5 CPU: 4 x 95% - 0.5 - 0.2 (system) = 3.1 CPUs for BE (at 65%: 1.9)
    node.advance(1.0, {ls: 0.5, be: 2.9})
    report = manager.tick()
    assert group_quota() == 310_000
    explanation = report.results["cpu_suppress"].explanation
    assert explanation.inputs["be_idle"] is True and explanation.inputs["threshold_percent"] == 95.0
    # LS steps to 3.7 busy CPUs: nothing left for BE, the quota falls to its floor at once
    node.advance(1.0, {ls: 3.7, be: 0.1})
    manager.tick()
    assert group_quota() == 2000
    # The group is no longer idle and not at the lowest weight (someone wrote cpu.idle = 0; the
    # kernel's weight is back to the default): BE does not yield in the kernel, threshold_percent
    # applies again, and the manager leaves the group to the hooks' reconcile pass (which
    # restores it through systemd where systemd owns it). LS idle: 4 x 65% - 0.2 = 2.4 CPUs.
    write_cgroup_file(node.root, group, "cpu.idle", "0")
    for _ in range(8):
        node.advance(1.0, {ls: 0.0, be: 2.0})
        report = manager.tick()
    assert group_quota() == 240_000
    assert report.results["cpu_suppress"].explanation.inputs["be_idle"] is False
    assert read_cgroup_file(node.root, group, "cpu.idle") == "0"
    # Idle again: grows on towards 4 x 95% - 0.2 = 3.6 CPUs.
    write_cgroup_file(node.root, group, "cpu.idle", "1")
    for _ in range(4):
        node.advance(1.0, {ls: 0.0, be: 2.4})
        manager.tick()
    assert group_quota() == 360_000


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_be_group_is_unthrottled_and_not_idle_while_ls_is_quiet(tmp_path, version):
    """Defaults: while LS is quiet the group runs without quota and not idle at the lowest
    weight (v1 cpu.shares 2, v2 cpu.weight 1); an LS step throttles and idles it in the tick
    that sees it; LS quiet again, it is lifted once the quota has grown back to its target."""
    node = FakeNode(tmp_path, version)
    group = "/kubepods/koordnode_be"
    add_cgroup(node.root, group)
    write_cgroup_file(node.root, group, "cpu.idle", "1")
    write_cgroup_file(node.root, group, "cpu.weight" if version == "v2" else "cpu.shares",
                      "100" if version == "v2" else "1024")
    ls = node.add_pod("ls1", "LS", BURSTABLE)
    be = node.add_pod("be1", "BE", group)
    manager = make_manager(node, dataclasses.replace(settings(), cgroup=CgroupConfig(be_idle_group=True)))
    weight_file = "cpu.weight" if version == "v2" else "cpu.shares"

    def group_state() -> tuple[str, str, str]:
        quota = (read_cgroup_file(node.root, group, "cpu.cfs_quota_us") if version == "v1"
                 else read_cgroup_file(node.root, group, "cpu.max").split()[0])
        return (quota, read_cgroup_file(node.root, group, "cpu.idle"),
                read_cgroup_file(node.root, group, weight_file))

    unthrottled = "-1" if version == "v1" else "max"
    lowest = "1" if version == "v2" else "2"
    manager.tick()
    node.advance(1.0, {ls: 0.2, be: 3.6})  # LS 5% of the node
    report = manager.tick()
    assert group_state() == (unthrottled, "0", lowest)
    assert report.results["cpu_suppress"].explanation.inputs["ls_quiet"] is True
    node.advance(1.0, {ls: 0.2, be: 3.6})
    assert manager.tick().results["cpu_suppress"].writes == ()  # already so: nothing written
    # LS steps to 3.7 busy CPUs: floor quota and idle in the same tick
    node.advance(1.0, {ls: 3.7, be: 0.2})
    manager.tick()
    assert group_state()[:2] == ("2000", "1")
    # LS quiet again: the quota grows (idle) and is lifted once at the target, 4 x 95% - 0.2 - 0.2
    seen = []
    for _ in range(12):
        node.advance(1.0, {ls: 0.2, be: 3.0})
        manager.tick()
        seen.append(group_state())
    lifted = seen.index((unthrottled, "0", lowest))
    assert lifted >= 8 and all(state[1] == "1" for state in seen[:lifted])
    assert seen[lifted:] == [(unthrottled, "0", lowest)] * (len(seen) - lifted)


# ------------------------------------------------------------------------ cost: counted, not timed


def test_regular_ticks_do_not_wake_the_event_loop(tmp_path):
    """The tick thread keeps its own schedule: once the watches have their targets, a tick that
    changed nothing for the loop schedules nothing on it (before: every tick went through the
    loop, submitted to a pool and came back with a thread-safe callback)."""
    node = FakeNode(tmp_path, "v1")
    node.add_pod("ls1", "LS", BURSTABLE)
    node.add_pod("be1", "BE", BESTEFFORT)
    config = settings(tick_ms=20, psi_triggers=False, psi_poll_ms=0, usage_wake_cpu_ms=0)
    manager = QoSManager(config, node.state, CgroupExecutor(node.root), procfs_root=node.proc)
    handed: list[object] = []

    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        real = loop.call_soon_threadsafe

        def counting(callback, *args, **kwargs):  # noqa: ANN001, ANN202 - a spy on the loop
            handed.append(callback)
            return real(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        stop = asyncio.Event()
        task = asyncio.create_task(manager.run(stop))
        for _ in range(200):
            await asyncio.sleep(0.02)
            if manager.status()["ticks"]["count"] >= 8:
                break
        stop.set()
        await asyncio.wait_for(task, 5)
        return manager.status()["ticks"]["count"]

    ticks = asyncio.run(scenario())
    assert ticks >= 8
    assert len(handed) == 1, handed  # the first tick's targets for the watches, then nothing


def test_an_unchanged_node_state_reuses_the_inventory_and_forgets_nothing(node):
    manager = make_manager(node)
    calls: list[object] = []
    keep_only = manager.history.keep_only

    def spy(prefix, live):  # noqa: ANN001, ANN202
        if prefix == "pod/":
            calls.append(prefix)
        return keep_only(prefix, live)

    manager.history.keep_only = spy  # type: ignore[method-assign]
    first = manager.inventory()
    assert manager.inventory() is first  # NodeState published no new view: nothing rebuilt
    for _ in range(3):
        node.advance(1.0, {node.ls: 0.5, node.be: 0.5})
        manager.tick()
    assert len(calls) == 1  # the first tick only
    node.add_pod("ls2", "LS", BURSTABLE)
    assert manager.inventory() is not first
    node.advance(1.0, {node.ls: 0.5, node.be: 0.5})
    manager.tick()
    assert len(calls) == 2


def test_the_node_usage_window_keeps_one_sample_a_second_for_nodemetrics_percentiles(node):
    """kube/nodemetric.py's percentiles read `usage_window`: ticks woken early (PSI, LS usage)
    must not weigh more than regular ones, so it keeps at most one sample a second."""
    gib = 1 << 30
    usage = "memory.current" if node.version == "v2" else "memory.usage_in_bytes"
    write_cgroup_file(node.root, "/kubepods", usage, str(2 * gib))
    write_cgroup_file(node.root, "/kubepods", "memory.stat", f"anon {2 * gib}\nfile 0\ninactive_file 0\n"
                      if node.version == "v2" else f"total_rss {2 * gib}\ntotal_cache 0\ntotal_inactive_file 0\n")
    write_meminfo(node.proc, total_kb=16 << 20, available_kb=13 << 20)  # 3 GiB used: 1 GiB the system's
    manager = make_manager(node)
    manager.tick()
    for _ in range(6):
        node.advance(0.5, {node.ls: 0.5})
        manager.tick()
    cpu = manager.usage_window.get("node/cpu_cores")
    assert cpu is not None
    times = [at for at, _ in cpu.items()]
    assert len(times) == 3 and all(later - earlier >= 1.0 for earlier, later in zip(times, times[1:], strict=False))
    assert all(value >= 0.5 for _, value in cpu.items())  # the LS pod's half CPU at least
    memory = manager.usage_window.get("node/memory_bytes")
    assert memory is not None and len(memory) == 3 and all(value > 0 for _, value in memory.items())
    # The system's memory: the node's use less the pods' working set (kubepods), as koordlet counts it.
    system = manager.usage_window.get("system/memory_bytes")
    kubepods = manager._measure.probe.working_set_bytes(manager._measure.kubepods)
    assert kubepods == 2 * gib and system is not None
    assert [v for _, v in system.items()] == [float(gib)] * 3
    assert manager.usage_window.capacity >= 30 * 60  # the longest window koord-manager asks for
