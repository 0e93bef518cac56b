#!/usr/bin/env python3
"""What koordnode adds to a pass-through CRI call.

Starts a private containerd (the test bed) with N containers, and `koordnode run` in front of
it as its own process, then issues the same calls directly and through koordnode, interleaved
(alternating which goes first) so both see the same machine state. Reports p50/p99 per call,
the p50 ratio and the added milliseconds.

    sudo python3 -m bench.proxy_overhead [--iterations 2000] [--containers 50] [--json out.json]
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
import psutil

from koordnode.cri import api_pb2 as pb
from tests.support.cri import Cri, container_config, sandbox_config
from tests.support.koordnode_runner import KoordnodeProcess
from tests.testbed.containerd_bed import ContainerdBed


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def make_containers(bed: ContainerdBed, cri: Cri, n: int) -> list[str]:
    ids = []
    per_pod = 10
    for p in range((n + per_pod - 1) // per_pod):
        sb = sandbox_config(bed, f"bench-{p}")
        sid = cri.rt.RunPodSandbox(pb.RunPodSandboxRequest(config=sb), timeout=60).pod_sandbox_id
        for c in range(min(per_pod, n - len(ids))):
            cfg = container_config(bed, f"c{c}", ["sleep", "3600"])
            ids.append(cri.rt.CreateContainer(
                pb.CreateContainerRequest(pod_sandbox_id=sid, config=cfg, sandbox_config=sb), timeout=60
            ).container_id)
    return ids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--containers", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--extra-toml", default="", help="appended to koordnode's config (e.g. to slow the QoS manager)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kn-bench-"))
    with ContainerdBed(work / "bed") as bed:
        direct_cri = Cri(bed.address)
        cids = make_containers(bed, direct_cri, args.containers)
        extra = args.extra_toml.replace("\\n", "\n")
        if "[qos_manager]" not in extra:
            extra += f'[qos_manager]\nkubepods_cgroup = "{bed.kubepods_cgroup}"\n'
        kn = KoordnodeProcess(work / "kn", str(bed.socket), extra_toml=extra).start()
        kn_proc = psutil.Process(kn.proc.pid)
        try:
            channels = {
                "direct": grpc.insecure_channel(bed.address),
                "koordnode": grpc.insecure_channel(f"unix://{kn.listen}"),
            }
            calls = {
                "Version": ("/runtime.v1.RuntimeService/Version", pb.VersionRequest(version="v1")),
                f"ListContainers({len(cids)})": ("/runtime.v1.RuntimeService/ListContainers",
                                                 pb.ListContainersRequest()),
                "ContainerStatus": ("/runtime.v1.RuntimeService/ContainerStatus",
                                    pb.ContainerStatusRequest(container_id=cids[0])),
                "ListImages": ("/runtime.v1.ImageService/ListImages", pb.ListImagesRequest()),
            }
            stubs = {
                (name, path_name): channels[path_name].unary_unary(path)
                for name, (path, _) in calls.items()
                for path_name in channels
            }
            bodies = {name: req.SerializeToString() for name, (_, req) in calls.items()}
            samples: dict[tuple[str, str], list[float]] = {key: [] for key in stubs}
            order = list(channels)
            cpu_at_start = 0.0
            for i in range(args.warmup + args.iterations):
                if i == args.warmup:
                    cpu_at_start = sum(kn_proc.cpu_times()[:2])
                for name in calls:
                    for path_name in (order if i % 2 == 0 else order[::-1]):
                        stub = stubs[(name, path_name)]
                        t0 = time.perf_counter_ns()
                        stub(bodies[name], timeout=10)
                        elapsed = (time.perf_counter_ns() - t0) / 1e6
                        if i >= args.warmup:
                            samples[(name, path_name)].append(elapsed)
            rss_mb = kn_proc.memory_info().rss / 2**20
            cpu_s = sum(kn_proc.cpu_times()[:2])
            # The daemon's CPU (user + system) per relayed call, its QoS manager's ticks included.
            cpu_per_call_us = (cpu_s - cpu_at_start) / (args.iterations * len(calls)) * 1e6
        finally:
            kn.stop()
            for sid in bed.list_pod_ids():
                bed.remove_pod(sid)

    results = []
    for name in calls:
        d, k = samples[(name, "direct")], samples[(name, "koordnode")]
        row = {
            "call": name,
            "direct_p50_ms": percentile(d, 50), "direct_p99_ms": percentile(d, 99),
            "koordnode_p50_ms": percentile(k, 50), "koordnode_p99_ms": percentile(k, 99),
        }
        row["p50_ratio"] = row["koordnode_p50_ms"] / row["direct_p50_ms"]
        row["added_p50_ms"] = row["koordnode_p50_ms"] - row["direct_p50_ms"]
        row["added_p99_ms"] = row["koordnode_p99_ms"] - row["direct_p99_ms"]
        row["added_mean_ms"] = statistics.fmean(k) - statistics.fmean(d)
        results.append(row)

    machine = f"{platform.node()} {platform.machine()} {psutil.cpu_count()} CPUs, " \
              f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}"
    print(f"# proxy overhead: {args.iterations} interleaved iterations per call, {machine}")
    print("| call | direct p50 | koordnode p50 | p50 ratio | added p50 | direct p99 | koordnode p99 | added p99 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['call']} | {r['direct_p50_ms']:.3f} ms | {r['koordnode_p50_ms']:.3f} ms | "
              f"{r['p50_ratio']:.2f} | {r['added_p50_ms']:+.3f} ms | {r['direct_p99_ms']:.3f} ms | "
              f"{r['koordnode_p99_ms']:.3f} ms | {r['added_p99_ms']:+.3f} ms |")
    print(f"koordnode process after the run: RSS {rss_mb:.1f} MiB, CPU {cpu_s:.1f} s; "
          f"{cpu_per_call_us:.0f} µs of its CPU per relayed call while measured")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "iterations": args.iterations,
                                         "results": results, "rss_mb": rss_mb,
                                         "cpu_per_relayed_call_us": cpu_per_call_us}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
