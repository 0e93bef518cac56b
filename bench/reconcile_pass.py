#!/usr/bin/env python3
"""CPU of one periodic reconcile pass with N pods on the test bed (root, real containerd, real cgroups).

koordnode runs in this process on the test bed (its own loop in a thread, periodic passes off);
N pods are created through it as in bench/daemon_cpu.py (half LS, half BE, each with one running
container, kubelet's tier and pod cgroups reproduced). Then the three calls of one pass
(`Reconciler.reconcile_once`, koordnode/periodic.py: the engine's reconcile, the resctrl and the net QoS reconcile) are run
--passes times from this thread on the loop's snapshot of the state, and each one's CPU time
(this thread's, so the daemon's other threads are not in it) is reported: median and max; and
the CPU of the engine's memory_plan(), which the QoS manager's memory_qos strategy calls every
10 s in the tick thread.

    python3 -m bench.reconcile_pass [--pods 20] [--passes 30] [--profile out.prof]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _timed(fn, *args) -> float:
    t0 = time.thread_time()
    fn(*args)
    return (time.thread_time() - t0) * 1000.0


def _count_results(engine, view) -> dict[tuple[str, str], int]:
    """One engine pass with the executor's apply wrapped to count what it returns."""
    counts: dict[tuple[str, str], int] = {}
    apply = engine.executor.apply

    def counting(writes, **kwargs):
        results = apply(writes, **kwargs)
        for r in results:
            key = (r.write.resource, r.status.value)
            counts[key] = counts.get(key, 0) + 1
        return results

    engine.executor.apply = counting
    try:
        engine.reconcile(False, view)
    finally:
        del engine.executor.apply
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=20)
    ap.add_argument("--passes", type=int, default=30)
    ap.add_argument("--profile", metavar="FILE", help="cProfile of the engine's passes to FILE")
    ap.add_argument("--counts", action="store_true", help="also count the executor's results of one pass")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root", file=sys.stderr)
        return 2
    from bench.daemon_cpu import make_pods
    from koordnode.qos.resctrl_control import containers_by_group
    from tests.support.cri import Cri, remove_pod
    from tests.support.koordnode_runner import InProcessKoordnode
    from tests.support.kubelet_tiers import kubelet_update_qos_cgroups, prepare_qos_tiers
    from tests.testbed.containerd_bed import ContainerdBed

    load = os.getloadavg()[0]
    rows: dict[str, list[float]] = {"engine": [], "resctrl": [], "netqos": []}
    memory_plan: list[float] = []
    with tempfile.TemporaryDirectory(prefix="koordnode-reconcile-pass-") as tmp:
        with ContainerdBed(Path(tmp) / "bed") as bed:
            prepare_qos_tiers(bed.kubepods_cgroup)
            kubelet_update_qos_cgroups(bed.kubepods_cgroup)
            kn = InProcessKoordnode(Path(tmp), str(bed.socket), extra_toml=(
                f'[qos_manager]\nkubepods_cgroup = "{bed.kubepods_cgroup}"\n'
                "[cgroup]\nreconcile_interval_s = 0\n")).start()
            cri = Cri(kn.listen)
            sids: list[str] = []
            try:
                kn.wait_rebuilt()
                sids = make_pods(bed, cri, args.pods)
                time.sleep(2)
                daemon = kn.daemon
                engine = daemon.qos
                profiler = cProfile.Profile() if args.profile else None
                for _ in range(args.passes):
                    view = kn.call(daemon.state.view)
                    groups = kn.call(lambda: containers_by_group(daemon.state, daemon.config.cgroup.driver))
                    networks = kn.call(daemon.pod_networks.ready_pods)
                    if profiler is not None:
                        profiler.enable()
                    rows["engine"].append(_timed(engine.reconcile, False, view))
                    if profiler is not None:
                        profiler.disable()
                    rows["resctrl"].append(_timed(daemon.resctrl.reconcile, groups))
                    rows["netqos"].append(_timed(daemon.netqos.reconcile, networks))
                    memory_plan.append(_timed(engine.memory_plan, view))
                    time.sleep(0.05)
                if profiler is not None:
                    profiler.dump_stats(args.profile)
                if args.counts:
                    counts = _count_results(engine, kn.call(daemon.state.view))
            finally:
                for sid in sids:
                    try:
                        remove_pod(cri, sid)
                    except Exception:  # noqa: BLE001 - best effort cleanup
                        pass
                cri.close()
                kn.stop()
    print(f"\n{os.cpu_count()} CPUs, {args.pods} pods, {args.passes} passes; load average {load:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after\n")
    print("| part of the pass | CPU median (ms) | max (ms) |")
    print("|---|---|---|")
    for name, values in rows.items():
        print(f"| {name} | {statistics.median(values):.2f} | {max(values):.2f} |")
    total = [sum(v) for v in zip(*rows.values(), strict=True)]
    print(f"| whole pass | {statistics.median(total):.2f} | {max(total):.2f} |")
    print(f"\nthe QoS manager's memory_qos planning (engine.memory_plan, every 10 s in the tick thread): "
          f"median {statistics.median(memory_plan):.2f} ms, max {max(memory_plan):.2f} ms")
    if args.counts:
        print("\nexecutor results of one pass (resource, outcome: count):")
        for (resource, status), n in sorted(counts.items()):
            print(f"  {resource:28} {status:10} {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
