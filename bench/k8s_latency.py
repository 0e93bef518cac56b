#!/usr/bin/env python3
"""LS latency, BE's yield and BE's share of the idle CPU on real nodes, side by side: kubelet's
own values ("direct"), koordnode as CRI proxy ("proxy"), koordnode as NRI plugin ("nri"),
Koordinator's koordlet v1.8.0 in NRI mode ("koordlet") and koordlet behind koord-runtime-proxy
v1.8.0 ("koordlet-proxy": kubelet -> koord-runtime-proxy -> containerd; the agent's CPU and RSS
count both processes).

One API server and koord-manager; one real node per mode (containerd, kubelet, the mode's agent),
every agent reading the same NodeSLO that koord-manager renders from one slo-controller-config
(colocation on, BE CPU suppression on at Koordinator's default threshold, 65 %, with
``--suppress-policy``: ``cfsQuota`` by default, not Koordinator's default ``cpuset``, because
koordlet v1.8.0's cpuset policy never gives BE fewer than 2 CPUs (beMinCPUSetCores), so on a
2-CPU machine it never suppresses at all). Then, for each run (``--runs``) the
modes take turns in the balanced order of ``bench.k8s_node.turn_orders``, and in each turn, for
each LS state (quiet, and busy: ``--ls-busy`` percent of a CPU beside the probe):

* an LS pod (``koordinator.sh/qosClass: LS``, Burstable, 1 CPU requested) runs ls_probe's
  server, with the static probe mounted from the host (a hostPath volume);
* **alone**: the probe (ExecSync into the LS container: sleep 1 ms, 100 us of work, ``--rounds``
  times, how late each round ends) and the request/response variant (a client on the node sends
  one 64-byte request per ms to the server, which works 50 us per request): p50 / p99 / p99.9;
* a BE pod (``koordinator.sh/qosClass: BE``, BestEffort) starts one busy loop per CPU; after
  ``--settle`` seconds **with BE**: the same two measurements, and the CPU BE got against what LS
  left idle (``be_share_of_idle``);
* **yield** (LS quiet state only): LS steps from quiet to ``--step-cpus`` CPUs of work; BE's CPU
  use is sampled every 20 ms; the yield is the time from LS's step (its use first seen above half
  the step) until BE's use over 100 ms first comes within 0.1 CPU of where it settles (its mean
  over the last 3 s of ``--step-seconds``).

* **pod start** (``--start-pods``, each run): that many pods per node started in balanced turns,
  p50 and its ratio to direct's (bench.k8s_node);

and after the runs, **agent load** (``--load-pods``): each agent's CPU and RSS over ``--window``
seconds of kubelet's own calls with 20, then 100 pods running (bench.k8s_node.load_window).

Each figure is given per run, with the median and the spread (min-max) over runs. The nodes idle
while another mode measures; the machine's load average is printed before and after.

    sudo setsid python3 -m bench.k8s_latency [--modes direct,proxy,nri,koordlet,koordlet-proxy] [--runs 5]
                                             [--rounds 8000] [--ls-busy 60] [--json out.json]

setsid: a session of its own, so its autogroup (where the rr client runs) is at nice 0 whatever
the shell's; it refuses to run otherwise.

Needs ``scripts/k8s-bed.sh "etcd containerd kubernetes koordinator koordlet"`` (koordlet only with
the koordlet modes), gcc for the probe, and root.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.k8s_node import (_agent, agent_cpu_seconds, bench_node, interleaved_start_latencies, koordinator,
                             load_windows, turn_orders)
from bench.ls_latency import (CG, CPUS, PORT, PROBE_IN_CONTAINER, SERVER_WORK_US, SLEEP_US, WORK_US, IdleLatencyHold,
                              build_probe, cgroup_of, container_pid, parse_line, usage_ns, with_cpu_use)
from tests.testbed.kube_bed import ControlPlane
from tests.testbed.real_node import NODE_NAMES

MODES = ("direct", "proxy", "nri", "koordlet", "koordlet-proxy")
VARIANTS = ("probe", "rr")
SAMPLE_S = 0.02
RATE_WINDOW_S = 0.1
SETTLED_TAIL_S = 3.0
NEAR_SETTLED_CPUS = 0.1


def slo_controller_config(policy: str) -> dict[str, str]:
    """koord-manager's ConfigMap data: colocation on, BE CPU suppression on (threshold left at
    Koordinator's default) with `policy`."""
    return {"colocation-config": json.dumps({"enable": True}),
            "resource-threshold-config": json.dumps({"clusterStrategy": {
                "enable": True, "cpuSuppressPolicy": policy}})}


