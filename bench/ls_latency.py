#!/usr/bin/env python3
"""LS tail latency under BE interference, on the test bed's real containerd (root, cgroup v1).

For each LS pod class (LS, LSR, LSE) and each setup -- pods created directly on containerd
with kubelet's values ("kubelet"), and through a `koordnode run` in front of it ("koordnode")
-- the LS pod is measured alone and then beside a BE pod running --be-loops busy loops:

    probe  inside the LS container (ExecSync): sleep 1 ms, then 100 us of calibrated work,
           --rounds times; how late each round finished (p50 / p99 / p99.9)
    rr     a TCP server in the LS container does 50 us of work per 64-byte request; a client
           sends one request per ms: round-trip times (p50 / p99 / p99.9). Where the client
           runs is --rr-client (one or more, each a row of its own):
             host     on the node, in the benchmark's own cgroup outside kubepods (the root
                      cgroup when run from a shell): a node agent or anything not in a pod. Its
                      wake-ups compete with the whole kubepods group, BE included, one level up,
                      where koordnode's idle BE group does not reach. Row "rr" (the old name).
             pod      in a pod of its own, an LS pod (Burstable, 1 CPU requested) created
                      through the same path as the server's, so kubelet's and koordnode's values
                      apply to it as to any LS pod: another LS service on the node calling this
                      one. Row "rr-pod".
             host-rt  on the node as "host", but SCHED_FIFO: a wake-up preempts any CFS task at
                      once (BE included; only kernel code a task is in when it wakes, here
                      preempt=none, delays it), so what is left is the server's side and the
                      network path -- the nearest this one-machine bed gets to a client on
                      another machine, whose CPU BE cannot touch. Row "rr-host-rt".
           For the slowest rounds (at or above p99 and p99.9) the client also says where the
           time went: how long the client and the server each waited for a CPU (run_delay of
           their schedstat) during those rounds; the rest is the network path and the work.

and the CPU the BE pod got while LS was measured, against what LS left idle.

kubelet's cgroup writes are reproduced (no kubelet binary here): QoS tiers (besteffort
cpu.shares 2), each pod's cgroup with its cpu.shares / quota before RunPodSandbox. The pods:
LS = Burstable requesting 1 CPU, LSR and LSE = Guaranteed 1 CPU, BE = BestEffort. The bed
uses its own cgroup prefix (never the real /kubepods).

Idle exit latency is held at 0 for the whole run (alone and with BE, every setup): the
bench opens /dev/cpu_dma_latency, writes a 32-bit 0 and keeps it open -- the PM QoS request
latency benchmarks such as cyclictest make, and what a latency-sensitive node is tuned to
(tuned's latency-performance profile). Idle CPUs then stay in their shallowest idle state
(POLL) instead of halting. Why: the probe sleeps 1 ms, so with the LS pod alone its CPU goes
idle, and waking an idle CPU costs the idle state's exit latency -- in a VM a halted vCPU's
wake-up through the hypervisor, hundreds of microseconds to milliseconds, and irregular.
That cost is the machine's, not BE's interference; with BE busy no CPU ever idles, so
without the hold "alone" is measured with it and "with BE" without it, and the ratio says
nothing about BE. --no-idle-latency-hold measures without the hold (the header says which,
and the cpuidle driver and states, so a reader on another machine knows).

    python3 -m bench.ls_latency [--quick] [--classes LS,LSR,LSE]
                                [--setups kubelet,koordnode-tier,koordnode,koordnode-nosuppress]
                                [--variants probe,rr] [--rr-client host[,pod,host-rt]]
                                [--rounds 8000] [--repeat 1] [--koordnode-toml FILE]
                                [--no-idle-latency-hold] [--json]

Prints a markdown table. Other load on the machine shows up in every column: the load
average before and after is printed with it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CG = Path("/sys/fs/cgroup")
PORT = 7411
PROBE_IN_CONTAINER = "/ls_probe"
SLEEP_US, WORK_US, SERVER_WORK_US = 1000, 100, 50
CPUS = os.cpu_count() or 1
# setup -> koordnode config added for it (None: pods straight on containerd, as kubelet makes them)
SETUPS = {
    "kubelet": None,
    "koordnode-tier": "[cgroup]\nbe_idle_group = false\n",
    "koordnode": "",
    "koordnode-nosuppress": "[strategy.cpu_suppress]\nenable = false\n",
    "koordnode-nri": "",
    "koordnode-nri-tier": "[cgroup]\nbe_idle_group = false\n",
}
# Setups where koordnode is containerd's NRI plugin (pods straight on containerd, as kubelet
# makes them) instead of the CRI proxy in front of it.
NRI_SETUPS = frozenset({"koordnode-nri", "koordnode-nri-tier"})
# NRI needs containerd >= 1.7: with an NRI setup every setup runs on Debian forky's containerd 2.1.
NRI_CONTAINERD_SUITE = "forky"


# --rr-client placement -> the table's variant name ("rr" keeps the name of the runs before the option)
RR_CLIENTS = {"host": "rr", "pod": "rr-pod", "host-rt": "rr-host-rt"}
RR_CLIENT_RT_PRIORITY = 50

CPU_DMA_LATENCY = Path("/dev/cpu_dma_latency")
CPUIDLE = Path("/sys/devices/system/cpu/cpuidle")
CPU0_IDLE_STATES = Path("/sys/devices/system/cpu/cpu0/cpuidle")


class IdleLatencyHold:
    """Holds the PM QoS CPU latency request at 0 us while open: the kernel keeps idle CPUs in
    states with no exit latency (POLL). The request lasts as long as the descriptor is open."""

    def __init__(self) -> None:
        self._fd: int | None = None

    def __enter__(self) -> IdleLatencyHold:
        try:
            self._fd = os.open(CPU_DMA_LATENCY, os.O_WRONLY)
            os.write(self._fd, struct.pack("=i", 0))  # a 4-byte write is taken as a binary s32, in us
        except OSError as err:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            raise SystemExit(
                f"cannot hold {CPU_DMA_LATENCY} at 0 us: {err.strerror} (needs root and a kernel with PM QoS); "
                "pass --no-idle-latency-hold to measure with the CPUs' idle exit latency instead") from err
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpuidle_description() -> dict:
    """The cpuidle driver, governor and CPU 0's idle states (name, exit latency), as sysfs says."""
    states = []
    for state in sorted(CPU0_IDLE_STATES.glob("state[0-9]*"), key=lambda p: int(p.name[5:])):
        latency = _read(state / "latency")
        states.append({"name": _read(state / "name"), "exit_latency_us": int(latency) if latency else None,
                       "disabled": _read(state / "disable") == "1"})
    return {"driver": _read(CPUIDLE / "current_driver"),
            "governor": _read(CPUIDLE / "current_governor") or _read(CPUIDLE / "current_governor_ro"),
            "states": states,
            "guest_halt_poll_ns": _read(Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns"))}


def describe_idle(idle: dict, held: bool) -> str:
    states = ", ".join(f"{s['name']} (exit {s['exit_latency_us']} us{', disabled' if s['disabled'] else ''})"
                       for s in idle["states"]) or "none"
    poll = f", haltpoll guest_halt_poll_ns {idle['guest_halt_poll_ns']}" if idle["guest_halt_poll_ns"] else ""
    hold = (f"held {CPU_DMA_LATENCY} = 0 us for the whole run (idle CPUs stay in their 0-latency state)" if held
            else "idle exit latency NOT held (--no-idle-latency-hold): LS alone pays the idle states' wake-ups")
    return f"cpuidle driver {idle['driver'] or 'none'}, governor {idle['governor'] or '-'}{poll}; states: {states}\n{hold}"


def describe_rr_clients(rr_clients: list[str], host_cgroup: str) -> str:
    where = {"host": f"on the node in cpu cgroup {host_cgroup} (outside kubepods)",
             "pod": "exec'd in an LS pod of its own (Burstable, 1 CPU requested)",
             "host-rt": f"on the node in cpu cgroup {host_cgroup}, SCHED_FIFO {RR_CLIENT_RT_PRIORITY}"}
    return "rr clients: " + "; ".join(f"{RR_CLIENTS[c]}: {where[c]}" for c in rr_clients)


def build_probe(directory: Path) -> Path:
    out = directory / "ls_probe"
    subprocess.run(["gcc", "-O2", "-static", "-o", str(out), str(REPO / "bench" / "ls_probe.c")], check=True)
    return out


def parse_line(text: str) -> dict:
    """ls_probe's line: five numbers, then (the rr client) key=value fields saying where the slowest
    round trips went, e.g. client_wait_p99=12.5 -> result["where"]["p99"]["client_wait_us"] (-1: the
    kernel had no schedstat)."""
    fields = text.split()
    p50, p99, p999, mx, n = fields[:5]
    out = {"p50_us": float(p50), "p99_us": float(p99), "p999_us": float(p999), "max_us": float(mx), "n": int(n)}
    where: dict[str, dict[str, float | None]] = {}
    for field in fields[5:]:
        key, _, value = field.partition("=")
        quantity, _, rounds = key.rpartition("_")
        if quantity in ("rtt", "client_wait", "server_wait") and rounds:
            number = float(value)
            where.setdefault(rounds, {})[f"{quantity}_us"] = None if number < 0 else number
    if where:
        out["where"] = where
    return out


def variants_of(kinds: list[str], rr_clients: list[str]) -> list[str]:
    """The measurements a run makes, in order: "probe", then one rr row per client placement."""
    out = ["probe"] if "probe" in kinds else []
    if "rr" in kinds:
        out += [RR_CLIENTS[c] for c in rr_clients]
    return out


def cgroup_of(pid: int, controller: str) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    raise RuntimeError(f"pid {pid} has no {controller} cgroup")


def usage_ns(cgroup: str) -> int:
    return int((CG / "cpuacct" / cgroup.lstrip("/") / "cpuacct.usage").read_text())


def busy_ns(stat: Path = Path("/proc/stat")) -> int:
    """CPU time the whole machine spent busy (all but idle and iowait), from /proc/stat's cpu line."""
    fields = stat.read_text().split("\n", 1)[0].split()
    assert fields[0] == "cpu", fields
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def container_pid(cri, cid: str) -> int:
    """The container's first process, as the runtime reports it (ContainerStatus, verbose)."""
    from koordnode.cri import api_pb2 as pb

    info = cri.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True)).info
    return json.loads(info["info"])["pid"]


