#!/usr/bin/env python3
"""koordnode demo: a private containerd, koordnode in front of it, an LS and a BE pod competing.

What you see, once a second: the CPU each pod uses, the node's CPU pressure (PSI), the BE
tier's CFS quota, and every cgroup value koordnode changed, with its reason. Everything is
removed at the end (pods, cgroups, sockets, processes), also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.support.cri import Cri, container_config, remove_pod, run_pod, sandbox_config, start_container
from tests.support.koordnode_runner import KoordnodeProcess
from tests.support.kubelet_tiers import prepare_qos_tiers
from tests.testbed.containerd_bed import ContainerdBed

CG = Path("/sys/fs/cgroup")


def read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return "?"


def cpu_usage_ns(cgroup: str) -> int:
    try:
        return int((CG / "cpuacct" / cgroup.lstrip("/") / "cpuacct.usage").read_text())
    except (OSError, ValueError):
        return 0


def psi_cpu() -> str:
    text = read(Path("/proc/pressure/cpu"))
    some = text.splitlines()[0] if text != "?" else ""
    return some.split()[1] if some else "n/a"


class Tail:
    """New lines of koordnode's JSON log, one per cgroup write, as they appear."""

    def __init__(self, path: Path) -> None:
        self.path, self.pos = path, 0

    def writes(self) -> list[str]:
        out = []
        try:
            with open(self.path) as f:
                f.seek(self.pos)
                for line in f:
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue
                    if ev.get("event") in ("cgroup_write", "be quota", "strategy decision"):
                        where = ev.get("cgroup", ev.get("path", ""))
                        out.append(f"{ev.get('resource', '')} {ev.get('old')} -> {ev.get('new')} "
                                   f"on {where[-60:]}: {ev.get('reason', '')}")
                self.pos = f.tell()
        except OSError:
            pass
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=30, help="length of the live view (default 30)")
    ap.add_argument("--keep-logs", action="store_true", help="keep containerd's and koordnode's logs")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="koordnode-demo-"))
    stop = False

    def on_signal(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print(f"== starting a private containerd under {work}")
    with ContainerdBed(work / "containerd") as bed:
        prepare_qos_tiers(bed.kubepods_cgroup)  # what kubelet would have set up
        print("== starting koordnode in front of it")
        kn = KoordnodeProcess(work / "koordnode", str(bed.socket), kubepods=bed.kubepods_cgroup).start()
        cri = Cri(kn.listen)
        pods = []
        try:
            busy_be = ["sh", "-c", "while :; do :; done"]
            # The LS service idles for a third of the view, is busy (2 CPUs) for a third, then idles.
            step_at = max(args.seconds // 3, 1)
            busy = f"timeout {step_at} sh -c 'while :; do :; done'"
            ls_cmd = ["sh", "-c", f"sleep {step_at}; {busy} & {busy}; sleep 3600"]
            print("== RunPodSandbox/CreateContainer/StartContainer through koordnode: LS pod 'web', BE pod 'batch'")
            ls_sb = sandbox_config(bed, "web", qos="burstable", labels={"koordinator.sh/qosClass": "LS"})
            ls_sid = run_pod(cri, ls_sb)
            pods.append(ls_sid)
            ls_cid = start_container(cri, ls_sid, ls_sb, container_config(
                bed, "web", ls_cmd, resources={"cpu_shares": 2048}))
            be_sb = sandbox_config(bed, "batch", qos="besteffort", labels={"koordinator.sh/qosClass": "BE"})
            be_sid = run_pod(cri, be_sb)
            pods.append(be_sid)
            be_cid = start_container(cri, be_sid, be_sb, container_config(
                bed, "batch", busy_be + [], resources={"cpu_shares": 2}))
            ls_cg = f"{ls_sb.linux.cgroup_parent}/{ls_cid}"
            be_cg = f"{be_sb.linux.cgroup_parent}/{be_cid}"
            be_tier = be_sb.linux.cgroup_parent.rsplit("/", 1)[0]
            tail = Tail(kn.log_path)
            print(f"== live view for {args.seconds} s (the LS load steps up at {step_at} s and stops at {2 * step_at} s)")
            print(f"{'t':>3}  {'LS cpu':>7}  {'BE cpu':>7}  {'PSI cpu some avg10':>18}  {'BE tier quota':>13}")
            last = (cpu_usage_ns(ls_cg), cpu_usage_ns(be_cg), time.monotonic())
            for t in range(1, args.seconds + 1):
                if stop:
                    break
                time.sleep(1)
                now = (cpu_usage_ns(ls_cg), cpu_usage_ns(be_cg), time.monotonic())
                dt = now[2] - last[2]
                ls_pct = (now[0] - last[0]) / 1e9 / dt * 100
                be_pct = (now[1] - last[1]) / 1e9 / dt * 100
                last = now
                quota = read(CG / "cpu" / be_tier.lstrip("/") / "cpu.cfs_quota_us")
                print(f"{t:>3}  {ls_pct:6.1f}%  {be_pct:6.1f}%  {psi_cpu():>18}  {quota:>13}")
                for change in tail.writes():
                    print(f"       koordnode: {change}")
            print("== koordnode status (what it applied and why):")
            status = kn.status()
            for pod in status["pods"]:
                print(f"  {pod['namespace']}/{pod['name']}: class {pod.get('qos_class')} ({pod.get('qos_reason')})")
                for line in pod.get("applied", []):
                    print(f"    pod   {line}")
                for c in pod["containers"]:
                    for line in c.get("applied", []):
                        print(f"    {c['name']:5} {line}")
        finally:
            print("== cleaning up: pods, koordnode, containerd")
            for sid in pods:
                try:
                    remove_pod(cri, sid)
                except Exception as exc:  # containerd's own cleanup below still runs
                    print(f"   (remove {sid[:12]}: {exc})")
            cri.close()
            kn.stop()
    if args.keep_logs:
        print(f"== logs kept under {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    print("== done: no pods, cgroups, sockets or processes left")
    return 0


if __name__ == "__main__":
    sys.exit(main())