def _pod(name: str, cls: str, command: str, probe: Path) -> dict[str, Any]:
    from tests.testbed.images import BUSYBOX_IMAGE_REF

    resources = {"requests": {"cpu": "1", "memory": "32Mi"}} if cls != "BE" else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"koordinator.sh/qosClass": cls}},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "volumes": [{"name": "probe", "hostPath": {"path": str(probe), "type": "File"}}],
                     "containers": [{"name": "app", "image": BUSYBOX_IMAGE_REF, "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", command], "resources": resources,
                                     "volumeMounts": [{"name": "probe", "mountPath": PROBE_IN_CONTAINER,
                                                       "readOnly": True}]}]}}


class NodeUnderTest:
    """One mode's node: its pods through the API, exec and measurements through its containerd."""

    def __init__(self, mode: str, node: Any, probe: Path, args: argparse.Namespace) -> None:
        from tests.support.cri import Cri

        self.mode, self.node, self.probe, self.args = mode, node, probe, args
        self.cri = Cri(node.containerd.address)

    def close(self) -> None:
        self.cri.close()

    def start(self, name: str, cls: str, command: str) -> tuple[str, str | None]:
        """Create the pod, wait for it to run: (container id, pod IP)."""
        self.node.create_pod(_pod(name, cls, command, self.probe))
        pod = self.node.wait_running(name, timeout=180)
        status = pod["status"]
        cid = status["containerStatuses"][0]["containerID"].split("://", 1)[1]
        return cid, status.get("podIP")

    def remove(self, *names: str) -> None:
        client = self.node.client()
        for name in names:
            client.delete(self.node.pod_path(name), grace_seconds=0)
        client.wait_for(f"pods {names} gone", lambda: not any(client.exists(self.node.pod_path(n)) for n in names),
                        timeout=120, interval=0.5)

    def exec(self, cid: str, cmd: list[str], timeout: int) -> str:
        from koordnode.cri import api_pb2 as pb

        resp = self.cri.rt.ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=cmd, timeout=timeout),
                                    timeout=timeout + 10)
        if resp.exit_code != 0:
            raise RuntimeError(f"{cmd[:2]} in {self.mode}'s pod exited {resp.exit_code}: {resp.stderr.decode()[-300:]}")
        return resp.stdout.decode()

    def pid_of(self, cid: str) -> int:
        return container_pid(self.cri, cid)

    def variant(self, variant: str, cid: str, ip: str | None) -> dict[str, Any]:
        rounds = self.args.rounds
        if variant == "probe":
            timeout = int(rounds * (SLEEP_US + WORK_US) / 1e6 * 5) + 30
            return parse_line(self.exec(cid, [PROBE_IN_CONTAINER, "probe", str(rounds), str(SLEEP_US), str(WORK_US)],
                                        timeout))
        done = subprocess.run([str(self.probe), "client", str(ip), str(PORT), str(rounds), str(SLEEP_US)],
                              capture_output=True, text=True, timeout=int(rounds / 200) + 60, check=True)
        return parse_line(done.stdout)

    def measure(self, ls_cid: str, ip: str | None, be_cid: str | None) -> dict[str, Any]:
        ls_pid = self.pid_of(ls_cid)
        ls_cg = cgroup_of(ls_pid, "cpuacct")
        be_cg = cgroup_of(self.pid_of(be_cid), "cpuacct") if be_cid else None
        _, agent_pids = _agent(self.node)
        out: dict[str, Any] = {"ls_cgroup": ls_cpu_values(ls_pid)}
        for variant in self.args.variants:
            began, agent0, ticks0 = time.monotonic(), agent_cpu_seconds(agent_pids), self.ticks()
            out[variant] = with_cpu_use(functools.partial(self.variant, variant, ls_cid, ip), ls_cg, be_cg)
            seconds = time.monotonic() - began
            if agent_pids:  # the node agent's own CPU meanwhile (it competes with LS from outside kubepods)
                out[variant]["agent_cpus"] = round((agent_cpu_seconds(agent_pids) - agent0) / seconds, 4)
            if ticks0:  # how often koordnode's QoS manager ran meanwhile, and what woke it
                out[variant]["agent_ticks_per_s"] = {key: round((count - ticks0[key]) / seconds, 2)
                                                     for key, count in self.ticks().items()}
        return out

    def ticks(self) -> dict[str, int]:
        """koordnode's QoS manager ticks so far: all, and those woken by LS pressure or usage."""
        if self.node.koordnode is None:
            return {}
        ticks = (self.node.koordnode.status().get("qos_manager") or {}).get("ticks") or {}
        return {key: int(ticks.get(key) or 0) for key in ("count", "woken_by_pressure", "woken_by_usage")}

    def step_yield(self, ls_cid: str, be_cid: str) -> dict[str, Any]:
        """LS steps to --step-cpus CPUs of work; BE's use sampled until --step-seconds after."""
        ls_cg, be_cg = cgroup_of(self.pid_of(ls_cid), "cpuacct"), cgroup_of(self.pid_of(be_cid), "cpuacct")
        whole, part = divmod(round(self.args.step_cpus * 100), 100)
        loads = [f"{PROBE_IN_CONTAINER} duty 100"] * whole + ([f"{PROBE_IN_CONTAINER} duty {part}"] if part else [])
        seconds = self.args.step_seconds
        step = f"{' & '.join(loads)} & sleep {seconds + 1}; kill $(jobs -p) 2>/dev/null; true"
        samples: list[tuple[float, int, int]] = []

        def sample_for(seconds_: float) -> None:
            until = time.monotonic() + seconds_
            while time.monotonic() < until:
                samples.append((time.monotonic(), usage_ns(ls_cg), usage_ns(be_cg)))
                time.sleep(SAMPLE_S)

        sample_for(1.0)  # BE beside quiet LS, then the step
        runner = threading.Thread(target=self.exec, args=(ls_cid, ["sh", "-c", step], int(seconds) + 30), daemon=True)
        runner.start()
        sample_for(seconds)
        runner.join(30)
        return yield_from_samples(samples, self.args.step_cpus)


