#!/usr/bin/env python3
"""koordnode demo: a private containerd, koordnode in front of it, an LS and a BE pod competing.

The BE pod burns every CPU from the start. The LS pod idles for the first third of the view, is
busy on every CPU for the second third, then idles again. What you see, once a second: the CPUs
each pod uses, the CPUs the rest of the node uses (koordnode, containerd, anything else running
here), the node's CPU pressure (PSI), the CFS quota of the cgroup koordnode puts the BE budget on,
and every cgroup value koordnode changed, with its reason.

The cgroups are the ones koordnode reports over its admin socket (`koordnode status`): a BE pod
runs in koordnode's BE group (`<kubepods>/koordnode_be/pod<uid>`), not in the `besteffort` tier
kubelet asked for, and its budget is written on that group. Everything is removed at the end
(pods, cgroups, sockets, processes), also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from koordnode.admin.client import fetch_status
from koordnode.cri import api_pb2 as pb
from tests.support.cri import Cri, container_config, remove_pod, run_pod, sandbox_config, start_container
from tests.support.koordnode_runner import REPO, KoordnodeProcess
from tests.support.kubelet_tiers import prepare_qos_tiers
from tests.testbed.containerd_bed import ContainerdBed

CG = Path("/sys/fs/cgroup")
QUIET, BUSY = "LS quiet", "LS busy"
REFRESH_TIMEOUT_S = 2.0
BUSY_LOOP = "while :; do :; done"


def read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return "?"


def cpu_usage_ns(cgroup: str) -> int | None:
    """CPU time of a cgroup and everything below it (cgroup v1 cpuacct, or v2 cpu.stat)."""
    v1 = CG / "cpuacct" / cgroup.lstrip("/") / "cpuacct.usage"
    try:
        return int(v1.read_text())
    except (OSError, ValueError):
        pass
    try:
        for line in (CG / cgroup.lstrip("/") / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) * 1000
    except (OSError, ValueError):
        pass
    return None


def cfs_quota_us(cgroup: str) -> str:
    """The CFS quota of a cgroup as koordnode writes it: µs per period, -1 unlimited."""
    v1 = read(CG / "cpu" / cgroup.lstrip("/") / "cpu.cfs_quota_us")
    if v1 != "?":
        return v1
    v2 = read(CG / cgroup.lstrip("/") / "cpu.max")
    return "-1" if v2.startswith("max") else v2.split()[0] if v2 != "?" else "?"


def node_busy_ns() -> int | None:
    """CPU time the whole node spent busy (not idle, not waiting for I/O), from /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:9]
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields)
    except (OSError, ValueError, IndexError):
        return None
    return (user + nice + system + irq + softirq + steal) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def psi_cpu() -> str:
    text = read(Path("/proc/pressure/cpu"))
    some = text.splitlines()[0] if text != "?" else ""
    return some.split()[1].removeprefix("avg10=") + "%" if some else "n/a"


class Placement:
    """Where koordnode put the demo's pods and the BE budget, as its admin socket reports it."""

    def __init__(self, kn: KoordnodeProcess) -> None:
        self.kn = kn
        self.pod_cgroups: dict[str, str] = {}
        self.be_tier = ""

    def refresh(self) -> None:
        try:
            status = fetch_status(self.kn.admin, timeout_s=REFRESH_TIMEOUT_S)
        except (OSError, ValueError):
            # The pods rarely move: a status that is slow to come (LS busy on every CPU above
            # koordnode's weight) keeps the last view instead of stalling the once-a-second rows.
            return
        # The pod cgroup koordnode writes (`cgroup`); its cgroup parent as koordnode rewrote it
        # is the same path with the cgroupfs driver.
        self.pod_cgroups = {p["sandbox_id"]: p.get("cgroup") or p["cgroup_parent"] for p in status.get("pods", [])}
        self.be_tier = (status.get("qos_manager") or {}).get("be_tier") or ""

    def wait(self, sandbox_ids: list[str], be_sandbox_id: str, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.refresh()
            be_pod = self.pod_cgroups.get(be_sandbox_id, "")
            # The budget reaches the BE pod once koordnode puts it on a cgroup above the pod.
            if be_pod.startswith(self.be_tier + "/") and all(self.pod_cgroups.get(sid) for sid in sandbox_ids):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"koordnode does not report the demo's pods: {self.pod_cgroups}")
            time.sleep(0.2)


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


LS_STOP_FILE = "/tmp/ls-stop"
# Busy until the demo says stop: the view's ticks stretch past a second on a loaded machine, so a
# fixed duration would end the load before the busy phase does.
LS_BUSY_LOOP = f"while [ ! -e {LS_STOP_FILE} ]; do :; done"


def start_ls_load(cri: Cri, container_id: str, seconds: int, workers: int) -> None:
    """`workers` busy loops in the LS container until stop_ls_load (at most 10 × `seconds` + 30 s
    should the demo die), detached so ExecSync returns at once."""
    loop = f"timeout {seconds * 10 + 30} sh -c '{LS_BUSY_LOOP}' </dev/null >/dev/null 2>&1 &"
    cri.rt.ExecSync(pb.ExecSyncRequest(container_id=container_id,
                                       cmd=["sh", "-c", f"rm -f {LS_STOP_FILE}; {loop * workers} exit 0"],
                                       timeout=10), timeout=20)


