#!/usr/bin/env python3
"""Reaction of BE suppression to an LS load step, on real cgroups (root; no containerd).

A kubelet-like layout is created under a test prefix in the cgroup v1 cpu and cpuacct
hierarchies and the cgroup2 `unified` mount (for PSI):

    /koordnode-bench-<id>/kubepods/burstable/podls   LS pod: (CPUs + 1) processes, idle until the step
    /koordnode-bench-<id>/kubepods/besteffort/podbe  BE pod: one busy loop per CPU

The QoS manager runs in this process on the real /proc and /sys/fs/cgroup. After the BE
quota settles with LS idle, the LS processes start spinning (the step). Measured per step:
the time from the step to the first BE tier quota write that lowers it, to the quota
reaching its suppressed level, and the CPU LS and BE got in the second after the step and
two seconds later. Modes:

    psi-trigger  kernel PSI triggers (without CAP_SYS_RESOURCE: window 2 s, evaluated every 2 s)
    psi-poll     the fallback: pressure polled every psi_poll_ms (100) against 50 ms / 500 ms
    ticks-only   no pressure wake-ups: the 1 s tick alone
    usage        LS usage wake-ups (perf cpu-clock events on the LS cgroups), no pressure polling
    usage+poll   both (the daemon's defaults)

With --be-group (the default) the BE pod lives where koordnode puts BestEffort pods, in the
group /koordnode-bench-<id>/kubepods/koordnode_be (made idle, as the hooks make it), and that
group's quota and idle flag are what the manager sets; --no-be-group keeps it in kubelet's
besteffort tier. With LS quiet before a step (`--ls-quiet`, the default 25%) BE runs unthrottled
(quota -1) and the group not idle; each step records cpu.idle before and after.

    python3 -m bench.qos_reaction [--steps 5] [--modes usage,usage+poll,psi-poll,ticks-only]
                                  [--be-shares 2] [--threshold 65] [--idle-group-threshold 95]
                                  [--ls-quiet 25] [--no-be-group] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path


import structlog

from koordnode.executor.cgroup_executor import CgroupExecutor

from koordnode.executor.write_result import WriteStatus
from koordnode.qos.manager import QoSManager
from koordnode.config.cgroup import CgroupConfig
from koordnode.config.components import ManagerSettings
from koordnode.config.qos_manager import QoSManagerConfig
from koordnode.config.strategies import CpuSuppressConfig, StrategyConfig
from koordnode.model.state import NodeState, PodRecord

CGROUP = Path("/sys/fs/cgroup")
HIERARCHIES = ("cpu", "cpuacct", "unified")
CPUS = os.cpu_count() or 1

LS_WORKER = r"""
import signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGUSR2})
while True:
    signal.sigwait({signal.SIGUSR1})          # the step: start spinning
    while signal.SIGUSR2 not in signal.sigpending():
        for _ in range(20000):
            pass
    signal.sigwait({signal.SIGUSR2})          # idle again