def with_cpu_use(run: Callable[[], dict], ls_cg: str, be_cg: str | None) -> dict:
    """run()'s result with the CPUs used meanwhile: by the LS pod, by everything else on the
    machine (the rr client too: on a shared machine, what else ran) and, beside a BE pod, by BE
    and its share of what LS left idle."""
    began, ls0, be0, busy0 = time.monotonic(), usage_ns(ls_cg), usage_ns(be_cg) if be_cg else 0, busy_ns()
    result = run()
    elapsed = time.monotonic() - began
    ls_ns, be_ns = usage_ns(ls_cg) - ls0, (usage_ns(be_cg) - be0) if be_cg else 0
    ls_cpus = ls_ns / 1e9 / elapsed
    result["ls_cpus"] = round(ls_cpus, 3)
    result["other_cpus"] = round(max(0, busy_ns() - busy0 - ls_ns - be_ns) / 1e9 / elapsed, 3)
    if be_cg:
        be_cpus = be_ns / 1e9 / elapsed
        result["be_cpus"] = round(be_cpus, 3)
        result["be_share_of_idle"] = round(be_cpus / max(1e-9, CPUS - ls_cpus), 3)
    return result


class Bench:
    def __init__(self, bed, probe: Path, args: argparse.Namespace, work: Path) -> None:
        from tests.support.kubelet_tiers import kubelet_update_qos_cgroups, prepare_qos_tiers

        self.bed, self.probe, self.args, self.work = bed, probe, args, work
        self.variants = variants_of(args.variants, args.rr_clients)
        prepare_qos_tiers(bed.kubepods_cgroup)
        kubelet_update_qos_cgroups(bed.kubepods_cgroup)

    # ---- pods, as kubelet makes them --------------------------------------------------------

    def pod(self, cri, name: str, cls: str, cmd: list[str]) -> tuple[str, str]:
        """A pod of class `cls` ("LS", "LSR", "LSE", "BE") as kubelet makes it, running `cmd`."""
        from koordnode.cri import api_pb2 as pb
        from tests.support.cri import container_config, run_pod, sandbox_config, start_container
        from tests.support.kubelet_tiers import kubelet_ensure_pod_cgroup

        uid = uuid.uuid4().hex
        kube = {"LS": ("burstable", 1024, -1, {"cpu_shares": 1024}),
                "LSR": ("", 1024, 100000, {"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000}),
                "LSE": ("", 1024, 100000, {"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000}),
                "BE": ("besteffort", 2, -1, {"cpu_shares": 2})}[cls]
        tier, pod_shares, pod_quota, resources = kube
        kubelet_ensure_pod_cgroup(self.bed.kubepods_cgroup, tier, uid, cpu_shares=pod_shares, cpu_quota=pod_quota)
        labels = {} if cls == "BE" else {"koordinator.sh/qosClass": cls}
        sb = sandbox_config(self.bed, name, qos=tier or "guaranteed", labels=labels, uid=uid)
        sid = run_pod(cri, sb)
        cfg = container_config(self.bed, "app", cmd, resources=resources)
        cfg.mounts.append(pb.Mount(container_path=PROBE_IN_CONTAINER, host_path=str(self.probe), readonly=True))
        cid = start_container(cri, sid, sb, cfg)
        return sid, cid

    def remove(self, cri, sid: str) -> None:
        from tests.support.cri import remove_pod

        remove_pod(cri, sid)

    pid_of = staticmethod(container_pid)

    # ---- measurements -----------------------------------------------------------------------

    def probe_run(self, cri, cid: str) -> dict:
        from koordnode.cri import api_pb2 as pb

        rounds = self.args.rounds
        timeout = int(rounds * (SLEEP_US + WORK_US) / 1e6 * 5) + 30
        resp = cri.rt.ExecSync(pb.ExecSyncRequest(
            container_id=cid, cmd=[PROBE_IN_CONTAINER, "probe", str(rounds), str(SLEEP_US), str(WORK_US)],
            timeout=timeout), timeout=timeout + 10)
        if resp.exit_code != 0:
            raise RuntimeError(f"probe failed: {resp.stderr.decode()}")
        return parse_line(resp.stdout.decode())

    def rr_run(self, cri, variant: str, ip: str, client_cid: str | None) -> dict:
        from koordnode.cri import api_pb2 as pb

        timeout = int(self.args.rounds / 200) + 60
        if variant == RR_CLIENTS["pod"]:
            resp = cri.rt.ExecSync(pb.ExecSyncRequest(
                container_id=client_cid,
                cmd=[PROBE_IN_CONTAINER, "client", ip, str(PORT), str(self.args.rounds), str(SLEEP_US)],
                timeout=timeout), timeout=timeout + 10)
            if resp.exit_code != 0:
                raise RuntimeError(f"rr client in its pod failed: {resp.stderr.decode()}")
            return parse_line(resp.stdout.decode())
        realtime = variant == RR_CLIENTS["host-rt"]
        done = subprocess.run([str(self.probe), "client", ip, str(PORT), str(self.args.rounds), str(SLEEP_US)],
                              capture_output=True, text=True, timeout=timeout, check=True,
                              preexec_fn=rt_client_scheduling if realtime else None)
        return parse_line(done.stdout)

    def measure(self, cri, ls_cid: str, ls_ip: str, be_cid: str | None, client_cid: str | None) -> dict:
        ls_cg = cgroup_of(self.pid_of(cri, ls_cid), "cpuacct")
        be_cg = cgroup_of(self.pid_of(cri, be_cid), "cpuacct") if be_cid else None
        return {variant: with_cpu_use(
                    functools.partial(self.probe_run, cri, ls_cid) if variant == "probe"
                    else functools.partial(self.rr_run, cri, variant, ls_ip, client_cid), ls_cg, be_cg)
                for variant in self.variants}

    def run_setup(self, setup: str) -> dict:
        from koordnode.cri import api_pb2 as pb
        from tests.support.cri import Cri
        from tests.support.koordnode_runner import KoordnodeProcess

        # A quota an earlier setup's suppression left on the BE tier or group must not carry over.
        for tier in ("besteffort", "koordnode_be"):
            quota = CG / "cpu" / self.bed.kubepods_cgroup.lstrip("/") / tier / "cpu.cfs_quota_us"
            if quota.exists():
                quota.write_text("-1")
        kn = None
        if SETUPS[setup] is not None:
            extra = SETUPS[setup] + (Path(self.args.koordnode_toml).read_text() if self.args.koordnode_toml else "")
            nri = setup in NRI_SETUPS
            kn = KoordnodeProcess(self.work / f"kn-{uuid.uuid4().hex[:6]}", str(self.bed.socket),
                                  kubepods=self.bed.kubepods_cgroup, extra_toml=extra,
                                  nri_socket=str(self.bed.nri_socket) if nri else "").start()
            if nri:  # kubelet's calls go to containerd, which calls koordnode
                kn.wait_synchronized()
                cri = Cri(self.bed.address)
            else:
                kn.wait_rebuilt()
                cri = Cri(kn.listen)
        else:
            cri = Cri(self.bed.address)
        out: dict = {}
        try:
            for row, cls, busy in ls_rows(self.args.classes, self.args.ls_busy):
                server = f"{PROBE_IN_CONTAINER} server {PORT} {SERVER_WORK_US}"
                load = f"{PROBE_IN_CONTAINER} duty {busy} & " if busy else ""
                ls_sid, ls_cid = self.pod(cri, f"ls-{cls.lower()}", cls, ["sh", "-c", f"{load}exec {server}"])
                client_sid = client_cid = None
                try:
                    if RR_CLIENTS["pod"] in self.variants:
                        client_sid, client_cid = self.pod(cri, "rr-client", "LS", CLIENT_POD_COMMAND)
                    ip = cri.rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=ls_sid)).status.network.ip
                    time.sleep(0.5)
                    alone = self.measure(cri, ls_cid, ip, None, client_cid)
                    loops = " & ".join([f"{PROBE_IN_CONTAINER} spin"] * self.args.be_loops)
                    be_sid, be_cid = self.pod(cri, "be", "BE", ["sh", "-c", f"{loops} & wait"])
                    try:
                        time.sleep(1.0)
                        settled_s = settle_suppression(kn) if kn is not None else None
                        be_cg = cgroup_of(self.pid_of(cri, be_cid), "cpu")
                        with_be = self.measure(cri, ls_cid, ip, be_cid, client_cid)
                        suppress = suppress_decision(kn) if kn is not None else None
                    finally:
                        self.remove(cri, be_sid)
                finally:
                    self.remove(cri, ls_sid)
                    if client_sid:
                        self.remove(cri, client_sid)
                out[row] = {"alone": alone, "with_be": with_be, "be_cgroup": be_cg, "cpu_suppress": suppress,
                            "suppress_settled_s": settled_s}
                print(f"  {setup:20s} {row} " + "  ".join(
                    f"{v}: alone p99 {alone[v]['p99_us']:.0f} us, with BE p99 {with_be[v]['p99_us']:.0f} / "
                    f"p99.9 {with_be[v]['p999_us']:.0f} us (BE {with_be[v]['be_cpus']:.2f} CPUs, other "
                    f"{alone[v]['other_cpus']:.2f} / {with_be[v]['other_cpus']:.2f})"
                    for v in self.variants), flush=True)
                if suppress:
                    settled = ("" if suppress == "off" else " (quota not settled)" if settled_s is None
                               else f" (quota at its target {1 + settled_s:.1f} s after BE started)")
                    print(f"  {'':20s}     cpu_suppress with BE{settled}: {suppress}", flush=True)
        finally:
            cri.close()
            if kn is not None:
                kn.stop()
        return out




def ls_rows(classes: list[str], busy_percents: list[int]) -> list[tuple[str, str, int]]:
    """(table row, LS pod class, the LS pod's own load in percent of a CPU) for each class and
    load: "LS" quiet, "LS busy 60%" with a duty-cycle load beside the probe in the LS container."""
    return [(cls if busy == 0 else f"{cls} busy {busy}%", cls, busy) for cls in classes for busy in busy_percents]


# The rr client pod's container only waits; each run's client is exec'd into it (ExecSync), so it
# runs in the pod's cgroup like any process of that pod.
CLIENT_POD_COMMAND = ["sh", "-c", "while :; do sleep 3600; done"]


def rt_client_scheduling() -> None:
    """In the host-rt client, before exec: SCHED_FIFO, so its wake-ups preempt every CFS task."""
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RR_CLIENT_RT_PRIORITY))


