"""Class isolation between pods on the real runtime and this host's real cgroup v1 files: pod
weights, the containers' processes' oom_score_adj, BE memory bounded."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from koordnode.cri import api_pb2 as pb
from koordnode.executor.process import oom_score_adj_floor
from koordnode.model.cpulist import parse_cpu_list
from support.cri import Cri, container_config, remove_pod, run_pod, sandbox_config, start_container
from support.koordnode_runner import KoordnodeProcess
from support.kubelet_tiers import (
    kubelet_ensure_pod_cgroup,
    kubelet_set_pod_config,
    kubelet_update_qos_cgroups,
    prepare_qos_tiers,
)

pytestmark = pytest.mark.e2e

CG = Path("/sys/fs/cgroup")
ALL_CPUS = parse_cpu_list(Path("/sys/devices/system/cpu/online").read_text().strip())
# The lowest oom_score_adj koordnode can set here (None: any; without CAP_SYS_RESOURCE its own).
OOM_FLOOR = oom_score_adj_floor()
BUSY = "while :; do :; done"


def cg_read(controller: str, cgroup: str, name: str) -> str:
    return (CG / controller / cgroup.lstrip("/") / name).read_text().strip()


def container_pid(cri: Cri, cid: str) -> int:
    info = cri.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True)).info
    return json.loads(info["info"])["pid"]


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


class KubeletPods:
    """Pods created as kubelet creates them (its pod cgroup first, with its values), removed at
    the end even when the test fails."""

    def __init__(self, bed, cri: Cri) -> None:
        self.bed, self.cri, self.ids = bed, cri, []

    def run(self, name: str, tier: str, *, cmd: list[str], labels=None, pod_shares: int = 2,
            pod_quota: int = -1, resources: dict | None = None) -> tuple[pb.PodSandboxConfig, str, str]:
        uid = uuid.uuid4().hex
        kubelet_ensure_pod_cgroup(self.bed.kubepods_cgroup, tier, uid, cpu_shares=pod_shares, cpu_quota=pod_quota)
        sb = sandbox_config(self.bed, name, qos=tier or "guaranteed", labels=labels, uid=uid)
        sid = run_pod(self.cri, sb)
        self.ids.append(sid)
        cid = start_container(self.cri, sid, sb, container_config(self.bed, "app", cmd, resources=resources))
        return sb, sid, cid

    def cleanup(self) -> None:
        for sid in self.ids:
            try:
                remove_pod(self.cri, sid)
            except Exception:
                pass


@pytest.fixture
def node(containerd_bed, tmp_path):
    """A koordnode with a fast reconcile pass in front of the bed, kubelet's tiers prepared.
    `node(extra_toml)` starts it."""
    bed = containerd_bed
    prepare_qos_tiers(bed.kubepods_cgroup)
    started: list[tuple[KoordnodeProcess, Cri, KubeletPods]] = []

    def start(extra_toml: str = "") -> tuple[KoordnodeProcess, KubeletPods]:
        kn = KoordnodeProcess(tmp_path / "kn", str(bed.socket), kubepods=bed.kubepods_cgroup,
                              extra_toml="[cgroup]\nreconcile_interval_s = 0.5\n" + extra_toml).start()
        cri = Cri(kn.listen)
        pods = KubeletPods(bed, cri)
        started.append((kn, cri, pods))
        return kn, pods

    yield start
    for kn, cri, pods in started:
        pods.cleanup()
        cri.close()
        kn.stop()


def cpu_usage_ns(cgroup: str) -> int:
    return int(cg_read("cpuacct", cgroup, "cpuacct.usage"))


def test_pod_weights_split_one_cpu_as_the_classes_promise(containerd_bed, node):
    """([cgroup] pod_class_weight = true.) An LS pod (Burstable, 1 CPU requested) and an LSR pod (Guaranteed, 1 CPU), both busy on
    the same CPU. kubelet gives both pod cgroups 1024 and its burstable tier the LS pod's 1024,
    so with kubelet's values they split the CPU 50/50 whatever the class; the class weights
    promise LSR 65536 against LS 1024: 98.5% / 1.5%."""
    bed = containerd_bed
    kubepods = bed.kubepods_cgroup
    kubelet_update_qos_cgroups(kubepods, burstable_shares=1024)
    # Every CPU stays in the share pool (the LSR pod gets no core of its own), so both pods
    # can run on one CPU: the one the busy loops are pinned to.
    kn, pods = node(f"pod_class_weight = true\n[node]\nmin_shared_cpus = {len(ALL_CPUS)}\n")
    cpu = str(max(ALL_CPUS))
    busy = ["taskset", "-c", cpu, "sh", "-c", BUSY]
    ls_sb, ls_sid, _ = pods.run("ls", "burstable", cmd=busy, pod_shares=1024,
                                resources={"cpu_shares": 1024})
    lsr_sb, lsr_sid, _ = pods.run("lsr", "", cmd=busy, pod_shares=1024, pod_quota=100000,
                                  resources={"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000,
                                             "memory_limit_in_bytes": 64 << 20})
    ls_pod, lsr_pod = ls_sb.linux.cgroup_parent, lsr_sb.linux.cgroup_parent
    wait_for(lambda: cg_read("cpu", lsr_pod, "cpu.shares") == "65536", 10, "the LSR pod's class weight")
    assert cg_read("cpu", ls_pod, "cpu.shares") == "1024"  # LS: 1024 per CPU, as kubelet's
    status = kn.wait_rebuilt()
    classes = {p["sandbox_id"]: p["qos_class"] for p in status["pods"]}
    assert (classes[ls_sid], classes[lsr_sid]) == ("LS", "LSR")
    # Status is built once the whole apply is done, a moment after the file is written.
    def weights() -> dict[str, object]:
        return {p["sandbox_id"]: p.get("cpu_weight") for p in kn.status()["pods"]}
    wait_for(lambda: (weights().get(lsr_sid), weights().get(ls_sid)) == ({"cpu.shares": 65536}, {"cpu.shares": 1024}),
             10, "both pods' weights in status")

    time.sleep(1.0)  # both loops running
    before = cpu_usage_ns(ls_pod), cpu_usage_ns(lsr_pod)
    time.sleep(4.0)
    ls_ns, lsr_ns = cpu_usage_ns(ls_pod) - before[0], cpu_usage_ns(lsr_pod) - before[1]
    lsr_share = lsr_ns / (ls_ns + lsr_ns)
    # Promised 98.5% (measured 98.5% at load 7-9); kubelet's values give 50%. The margins hold
    # on a busy 2-CPU machine: other work on that CPU takes time from the bed's kubepods as a
    # whole, not from one pod.
    assert lsr_ns > 0.5e9, (ls_ns, lsr_ns)  # the CPU was theirs for a good part of the window
    assert 0.93 <= lsr_share <= 0.996, (ls_ns, lsr_ns, lsr_share)

    # kubelet writes its own weight again (as at a pod resize): the pass restores the class's
    # and counts it as an overwrite.
    kubelet_set_pod_config(lsr_pod, cpu_shares=1024, cpu_quota=100000)
    wait_for(lambda: cg_read("cpu", lsr_pod, "cpu.shares") == "65536", 10, "the LSR pod's weight restored")
    wait_for(lambda: kn.status()["qos"]["overwrites"]["counts"].get("cpu.shares", 0) >= 1, 5,
             "the overwrite counted")


def test_the_reconcile_pass_gives_container_processes_their_class_oom_score_adj(containerd_bed, node):
    """After a hook timeout (or anyone's write) a container's process runs with another
    oom_score_adj than its class's: the next reconcile pass writes the class value back."""
    kn, pods = node()
    sleep = ["sleep", "3600"]
    _, _, be_cid = pods.run("be", "besteffort", cmd=sleep)
    _, _, ls_cid = pods.run("ls", "burstable", cmd=sleep, pod_shares=512, resources={"cpu_shares": 512})
    kn.wait_rebuilt()
    # Where koordnode cannot lower it (no CAP_SYS_RESOURCE) not below its own, as the runtime.
    expected = {be_cid: 1000, ls_cid: -300 if OOM_FLOOR is None else max(-300, OOM_FLOOR)}
    pids = {cid: container_pid(pods.cri, cid) for cid in expected}

    def oom(cid: str) -> int:
        return int(Path(f"/proc/{pids[cid]}/oom_score_adj").read_text())

    for cid, value in expected.items():
        wait_for(lambda cid=cid, value=value: oom(cid) == value, 10, f"{cid[:12]}'s class value")
    # kubelet's values (BestEffort 1000 would be right: use a Burstable pod's) or a script's.
    Path(f"/proc/{pids[be_cid]}/oom_score_adj").write_text("500")
    Path(f"/proc/{pids[ls_cid]}/oom_score_adj").write_text("900")
    for cid, value in expected.items():
        wait_for(lambda cid=cid, value=value: oom(cid) == value, 10, f"{cid[:12]}'s class value restored")
    counts = kn.status()["qos"]["overwrites"]["counts"]
    assert counts.get("oom_score_adj", 0) >= 2, counts


def slice_ns(pid: int) -> int:
    line = next(line for line in Path(f"/proc/{pid}/sched").read_text().splitlines() if line.startswith("se.slice"))
    return int(line.split(":")[1])


def test_be_container_threads_get_the_shortest_scheduler_slice_and_exec_ed_ones_at_the_next_pass(
        containerd_bed, node):
    """BE's tasks run with the kernel's shortest EEVDF slice (100 us), LS's with the kernel's
    default; a process started in the BE container later (an exec) gets it from the pass."""
    kn, pods = node()
    sleep = ["sleep", "3600"]
    _, be_sid, be_cid = pods.run("be", "besteffort", cmd=sleep)
    _, ls_sid, ls_cid = pods.run("ls", "burstable", cmd=sleep, pod_shares=512, resources={"cpu_shares": 512})
    kn.wait_rebuilt()
    be_pid, ls_pid = container_pid(pods.cri, be_cid), container_pid(pods.cri, ls_cid)
    default = slice_ns(os.getpid())
    wait_for(lambda: slice_ns(be_pid) == 100_000, 10, "the BE process's slice")
    assert slice_ns(ls_pid) == default
    pod_status = {p["sandbox_id"]: p for p in kn.status()["pods"]}
    assert pod_status[be_sid]["sched_slice"] == "100 us for 1 thread(s)", pod_status[be_sid]
    assert "sched_slice" not in pod_status[ls_sid]
    # What `kubectl exec` does: a process of the node moved into the container's cgroups.
    joined = subprocess.Popen(["sleep", "3600"])
    try:
        assert slice_ns(joined.pid) == default
        be_cgroups = [line.split(":", 2) for line in Path(f"/proc/{be_pid}/cgroup").read_text().splitlines()]
        for _, controllers, path in be_cgroups:
            for controller in ("cpu", "memory", "pids", "cpuset"):
                if controller in controllers.split(","):
                    (CG / controllers / path.lstrip("/") / "cgroup.procs").write_text(str(joined.pid))
        wait_for(lambda: slice_ns(joined.pid) == 100_000, 10, "the joined process's slice from the pass")
    finally:
        joined.kill()
        joined.wait()


MIB = 1 << 20


def memory_stat(cgroup: str) -> dict[str, int]:
    lines = cg_read("memory", cgroup, "memory.stat").splitlines()
    return {key: int(value) for key, value in (line.split() for line in lines)}


def test_a_be_pod_allocating_past_the_budget_is_held_at_it_while_ls_keeps_its_page_cache(
        containerd_bed, node):
    """The budget here is its floor, 200 MiB (1% of the node's memory is less than what the
    system uses): a BE pod allocating 300 MiB in one buffer meets the BE group's cap and the
    kernel's OOM killer inside the group, not the node's; the LS pod's 64 MiB of page cache stay."""
    kn, pods = node("[strategy.be_memory]\nbudget_percent = 1\nmin_budget_mib = 200\n"
                    "[qos_manager]\nreconcile_interval_s = 1\n")
    group = f"{containerd_bed.kubepods_cgroup}/koordnode_be"
    ls_sb, _, _ = pods.run("ls", "burstable", pod_shares=512, resources={"cpu_shares": 512},
                           cmd=["sh", "-c", "dd if=/dev/zero of=/cache.bin bs=1M count=64 && sleep 3600"])
    ls_pod = ls_sb.linux.cgroup_parent
    wait_for(lambda: memory_stat(ls_pod)["total_cache"] >= 64 * MIB, 20, "the LS pod's page cache")
    cache_before = memory_stat(ls_pod)["total_cache"]
    _, be_sid, be_cid = pods.run("be", "besteffort", cmd=["sleep", "3600"])
    budget = 200 * MIB
    wait_for(lambda: cg_read("memory", group, "memory.limit_in_bytes") == str(budget), 15, "the BE group's cap")
    assert cg_read("memory", group, "memory.soft_limit_in_bytes") == str(budget)
    be_pod = next(p for p in kn.status()["pods"] if p["sandbox_id"] == be_sid)["cgroup_parent"]
    pod_bound = budget * 70 // 100 // 4096 * 4096  # the kernel keeps whole pages
    wait_for(lambda: cg_read("memory", be_pod, "memory.soft_limit_in_bytes") == str(pod_bound), 10,
             "the BE pod's soft limit")

    # 300 MiB in one buffer, touched: past the budget.
    reply = pods.cri.rt.ExecSync(pb.ExecSyncRequest(
        container_id=be_cid, cmd=["dd", "if=/dev/zero", "of=/dev/null", "bs=300M", "count=2"], timeout=60),
        timeout=90)
    assert reply.exit_code != 0, reply  # killed inside the BE group
    assert int(cg_read("memory", group, "memory.failcnt")) > 0
    assert int(cg_read("memory", group, "memory.max_usage_in_bytes")) <= budget
    # LS lost nothing to it.
    assert memory_stat(ls_pod)["total_cache"] >= cache_before * 0.95
    status = kn.status()
    strategy = status["qos_manager"]["strategies"]["be_memory"]
    assert strategy["budget_bytes"] == budget and strategy["pod_bounds"][be_sid] == budget * 70 // 100
    be_status = next(p for p in status["pods"] if p["sandbox_id"] == be_sid)
    assert be_status["be_memory_bound"] == {"memory.high": budget * 70 // 100, "budget_bytes": budget}