LS_CPU_FILES = ("cpu.shares", "cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.cfs_burst_us")


def ls_cpu_values(pid: int) -> dict[str, str]:
    """The CPU values of the LS container's cgroup and its pod's (cgroup v1), and its cpuset:
    what each node's agent left there, to compare the nodes when LS alone differs."""
    values: dict[str, str] = {}
    container = cgroup_of(pid, "cpu").lstrip("/")
    for level, path in (("container", container), ("pod", str(Path(container).parent))):
        for name in LS_CPU_FILES:
            with contextlib.suppress(OSError):
                values[f"{level} {name}"] = (CG / "cpu" / path / name).read_text().strip()
    with contextlib.suppress(OSError, RuntimeError):
        values["container cpuset.cpus"] = (CG / "cpuset" / cgroup_of(pid, "cpuset").lstrip("/")
                                           / "cpuset.cpus").read_text().strip()
    return values


def _rates(samples: list[tuple[float, int, int]], column: int) -> list[tuple[float, float]]:
    """(time, CPUs over the last RATE_WINDOW_S) at each sample a whole window after the first."""
    out = []
    start = 0
    for end, (t_end, *_rest) in enumerate(samples):
        while start + 1 < end and t_end - samples[start + 1][0] >= RATE_WINDOW_S:
            start += 1
        span = t_end - samples[start][0]
        if span >= RATE_WINDOW_S:
            out.append((t_end, (samples[end][column] - samples[start][column]) / 1e9 / span))
    return out


def yield_from_samples(samples: list[tuple[float, int, int]], step_cpus: float) -> dict[str, Any]:
    """From (time, LS usage ns, BE usage ns) samples around an LS step: when LS stepped, where
    BE settled, how long BE took to get there (None: LS never stepped or BE never came near)."""
    ls_rates, be_rates = _rates(samples, 1), _rates(samples, 2)
    stepped = next((t for t, cpus in ls_rates if cpus >= step_cpus / 2), None)
    if stepped is None or not be_rates:
        return {"yield_s": None, "why": "LS never reached half its step"}
    before = [cpus for t, cpus in be_rates if t < stepped]
    tail = [cpus for t, cpus in be_rates if t >= be_rates[-1][0] - SETTLED_TAIL_S]
    settled = statistics.fmean(tail)
    reached = next((t for t, cpus in be_rates if t >= stepped and cpus <= settled + NEAR_SETTLED_CPUS), None)
    return {"yield_s": None if reached is None else round(reached - stepped, 3),
            "be_cpus_before": round(statistics.fmean(before), 3) if before else None,
            "be_cpus_settled": round(settled, 3),
            "ls_cpus_settled": round(statistics.fmean(c for t, c in ls_rates if t >= ls_rates[-1][0] - SETTLED_TAIL_S), 3)}