def check_rt_client() -> str | None:
    """Why a SCHED_FIFO client cannot run here (None: it can). With RT group scheduling a task
    in a cgroup without cpu.rt_runtime_us may not become real-time."""
    try_it = (f"import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param({RR_CLIENT_RT_PRIORITY}))")
    done = subprocess.run([sys.executable, "-c", try_it], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no error text"])[-1]
        return (f"--rr-client host-rt: cannot make the client SCHED_FIFO in cgroup "
                f"{cgroup_of(os.getpid(), 'cpu')} ({last})")
    return None


def settle_suppression(kn, timeout_s: float = 30.0) -> float | None:
    """Wait until koordnode's BE quota has reached its target with BE running (the last
    decision saw BE use CPU and did not have to limit its growth), so "with BE" measures LS
    beside BE as it runs for good, not while the quota still grows by max_growth_percent per
    tick from where an earlier class left it. Seconds waited, or None when it did not settle
    within timeout_s (or the strategy is off)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            strategy = kn.status()["qos_manager"]["strategies"]["cpu_suppress"]
        except Exception:  # noqa: BLE001 - status not answering yet: keep waiting
            strategy = {}
        if strategy and not strategy.get("enabled"):
            return None
        decision = strategy.get("decision") or {}
        be_used = (decision.get("inputs") or {}).get("be_used_cpus") or 0
        if be_used > 0.05 and "grow (limited)" not in (decision.get("reason") or ""):
            return time.monotonic() - started
        time.sleep(0.25)
    return None


def suppress_decision(kn) -> str | None:
    """koordnode's last cpu_suppress decision in a line: the threshold it used (BE group idle or
    not) and the BE quota, so the table's BE share can be read against it."""
    try:
        strategy = kn.status()["qos_manager"]["strategies"]["cpu_suppress"]
    except Exception as err:  # noqa: BLE001 - a report line, never a reason to fail the run
        return f"status unavailable: {err}"
    if not strategy.get("enabled"):
        return "off"
    decision = strategy.get("decision") or {}
    inputs = decision.get("inputs") or {}
    return (f"BE cgroup {inputs.get('be_tier')} (idle: {inputs.get('be_idle')}, LS quiet: "
            f"{inputs.get('ls_quiet')}), threshold "
            f"{inputs.get('threshold_percent')}%, LS {inputs.get('ls_used_cpus')} / system "
            f"{inputs.get('system_used_cpus')} CPUs -> budget {inputs.get('be_budget_cpus')} CPUs; "
            f"{decision.get('decision') or ''}").rstrip("; ")


