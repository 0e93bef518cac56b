#!/usr/bin/env python3
"""Pod start latency and CRI call latency: directly, through the proxy, and in NRI mode.

One private containerd 2.1 (Debian forky's package, NRI on a private socket) serves all three:
  direct    - CRI calls straight to containerd, no koordnode at all;
  proxy     - the same calls through `koordnode run` in proxy mode;
  nri       - straight to containerd again, with `koordnode run` registered as its NRI plugin.
Pod start = RunPodSandbox + CreateContainer + StartContainer, timed until StartContainer
returns; pods are removed between batches (not timed). The modes take turns in rounds, each
going first in turn, so they see the same machine state. CRI call latency compares direct calls without and with the
NRI plugin registered (NRI mode puts nothing in the path of these calls).

    sudo python3 -m bench.nri_latency [--rounds 3] [--pods 10] [--iterations 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

from koordnode.cri import api_pb2 as pb
from tests.support.cri import Cri, container_config, remove_pod, sandbox_config
from tests.support.koordnode_runner import KoordnodeProcess, short_socket_dir
from tests.support.kubelet_tiers import prepare_qos_tiers
from tests.testbed.containerd_bed import ContainerdBed
from tests.testbed.containerd_dist import containerd_bin_dir, containerd_version


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def summary(samples: list[float]) -> dict[str, float]:
    return {"n": len(samples), "p50_ms": percentile(samples, 50) * 1e3, "p95_ms": percentile(samples, 95) * 1e3,
            "mean_ms": statistics.fmean(samples) * 1e3}


def start_pods(bed: ContainerdBed, cri: Cri, n: int, tag: str, by_class: dict | None = None
               ) -> tuple[list[float], list[str]]:
    times, sids = [], []
    for i in range(n):
        qos, labels, res = (("besteffort", {}, {"cpu_shares": 2}) if i % 2 else
                            ("burstable", {"koordinator.sh/qosClass": "LS"}, {"cpu_shares": 512}))
        sb = sandbox_config(bed, f"{tag}-{i}", qos=qos, labels=labels)
        cfg = container_config(bed, "app", ["sleep", "3600"], resources=res)
        began = time.perf_counter()
        sid = cri.rt.RunPodSandbox(pb.RunPodSandboxRequest(config=sb), timeout=60).pod_sandbox_id
        cid = cri.rt.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=sid, config=cfg, sandbox_config=sb),
                                     timeout=60).container_id
        cri.rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
        times.append(time.perf_counter() - began)
        sids.append(sid)
        if by_class is not None:
            by_class.setdefault("BE" if i % 2 else "LS", []).append(times[-1])
    return times, sids


def call_latencies(channel: grpc.Channel, calls: dict, iterations: int) -> dict[str, list[float]]:
    stubs = {name: channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=lambda b: b) for name, (path, _) in calls.items()}
    out: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(iterations):
        for name, (_, request) in calls.items():
            began = time.perf_counter()
            stubs[name](request, timeout=10)
            out[name].append(time.perf_counter() - began)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pods", type=int, default=10, help="pods started per mode and round")
    ap.add_argument("--iterations", type=int, default=2000, help="CRI calls per kind, mode and round")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    bin_dir = containerd_bin_dir("forky")
    work = Path(tempfile.mkdtemp(prefix="kn-nri-bench-"))
    nri_socket = short_socket_dir() / "nri.sock"
    starts: dict[str, list[float]] = {"direct": [], "proxy": [], "nri": []}
    # BE pods run with cpu.idle = 1 under koordnode (either mode): on a busy machine their own
    # start-up (runc init inside the pod cgroup) waits for idle CPU. Reported apart.
    starts_by_class: dict[str, dict[str, list[float]]] = {m: {} for m in starts}
    calls_by_mode: dict[str, dict[str, list[float]]] = {"direct": {}, "nri": {}}
    late_answers: dict[str, int] = {}
    answer_ms: dict[str, list[dict]] = {}  # koordnode's own answer time per NRI event, per round
    with ContainerdBed(work / "bed", bin_dir=bin_dir, nri_socket=nri_socket) as bed:
        prepare_qos_tiers(bed.kubepods_cgroup)
        direct = Cri(bed.address)
        # Something to look at for ContainerStatus / ListContainers.
        _, standing = start_pods(bed, direct, 4, "standing")
        cid = direct.rt.ListContainers(pb.ListContainersRequest()).containers[0].id
        calls = {
            "Version": ("/runtime.v1.RuntimeService/Version", pb.VersionRequest(version="v1")),
            "ContainerStatus": ("/runtime.v1.RuntimeService/ContainerStatus", pb.ContainerStatusRequest(container_id=cid)),
            "ListContainers": ("/runtime.v1.RuntimeService/ListContainers", pb.ListContainersRequest()),
        }
        call_latencies(direct.channel, calls, 200)  # warm-up
        start_pods(bed, direct, 2, "warmup")
        for r in range(args.rounds):
            modes = ("direct", "proxy", "nri")
            for mode in modes[r % 3:] + modes[:r % 3]:  # each mode goes first once in three rounds
                kn = None
                cri = direct
                if mode == "proxy":
                    kn = KoordnodeProcess(work / f"kn-{mode}-{r}", str(bed.socket), kubepods=bed.kubepods_cgroup).start()
                    kn.wait_rebuilt()
                    cri = Cri(kn.listen)
                elif mode == "nri":
                    kn = KoordnodeProcess(work / f"kn-{mode}-{r}", str(bed.socket), nri_socket=str(nri_socket),
                                          kubepods=bed.kubepods_cgroup).start()
                    kn.wait_synchronized()
                try:
                    times, sids = start_pods(bed, cri, args.pods, f"{mode}{r}", starts_by_class[mode])
                    starts[mode] += times
                    if mode in calls_by_mode:
                        for name, samples in call_latencies(direct.channel, calls, args.iterations).items():
                            calls_by_mode[mode].setdefault(name, []).extend(samples)
                    for sid in sids:
                        remove_pod(cri, sid)
                    if mode == "nri":
                        nri_status = kn.status()["nri"]
                        for event, n in nri_status["answered_without_changes_after_deadline"].items():
                            late_answers[event] = late_answers.get(event, 0) + n
                        for event, ms in nri_status["answer_ms"].items():
                            answer_ms.setdefault(event, []).append(ms)
                finally:
                    if cri is not direct:
                        cri.close()
                    if kn is not None:
                        kn.stop()
        for sid in standing:
            remove_pod(direct, sid)
        direct.close()
        version = containerd_version(bin_dir)

    result = {
        "machine": {"cpus": len(__import__("os").sched_getaffinity(0)), "kernel": platform.release(),
                    "python": platform.python_version(), "containerd": version},
        "pod_start": {mode: summary(samples) for mode, samples in starts.items()},
        "pod_start_by_class": {mode: {cls: summary(s) for cls, s in by.items()} for mode, by in starts_by_class.items()},
        "cri_calls": {mode: {name: summary(s) for name, s in by.items()} for mode, by in calls_by_mode.items()},
        "nri_late_answers": late_answers,
        "nri_answer_ms": {event: {"mean": round(statistics.fmean(r["mean"] for r in rounds), 2),
                                  "max": max(r["max"] for r in rounds)} for event, rounds in answer_ms.items()},
    }
    print(f"containerd {version}, {result['machine']['cpus']} CPUs, kernel {platform.release()}")
    print("\npod start (RunPodSandbox -> StartContainer done)")
    print(f"{'mode':8} {'n':>4} {'p50':>9} {'p95':>9} {'mean':>9}")
    for mode, s in result["pod_start"].items():
        print(f"{mode:8} {s['n']:4d} {s['p50_ms']:8.1f}ms {s['p95_ms']:8.1f}ms {s['mean_ms']:8.1f}ms")
    for cls in ("LS", "BE"):
        print(f"  {cls} pods: " + ", ".join(
            f"{mode} p50 {result['pod_start_by_class'][mode][cls]['p50_ms']:.1f} ms" for mode in starts))
    print(f"NRI answers past the deadline (sent without changes): {late_answers or 'none'}")
    print("koordnode's answer time per NRI event (mean / max over the rounds):")
    for event, ms in sorted(result["nri_answer_ms"].items()):
        print(f"  {event:22} {ms['mean']:7.2f} ms / {ms['max']:7.2f} ms")
    print("\nCRI calls straight to containerd, without and with the NRI plugin registered")
    print(f"{'call':16} {'direct p50':>11} {'nri p50':>9} {'direct p95':>11} {'nri p95':>9}")
    for name in calls:
        d, n = result["cri_calls"]["direct"][name], result["cri_calls"]["nri"][name]
        print(f"{name:16} {d['p50_ms']:10.3f}ms {n['p50_ms']:8.3f}ms {d['p95_ms']:10.3f}ms {n['p95_ms']:8.3f}ms")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