"""


def mode_settings(mode: str, kubepods: str, threshold: float, be_group: bool,
                  idle_group_threshold: float = CpuSuppressConfig().idle_group_threshold_percent,
                  ls_quiet: float = CpuSuppressConfig().ls_quiet_percent) -> ManagerSettings:
    base = QoSManagerConfig(kubepods_cgroup=kubepods, usage_wake_cpu_ms=0)
    usage = dataclasses.replace(base, usage_wake_cpu_ms=QoSManagerConfig().usage_wake_cpu_ms)
    manager = {
        "psi-trigger": dataclasses.replace(base, psi_stall_us=100_000, psi_window_us=2_000_000),
        "psi-poll": base,  # 50 ms / 500 ms: refused without CAP_SYS_RESOURCE -> polling
        "ticks-only": dataclasses.replace(base, psi_triggers=False, psi_poll_ms=0),
        "usage": dataclasses.replace(usage, psi_triggers=False, psi_poll_ms=0),
        "usage+poll": usage,
    }[mode]
    strategy = StrategyConfig(cpu_suppress=CpuSuppressConfig(threshold_percent=threshold,
                                                             idle_group_threshold_percent=idle_group_threshold,
                                                             ls_quiet_percent=ls_quiet))
    return ManagerSettings(strategy=strategy, qos_manager=manager, cgroup=CgroupConfig(be_idle_group=be_group))


class Bed:
    def __init__(self, be_shares: int, be_group: bool) -> None:
        self.prefix = f"/koordnode-bench-{uuid.uuid4().hex[:8]}"
        self.kubepods = f"{self.prefix}/kubepods"
        self.ls_pod = f"{self.kubepods}/burstable/podls"
        self.be_tier = f"{self.kubepods}/koordnode_be" if be_group else f"{self.kubepods}/besteffort"
        self.be_pod = f"{self.be_tier}/podbe"
        self.created: list[Path] = []
        self.procs: list[subprocess.Popen] = []
        self.ls_procs: list[subprocess.Popen] = []
        for cgroup in (self.ls_pod, self.be_pod):
            for h in HIERARCHIES:
                parts = cgroup.strip("/").split("/")
                for depth in range(1, len(parts) + 1):
                    directory = CGROUP / h / "/".join(parts[:depth])
                    if not directory.is_dir():
                        directory.mkdir()
                        self.created.append(directory)
        if be_group:  # koordnode's idle BE group, as the hooks create it
            (CGROUP / "cpu" / self.be_tier.strip("/") / "cpu.idle").write_text("1")
        else:  # kubelet gives the besteffort tier cpu.shares 2
            (CGROUP / "cpu" / self.be_tier.strip("/") / "cpu.shares").write_text(str(be_shares))

    def spawn(self, code: str, cgroup: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", code])
        for h in HIERARCHIES:
            (CGROUP / h / cgroup.strip("/") / "cgroup.procs").write_text(str(proc.pid))
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        for _ in range(CPUS):
            self.spawn("while True: pass", self.be_pod)
        for _ in range(CPUS + 1):
            self.ls_procs.append(self.spawn(LS_WORKER, self.ls_pod))

    def signal_ls(self, sig: int) -> None:
        for proc in self.ls_procs:
            os.kill(proc.pid, sig)

    def usage_ns(self, cgroup: str) -> int:
        return int((CGROUP / "cpuacct" / cgroup.strip("/") / "cpuacct.usage").read_text())

    def be_quota(self) -> int:
        return int((CGROUP / "cpu" / self.be_tier.strip("/") / "cpu.cfs_quota_us").read_text())

    def be_idle(self) -> str:
        return (CGROUP / "cpu" / self.be_tier.strip("/") / "cpu.idle").read_text().strip()

    def state(self) -> NodeState:
        state = NodeState()
        state.put_pod(PodRecord("ls", "ls", "bench", "uid-ls", {}, {}, self.ls_pod, qos_class="LS"))
        state.put_pod(PodRecord("be", "be", "bench", "uid-be", {}, {}, self.be_pod, qos_class="BE"))
        return state

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()
        deadline = time.monotonic() + 5
        for directory in reversed(self.created):
            while True:
                try:
                    directory.rmdir()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        print(f"could not remove {directory}", file=sys.stderr)
                        break
                    time.sleep(0.05)


class RecordingExecutor(CgroupExecutor):
    """The real executor, noting when each BE tier quota write landed."""

    def __init__(self, root: Path, tier: str) -> None:
        super().__init__(root)
        self.tier = tier
        self.quota_writes: list[tuple[float, int]] = []

    def apply(self, writes, *, force: bool = False):  # type: ignore[no-untyped-def]
        results = super().apply(writes, force=force)
        now = time.monotonic()
        for result in results:
            write = result.write
            if (result.status is WriteStatus.WRITTEN and getattr(write, "resource", "") == "cpu.cfs_quota_us"
                    and write.cgroup == self.tier):
                self.quota_writes.append((now, int(write.value)))
        return results


async def cpu_share(bed: Bed, start: float, seconds: float) -> dict[str, float]:
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    ls0, be0, t0 = bed.usage_ns(bed.ls_pod), bed.usage_ns(bed.be_pod), time.monotonic()
    await asyncio.sleep(seconds)
    ls1, be1, t1 = bed.usage_ns(bed.ls_pod), bed.usage_ns(bed.be_pod), time.monotonic()
    return {"ls_cpus": round((ls1 - ls0) / 1e9 / (t1 - t0), 3), "be_cpus": round((be1 - be0) / 1e9 / (t1 - t0), 3)}


async def run_mode(mode: str, steps: int, be_shares: int, settle_s: float, observe_s: float,
                   threshold: float, be_group: bool, idle_group_threshold: float, ls_quiet: float) -> dict:
    bed = Bed(be_shares, be_group)
    executor = RecordingExecutor(CGROUP, bed.be_tier)
    manager = QoSManager(mode_settings(mode, bed.kubepods, threshold, be_group, idle_group_threshold, ls_quiet),
                         bed.state(), executor)
    stop = asyncio.Event()
    results = []
    usage_wakes: list[float] = []
    on_usage = manager._on_usage

    def noting_usage(target: str) -> None:  # when the kernel's usage event reached the manager
        usage_wakes.append(time.monotonic())
        on_usage(target)

    manager._on_usage = noting_usage  # type: ignore[method-assign]
    try:
        bed.start()
        task = asyncio.create_task(manager.run(stop))
        for _ in range(steps):
            # LS idle: BE quota grows back to its budget. The jitter puts the step at a random
            # phase of the tick, as a real load step would be.
            await asyncio.sleep(settle_s + random.uniform(0.0, 1.0))
            before = bed.be_quota()
            idle_before = bed.be_idle()
            writes_before = len(executor.quota_writes)
            wakeups_before = _early_wakes(manager)
            wakes_before = len(usage_wakes)
            step = time.monotonic()
            bed.signal_ls(signal.SIGUSR1)
            shares = await asyncio.gather(cpu_share(bed, step, 1.0), cpu_share(bed, step + 2.0, 1.0))
            await asyncio.sleep(max(0.0, step + observe_s - time.monotonic()))
            bed.signal_ls(signal.SIGUSR2)
            after = executor.quota_writes[writes_before:]
            # -1: unthrottled (LS was quiet), above any quota
            lowered = [(t, q) for t, q in after if 0 <= q and (before < 0 or q < before)]
            final = min((q for _, q in after if q >= 0), default=before)
            settled = [t for t, q in after if q <= final * 1.05 + 1000]
            results.append({
                "quota_before": before,
                "be_idle_before": idle_before,
                "be_idle_after": bed.be_idle(),
                "first_lower_write_ms": round((lowered[0][0] - step) * 1000, 1) if lowered else None,
                "first_lower_quota": lowered[0][1] if lowered else None,
                "suppressed_quota": final,
                "suppressed_ms": round((settled[0] - step) * 1000, 1) if settled else None,
                "early_wakeups": _early_wakes(manager) - wakeups_before,
                "usage_event_ms": round((usage_wakes[wakes_before] - step) * 1000, 1)
                if len(usage_wakes) > wakes_before else None,
                "below_half_cpu_ms": _below(executor, writes_before, step, 50_000),
                "first_second": shares[0],
                "third_second": shares[1],
            })
        status = manager.status()
        stop.set()
        await task
    finally:
        bed.close()
    firsts = [r["first_lower_write_ms"] for r in results if r["first_lower_write_ms"] is not None]
    belows = [r["below_half_cpu_ms"] for r in results if r["below_half_cpu_ms"] is not None]
    events = [r["usage_event_ms"] for r in results if r["usage_event_ms"] is not None]
    settled = [r["suppressed_ms"] for r in results if r["suppressed_ms"] is not None]
    return {
        "trigger_mode": status["trigger_mode"],
        "usage_watch": status["usage_watch"]["mode"],
        "median_below_half_cpu_ms": round(statistics.median(belows), 1) if belows else None,
        "median_usage_event_ms": round(statistics.median(events), 1) if events else None,
        "median_first_lower_write_ms": round(statistics.median(firsts), 1) if firsts else None,
        "median_suppressed_ms": round(statistics.median(settled), 1) if settled else None,
        "steps": results,
    }


def _early_wakes(manager: QoSManager) -> int:
    ticks = manager.status()["ticks"]
    return ticks["woken_by_pressure"] + ticks.get("woken_by_usage", 0)


def _below(executor: RecordingExecutor, start: int, step: float, quota_us: int) -> float | None:
    """ms from the step to the first quota write under `quota_us` (0.5 CPU at 100 ms periods)."""
    for t, quota in executor.quota_writes[start:]:
        if 0 <= quota < quota_us:
            return round((t - step) * 1000, 1)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--modes", default="usage,usage+poll,psi-poll,ticks-only")
    parser.add_argument("--no-be-group", dest="be_group", action="store_false",
                        help="BE in kubelet's besteffort tier instead of koordnode's idle BE group")
    parser.add_argument("--be-shares", type=int, default=2, help="cpu.shares of the BE tier (kubelet: 2)")
    parser.add_argument("--settle", type=float, default=8.0, help="seconds of LS idle before each step")
    parser.add_argument("--observe", type=float, default=3.5, help="seconds of LS load per step")
    parser.add_argument("--threshold", type=float, default=65.0,
                        help="[strategy.cpu_suppress] threshold_percent (BE in the besteffort tier)")
    parser.add_argument("--idle-group-threshold", type=float,
                        default=CpuSuppressConfig().idle_group_threshold_percent,
                        help="[strategy.cpu_suppress] idle_group_threshold_percent (BE in the idle BE group)")
    parser.add_argument("--ls-quiet", type=float, default=CpuSuppressConfig().ls_quiet_percent,
                        help="[strategy.cpu_suppress] ls_quiet_percent (0: BE always suppressed)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0 or not all((CGROUP / h).is_dir() for h in HIERARCHIES):
        print("needs root, cgroup v1 cpu/cpuacct and the cgroup2 unified mount", file=sys.stderr)
        return 2
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    results = {"cpus": CPUS, "be_group": args.be_group, "be_tier_shares": args.be_shares, "threshold_percent": args.threshold,
               "idle_group_threshold_percent": args.idle_group_threshold, "ls_quiet_percent": args.ls_quiet,
               "ls_processes": CPUS + 1, "be_processes": CPUS, "load_avg_before": os.getloadavg()[0]}
    for mode in args.modes.split(","):
        results[mode] = asyncio.run(run_mode(mode, args.steps, args.be_shares, args.settle, args.observe,
                                             args.threshold, args.be_group, args.idle_group_threshold,
                                             args.ls_quiet))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for key, value in results.items():
            if isinstance(value, dict):
                summary = {k: v for k, v in value.items() if k != "steps"}
                print(f"{key}: {json.dumps(summary)}")
                for step in value["steps"]:
                    print(f"    {json.dumps(step)}")
            else:
                print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