def _med(values):
    import statistics

    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _us(v):
    return "—" if v is None else f"{v:,.0f} µs"


def _variants_in(results: list[dict]) -> list[str]:
    """The variants the runs measured, in the order they were measured."""
    seen: list[str] = []
    for run in results:
        for per_class in run.values():
            for cls in per_class.values():
                seen += [v for v in cls["alone"] if v not in seen]
    return seen


def table(results: list[dict], classes: list[str], setups: list[str]) -> str:
    """One row per class, variant and setup; medians over the repeats."""
    med, us = _med, _us

    def ratio(a, b):
        return "—" if a is None or not b else f"{a / b:.1f}×"

    head = ["LS pod class", "variant", "setup", "alone p99", "alone p99.9", "with BE p99", "with BE p99.9",
            "p99 with/alone", "p99.9 with/alone", "BE CPUs (of what LS left idle)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cls in classes:
        for variant in _variants_in(results):
            for s in setups:
                runs = [r[s][cls] for r in results if s in r and cls in r[s]]
                if not runs:
                    continue
                a99 = med([r["alone"][variant]["p99_us"] for r in runs])
                a999 = med([r["alone"][variant]["p999_us"] for r in runs])
                w99 = med([r["with_be"][variant]["p99_us"] for r in runs])
                w999 = med([r["with_be"][variant]["p999_us"] for r in runs])
                be = med([r["with_be"][variant]["be_cpus"] for r in runs])
                share = med([r["with_be"][variant]["be_share_of_idle"] for r in runs])
                lines.append("| " + " | ".join([
                    cls, variant, s, us(a99), us(a999), us(w99), us(w999), ratio(w99, a99), ratio(w999, a999),
                    f"{be:.2f} ({share:.0%})"]) + " |")
    return "\n".join(lines)


def where_table(results: list[dict], classes: list[str], setups: list[str]) -> str:
    """Where the request/response tail went: for the rounds at or above p99 (and p99.9 with BE),
    the mean round trip and how much of it the client and the server each waited for a CPU
    (schedstat run_delay); medians over the repeats. Empty when no rr variant ran."""
    rr = [v for v in _variants_in(results) if v != "probe"]
    if not rr:
        return ""
    head = ["LS pod class", "variant", "setup"]
    parts = [("alone", "p99"), ("with_be", "p99"), ("with_be", "p999")]
    label = {("alone", "p99"): "alone ≥p99", ("with_be", "p99"): "with BE ≥p99", ("with_be", "p999"): "with BE ≥p99.9"}
    for part in parts:
        head += [f"{label[part]}: RTT", "client waited", "server waited"]
    head.append("other CPUs alone / with BE")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cls in classes:
        for variant in rr:
            for s in setups:
                runs = [r[s][cls] for r in results if s in r and cls in r[s]]
                if not runs:
                    continue
                cells = [cls, variant, s]
                for phase, rounds in parts:
                    wheres = [r[phase][variant].get("where", {}).get(rounds, {}) for r in runs]
                    cells += [_us(_med([w.get(q) for w in wheres])) for q in ("rtt_us", "client_wait_us", "server_wait_us")]
                other = [_med([r[phase][variant].get("other_cpus") for r in runs]) for phase in ("alone", "with_be")]
                cells.append(" / ".join("—" if o is None else f"{o:.2f}" for o in other))
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2000 rounds, one repeat (a few minutes)")
    parser.add_argument("--classes", default="LS,LSR,LSE")
    parser.add_argument("--setups", default=",".join(SETUPS),
                        help="kubelet: pods straight on containerd with kubelet's values; koordnode: through "
                        "koordnode (defaults); koordnode-tier: BE pods left in kubelet's besteffort tier "
                        "(be_idle_group = false, the behaviour before the BE group); koordnode-nosuppress: "
                        "the BE group without the cpu_suppress quota")
    parser.add_argument("--variants", default="probe,rr",
                        help="probe: the sleep/work probe in the LS container; rr: request/response round trips")
    parser.add_argument("--rr-client", default="host",
                        help="where the rr client runs, one or more of: host (on the node outside kubepods; row "
                        "'rr'), pod (in an LS pod of its own; row 'rr-pod'), host-rt (on the node, SCHED_FIFO: "
                        "does not wait for BE or any CFS task, the nearest to a client on another machine; "
                        "row 'rr-host-rt')")
    parser.add_argument("--rounds", type=int, default=8000)
    parser.add_argument("--repeat", type=int, default=1, help="repeat every setup, interleaved; medians reported")
    parser.add_argument("--be-loops", type=int, default=3)
    parser.add_argument("--ls-busy", default="0,60",
                        help="the LS pod's own load, percent of a CPU, one row each (0: LS quiet; 60: a "
                        "duty-cycle load using 60%% of a CPU in 10 ms periods beside the probe)")
    parser.add_argument("--koordnode-toml", default="", help="extra koordnode config (TOML) for the koordnode setup")
    parser.add_argument("--no-idle-latency-hold", dest="idle_latency_hold", action="store_false",
                        help=f"do not hold {CPU_DMA_LATENCY} at 0 us: idle CPUs may enter deep states (a VM's "
                        "halted vCPU), and LS alone pays their exit latency, which is the machine's, not BE's")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rounds = min(args.rounds, 2000)
    args.classes = [c.strip() for c in args.classes.split(",") if c.strip()]
    setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    unknown = [s for s in setups if s not in SETUPS]
    if unknown:
        parser.error(f"unknown setups {unknown}; known: {', '.join(SETUPS)}")
    try:
        args.ls_busy = [int(v) for v in args.ls_busy.split(",") if v.strip()]
    except ValueError:
        parser.error(f"--ls-busy: {args.ls_busy!r} is not a list of whole percents")
    if not args.ls_busy or any(not 0 <= v <= 100 for v in args.ls_busy) or len(set(args.ls_busy)) != len(args.ls_busy):
        parser.error(f"--ls-busy: {args.ls_busy} must be distinct percents from 0 to 100")
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.rr_clients = [c.strip() for c in args.rr_client.split(",") if c.strip()]
    for name, given, known in (("variants", args.variants, ("probe", "rr")), ("--rr-client", args.rr_clients, RR_CLIENTS)):
        wrong = [g for g in given if g not in known]
        if wrong or not given or len(set(given)) != len(given):
            parser.error(f"{name}: {', '.join(given) or 'nothing'} given; choose one or more of {', '.join(known)}, each once")
    if os.geteuid() != 0 or not (CG / "cpuacct").is_dir() or shutil.which("gcc") is None:
        print("needs root, cgroup v1 (cpu, cpuacct) and gcc", file=sys.stderr)
        return 2
    if "rr" in args.variants and "host-rt" in args.rr_clients and (why := check_rt_client()):
        print(why, file=sys.stderr)
        return 2
    from contextlib import nullcontext

    from tests.testbed.containerd_bed import ContainerdBed

    idle = cpuidle_description()
    hold = IdleLatencyHold() if args.idle_latency_hold else nullcontext()
    load_before = os.getloadavg()
    results: list[dict] = []
    print(describe_idle(idle, args.idle_latency_hold), flush=True)
    host_client_cgroup = cgroup_of(os.getpid(), "cpu")
    if "rr" in args.variants:
        print(describe_rr_clients(args.rr_clients, host_client_cgroup), flush=True)
    with hold, tempfile.TemporaryDirectory(prefix="koordnode-ls-latency-") as tmp:
        work = Path(tmp)
        probe = build_probe(work)
        bed_options = {}
        if NRI_SETUPS & set(setups):
            from tests.support.koordnode_runner import short_socket_dir
            from tests.testbed.containerd_dist import containerd_bin_dir

            bed_options = {"bin_dir": containerd_bin_dir(NRI_CONTAINERD_SUITE), "nri_socket": short_socket_dir() / "nri.sock"}
        with ContainerdBed(work / "bed", **bed_options) as bed:
            print(f"containerd {bed.containerd_major}.{bed.containerd_minor}"
                  f"{', NRI on ' + str(bed.nri_socket) if bed.nri_socket else ''}", flush=True)
            bench = Bench(bed, probe, args, work)
            for i in range(args.repeat):
                run = {}
                for setup in (setups if i % 2 == 0 else list(reversed(setups))):
                    run[setup] = bench.run_setup(setup)
                results.append(run)
    load_after = os.getloadavg()
    doc = {"cpus": CPUS, "rounds": args.rounds, "repeat": args.repeat, "be_loops": args.be_loops,
           "ls_busy_percent": args.ls_busy,
           "load_before": load_before, "load_after": load_after, "kernel": os.uname().release,
           "idle_latency_hold": args.idle_latency_hold, "cpuidle": idle, "variants": args.variants,
           "rr_clients": args.rr_clients if "rr" in args.variants else [], "host_client_cgroup": host_client_cgroup,
           "runs": results}
    if args.json:
        print(json.dumps(doc, indent=2))
    print()
    print(f"{CPUS} CPUs, kernel {os.uname().release}, {args.rounds} rounds x {args.repeat}, BE = {args.be_loops} "
          f"busy loops; load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    print(describe_idle(idle, args.idle_latency_hold))
    if "rr" in args.variants:
        print(describe_rr_clients(args.rr_clients, host_client_cgroup))
    print()
    rows = [row for row, _, _ in ls_rows(args.classes, args.ls_busy)]
    print(table(results, rows, setups))
    where = where_table(results, rows, setups)
    if where:
        print()
        print("Where the round trips' tail went (mean per round over the rounds at or above the percentile; "
              "client / server waited = schedstat run_delay, waiting for a CPU while runnable, and both can "
              "wait at once; the rest is the network path, the 50 us of work and the system calls; other "
              "CPUs = what the machine used besides the LS and BE pods, the client included):")
        print()
        print(where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
