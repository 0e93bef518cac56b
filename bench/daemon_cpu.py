#!/usr/bin/env python3
"""CPU used by the whole `koordnode run` process with N pods on the test bed (root, real containerd).

Half the pods are LS (Burstable, 1 CPU requested, a short burst of work every second), half BE
(BestEffort, a short burst every second), as kubelet would create them (its QoS tiers and pod
cgroups are reproduced). After a settle time the daemon's utime + stime (with the children it
ran, such as nft) over --seconds is reported as percent of one core, with how its wake-ups are
made (pressure polling or not, LS usage events), and split by thread (CPU time from
/proc/PID/task/*/schedstat; thread names from `py-spy dump` when py-spy is on PATH): the event
loop (MainThread), the QoS tick thread (koordnode-qos), the worker threads of asyncio.to_thread
(asyncio_*: the reconcile passes), others. Setups:

    default    koordnode's defaults (BE pods in the idle BE group, LS usage events)
    tier       BE pods left in kubelet's besteffort tier (be_idle_group = false): pressure polling
    nousage    the BE group without usage events (usage_wake_cpu_ms = 0): pressure polling

    python3 -m bench.daemon_cpu [--pods 20] [--seconds 60] [--setups default,tier]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

SETUPS = {
    "default": "",
    "tier": "[cgroup]\nbe_idle_group = false\n",
    "nousage": "[qos_manager]\nusage_wake_cpu_ms = 0\n",
}
BURST = "while :; do i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; sleep 1; done"


def cpu_seconds(pid: int) -> float:
    """utime + stime of the daemon and of the children it waited for (tc, nft, ...)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def thread_cpu_ns(pid: int) -> dict[int, int]:
    """tid -> ns on CPU (first field of schedstat) for every thread of `pid`."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return out


def thread_names(pid: int) -> dict[int, str]:
    """tid -> Python thread name, from `py-spy dump` (empty without py-spy)."""
    spy = shutil.which("py-spy")
    if spy is None:
        return {}
    try:
        text = subprocess.run([spy, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True,
                              text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    names = {}
    for m in re.finditer(r'^Thread (\d+) \([^)]*\): "([^"]*)"', text, re.M):
        names[int(m.group(1))] = m.group(2)
    return names


def thread_groups(pid: int, before: dict[int, int], after: dict[int, int], seconds: float) -> dict[str, float]:
    """ms of CPU per second of wall time, by role."""
    names = thread_names(pid)
    groups: dict[str, float] = {}
    for tid, ns in after.items():
        name = names.get(tid, f"tid {tid}")
        role = ("event loop" if name == "MainThread" else "qos tick" if name.startswith("koordnode-qos")
                else "to_thread workers" if name.startswith("asyncio_") else name)
        groups[role] = groups.get(role, 0.0) + (ns - before.get(tid, 0)) / 1e6 / seconds
    return {k: round(v, 2) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])}


def make_pods(bed, cri, n: int) -> list[str]:
    from tests.support.cri import container_config, run_pod, sandbox_config, start_container
    from tests.support.kubelet_tiers import kubelet_ensure_pod_cgroup

    sids = []
    for i in range(n):
        ls = i % 2 == 0
        uid = uuid.uuid4().hex
        tier = "burstable" if ls else "besteffort"
        kubelet_ensure_pod_cgroup(bed.kubepods_cgroup, tier, uid, cpu_shares=1024 if ls else 2)
        labels = {"koordinator.sh/qosClass": "LS"} if ls else {}
        sb = sandbox_config(bed, f"{'ls' if ls else 'be'}-{i}", qos=tier, labels=labels, uid=uid)
        sids.append(run_pod(cri, sb))
        start_container(cri, sids[-1], sb, container_config(
            bed, "app", ["sh", "-c", BURST], resources={"cpu_shares": 1024 if ls else 2}))
    return sids


def start_profiler(pid: int, out: str, seconds: float) -> subprocess.Popen:
    """py-spy (not a dependency: `pip install py-spy` to use --profile) sampling every thread of
    the daemon over the measured window, as collapsed stacks (one line per stack, then a count)."""
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--profile needs py-spy on PATH (pip install py-spy)")
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "1000", "--nonblocking",
                             "--format", "raw", "--output", out, "--duration", str(int(seconds))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_setup(bed, work: Path, setup: str, pods: int, settle: float, seconds: float,
              profile: str | None = None) -> dict:
    from tests.support.cri import Cri, remove_pod
    from tests.support.koordnode_runner import KoordnodeProcess

    kn = KoordnodeProcess(work / f"kn-{setup}", str(bed.socket), kubepods=bed.kubepods_cgroup,
                          extra_toml=SETUPS[setup]).start()
    cri = Cri(kn.listen)
    sids: list[str] = []
    try:
        kn.wait_rebuilt()
        sids = make_pods(bed, cri, pods)
        time.sleep(settle)
        spy = start_profiler(kn.proc.pid, f"{profile}.{setup}.txt", seconds) if profile else None
        ticks0 = kn.status()["qos_manager"]["ticks"]
        c0, t0, th0 = cpu_seconds(kn.proc.pid), time.monotonic(), thread_cpu_ns(kn.proc.pid)
        time.sleep(seconds)
        c1, t1, th1 = cpu_seconds(kn.proc.pid), time.monotonic(), thread_cpu_ns(kn.proc.pid)
        ticks1 = kn.status()["qos_manager"]["ticks"]
        if spy is not None:
            spy.wait(30)
        manager = kn.status()["qos_manager"]
        return {
            "setup": setup,
            "cpu_percent": round(100 * (c1 - c0) / (t1 - t0), 3),
            "pressure_watch": manager["pressure_watch"].get("note") or manager["trigger_mode"],
            "usage_watch": manager.get("usage_watch", {}).get("mode"),
            "ticks": manager["ticks"]["count"],
            "woken_by_usage": manager["ticks"].get("woken_by_usage"),
            # within the measured window (the counts above are since start)
            "window_ticks": ticks1["count"] - ticks0["count"],
            "window_woken_by_usage": (ticks1.get("woken_by_usage") or 0) - (ticks0.get("woken_by_usage") or 0),
            "woken_by_pressure": manager["ticks"]["woken_by_pressure"],
            "threads_ms_per_s": thread_groups(kn.proc.pid, th0, th1, t1 - t0),
        }
    finally:
        for sid in sids:
            try:
                remove_pod(cri, sid)
            except Exception:  # noqa: BLE001 - best effort cleanup
                pass
        cri.close()
        kn.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--setups", default="default,tier")
    ap.add_argument("--profile", metavar="PREFIX", help=argparse.SUPPRESS)  # py-spy stacks to PREFIX.SETUP.txt
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root", file=sys.stderr)
        return 2
    from tests.support.kubelet_tiers import kubelet_update_qos_cgroups, prepare_qos_tiers
    from tests.testbed.containerd_bed import ContainerdBed

    load = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="koordnode-daemon-cpu-") as tmp:
        with ContainerdBed(Path(tmp) / "bed") as bed:
            prepare_qos_tiers(bed.kubepods_cgroup)
            kubelet_update_qos_cgroups(bed.kubepods_cgroup)
            for setup in args.setups.split(","):
                rows.append(run_setup(bed, Path(tmp), setup.strip(), args.pods, args.settle, args.seconds,
                                        args.profile))
                print(rows[-1], flush=True)
    print(f"\n{os.cpu_count()} CPUs, {args.pods} pods, {args.seconds:.0f} s; load average {load:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after\n")
    print("| setup | daemon CPU (% of a core) | by thread (ms of CPU per s) | pressure wake-ups | LS usage wake-ups "
          "| ticks in the window (woken by usage) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        threads = ", ".join(f"{k} {v:.2f}" for k, v in r["threads_ms_per_s"].items() if v >= 0.01)
        print(f"| {r['setup']} | {r['cpu_percent']:.2f}% | {threads} | {r['pressure_watch']} | {r['usage_watch']} | "
              f"{r['window_ticks']} ({r['window_woken_by_usage']}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
