#!/usr/bin/env python3
"""koordnode under a real kubelet: pod start latency, its CPU and memory under kubelet's own
call load, and kubelet's CRI call rate by method.

Uses the real-node test bed (``scripts/k8s-bed.sh`` builds kubelet, kube-apiserver, etcd and
containerd 2.x from their Go modules): one etcd + kube-apiserver, then one node per mode, each
with its own containerd and kubelet:

* **pod start**: ``--pods`` pods (30) created one after another through the API, each timed from
  the create call to the API reporting it Running, for kubelet → containerd direct, through
  koordnode's proxy, and with koordnode as containerd's NRI plugin;
* **load**: on the proxy node, ``--load-pods`` (20, then 100) pods running, koordnode's CPU time
  and RSS over ``--window`` seconds (60) of kubelet's own calls (PLEG relists, stats, status),
  and the calls by method from koordnode's counters; the window opens once containerd holds
  exactly the running pods' sandboxes (kubelet removes deleted pods' sandboxes minutes later).

``--modes ...,koordlet`` adds a node whose agent is Koordinator's koordlet v1.8.0 in NRI mode
(``scripts/k8s-bed.sh koordlet koordinator`` builds it; koord-manager runs for its NodeSLO), with
its own load windows (koordlet's CPU and RSS); the koordnode nodes then run with ``[kubernetes]``
on the same API server, so both agents watch their NodeSLO and pods and report their NodeMetric.

With ``--interleave`` the three nodes run side by side and the pods start in turns (direct, proxy,
NRI, the first of each turn rotating), so a drift of the machine's load meets every mode alike;
without it each mode's pods start while only its own node runs.

To compare two versions of koordnode, ``--proxy-from NAME=DIR`` adds a proxy node whose koordnode
runs from another checkout (``git worktree add DIR COMMIT``), interleaved with the others, and
``--runs N`` repeats the pod starts N times, each on fresh nodes and a fresh API server: one run of
40 pods moves by a few per cent on a 2-core machine, so compare medians over runs. Interleaved
runs also report kubelet's own timings over the pod starts (its /metrics: each CRI operation's
mean, each pod worker sync's), so what a mode adds to a start is seen call by call
(``kubelet_added_ms``: the median over runs, against direct's).

    sudo python3 -m bench.k8s_node [--pods 30] [--load-pods 20,100] [--window 60] [--json out.json]
    sudo python3 -m bench.k8s_node --modes direct,proxy --proxy-from before=/tmp/before \\
        --interleave --runs 8 --pods 40 --load-pods ""
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.daemon_cpu import start_profiler, thread_cpu_ns, thread_groups
from tests.testbed.koord_bed import NAMESPACE, KoordManager, install_koordinator, install_koordnode_rbac
from tests.testbed.koordlet_bed import install_koordlet_rbac, koordlet_node
from tests.testbed.kube_bed import ControlPlane
from tests.testbed.real_node import NODE_NAMES, real_node

CLK_TCK = 100  # USER_HZ on Linux
PAGE = 4096


def _pod(name: str) -> dict[str, Any]:
    from tests.testbed.images import BUSYBOX_IMAGE_REF

    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"koordinator.sh/qosClass": "LS"}},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [
                {"name": "app", "image": BUSYBOX_IMAGE_REF, "imagePullPolicy": "Never",
                 "command": ["/bin/sleep", "3600"],
                 "resources": {"requests": {"cpu": "10m", "memory": "8Mi"}}}]}}


def _running(node, name: str) -> bool:
    return node.pod(name).get("status", {}).get("phase") == "Running"


def pod_start_latency(node, name: str) -> float:
    """Seconds from the create call to the API reporting the pod Running."""
    began = time.monotonic()
    node.create_pod(_pod(name))
    while not _running(node, name):
        if time.monotonic() - began > 120:
            raise TimeoutError(f"pod {name} not Running after 120 s")
        time.sleep(0.02)
    return time.monotonic() - began


def pod_start_latencies(node, count: int, prefix: str) -> list[float]:
    return [pod_start_latency(node, f"{prefix}-{i}") for i in range(count)]


def turn_orders(n: int) -> list[list[int]]:
    """The orders of the turns, cycled (a balanced Latin square, Williams' design): over a
    cycle every mode starts at every place equally often and right after every other mode equally
    often. A fixed order (each turn a rotation of one cycle) lets a mode always follow the same
    one, whose trailing work (kubelet's status updates, the API server's writes) then lands on
    it alone: that moved a node's ratio by several per cent."""
    first = [0, *[(j + 1) // 2 if j % 2 else n - j // 2 for j in range(1, n)]]  # 0, 1, n-1, 2, n-2, ...
    rows = [[(x + r) % n for x in first] for r in range(n)]
    return rows if n % 2 == 0 or n == 1 else rows + [row[::-1] for row in rows]


def interleaved_start_latencies(nodes: dict[str, Any], count: int, prefix: str = "start") -> dict[str, list[float]]:
    """``count`` pods per mode (named PREFIX-MODE-I), started in turns, in the orders of turn_orders."""
    modes = list(nodes)
    latencies: dict[str, list[float]] = {mode: [] for mode in modes}
    orders = turn_orders(len(modes))
    for i in range(count):
        for k in orders[i % len(orders)]:
            mode = modes[k]
            latencies[mode].append(pod_start_latency(nodes[mode], f"{prefix}-{mode}-{i}"))
    return latencies


def _start_summary(latencies: list[float]) -> dict[str, Any]:
    return {"p50_s": round(statistics.median(latencies), 3), "p99_s": round(_percentile(latencies, 0.99), 3),
            "all_s": [round(x, 3) for x in latencies]}


def nri_answer_ms(node) -> dict[str, Any] | None:
    """NRI mode: koordnode's time to answer each event (mean and max ms, from its status), the
    part of a pod's start the runtime spends waiting on koordnode."""
    if node.mode != "nri" or node.koordnode is None:
        return None
    return (node.koordnode.status().get("nri") or {}).get("answer_ms")


# kubelet's own timings: each CRI call it makes (by operation) and each pod worker sync.
_KUBELET_TIMING = re.compile(
    r'^kubelet_(runtime_operations|pod_worker)_duration_seconds_(sum|count)\{[^}]*operation_type="([^"]+)"[^}]*\} (\S+)$',
    re.MULTILINE)


def kubelet_timings(metrics_text: str) -> dict[str, list[float]]:
    """From kubelet's /metrics: {"runtime:<operation>" or "worker:<operation>": [calls, seconds]}."""
    timings: dict[str, list[float]] = {}
    for family, part, operation, value in _KUBELET_TIMING.findall(metrics_text):
        key = f"{'runtime' if family == 'runtime_operations' else 'worker'}:{operation}"
        timings.setdefault(key, [0.0, 0.0])[0 if part == "count" else 1] += float(value)
    return timings


def timings_between(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """What kubelet timed in between: per operation its calls and their mean in ms (a mean: the
    pod worker's periodic syncs, a few of them slow, make its "sync" line noisy; "create" is the
    first sync of each new pod, RunPodSandbox to StartContainer's answer)."""
    out = {}
    for key, (calls, seconds) in sorted(after.items()):
        calls_before, seconds_before = before.get(key, [0.0, 0.0])
        if calls > calls_before:
            out[key] = {"calls": int(calls - calls_before),
                        "mean_ms": round(1000 * (seconds - seconds_before) / (calls - calls_before), 3)}
    return out


def _kubelet_timings(nodes: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    return {mode: kubelet_timings(node.kubelet.get("/metrics")) for mode, node in nodes.items()}


def timed_interleaved_starts(nodes: dict[str, Any], count: int) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """interleaved_start_latencies, and by node what its kubelet timed meanwhile (timings_between)."""
    before = _kubelet_timings(nodes)
    latencies = interleaved_start_latencies(nodes, count)
    after = _kubelet_timings(nodes)
    return latencies, {mode: timings_between(before[mode], after[mode]) for mode in nodes}


KOORDLET_MODES = ("koordlet", "koordlet-proxy")  # koordlet's hooks over NRI; through koord-runtime-proxy


def with_koordlet(modes: list[str]) -> bool:
    """A koordlet node among `modes`: koord-manager runs, and koordnode does its cluster part too."""
    return any(mode in KOORDLET_MODES for mode in modes)


def _agent(node) -> tuple[str, list[int]]:
    """The node agent's name and processes: koordnode; koordlet on a koordlet node, with
    koord-runtime-proxy when its hooks go through it (the agent is both); ("", []) on a direct
    node. The first process is the agent's own."""
    if node.koordnode is not None:
        return "koordnode", [node.koordnode.proc.pid]
    if node.koordlet is not None:
        proxy = node.runtime_proxy.pid if node.runtime_proxy is not None else None
        return "koordlet", [pid for pid in (node.koordlet.pid, proxy) if pid]
    return "", []


def agent_cpu_seconds(pids: list[int]) -> float:
    return sum(_cpu_seconds(pid) for pid in pids)


def _load_windows(node, args: argparse.Namespace, mode: str = "proxy") -> list[dict[str, Any]]:
    """A node's load windows, after its start pods are gone."""
    for stale in range(args.pods):
        node.client().delete(node.pod_path(f"start-{mode}-{stale}"), grace_seconds=0)
    return load_windows(node, [int(n) for n in args.load_pods.split(",") if n], args.window, args.profile)


def load_windows(node, pod_counts: list[int], window_s: float, profile: str | None = None) -> list[dict[str, Any]]:
    """Once only the node's own pods are left (a koordlet node keeps its seed pod, which the
    windows count too), a load window (load_window) with each count of pods running."""
    keep = 1 if node.koordlet is not None else 0
    node.client().wait_for("the earlier pods gone", lambda: len(node.client().get(
        "/api/v1/pods", fieldSelector=f"spec.nodeName={node.name}")["items"]) <= keep, timeout=180, interval=2)
    windows = []
    for pods in pod_counts:
        window = load_window(node, pods, window_s, profile)
        windows.append(window)
        agent = window["agent"]
        print(f"load {pods} pods: {agent} {window[f'{agent}_cpu_percent_of_a_core']}% of a core, "
              f"RSS {window[f'{agent}_rss_mb']} MB; by thread (ms/s) {window[f'{agent}_threads_ms_per_s']}; "
              f"kubelet's calls/s {window['kubelet_calls_per_s']}",
              flush=True)
    return windows


def _builds(specs: list[str]) -> dict[str, Path]:
    """--proxy-from NAME=DIR: the checkouts to run koordnode from, by node name."""
    builds: dict[str, Path] = {}
    for spec in specs:
        name, _, directory = spec.partition("=")
        if not name or not directory or not (Path(directory) / "koordnode" / "__main__.py").is_file():
            raise SystemExit(f"--proxy-from {spec!r}: NAME=DIR, DIR a checkout of koordnode")
        builds[name] = Path(directory).resolve()
    return builds


def bench_node(workdir: Path, plane: ControlPlane, i: int, mode: str, builds: dict[str, Path],
               feature_gates: dict[str, bool], cluster: bool = False, extra_toml: str = ""):
    """The bench's i-th node: a mode's, or a proxy node running koordnode from one of `builds`;
    mode "koordlet": a node whose agent is Koordinator's koordlet (NRI mode); "koordlet-proxy":
    koordlet behind koord-runtime-proxy. `cluster`: beside
    a koordlet node, koordnode runs with [kubernetes] too (NodeSLO, pod facts, NodeMetric,
    NodeResourceTopology), so both agents do an agent's whole work. `extra_toml`: added to
    every koordnode's configuration."""
    name = NODE_NAMES[i]
    if mode in KOORDLET_MODES:
        return koordlet_node(workdir / mode, plane, name, namespace=f"bench-{mode}", feature_gates=feature_gates,
                             runtime_proxy=mode == "koordlet-proxy")
    toml = ""
    if cluster and mode != "direct":
        kubeconfig = plane.kubeconfig((workdir / f"{mode}-kubeconfig").resolve(), plane.tokens["koordnode"])
        toml = f'[kubernetes]\nenable = true\nkubeconfig = "{kubeconfig}"\nnode_name = "{name}"\n'
    toml += extra_toml if mode != "direct" else ""
    return real_node(workdir / mode, mode="proxy" if mode in builds else mode, control_plane=plane,
                     node_name=name, namespace=f"bench-{mode}", feature_gates=feature_gates,
                     koordnode_repo=builds.get(mode), koordnode_toml=toml)


@contextlib.contextmanager
def koordinator(plane: ControlPlane, workdir: Path, modes: list[str], slo_config: dict[str, str] | None = None):
    """With a koordlet node, or `slo_config` (the data of koord-manager's slo-controller-config):
    Koordinator's CRDs, koordlet's and koordnode's RBAC and koord-manager, whose NodeSLO every
    agent then takes (default: colocation on, the rest Koordinator's defaults)."""
    if not with_koordlet(modes) and slo_config is None:
        yield None
        return
    install_koordinator(plane)
    install_koordlet_rbac(plane)
    install_koordnode_rbac(plane.client())
    plane.client().create(f"/api/v1/namespaces/{NAMESPACE}/configmaps", {
        "metadata": {"name": "slo-controller-config", "namespace": NAMESPACE},
        "data": slo_config or {"colocation-config": json.dumps({"enable": True})}})
    with KoordManager(plane, workdir / "koord-manager") as manager:
        yield manager


def _interleaved_run(workdir: Path, modes: list[str], builds: dict[str, Path], pods: int,
                     feature_gates: dict[str, bool], run_index: int = 0) -> dict[str, Any]:
    """One run of --runs: fresh API server and nodes, the pods started in turns; p50 by node and
    its ratio to direct's. Run r puts mode i on node slot (i + r) mod n: what differs between
    slots (the node's name, addresses, directories) meets every mode alike over the runs."""
    with ControlPlane(workdir / "control-plane", node_names=NODE_NAMES) as plane, \
            koordinator(plane, workdir, modes), contextlib.ExitStack() as stack:
        nodes = {mode: stack.enter_context(bench_node(workdir, plane, (i + run_index) % len(modes), mode, builds,
                                                 feature_gates, cluster=with_koordlet(modes)))
                 for i, mode in enumerate(modes)}
        latencies, timed = timed_interleaved_starts(nodes, pods)
    run: dict[str, Any] = {mode: {"p50_s": round(statistics.median(v), 4), "all_s": [round(x, 4) for x in v],
                                  "kubelet_ms": timed[mode]}
                           for mode, v in latencies.items()}
    if "direct" in run:
        for mode in modes:
            run[mode]["p50_vs_direct"] = round(run[mode]["p50_s"] / run["direct"]["p50_s"], 3)
    print("run: " + "  ".join(f"{mode} {r['p50_s']:.3f} s ({r.get('p50_vs_direct', '-')}x)"
                              for mode, r in run.items()), flush=True)
    return run


def _over_runs(runs: list[dict[str, Any]], modes: list[str]) -> dict[str, Any]:
    """Per node: the runs' p50 ratios to direct and their median, the median of every pod, and
    per operation kubelet timed the median of the runs' means (``kubelet_ms_median``)."""
    out: dict[str, Any] = {}
    for mode in modes:
        every = [x for run in runs for x in run[mode]["all_s"]]
        out[mode] = {"p50_s": round(statistics.median(every), 4)}
        if "direct" in modes:
            ratios = [round(run[mode]["p50_s"] / run["direct"]["p50_s"], 3) for run in runs]
            direct = statistics.median(x for run in runs for x in run["direct"]["all_s"])
            out[mode].update(p50_vs_direct_by_run=ratios, p50_vs_direct_median=round(statistics.median(ratios), 3),
                             p50_vs_direct_pooled=round(out[mode]["p50_s"] / direct, 3))
        timed = [run[mode].get("kubelet_ms", {}) for run in runs]
        out[mode]["kubelet_ms_median"] = {
            key: round(statistics.median(t[key]["mean_ms"] for t in timed if key in t), 3)
            for key in sorted({key for t in timed for key in t})}
    return out


def kubelet_added_ms(mine: dict[str, float], direct: dict[str, float]) -> dict[str, float]:
    """Per operation kubelet timed on both nodes, what a node's mean adds to direct's (ms), largest first."""
    added = {key: round(mine[key] - direct[key], 3) for key in mine if key in direct}
    return dict(sorted(added.items(), key=lambda item: -abs(item[1])))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _rss_mb(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20


def _only_running_pods(node, client) -> bool:
    """containerd holds a ready sandbox for each of the node's pods in the API, and nothing else."""
    uids = {p["metadata"]["uid"] for p in client.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node.name}")["items"]}
    sandboxes = node.containerd_pods()
    return len(sandboxes) == len(uids) and all(s["uid"] in uids and s["state"] == "SANDBOX_READY" for s in sandboxes)


def load_window(node, pods: int, window_s: float, profile: str | None = None) -> dict[str, Any]:
    """With ``pods`` pods running: koordnode's CPU and RSS over the window, by thread (the event
    loop relays kubelet's calls), kubelet's calls by method; `profile`: py-spy's stacks of the
    window to PROFILE.PODS.txt. An agent of two processes (koordlet and koord-runtime-proxy)
    counts both in CPU and RSS; its threads are the first's."""
    client = node.client()
    have = len(client.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node.name}")["items"])
    for i in range(have, pods):
        node.create_pod(_pod(f"load-{i}"))
    client.wait_for(f"{pods} pods Running", lambda: sum(
        p["status"].get("phase") == "Running"
        for p in client.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node.name}")["items"]) >= pods,
        timeout=60 + 3 * pods, interval=2)
    # kubelet removes the sandboxes of deleted pods in its own time (StopPodSandbox and
    # RemovePodSandbox for minutes after the API forgot them): measure only once it is done.
    client.wait_for("kubelet's clean-up of the earlier pods", lambda: _only_running_pods(node, client),
                    timeout=600, interval=5)
    time.sleep(30)  # let the creations' work settle
    agent, pids = _agent(node)
    if not pids:
        raise ValueError(f"node {node.name} runs no node agent")
    pid = pids[0]

    def calls() -> dict[str, int]:  # kubelet's calls as koordnode's proxy counts them (none through koordlet)
        return node.koordnode.status()["proxy"]["calls_by_method"] if node.koordnode is not None else {}

    calls_before = calls()
    spy = start_profiler(pid, f"{profile}.{pods}.txt", window_s) if profile else None
    cpu_before, began, threads_before = agent_cpu_seconds(pids), time.monotonic(), thread_cpu_ns(pid)
    time.sleep(window_s)
    cpu_after, ended, threads_after = agent_cpu_seconds(pids), time.monotonic(), thread_cpu_ns(pid)
    if spy is not None:
        spy.wait(30)
    calls_after = calls()
    settled = _only_running_pods(node, client)  # no clean-up started within the window either
    seconds = ended - began
    rates = {m: round((calls_after.get(m, 0) - calls_before.get(m, 0)) / seconds, 3)
             for m in sorted(calls_after) if calls_after.get(m, 0) > calls_before.get(m, 0)}
    return {"pods": pods, "window_s": round(seconds, 1), "agent": agent,
            f"{agent}_cpu_percent_of_a_core": round(100 * (cpu_after - cpu_before) / seconds, 3),
            f"{agent}_rss_mb": round(sum(_rss_mb(p) for p in pids), 1), "processes": len(pids),
            "kubelet_calls_per_s": rates,
            f"{agent}_threads_ms_per_s": thread_groups(pid, threads_before, threads_after, seconds),
            "only_running_pods": settled}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=30, help="pods started one by one per mode (30)")
    parser.add_argument("--load-pods", default="20,100", help="pod counts of the load windows (20,100)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds of each load window (60)")
    parser.add_argument("--modes", default="direct,proxy,nri")
    parser.add_argument("--interleave", action="store_true",
                        help="run the modes' nodes side by side and start their pods in turns")
    parser.add_argument("--json", help="also write the results there")
    parser.add_argument("--profile", metavar="PREFIX",
                        help="py-spy's stacks of each load window to PREFIX.PODS.txt (pip install py-spy)")
    parser.add_argument("--proxy-from", action="append", default=[], metavar="NAME=DIR",
                        help="also a proxy node running koordnode from the checkout DIR, named NAME (repeatable)")
    parser.add_argument("--runs", type=int, default=1,
                        help="with --interleave: repeat the pod starts this many times on fresh nodes (1)")
    args = parser.parse_args(argv)
    builds = _builds(args.proxy_from)
    modes = [*args.modes.split(","), *builds]
    if len(modes) > len(NODE_NAMES) or len(set(modes)) != len(modes):
        parser.error(f"at most {len(NODE_NAMES)} nodes with distinct names, not {modes}")
    if (builds or args.runs > 1) and not args.interleave:
        parser.error("--proxy-from and --runs compare nodes side by side: add --interleave")

    feature_gates = {"PodAndContainerStatsFromCRI": True}
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "start": {}}
    workdir = Path(tempfile.mkdtemp(prefix="bench-k8s-"))
    if args.runs > 1:
        results["runs"] = [_interleaved_run(workdir / f"run-{run}", modes, builds, args.pods, feature_gates, run)
                           for run in range(args.runs)]
        results["start"] = _over_runs(results["runs"], modes)
        if "direct" in modes:
            for mode in modes:
                if mode != "direct":
                    results["start"][mode]["kubelet_added_ms"] = kubelet_added_ms(
                        results["start"][mode]["kubelet_ms_median"], results["start"]["direct"]["kubelet_ms_median"])
        print(json.dumps({"start": results["start"]}, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        return 0
    with ControlPlane(workdir / "control-plane", node_names=NODE_NAMES) as plane, \
            koordinator(plane, workdir, modes):
        def node_of(i: int, mode: str):
            return bench_node(workdir, plane, i, mode, builds, feature_gates,
                              cluster=with_koordlet(modes))

        if args.interleave:
            with contextlib.ExitStack() as stack:
                nodes = {mode: stack.enter_context(node_of(i, mode)) for i, mode in enumerate(modes)}
                started, timed = timed_interleaved_starts(nodes, args.pods)
                for mode, latencies in started.items():
                    results["start"][mode] = _start_summary(latencies)
                    results["start"][mode]["kubelet_ms"] = timed[mode]
                    results["start"][mode]["nri_answer_ms"] = nri_answer_ms(nodes[mode])
                    print(f"pod start {mode:7s}: p50 {results['start'][mode]['p50_s']:.3f} s  "
                          f"p99 {results['start'][mode]['p99_s']:.3f} s", flush=True)
                if "proxy" in nodes:
                    results["load"] = _load_windows(nodes["proxy"], args)
                if "koordlet" in nodes:
                    results["load_koordlet"] = _load_windows(nodes["koordlet"], args, "koordlet")
                    if "nri" in nodes:  # koordlet's like: both NRI plugins
                        results["load_nri"] = _load_windows(nodes["nri"], args, "nri")
        else:
            for i, mode in enumerate(modes):
                with node_of(i, mode) as node:
                    agent, pids = _agent(node)
                    cpu_before = agent_cpu_seconds(pids)
                    results["start"][mode] = _start_summary(pod_start_latencies(node, args.pods, f"start-{mode}"))
                    results["start"][mode]["nri_answer_ms"] = nri_answer_ms(node)
                    if pids:  # the agent's CPU time per pod start (answers, Post hooks, its other work)
                        results["start"][mode][f"{agent}_cpu_ms_per_pod"] = round(
                            (agent_cpu_seconds(pids) - cpu_before) * 1000 / args.pods, 1)
                    print(f"pod start {mode:7s}: p50 {results['start'][mode]['p50_s']:.3f} s  "
                          f"p99 {results['start'][mode]['p99_s']:.3f} s", flush=True)
                    if mode == "proxy":
                        results["load"] = _load_windows(node, args)
                    if mode == "koordlet":
                        results["load_koordlet"] = _load_windows(node, args, "koordlet")
    direct = results["start"].get("direct")
    for mode in ("proxy", "nri", "koordlet", *builds):
        if direct and mode in results["start"]:
            results["start"][mode]["p50_vs_direct"] = round(results["start"][mode]["p50_s"] / direct["p50_s"], 3)
            results["start"][mode]["p99_vs_direct"] = round(results["start"][mode]["p99_s"] / direct["p99_s"], 3)
            if "kubelet_ms" in direct:  # interleaved
                results["start"][mode]["kubelet_added_ms"] = kubelet_added_ms(
                    {k: v["mean_ms"] for k, v in results["start"][mode]["kubelet_ms"].items()},
                    {k: v["mean_ms"] for k, v in direct["kubelet_ms"].items()})
    print(json.dumps({k: v for k, v in results.items()}, indent=1, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