def measure_turn(unit: NodeUnderTest, busy_states: list[int], run: int) -> dict[str, Any]:
    """One mode's turn: every LS state, alone and with BE; the yield in the quiet state."""
    out: dict[str, Any] = {}
    states = busy_states if run % 2 == 0 else busy_states[::-1]
    for busy in states:
        state = "quiet" if busy == 0 else f"busy {busy}%"
        ls, be = f"ls-{run}-{busy}", f"be-{run}-{busy}"
        load = f"{PROBE_IN_CONTAINER} duty {busy} & " if busy else ""
        ls_cid, ip = unit.start(ls, "LS", f"{load}exec {PROBE_IN_CONTAINER} server {PORT} {SERVER_WORK_US}")
        try:
            time.sleep(0.5)
            alone = unit.measure(ls_cid, ip, None)
            loops = " & ".join([f"{PROBE_IN_CONTAINER} spin"] * CPUS)
            be_cid, _ = unit.start(be, "BE", f"{loops} & wait")
            time.sleep(unit.args.settle)
            with_be = unit.measure(ls_cid, ip, be_cid)
            stepped = unit.step_yield(ls_cid, be_cid) if busy == 0 else None
        finally:
            unit.remove(ls, be)
        out[state] = {"alone": alone, "with_be": with_be, **({"step": stepped} if stepped else {})}
        print(f"  run {run} {unit.mode:8s} LS {state:9s} " + "  ".join(
            f"{v}: p99 {alone[v]['p99_us']:.0f} -> {with_be[v]['p99_us']:.0f} us, p99.9 {alone[v]['p999_us']:.0f} "
            f"-> {with_be[v]['p999_us']:.0f} us, BE {with_be[v]['be_cpus']:.2f} CPUs "
            f"({with_be[v]['be_share_of_idle']:.2f} of idle)" for v in unit.args.variants)
              + (f"  yield {stepped['yield_s']} s (BE {stepped['be_cpus_before']} -> {stepped['be_cpus_settled']})"
                 if stepped else ""), flush=True)
    return out


def figures(turn: dict[str, Any]) -> dict[str, float | None]:
    """One turn's figures, flat: "<state> <variant> p99 alone/with BE" (us), ratios, BE's share, yield."""
    flat: dict[str, float | None] = {}
    for state, m in turn.items():
        if state == "pod start":
            flat["pod start p50 s"] = m["p50_s"]
            flat["pod start p50 vs direct"] = m.get("p50_vs_direct")
            continue
        for variant, alone in m["alone"].items():
            if variant == "ls_cgroup":
                continue
            with_be = m["with_be"][variant]
            for q in ("p99", "p999"):
                flat[f"{state} {variant} {q} alone us"] = alone[f"{q}_us"]
                flat[f"{state} {variant} {q} with BE us"] = with_be[f"{q}_us"]
                flat[f"{state} {variant} {q} ratio"] = round(with_be[f"{q}_us"] / max(1.0, alone[f"{q}_us"]), 2)
            flat[f"{state} {variant} BE share of idle"] = with_be["be_share_of_idle"]
            if "agent_cpus" in alone:
                flat[f"{state} {variant} agent CPUs alone"] = alone["agent_cpus"]
                flat[f"{state} {variant} agent CPUs with BE"] = with_be["agent_cpus"]
            for when, measured in (("alone", alone), ("with BE", with_be)):
                if "agent_ticks_per_s" in measured:
                    flat[f"{state} {variant} agent ticks/s {when}"] = measured["agent_ticks_per_s"]["count"]
        if "step" in m:
            flat["yield s"] = m["step"]["yield_s"]
            flat["BE CPUs after the step"] = m["step"]["be_cpus_settled"]
    return flat


