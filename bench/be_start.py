#!/usr/bin/env python3
"""BE pods starting beside busy LS while BE is at its floor: how long a BE pod takes to run, and
what the start allowance ([strategy.cpu_suppress] pod_start_cpu_percent) costs LS meanwhile.

Real nodes side by side (one API server; containerd and kubelet each), koordnode in proxy mode:

* ``allowance``: koordnode's shipped settings (the allowance: 25 % of one CPU while a BE pod
  starts, the BE group still idle; once a start has run 5 s, the group out of idle at
  cpu.shares 64);
* ``at-once``: the same with ``pod_start_lift_after_s = 0`` (the group out of idle as soon as a
  start begins: the shipped settings until 2026-12-03);
* ``off``: ``pod_start_cpu_percent = 0`` (BE idle at its floor throughout);
* ``direct``: kubelet's own values, no koordnode (its besteffort tier, weight 2, no quota).

Each run, the nodes take turns in the balanced order of ``bench.k8s_node.turn_orders``. In a turn:
an LS pod (Burstable, 1 CPU requested) runs ls_probe's duty loop at ``--ls-busy`` percent on
every CPU and a BE pod spins on every CPU; once koordnode holds BE at its floor, two windows in
alternating order: **quiet** (nothing starts) and **starts** (a BE pod created through the API
every ``--start-every`` seconds, whatever the earlier ones do, each deleted once Running). In
each window ls_probe's probe runs in the LS container (sleep 1 ms, 100 us of work, ``--rounds``
times): p50 / p99 / p99.9, and the LS pod's CPU use. The starts window also gives each BE pod's
time from creation to Running.

    sudo setsid python3 -m bench.be_start [--runs 4] [--rounds 8000] [--ls-busy 90] [--json out.json]

Needs ``scripts/k8s-bed.sh "etcd containerd kubernetes"``, gcc for the probe, and root.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.k8s_latency import NodeUnderTest, autogroup_nice, over_runs, table
from bench.k8s_node import bench_node, turn_orders
from bench.ls_latency import CPUS, PROBE_IN_CONTAINER, IdleLatencyHold, build_probe, cgroup_of, with_cpu_use
from tests.testbed.kube_bed import ControlPlane
from tests.testbed.real_node import NODE_NAMES

REPO = Path(__file__).resolve().parents[1]
_SUPPRESS = "[strategy.cpu_suppress]\n"
SETUPS = {"allowance": "", "at-once": _SUPPRESS + "pod_start_lift_after_s = 0\n",
          "off": _SUPPRESS + "pod_start_cpu_percent = 0\n", "direct": None}
FLOOR_WAIT_S = 60.0


def at_floor(node: Any) -> bool:
    """koordnode holds the BE group idle at its quota floor (direct: nothing to wait for)."""
    if node.koordnode is None:
        return True
    group = Path("/sys/fs/cgroup/cpu") / node.kubepods.lstrip("/") / "koordnode_be"
    try:
        quota = int((group / "cpu.cfs_quota_us").read_text())
        idle = (group / "cpu.idle").read_text().strip()
    except (OSError, ValueError):
        return False
    return 0 < quota <= 2000 and idle == "1"


class Starter(threading.Thread):
    """BE pods created at a fixed pace (one every `every_s`, whatever the earlier ones do, so
    that every setup has kubelet and containerd start as many), each deleted once Running."""

    def __init__(self, unit: NodeUnderTest, prefix: str, every_s: float) -> None:
        super().__init__(daemon=True)
        self.unit, self.prefix, self.every_s = unit, prefix, every_s
        self.stop = threading.Event()
        self.seconds: list[float] = []
        self.names: list[str] = []
        self.errors: list[str] = []
        self._starts: list[threading.Thread] = []

    def run(self) -> None:
        while not self.stop.is_set():
            name = f"{self.prefix}-{len(self.names)}"
            self.names.append(name)
            start = threading.Thread(target=self._one, args=(name,), daemon=True)
            start.start()
            self._starts.append(start)
            self.stop.wait(self.every_s)

    def _one(self, name: str) -> None:
        from bench.k8s_latency import _pod

        node = self.unit.node
        began = time.monotonic()
        try:
            node.create_pod(_pod(name, "BE", "exec sleep 3600", self.unit.probe))
            node.wait_running(name, timeout=300)
        except Exception as err:  # noqa: BLE001 - reported with the turn's figures
            self.errors.append(repr(err))
            return
        self.seconds.append(time.monotonic() - began)
        node.client().delete(node.pod_path(name), grace_seconds=0)

    def finish(self, timeout_s: float = 400) -> None:
        self.stop.set()
        self.join(timeout_s)
        for start in self._starts:
            start.join(timeout_s)


def probe_window(unit: NodeUnderTest, ls_cid: str, be_cid: str, starter: Starter | None) -> dict[str, Any]:
    ls_cg = cgroup_of(unit.pid_of(ls_cid), "cpuacct")
    be_cg = cgroup_of(unit.pid_of(be_cid), "cpuacct")
    if starter is not None:
        starter.start()
    try:
        out = with_cpu_use(functools.partial(unit.variant, "probe", ls_cid, None), ls_cg, be_cg)
    finally:
        if starter is not None:
            starter.finish()
    if starter is not None:
        out["starts"] = len(starter.seconds)
        if starter.seconds:
            out["start_p50_s"] = round(statistics.median(starter.seconds), 3)
            out["start_max_s"] = round(max(starter.seconds), 3)
        if starter.errors:
            out["start_errors"] = starter.errors
    return out


def measure_turn(unit: NodeUnderTest, run: int, args: argparse.Namespace) -> dict[str, Any]:
    ls, be = f"ls-{run}", f"be-{run}"
    loops = " & ".join([f"{PROBE_IN_CONTAINER} duty {args.ls_busy}"] * CPUS)
    ls_cid, _ = unit.start(ls, "LS", f"{loops} & wait")
    spin = " & ".join([f"{PROBE_IN_CONTAINER} spin"] * CPUS)
    be_cid, _ = unit.start(be, "BE", f"{spin} & wait")
    starter: Starter | None = None
    try:
        began = time.monotonic()
        while not at_floor(unit.node) and time.monotonic() - began < FLOOR_WAIT_S:
            time.sleep(0.5)
        out: dict[str, Any] = {"floor_after_s": round(time.monotonic() - began, 1), "at_floor": at_floor(unit.node)}
        time.sleep(args.settle)
        for window in (("quiet", "starts") if run % 2 == 0 else ("starts", "quiet")):
            starter = Starter(unit, f"bes-{run}", args.start_every) if window == "starts" else None
            out[window] = probe_window(unit, ls_cid, be_cid, starter)
        return out
    finally:
        names = [ls, be, *(starter.names if starter is not None else [])]
        unit.remove(*[n for n in names if unit.node.client().exists(unit.node.pod_path(n))])


def figures(turn: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for window in ("quiet", "starts"):
        w = turn[window]
        for key in ("p99_us", "p999_us", "ls_cpus", "be_cpus"):
            flat[f"{window} {key}"] = w.get(key)
    quiet, starts = turn["quiet"], turn["starts"]
    flat["p99 starts/quiet"] = round(starts["p99_us"] / quiet["p99_us"], 3)
    flat["p99.9 starts/quiet"] = round(starts["p999_us"] / quiet["p999_us"], 3)
    flat["starts"] = starts.get("starts")
    flat["start p50 s"] = starts.get("start_p50_s")
    flat["start max s"] = starts.get("start_max_s")
    return flat


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=8000)
    parser.add_argument("--ls-busy", type=int, default=90, help="LS duty cycle on every CPU, percent (90)")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds at the floor before measuring (3)")
    parser.add_argument("--start-every", type=float, default=2.0, help="seconds between BE pod creations (2)")
    parser.add_argument("--json", help="also write the results there")
    args = parser.parse_args(argv)
    setups = args.setups.split(",")
    if not set(setups) <= set(SETUPS):
        parser.error(f"--setups: from {list(SETUPS)}")
    if autogroup_nice() not in (None, 0):
        parser.error("run the benchmark in a session of its own (setsid python3 -m bench.be_start ...)")
    workdir = Path(tempfile.mkdtemp(prefix="bench-be-start-"))
    probe = build_probe(workdir)
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "machine": f"{CPUS} CPUs, kernel {os.uname().release}",
                               "load_before": os.getloadavg(), "args": vars(args), "runs": []}
    print(f"{results['date']}, {results['machine']}, load average before {os.getloadavg()[0]:.2f}", flush=True)
    args.variants = ["probe"]
    with IdleLatencyHold(), ControlPlane(workdir / "control-plane", node_names=NODE_NAMES) as plane, \
            contextlib.ExitStack() as stack:
        # Each koordnode setup a proxy node of its own (its own directory and namespace), run
        # from this checkout.
        builds = {setup: REPO for setup, toml in SETUPS.items() if toml is not None}
        nodes = {setup: stack.enter_context(bench_node(
                     workdir, plane, i, setup, builds, {"PodAndContainerStatsFromCRI": True},
                     extra_toml=SETUPS[setup] or ""))
                 for i, setup in enumerate(setups)}
        units = {setup: NodeUnderTest(setup, node, probe, args) for setup, node in nodes.items()}
        for unit in units.values():
            stack.callback(unit.close)
        orders = turn_orders(len(setups))
        for run in range(args.runs):
            turn = {setups[k]: measure_turn(units[setups[k]], run, args) for k in orders[run % len(orders)]}
            results["runs"].append(turn)
            print(f"  run {run}: " + "; ".join(
                f"{s} p99 {t['quiet']['p99_us']:.0f}/{t['starts']['p99_us']:.0f} us, "
                f"{t['starts'].get('starts')} starts p50 {t['starts'].get('start_p50_s')} s" for s, t in turn.items()),
                flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
    results["load_after"] = os.getloadavg()
    results["summary"] = over_runs(results["runs"], setups, flatten=figures)
    print(f"load average after {os.getloadavg()[0]:.2f}")
    print(table(results["summary"], setups))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
