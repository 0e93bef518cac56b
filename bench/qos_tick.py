#!/usr/bin/env python3
"""Cost of the QoS manager with 200 containers.

1. tick: one full tick (collect -> strategies -> executor) over 200 containers on a fake
   cgroup tree in the kernel's layout (target <= 10 ms). With --real, also on 200 real
   cgroup v1 cgroups created under a test prefix (root only; removed afterwards).
2. cpu: the manager's CPU use while `run()` ticks at the default 1 s period, with its
   pressure watch, for --cpu-seconds (target <= 1% of a core).
3. rss: RSS while 3600 ticks (an hour at the default period) run back to back, sampled
   every 600 ticks (target <= 40 MB, flat).

    python3 -m bench.qos_tick [--json] [--real] [--cpu-seconds 30] [--only tick,cpu,rss]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import structlog

from koordnode.config.qos_manager import QoSManagerConfig
from koordnode.config.strategies import BeEvictConfig, CpuBurstConfig, StrategyConfig
from koordnode.cri import api_pb2 as pb
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.policy.plan import CgroupWrite
from koordnode.config.components import ManagerSettings
from koordnode.qos.manager import QoSManager
from koordnode.model.state import CONTAINER_RUNNING, ContainerRecord, NodeState, PodRecord
from tests.faketree import add_cgroup, make_cgroup_tree, write_cgroup_file
from tests.support.fakeproc import format_pressure, make_procfs, write_proc_stat

CPUS = 8
PODS = {"LS": 50, "LSR": 10, "BE": 40}  # x 2 containers = 200 containers


def quiet_logs() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))


@dataclasses.dataclass
class Layout:
    root: Path
    proc: Path
    state: NodeState
    pod_cgroups: list[str]
    memory_plan: list[CgroupWrite]


def build_state(kubepods: str) -> tuple[NodeState, list[str], list[str], list[CgroupWrite]]:
    """NodeState with 100 pods x 2 containers; the pod and container cgroups; a memory plan."""
    state = NodeState()
    pods, containers, plan = [], [], []
    n = 0
    for qos, count in PODS.items():
        for _ in range(count):
            n += 1
            sid = f"{n:04d}{uuid.uuid4().hex[:8]}"
            parent = {"LS": f"{kubepods}/burstable", "LSR": kubepods, "BE": f"{kubepods}/besteffort"}[qos]
            cgroup = f"{parent}/pod{sid}"
            pods.append(cgroup)
            state.put_pod(PodRecord(sid, f"pod{n}", "bench", f"uid{n}", {}, {}, cgroup, qos_class=qos))
            for c in range(2):
                cid = f"{sid}c{c}" + "0" * 50
                containers.append(f"{cgroup}/{cid}")
                quota = 50_000 if qos == "LS" else 0
                res = pb.LinuxContainerResources(cpu_quota=quota, cpu_period=100_000, memory_limit_in_bytes=1 << 30)
                state.put_container(ContainerRecord(cid, sid, f"c{c}", {}, {}, res, state=CONTAINER_RUNNING))
                if qos != "BE":
                    plan += [CgroupWrite(f"{cgroup}/{cid}", "memory.min", 64 << 20, "bench"),
                             CgroupWrite(f"{cgroup}/{cid}", "memory.low", 96 << 20, "bench"),
                             CgroupWrite(f"{cgroup}/{cid}", "memory.high", 900 << 20, "bench")]
    return state, pods, containers, plan


def fake_layout(tmp: Path, version: str) -> Layout:
    state, pods, containers, plan = build_state("/kubepods")
    root = make_cgroup_tree(tmp, version, anolis=(version == "v1"), cpus=f"0-{CPUS - 1}",
                            cgroups=["/kubepods/burstable", "/kubepods/besteffort"])
    for cgroup in pods + containers:
        add_cgroup(root, cgroup)
    proc = make_procfs(tmp, cpus=CPUS)
    # cgroup2 pressure files for the LS targets (the burstable tier, the Guaranteed pods)
    targets = ["/kubepods/burstable"] + [p for p in pods if p.count("/") == 2]
    for target in targets:
        if version == "v1":
            directory = root / "unified" / target.strip("/")
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "cgroup.procs").write_text("")
            (directory / "cpu.pressure").write_text(format_pressure(0))
        else:
            write_cgroup_file(root, target, "cpu.pressure", format_pressure(0))
    return Layout(root, proc, state, pods, plan)


class Counters:
    """Advances the usage counters of the pods and the node between ticks."""

    def __init__(self, layout: Layout, version: str) -> None:
        self.layout, self.version = layout, version
        self.ns: dict[str, int] = {}
        self.jiffies = 0

    def advance(self, seconds: float, load: float) -> None:
        for i, cgroup in enumerate(self.layout.pod_cgroups[:: 5]):
            self.ns[cgroup] = self.ns.get(cgroup, 0) + int((0.05 + 0.02 * (i % 3) * load) * seconds * 1e9)
            if self.version == "v1":
                write_cgroup_file(self.layout.root, cgroup, "cpuacct.usage", str(self.ns[cgroup]), controller="cpuacct")
            else:
                write_cgroup_file(self.layout.root, cgroup, "cpu.stat", f"usage_usec {self.ns[cgroup] // 1000}\n"
                                  "user_usec 0\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n")
        self.jiffies += int(seconds * 100)
        busy = int(self.jiffies * (0.3 + 0.3 * load))
        write_proc_stat(self.layout.proc, [[busy, 0, 0, self.jiffies - busy, 0]] * CPUS)


def all_enabled() -> ManagerSettings:
    strategy = StrategyConfig(cpu_burst=CpuBurstConfig(enable=True), be_evict=BeEvictConfig(enable=True))
    return ManagerSettings(strategy, QoSManagerConfig())


def time_ticks(manager: QoSManager, counters: Counters | None, ticks: int, clock: list[float]) -> dict:
    samples = []
    for i in range(ticks):
        clock[0] += 1.0
        if counters is not None:
            counters.advance(1.0, load=(i // 20) % 2)
        started = time.perf_counter()
        manager.tick()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {
        "ticks": ticks,
        "median_ms": round(statistics.median(samples), 3),
        "p95_ms": round(samples[int(0.95 * len(samples)) - 1], 3),
        "max_ms": round(samples[-1], 3),
    }


def bench_fake_tick(version: str, ticks: int) -> dict:
    out = {}
    with tempfile.TemporaryDirectory(prefix="koordnode-qos-bench-") as tmp:
        layout = fake_layout(Path(tmp), version)
        for name, config in (("default", ManagerSettings()), ("all_strategies", all_enabled())):
            clock = [0.0]
            manager = QoSManager(config, layout.state, CgroupExecutor(layout.root), procfs_root=layout.proc,
                                 memory_plan=lambda: layout.memory_plan, clock=lambda clock=clock: clock[0])
            counters = Counters(layout, version)
            manager.tick()  # warm-up: opens the descriptors, first reconcile pass
            out[name] = time_ticks(manager, counters, ticks, clock)
            manager.collector.close()
    return out


def bench_real_tick(ticks: int) -> dict:
    """200 containers as real cgroup v1 cgroups (cpu, cpuacct, cpuset, memory, unified)."""
    prefix = f"/koordnode-bench-{uuid.uuid4().hex[:8]}"
    kubepods = f"{prefix}/kubepods"
    state, pods, containers, plan = build_state(kubepods)
    base = Path("/sys/fs/cgroup")
    hierarchies = [h for h in ("cpu", "cpuacct", "cpuset", "memory", "unified") if (base / h).is_dir()]
    created: list[Path] = []
    try:
        for cgroup in [kubepods + "/burstable", kubepods + "/besteffort"] + pods + containers:
            for h in hierarchies:
                parts = cgroup.strip("/").split("/")
                for depth in range(1, len(parts) + 1):
                    directory = base / h / "/".join(parts[:depth])
                    if not directory.is_dir():
                        directory.mkdir()
                        created.append(directory)
                        if h == "cpuset":  # v1 cpuset children start empty
                            parent = directory.parent
                            for name in ("cpuset.cpus", "cpuset.mems"):
                                (directory / name).write_text((parent / name).read_text())
        out = {}
        for name, config in (("default", ManagerSettings(qos_manager=QoSManagerConfig(kubepods_cgroup=kubepods))),
                             ("all_strategies", dataclasses.replace(
                                 all_enabled(), qos_manager=QoSManagerConfig(kubepods_cgroup=kubepods)))):
            clock = [time.monotonic()]
            manager = QoSManager(config, state, CgroupExecutor(base), procfs_root="/proc",
                                 memory_plan=lambda: plan, clock=lambda clock=clock: clock[0])
            manager.tick()
            out[name] = time_ticks(manager, None, ticks, clock)
            manager.collector.close()
        return out
    finally:
        for directory in reversed(created):
            try:
                directory.rmdir()
            except OSError:
                pass


def bench_cpu(seconds: float) -> dict:
    """Process CPU while run() ticks at the default period (and its pressure watch polls)."""
    with tempfile.TemporaryDirectory(prefix="koordnode-qos-bench-") as tmp:
        layout = fake_layout(Path(tmp), "v1")
        manager = QoSManager(ManagerSettings(), layout.state, CgroupExecutor(layout.root), procfs_root=layout.proc,
                             memory_plan=lambda: layout.memory_plan)

        async def scenario() -> dict:
            stop = asyncio.Event()
            task = asyncio.create_task(manager.run(stop))
            await asyncio.sleep(2.0)  # first ticks, descriptors opened
            process = psutil.Process()
            cpu0, wall0 = process.cpu_times(), time.monotonic()
            ticks0 = manager.status()["ticks"]["count"]
            await asyncio.sleep(seconds)
            cpu1, wall1 = process.cpu_times(), time.monotonic()
            status = manager.status()
            stop.set()
            await task
            used = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
            return {
                "seconds": round(wall1 - wall0, 1),
                "ticks": status["ticks"]["count"] - ticks0,
                "trigger_mode": status["trigger_mode"],
                "cpu_percent_of_a_core": round(100 * used / (wall1 - wall0), 3),
                "avg_tick_ms": status["ticks"]["avg_duration_ms"],
            }

        return asyncio.run(scenario())


def bench_rss(ticks: int) -> dict:
    process = psutil.Process()
    with tempfile.TemporaryDirectory(prefix="koordnode-qos-bench-") as tmp:
        layout = fake_layout(Path(tmp), "v1")
        gc.collect()
        before = process.memory_info().rss
        clock = [0.0]
        manager = QoSManager(all_enabled(), layout.state, CgroupExecutor(layout.root), procfs_root=layout.proc,
                             memory_plan=lambda: layout.memory_plan, clock=lambda: clock[0])
        counters = Counters(layout, "v1")
        samples = []
        for i in range(ticks + 1):
            if i % 600 == 0:
                samples.append({"tick": i, "rss_mb": round(process.memory_info().rss / 2**20, 2)})
            clock[0] += 1.0
            counters.advance(1.0, load=(i // 30) % 2)
            manager.tick()
        series = len(manager.history)
        manager.collector.close()
    first, last = samples[1]["rss_mb"], samples[-1]["rss_mb"]
    return {"ticks": ticks, "rss_before_manager_mb": round(before / 2**20, 2), "samples": samples,
            "growth_after_first_600_ticks_mb": round(last - first, 2), "history_series": series}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ticks", type=int, default=300, help="ticks timed per configuration")
    parser.add_argument("--cpu-seconds", type=float, default=30.0)
    parser.add_argument("--rss-ticks", type=int, default=3600)
    parser.add_argument("--real", action="store_true", help="also time ticks on real cgroup v1 cgroups (root)")
    parser.add_argument("--only", default="tick,cpu,rss", help="comma-separated parts to run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    quiet_logs()
    results: dict = {"containers": 2 * sum(PODS.values()), "pods": dict(PODS)}
    if "tick" in parts:
        results["tick_fake_v1"] = bench_fake_tick("v1", args.ticks)
        results["tick_fake_v2"] = bench_fake_tick("v2", args.ticks)
        if args.real:
            if os.geteuid() != 0:
                print("--real needs root", file=sys.stderr)
                return 2
            results["tick_real_v1"] = bench_real_tick(args.ticks)
    if "cpu" in parts:
        results["cpu_default_tick"] = bench_cpu(args.cpu_seconds)
    if "rss" in parts:
        results["rss"] = bench_rss(args.rss_ticks)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for key, value in results.items():
            print(f"{key}: {json.dumps(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
