"""QoS classes applied at creation, read back from the real cgroup v1 files of the test bed."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from koordnode.cri import api_pb2 as pb
from koordnode.cri.client import RuntimeBackend
from koordnode.executor.process import oom_score_adj_floor
from koordnode.model.cpulist import parse_cpu_list
from support.cri import Cri, Pods, container_config, remove_pod, run_pod, sandbox_config, start_container
from support.koordnode_runner import KoordnodeProcess

pytestmark = pytest.mark.e2e

CG = Path("/sys/fs/cgroup")
ALL_CPUS = parse_cpu_list(Path("/sys/devices/system/cpu/online").read_text().strip())
OOM_FLOOR = oom_score_adj_floor()  # None: koordnode may lower oom_score_adj (CAP_SYS_RESOURCE)


def cg_read(controller: str, cgroup: str, name: str) -> str:
    return (CG / controller / cgroup.lstrip("/") / name).read_text().strip()


def container_pid(cri: Cri, cid: str) -> int:
    info = cri.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True)).info
    return json.loads(info["info"])["pid"]


@pytest.fixture
def pods(containerd_bed, cri_proxy):
    p = Pods(containerd_bed, cri_proxy)
    yield p
    p.cleanup()


GUARANTEED_1CPU = {"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000, "memory_limit_in_bytes": 256 << 20}


def test_each_class_gets_its_values_in_the_real_cgroups(containerd_bed, cri_proxy, koordnode, pods):
    cases = {
        "SYSTEM": dict(qos="guaranteed", labels={"koordinator.sh/qosClass": "SYSTEM"}, resources=GUARANTEED_1CPU),
        "LSE": dict(qos="guaranteed", labels={"koordinator.sh/qosClass": "LSE"}, resources=GUARANTEED_1CPU),
        "LSR": dict(qos="guaranteed", resources=GUARANTEED_1CPU),  # Guaranteed -> LSR by default
        "LS": dict(qos="burstable", resources={"cpu_shares": 512}),  # Burstable -> LS
        "BE": dict(qos="besteffort", resources={"cpu_shares": 2}),  # BestEffort -> BE
    }
    created = {}
    for cls, kwargs in cases.items():
        sb, sid, cid = pods.run(cls.lower(), **kwargs)
        created[cls] = (sb.linux.cgroup_parent, sid, cid)
    time.sleep(0.3)  # post hooks of the last StartContainer
    expect_shares = {"SYSTEM": 32768, "LSE": 262144, "LSR": 65536, "LS": 512, "BE": 2}
    expect_idle = {"SYSTEM": "0", "LSE": "0", "LSR": "0", "LS": "0", "BE": "0"}  # [qos.BE] cpu_idle = 0
    expect_oom = {"SYSTEM": -1000, "LSE": -900, "LSR": -700, "LS": -300, "BE": 1000}
    status = koordnode.status()
    by_sid = {p["sandbox_id"]: p for p in status["pods"]}
    for cls, (parent, sid, cid) in created.items():
        # BestEffort BE pods run in koordnode's idle group beside kubelet's tiers (test_e2e_be_group).
        assert (by_sid[sid]["cgroup_parent"] != parent) == (cls == "BE"), cls
        parent = by_sid[sid]["cgroup_parent"]
        ccg = f"{parent}/{cid}"
        assert cg_read("cpu", ccg, "cpu.shares") == str(expect_shares[cls]), cls
        # What containerd reports back, and kubelet makes the pod's status.containerStatuses[]
        # .resources of, is what kubelet asked: the class weight is in the file only.
        reported = cri_proxy.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid)).status.resources.linux
        assert reported.cpu_shares == cases[cls]["resources"]["cpu_shares"], cls
        assert cg_read("cpu", parent, "cpu.idle") == expect_idle[cls], cls
        if cls == "BE":  # not idle: the pod has BE's weight
            assert cg_read("cpu", parent, "cpu.shares") == "2"
        quota = cg_read("cpu", ccg, "cpu.cfs_quota_us")
        assert quota == ("100000" if cls in ("SYSTEM", "LSE", "LSR") else "-1"), cls
        # The runtime clamps negative values to its own (restrict_oom_score_adj); koordnode then
        # gives the processes the class value where it may lower it (CAP_SYS_RESOURCE; without
        # it, as on the test machine, not below its own 0). And the CRI request carried ours.
        oom = int(Path(f"/proc/{container_pid(cri_proxy, cid)}/oom_score_adj").read_text())
        assert oom == (expect_oom[cls] if OOM_FLOOR is None else max(expect_oom[cls], 0)), cls
        pod = by_sid[sid]
        assert pod["qos_class"] == cls
        assert pod["containers"][0]["resources"]["oom_score_adj"] == expect_oom[cls]
        assert pod["qos_reason"]
        # blkio weight: this kernel has only the bfq weight file, the executor uses it.
        weight = {"LSE": "1000", "LSR": "800", "LS": "500", "BE": "100"}.get(cls)
        if weight and (CG / "blkio" / parent.lstrip("/") / "blkio.bfq.weight").exists():
            assert cg_read("blkio", parent, "blkio.bfq.weight") == weight, cls
        # Memory protection files do not exist on cgroup v1 here: skipped, with the reason shown.
        if cls != "SYSTEM":  # SYSTEM has no memory protection by default
            assert any("memory.min" in s and "not present" in s for s in pod["skipped"]), cls
    # Exclusive cores: LSE and LSR own CPUs, the shared pools exclude them.
    lse_cpus = parse_cpu_list(cg_read("cpuset", f"{created['LSE'][0]}/{created['LSE'][2]}", "cpuset.cpus"))
    ls_cpus = parse_cpu_list(cg_read("cpuset", f"{created['LS'][0]}/{created['LS'][2]}", "cpuset.cpus"))
    assert len(lse_cpus) == 1 and not (lse_cpus & ls_cpus)


def test_lse_pods_get_disjoint_cores_and_the_pool_shrinks_and_grows(containerd_bed, cri_proxy, koordnode, pods):
    _, ls_sid, ls_cid = pods.run("ls", qos="burstable", resources={"cpu_shares": 512})
    ls_parent = koordnode.status()["pods"][0]["cgroup_parent"]

    def ls_pool() -> frozenset[int]:
        return parse_cpu_list(cg_read("cpuset", f"{ls_parent}/{ls_cid}", "cpuset.cpus"))

    assert ls_pool() == ALL_CPUS
    lse_sids, lse_cpus = [], []
    n_lse = len(ALL_CPUS) - 1  # leave one CPU to the share pool
    for i in range(n_lse):
        sb, sid, cid = pods.run(f"lse{i}", qos="guaranteed", labels={"koordinator.sh/qosClass": "LSE"},
                                resources=GUARANTEED_1CPU)
        lse_sids.append(sid)
        lse_cpus.append(parse_cpu_list(cg_read("cpuset", f"{sb.linux.cgroup_parent}/{cid}", "cpuset.cpus")))
    time.sleep(0.3)
    taken = frozenset().union(*lse_cpus)
    assert sum(len(c) for c in lse_cpus) == len(taken) == n_lse  # disjoint
    assert ls_pool() == ALL_CPUS - taken  # the running LS container was moved off them
    allocations = koordnode.status()["qos"]["cpus"]["allocations"]
    assert sorted(c for a in allocations.values() for c in a["cpus"]) == sorted(taken)

    # One more LSE than there are free cores: still created (fail-open) on the share pool.
    sb, extra_sid, extra_cid = pods.run("lse-extra", qos="guaranteed", labels={"koordinator.sh/qosClass": "LSE"},
                                        resources=GUARANTEED_1CPU)
    extra = parse_cpu_list(cg_read("cpuset", f"{sb.linux.cgroup_parent}/{extra_cid}", "cpuset.cpus"))
    assert not (extra & taken)
    pods.remove(extra_sid)

    for sid in lse_sids:
        pods.remove(sid)
    time.sleep(0.3)
    assert ls_pool() == ALL_CPUS
    assert koordnode.status()["qos"]["cpus"]["allocations"] == {}


def test_allocations_and_status_survive_a_restart(containerd_bed, tmp_path):
    bed = containerd_bed
    kn = KoordnodeProcess(tmp_path / "kn", str(bed.socket)).start()
    cri = Cri(kn.listen)
    pods = Pods(bed, cri)
    try:
        sb, sid, cid = pods.run("lse", qos="guaranteed", labels={"koordinator.sh/qosClass": "LSE"},
                                resources=GUARANTEED_1CPU)
        _, be_sid, be_cid = pods.run("be", qos="besteffort", resources={"cpu_shares": 2})
        time.sleep(0.3)
        before = kn.wait_rebuilt()
        kn.stop()
        kn.start()
        after = kn.wait_rebuilt()

        def adopted(status: dict) -> bool:
            # The worker restores the allocations, then the loop records the classes it returns.
            return bool(status["qos"]["cpus"]["allocations"]) and all(p["qos_class"] for p in status["pods"])

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not adopted(after):
            time.sleep(0.2)
            after = kn.status()
        assert after["qos"]["cpus"]["allocations"] == before["qos"]["cpus"]["allocations"]
        assert after["qos"]["cpus"]["be_pool"] == before["qos"]["cpus"]["be_pool"]
        classes = {p["sandbox_id"]: p["qos_class"] for p in after["pods"]}
        assert classes[sid] == "LSE" and classes[be_sid] == "BE"
        # After the restart, a new LSE pod must not get the CPU the first one holds.
        sb2, sid2, cid2 = pods.run("lse2", qos="guaranteed", labels={"koordinator.sh/qosClass": "LSE"},
                                   resources=GUARANTEED_1CPU)
        first = parse_cpu_list(cg_read("cpuset", f"{sb.linux.cgroup_parent}/{cid}", "cpuset.cpus"))
        second = parse_cpu_list(cg_read("cpuset", f"{sb2.linux.cgroup_parent}/{cid2}", "cpuset.cpus"))
        assert not (first & second)
    finally:
        pods.cleanup()
        cri.close()
        kn.stop()


def test_reconcile_restores_overwritten_values(containerd_bed, tmp_path):
    kn = KoordnodeProcess(tmp_path / "kn", str(containerd_bed.socket),
                          extra_toml="[cgroup]\nreconcile_interval_s = 0.5\n").start()
    cri = Cri(kn.listen)
    pods = Pods(containerd_bed, cri)
    try:
        sb, sid, cid = pods.run("be", qos="besteffort", resources={"cpu_shares": 2})
        status = kn.wait_rebuilt()
        parent = next(p for p in status["pods"] if p["sandbox_id"] == sid)["cgroup_parent"]
        # An operator's overwrite (koordnode's value is 0: [qos.BE] cpu_idle = 0).
        (CG / "cpu" / parent.lstrip("/") / "cpu.idle").write_text("1")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and cg_read("cpu", parent, "cpu.idle") != "0":
            time.sleep(0.1)
        assert cg_read("cpu", parent, "cpu.idle") == "0"
    finally:
        pods.cleanup()
        cri.close()
        kn.stop()


def _hook_writes(port: int) -> dict[str, float]:
    """koordnode_executor_writes_total by outcome, over the values the hooks own (the QoS
    manager's BE quota changes with the load and is left out)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    totals: dict[str, float] = {}
    for line in body.splitlines():
        if line.startswith("koordnode_executor_writes_total{") and 'resource="cpu.cfs_quota_us"' not in line:
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            totals[outcome] = totals.get(outcome, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def test_reconcile_passes_with_nothing_changed_write_nothing(containerd_bed, tmp_path):
    """The periodic pass reads and compares every value; a value nobody changed is not written
    again, one somebody changed is written back."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kn = KoordnodeProcess(tmp_path / "kn", str(containerd_bed.socket), metrics_listen=f"127.0.0.1:{port}",
                          extra_toml="[cgroup]\nreconcile_interval_s = 0.3\n").start()
    cri = Cri(kn.listen)
    pods = Pods(containerd_bed, cri)
    try:
        pods.run("be", qos="besteffort", resources={"cpu_shares": 2})
        _, ls_sid, _ = pods.run("ls", qos="burstable", labels={"koordinator.sh/qosClass": "LS"},
                                resources={"cpu_shares": 1024})
        status = kn.wait_rebuilt()
        time.sleep(1.0)  # creation and the first passes settled
        before = _hook_writes(port)
        time.sleep(1.5)  # about five passes
        after = _hook_writes(port)
        assert after.get("unchanged", 0) > before.get("unchanged", 0), (before, after)  # the passes ran
        assert after.get("written", 0) == before.get("written", 0), (before, after)

        parent = next(p for p in status["pods"] if p["sandbox_id"] == ls_sid)["cgroup_parent"]
        (CG / "blkio" / parent.lstrip("/") / "blkio.bfq.weight").write_text("100")  # an operator's overwrite
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and cg_read("blkio", parent, "blkio.bfq.weight") == "100":
            time.sleep(0.1)
        assert cg_read("blkio", parent, "blkio.bfq.weight") != "100"
        assert _hook_writes(port).get("written", 0) == after.get("written", 0) + 1
    finally:
        pods.cleanup()
        cri.close()
        kn.stop()


def _busy_pair(bed, cri: Cri, pods: Pods, cpu: str, through_koordnode: bool) -> tuple[float, float]:
    """An LS and a BE busy loop on the same CPU for 3 s; each one's share of that CPU."""
    burstable_1cpu = {"cpu_shares": 1024, "cpuset_cpus": cpu}
    busy = ("sh", "-c", "while :; do :; done")
    ls_sb, ls_sid, ls_cid = pods.run("busy-ls", qos="burstable", labels={"koordinator.sh/qosClass": "LS"},
                                     resources=burstable_1cpu, cmd=busy)
    be_sb, be_sid, be_cid = pods.run("busy-be", qos="burstable", labels={"koordinator.sh/qosClass": "BE"},
                                     resources=burstable_1cpu, cmd=busy)
    cgroups = [f"{ls_sb.linux.cgroup_parent}/{ls_cid}", f"{be_sb.linux.cgroup_parent}/{be_cid}"]
    for cg in cgroups:  # both on that one CPU: kubelet's cpuset directly, koordnode's pools through it
        assert cg_read("cpuset", cg, "cpuset.cpus") == cpu
    time.sleep(0.5)
    start = [int(cg_read("cpuacct", cg, "cpuacct.usage")) for cg in cgroups]
    t0 = time.monotonic()
    time.sleep(3)
    elapsed = time.monotonic() - t0
    used = [int(cg_read("cpuacct", cg, "cpuacct.usage")) - s for cg, s in zip(cgroups, start, strict=True)]
    pods.remove(ls_sid)
    pods.remove(be_sid)
    return tuple(u / 1e9 / elapsed for u in used)  # type: ignore[return-value]


def test_ls_gets_the_cpu_when_be_competes(containerd_bed, tmp_path, cri_direct):
    """Both pods Burstable with 1 CPU requested (kubelet gives both 1024 shares); one is labelled
    LS, the other BE. Without koordnode they split the CPU; with it, LS gets >= 90%."""
    cpu = str(max(ALL_CPUS))
    direct_pods = Pods(containerd_bed, cri_direct)
    try:
        ls_direct, be_direct = _busy_pair(containerd_bed, cri_direct, direct_pods, cpu, through_koordnode=False)
    finally:
        direct_pods.cleanup()
    # Reserve every other CPU for the node, so koordnode's LS and BE pools are that one CPU.
    others = ",".join(str(c) for c in sorted(ALL_CPUS - {int(cpu)}))
    kn = KoordnodeProcess(tmp_path / "kn", str(containerd_bed.socket),
                          extra_toml=f'[node]\nreserved_cpus = "{others}"\n').start()
    cri = Cri(kn.listen)
    pods = Pods(containerd_bed, cri)
    try:
        ls_kn, be_kn = _busy_pair(containerd_bed, cri, pods, cpu, through_koordnode=True)
    finally:
        pods.cleanup()
        cri.close()
        kn.stop()
    print(f"without koordnode: LS {ls_direct:.1%} BE {be_direct:.1%}; with: LS {ls_kn:.1%} BE {be_kn:.1%}")
    # Shares of what the pair got on that CPU, so unrelated load on a shared CI machine does not
    # decide the result (on a quiet machine the absolute figures are ~98% / <1%, see docs/benchmarks.md).
    assert ls_direct / (ls_direct + be_direct) < 0.75  # they really competed
    assert ls_kn / (ls_kn + be_kn) >= 0.90
    assert ls_kn > 0.5


def test_hostile_inputs_change_nothing_outside_the_root_and_calls_behave_as_direct(
        containerd_bed, cri_proxy, cri_direct, koordnode, tmp_path):
    bed = containerd_bed
    # Bad label and malformed annotations: classified from the cgroup parent, call succeeds.
    sb = sandbox_config(bed, "hostile", qos="besteffort",
                        labels={"koordinator.sh/qosClass": "PLATINUM"},
                        annotations={"koordinator.sh/memoryQOS": "{not json",
                                     "node.koordinator.sh/extended-resource-spec": "[1,2",
                                     "scheduling.koordinator.sh/resource-status": '{"cpuset": "999-1000"}'})
    sid = run_pod(cri_proxy, sb)
    try:
        cid = start_container(cri_proxy, sid, sb, container_config(bed, "app", ["sleep", "3600"]))
        time.sleep(0.3)
        pod = next(p for p in koordnode.status()["pods"] if p["sandbox_id"] == sid)
        assert pod["qos_class"] == "BE" and "PLATINUM" in pod["qos_reason"]
        assert any("memoryQOS" in n for n in pod["notes"] + pod["containers"][0].get("notes", []))
        assert cg_read("cpu", f"{pod['cgroup_parent']}/{cid}", "cpu.shares") == "2"
    finally:
        remove_pod(cri_proxy, sid)

    # A cgroup parent that climbs out of the hierarchy: whatever containerd answers directly,
    # koordnode answers too, and nothing appears outside the cgroup root.
    marker = f"koordnode-escape-{uuid.uuid4().hex[:8]}"
    outside = tmp_path / marker
    results = []
    for cri in (cri_direct, cri_proxy):
        esc = sandbox_config(bed, "escape", qos="besteffort")
        esc.linux.cgroup_parent = f"/../../../../..{tmp_path}/{marker}"
        try:
            results.append(("ok", run_pod(cri, esc)))
        except Exception as exc:  # grpc.RpcError
            results.append(("error", exc.code(), exc.details().split(":")[0]))
    for r in results:
        if r[0] == "ok":
            remove_pod(cri_direct, r[1])
    assert results[0][0] == results[1][0]
    if results[0][0] == "error":
        assert results[0][1] == results[1][1]
    assert not outside.exists() or not any(outside.rglob("cpu.idle"))
    # koordnode refused to write there and said so.
    assert "cgroup_write" not in [line for line in koordnode.log_text().splitlines() if marker in line and '"cgroup_write"' in line]


def test_pod_ips_are_asked_of_the_runtime_only_for_the_network_classes(containerd_bed, cri_proxy, cri_direct,
                                                                        koordnode, pods):
    sb, sid, cid = pods.run("net", qos="burstable", resources={"cpu_shares": 512})
    want = cri_direct.rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=sid)).status.network.ip
    assert want  # the bed's CNI bridge gave the pod an address
    # [net] is off: no round trip to the runtime inside the pod's start (the reconcile pass asks
    # once a reload turns it on: test_daemon_parts.py).
    time.sleep(1)
    pod = next(p for p in koordnode.status()["pods"] if p["sandbox_id"] == sid)
    assert pod["ips"] == [] and pod["qos_class"] == "LS"
    # What koordnode asks when it is on, of the real runtime.
    backend = RuntimeBackend(str(containerd_bed.socket))

    async def ask():
        try:
            return await backend.pod_network(sid)
        finally:
            await backend.close()

    assert asyncio.run(ask()) == ((want,), False)