def over_runs(runs: list[dict[str, dict[str, Any]]], modes: list[str],
              flatten: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """Per mode and figure (`flatten` makes a turn's figures; default this bench's): each run's
    value, their median, min and max."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for mode in modes:
        flats = [(flatten or figures)(run[mode]) for run in runs]
        out[mode] = {}
        for key in flats[0]:
            values = [v for f in flats if (v := f.get(key)) is not None]
            out[mode][key] = {"runs": [f.get(key) for f in flats],
                              **({"median": round(statistics.median(values), 3), "min": min(values),
                                  "max": max(values)} if values else {"median": None})}
    return out


def table(summary: dict[str, dict[str, dict[str, Any]]], modes: list[str]) -> str:
    keys = list(dict.fromkeys(key for mode in modes for key in summary[mode]))  # direct has no agent rows
    lines = ["| figure | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for key in keys:
        cells = []
        for mode in modes:
            fig = summary[mode].get(key, {})
            if fig.get("median") is None:
                cells.append("—")
            else:
                spread = f" ({fig['min']:g}–{fig['max']:g})" if len(fig["runs"]) > 1 else ""
                cells.append(f"{fig['median']:g}{spread}")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def start_pods(nodes: dict[str, Any], count: int, run: int) -> dict[str, dict[str, float]]:
    """`count` pods per node started in balanced turns (bench.k8s_node), then deleted: the p50
    of each node's start times and its ratio to direct's."""
    latencies = interleaved_start_latencies(nodes, count, prefix=f"start{run}")
    for mode, node in nodes.items():
        for i in range(count):
            node.client().delete(node.pod_path(f"start{run}-{mode}-{i}"), grace_seconds=0)
    out = {mode: {"p50_s": round(statistics.median(values), 4)} for mode, values in latencies.items()}
    if "direct" in out:
        for mode in out:
            out[mode]["p50_vs_direct"] = round(out[mode]["p50_s"] / out["direct"]["p50_s"], 3)
    print(f"  run {run} pod start p50: " + "  ".join(f"{mode} {r['p50_s']:.3f} s" for mode, r in out.items()),
          flush=True)
    return out


def agent_load(nodes: dict[str, Any], pod_counts: list[int], window_s: float) -> dict[str, list[dict[str, Any]]]:
    """Each agent's CPU and RSS over `window_s` of kubelet's own calls with each count of pods
    running (bench.k8s_node.load_windows), one node at a time; the load pods deleted after."""
    out: dict[str, list[dict[str, Any]]] = {}
    for mode, node in nodes.items():
        if not _agent(node)[1]:
            continue
        print(f"  {mode}:", flush=True)
        out[mode] = load_windows(node, pod_counts, window_s)
        for i in range(max(pod_counts, default=0)):
            node.client().delete(node.pod_path(f"load-{i}"), grace_seconds=0)
    return out


def wait_for_nodeslo(plane: ControlPlane, nodes: dict[str, Any], timeout: float = 120.0) -> None:
    """koord-manager has rendered each node's NodeSLO with BE suppression on, and each koordnode
    has applied it (koordlet's informer takes it within its resync; its turn starts later)."""
    client = plane.client()
    deadline = time.monotonic() + timeout

    def rendered(name: str) -> bool:
        path = f"/apis/slo.koordinator.sh/v1alpha1/nodeslos/{name}"
        return client.exists(path) and bool(
            client.get(path).get("spec", {}).get("resourceUsedThresholdWithBE", {}).get("enable"))

    for mode, node in nodes.items():
        while not (rendered(node.name) and (node.koordnode is None or "strategy.cpu_suppress.enable" in (
                ((node.koordnode.status().get("kubernetes") or {}).get("nodeslo") or {}).get("keys") or {}))):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{mode}'s NodeSLO not rendered and applied in {timeout:.0f} s")
            time.sleep(1)


def autogroup_nice(path: Path = Path("/proc/self/autogroup")) -> int | None:
    """The nice value of this process's autogroup (None: no autogroups). The rr client runs in
    it, outside kubepods: a shell's autogroup at nice 19 gives it 1/70 of kubepods' weight."""
    try:
        return int(path.read_text().split("nice")[1])
    except (OSError, IndexError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--runs", type=int, default=5, help="runs (5: each mode in every place of the turns once)")
    parser.add_argument("--rounds", type=int, default=8000)
    parser.add_argument("--ls-busy", default="60", help="busy LS states, percent of a CPU (60); quiet always runs")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--settle", type=float, default=5.0, help="seconds of BE before measuring beside it (5)")
    parser.add_argument("--step-cpus", type=float, default=1.5, help="LS's step, CPUs of work (1.5)")
    parser.add_argument("--step-seconds", type=float, default=10.0)
    parser.add_argument("--suppress-policy", choices=("cpuset", "cfsQuota"), default="cfsQuota")
    parser.add_argument("--start-pods", type=int, default=20,
                        help="pods per node started in turns each run, for pod start p50 (20; 0: none)")
    parser.add_argument("--load-pods", default="20,100",
                        help='after the runs, each agent\'s CPU and RSS with these many pods running (20,100; "": none)')
    parser.add_argument("--window", type=float, default=60.0, help="seconds of each load window (60)")
    parser.add_argument("--koordnode-toml", help="a TOML file added to every koordnode's configuration")
    parser.add_argument("--json", help="also write the results there")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if not set(modes) <= set(MODES) or len(set(modes)) != len(modes):
        parser.error(f"--modes: distinct names from {MODES}")
    args.variants = args.variants.split(",")
    if not set(args.variants) <= set(VARIANTS):
        parser.error(f"--variants: from {VARIANTS}")
    busy_states = [0, *(int(v) for v in args.ls_busy.split(",") if v)]
    args.load_pods = [int(v) for v in args.load_pods.split(",") if v.strip()]
    if autogroup_nice() not in (None, 0):
        parser.error(f"this session's autogroup runs at nice {autogroup_nice()}: the rr client would be starved; "
                     "run the benchmark in a session of its own (setsid python3 -m bench.k8s_latency ...)")

    extra_toml = Path(args.koordnode_toml).read_text() if args.koordnode_toml else ""
    workdir = Path(tempfile.mkdtemp(prefix="bench-k8s-latency-"))
    probe = build_probe(workdir)
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "machine": f"{CPUS} CPUs, kernel {os.uname().release}",
                               "load_before": os.getloadavg(), "args": {k: v for k, v in vars(args).items()},
                               "runs": []}
    print(f"{results['date']}, {results['machine']}, load average before {os.getloadavg()[0]:.2f}", flush=True)
    with IdleLatencyHold(), ControlPlane(workdir / "control-plane", node_names=NODE_NAMES) as plane, \
            koordinator(plane, workdir, modes, slo_controller_config(args.suppress_policy)), \
            contextlib.ExitStack() as stack:
        nodes = {mode: stack.enter_context(bench_node(workdir, plane, i, mode, {}, {"PodAndContainerStatsFromCRI": True},
                                                 cluster=True, extra_toml=extra_toml))
                 for i, mode in enumerate(modes)}
        wait_for_nodeslo(plane, nodes)
        units = {mode: NodeUnderTest(mode, node, probe, args) for mode, node in nodes.items()}
        for unit in units.values():
            stack.callback(unit.close)
        orders = turn_orders(len(modes))
        for run in range(args.runs):
            turn: dict[str, Any] = {}
            for k in orders[run % len(orders)]:
                turn[modes[k]] = measure_turn(units[modes[k]], busy_states, run)
            if args.start_pods:
                for mode, started in start_pods(nodes, args.start_pods, run).items():
                    turn[mode]["pod start"] = started
            results["runs"].append(turn)
            if args.json:  # each run kept as it ends: a node that fails later loses only its run
                Path(args.json).write_text(json.dumps(results, indent=1))
        if args.load_pods:
            results["agent_load"] = agent_load(nodes, args.load_pods, args.window)
    results["load_after"] = os.getloadavg()
    results["summary"] = over_runs(results["runs"], modes)
    print(f"load average after {os.getloadavg()[0]:.2f}")
    print(table(results["summary"], modes))
    for mode, windows in results.get("agent_load", {}).items():
        print(f"{mode}: " + "; ".join(f"{w['pods']} pods {w[w['agent'] + '_cpu_percent_of_a_core']} % of a core, "
                                     f"{w[w['agent'] + '_rss_mb']} MB" for w in windows))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