def stop_ls_load(cri: Cri, container_id: str) -> None:
    cri.rt.ExecSync(pb.ExecSyncRequest(container_id=container_id, cmd=["touch", LS_STOP_FILE], timeout=10),
                    timeout=20)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=30, help="length of the live view (default 30, at least 6)")
    ap.add_argument("--keep-logs", action="store_true", help="keep containerd's and koordnode's logs")
    ap.add_argument("--workdir", type=Path, help="where the demo's files go (default: a new temporary directory)")
    ap.add_argument("--record", type=Path,
                    help="also write each line of the live view as JSON to this file (one object per second)")
    args = ap.parse_args()
    seconds = max(args.seconds, 6)
    ncpu = os.cpu_count() or 1

    work = args.workdir or Path(tempfile.mkdtemp(prefix="koordnode-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    record = open(args.record, "w") if args.record else None  # closed in the finally below
    stop = False

    def on_signal(*_: Any) -> None:
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
            print("== RunPodSandbox/CreateContainer/StartContainer through koordnode: LS pod 'web', BE pod 'batch'")
            ls_sb = sandbox_config(bed, "web", qos="burstable", labels={"koordinator.sh/qosClass": "LS"})
            ls_sid = run_pod(cri, ls_sb)
            pods.append(ls_sid)
            ls_cid = start_container(cri, ls_sid, ls_sb, container_config(
                bed, "web", ["sleep", "3600"], resources={"cpu_shares": 1024 * ncpu}))
            be_sb = sandbox_config(bed, "batch", qos="besteffort", labels={"koordinator.sh/qosClass": "BE"})
            be_sid = run_pod(cri, be_sb)
            pods.append(be_sid)
            # One busy loop per CPU: a batch job that takes the whole node when it may.
            start_container(cri, be_sid, be_sb, container_config(
                bed, "batch", ["sh", "-c", f"{f'sh -c {BUSY_LOOP!r} & ' * ncpu} wait"]))
            where = Placement(kn)
            where.wait([ls_sid, be_sid], be_sid)
            print(f"== koordnode put LS 'web' in {where.pod_cgroups[ls_sid]}")
            print(f"== koordnode put BE 'batch' in {where.pod_cgroups[be_sid]} (kubelet asked for "
                  f"{be_sb.linux.cgroup_parent}); the BE budget goes on {where.be_tier}")
            print(f"== watch it live from another terminal: cd {REPO} && python3 -m koordnode top "
                  f"--config {kn.config_path}")
            tail = Tail(kn.log_path)
            busy_from = max(seconds // 3, 2)
            busy_until = max(2 * seconds // 3, busy_from + 1)
            print(f"== live view for {seconds} s: LS quiet, busy on {ncpu} CPUs from {busy_from} s to "
                  f"{busy_until} s, then quiet again; BE busy on {ncpu} CPUs throughout")
            print(f"{'t':>3}  {'phase':8}  {'LS cpus':>7}  {'BE cpus':>7}  {'other cpus':>10}  {'PSI cpu some avg10':>18}  "
                  f"{'BE quota µs':>12}")

            def usage() -> tuple[int | None, int | None, int | None, float]:
                return (cpu_usage_ns(where.pod_cgroups.get(ls_sid, "")),
                        cpu_usage_ns(where.pod_cgroups.get(be_sid, "")), node_busy_ns(), time.monotonic())

            def rate(now: int | None, before: int | None, dt: float) -> float | None:
                return (now - before) / 1e9 / dt if now is not None and before is not None else None

            last = usage()
            for t in range(1, seconds + 1):
                if stop:
                    break
                if t == busy_from + 1:
                    start_ls_load(cri, ls_cid, busy_until - busy_from, ncpu)
                if t == busy_until + 1:
                    stop_ls_load(cri, ls_cid)
                time.sleep(max(0.0, 1.0 - (time.monotonic() - last[3])))
                where.refresh()  # follow the pods wherever koordnode has them now
                now = usage()
                dt = now[3] - last[3]
                ls, be, node = (rate(now[i], last[i], dt) for i in range(3))
                last = now
                # Everything else the node ran: koordnode, containerd, and whatever runs beside the demo.
                other = node - (ls or 0.0) - (be or 0.0) if node is not None else None
                phase = BUSY if busy_from < t <= busy_until else QUIET
                quota = cfs_quota_us(where.be_tier)
                pressure = psi_cpu()
                print(f"{t:>3}  {phase:8}  {_cpus(ls):>7}  {_cpus(be):>7}  {_cpus(other):>10}  {pressure:>18}  {quota:>12}")
                if record is not None:
                    record.write(json.dumps({"t": t, "phase": phase, "ls_cpus": ls, "be_cpus": be, "other_cpus": other,
                                             "psi_cpu_some_avg10": pressure, "be_quota_us": quota,
                                             "be_quota_cgroup": where.be_tier,
                                             "ls_cgroup": where.pod_cgroups.get(ls_sid),
                                             "be_cgroup": where.pod_cgroups.get(be_sid)}) + "\n")
                    record.flush()
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
            if record is not None:
                record.close()
    if args.keep_logs:
        print(f"== logs kept under {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    print("== done: no pods, cgroups, sockets or processes left")
    return 0


def _cpus(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
