"""NRI mode end to end: a real containerd 2.1 (Debian forky's package) and 1.7 (trixie's) with
NRI on a private socket, koordnode registered as an external NRI plugin, and CRI calls made
straight to containerd as kubelet would make them — koordnode is not in their path. Both
releases run every lifecycle test; the hanging hook, BE suppression and the one-mode-per-node
checks do not depend on the release and run on 2.1 only.

Values are read back from the real cgroup v1 files and from the OCI spec containerd keeps
(ContainerStatus verbose info): a value that arrived through NRI is in both, a value written
to the cgroup behind containerd's back only in the first.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import time
from pathlib import Path

import pytest

from koordnode.cri import api_pb2 as pb
from koordnode.hooks.chain import Phase, Stage
from koordnode.model.be_group import be_group_parent
from koordnode.model.cpulist import parse_cpu_list
from koordnode.executor.process import oom_score_adj_floor
from support.cri import Cri, Pods, container_config, run_pod, sandbox_config
from support.koordnode_runner import InProcessKoordnode, KoordnodeProcess, short_socket_dir
from support.kubelet_tiers import prepare_qos_tiers
from testbed.containerd_bed import ContainerdBed
from testbed.fixtures import running_in_ci

pytestmark = pytest.mark.e2e

CG = Path("/sys/fs/cgroup")
ALL_CPUS = parse_cpu_list(Path("/sys/devices/system/cpu/online").read_text().strip())
GUARANTEED_1CPU = {"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000, "memory_limit_in_bytes": 256 << 20}
LSE = {"koordinator.sh/qosClass": "LSE"}
OOM_FLOOR = oom_score_adj_floor()


def cg_read(controller: str, cgroup: str, name: str) -> str:
    return (CG / controller / cgroup.lstrip("/") / name).read_text().strip()


def cg_write(controller: str, cgroup: str, name: str, value: str) -> None:
    (CG / controller / cgroup.lstrip("/") / name).write_text(value)


@pytest.fixture(scope="module", params=["forky", "trixie"], ids=["containerd2.1", "containerd1.7"])
def nri_bed(request, tmp_path_factory):
    suite = request.param
    try:
        from testbed.containerd_dist import DistError, containerd_bin_dir
    except ImportError as exc:  # pragma: no cover - the test bed lacks the dist helper
        pytest.fail(f"tests/testbed/containerd_dist.py missing: {exc}")
    try:
        bin_dir = containerd_bin_dir(suite)
    except DistError as exc:
        if running_in_ci():
            pytest.fail(f"containerd of Debian {suite} unavailable: {exc}", pytrace=False)
        pytest.skip(f"containerd of Debian {suite} unavailable: {exc}")
    sock = short_socket_dir() / "nri.sock"
    bed = ContainerdBed(tmp_path_factory.mktemp("nri-bed"), bin_dir=bin_dir, nri_socket=sock)
    bed.start()
    prepare_qos_tiers(bed.kubepods_cgroup)
    try:
        yield bed
    finally:
        bed.stop()


@pytest.fixture
def cri(nri_bed):
    c = Cri(nri_bed.address)
    yield c
    c.close()


@pytest.fixture
def koordnode(nri_bed, tmp_path):
    kn = KoordnodeProcess(tmp_path / "kn", str(nri_bed.socket), nri_socket=str(nri_bed.nri_socket),
                          kubepods=nri_bed.kubepods_cgroup).start()
    kn.wait_synchronized()
    yield kn
    kn.stop()


@pytest.fixture
def pods(nri_bed, cri):
    p = Pods(nri_bed, cri)
    yield p
    p.cleanup()


def runtime_spec(cri: Cri, cid: str) -> dict:
    """The OCI spec containerd holds for a container (what NRI adjusted and updated)."""
    info = cri.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True), timeout=10).info
    return json.loads(info["info"])["runtimeSpec"]


def spec_cgroup(cri: Cri, cid: str) -> str:
    """The container's cgroup as containerd placed it (its spec's cgroupsPath, cgroupfs form)."""
    return runtime_spec(cri, cid)["linux"]["cgroupsPath"]


def process_oom(cri: Cri, cid: str) -> int:
    info = cri.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True), timeout=10).info
    return int(Path(f"/proc/{json.loads(info['info'])['pid']}/oom_score_adj").read_text())


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s} s (last {last!r})")


def restart_containerd(bed: ContainerdBed) -> None:
    """Stop containerd (its shims and pods go on running) and start it again, as systemd would."""
    bed._close_channel()
    bed._terminate_containerd()
    bed._launch()
    bed._wait_ready()


def test_each_class_gets_its_values_through_nri(nri_bed, cri, koordnode, pods):
    cases = {
        "SYSTEM": dict(qos="guaranteed", labels={"koordinator.sh/qosClass": "SYSTEM"}, resources=GUARANTEED_1CPU),
        "LSE": dict(qos="guaranteed", labels=LSE, resources=GUARANTEED_1CPU),
        "LSR": dict(qos="guaranteed", resources=GUARANTEED_1CPU),  # Guaranteed -> LSR
        "LS": dict(qos="burstable", resources={"cpu_shares": 512}),  # Burstable -> LS
        "BE": dict(qos="besteffort", resources={"cpu_shares": 2}),  # BestEffort -> BE
    }
    created = {}
    for cls, kwargs in cases.items():
        sb, sid, cid = pods.run(cls.lower(), **kwargs)
        created[cls] = (sb.linux.cgroup_parent, sid, cid)
    expect_shares = {"SYSTEM": 32768, "LSE": 262144, "LSR": 65536, "LS": 512, "BE": 2}
    kubelet_shares = {"SYSTEM": 1024, "LSE": 1024, "LSR": 1024, "LS": 512, "BE": 2}
    expect_idle = {"SYSTEM": "0", "LSE": "0", "LSR": "0", "LS": "0", "BE": "0"}  # [qos.BE] cpu_idle = 0
    expect_oom = {"SYSTEM": -1000, "LSE": -900, "LSR": -700, "LS": -300, "BE": 1000}
    # Pod-level values are written after PostStartContainer: give the last one a moment.
    wait_for(lambda: cg_read("cpu", be_group_parent(created["BE"][0]), "cpu.shares") == "2", 5, "BE pod cpu.shares")
    status = koordnode.status()
    assert status["mode"] == "nri" and status["nri"]["connected"]
    by_sid = {p["sandbox_id"]: p for p in status["pods"]}
    for cls, (parent, sid, cid) in created.items():
        ccg = spec_cgroup(cri, cid)
        # The BE container runs in koordnode's BE group (test_be_containers_run_in_the_idle_be_group).
        assert ccg == (f"{be_group_parent(parent)}/{cid}" if cls == "BE" else f"{parent}/{cid}"), cls
        spec = runtime_spec(cri, cid)
        # A pool move (an NRI update, when LSE and LSR took their CPUs) makes containerd write the
        # whole spec to the cgroup, kubelet's shares too: the class value follows a moment later.
        wait_for(lambda ccg=ccg, cls=cls: cg_read("cpu", ccg, "cpu.shares") == str(expect_shares[cls]), 5,
                 f"{cls} cpu.shares")
        # What containerd reports back to kubelet (ContainerStatus, from the spec) stays
        # kubelet's: the class weight is written to the cgroup, never adjusted into the spec.
        assert spec["linux"]["resources"]["cpu"]["shares"] == kubelet_shares[cls], cls
        reported = cri.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid)).status.resources.linux
        assert reported.cpu_shares == kubelet_shares[cls], cls
        assert cg_read("cpu", parent, "cpu.idle") == expect_idle[cls], cls
        quota = cg_read("cpu", ccg, "cpu.cfs_quota_us")
        assert quota == ("100000" if cls in ("SYSTEM", "LSE", "LSR") else "-1"), cls
        # The adjustment carries our oom_score_adj; containerd applies it to the process. Where
        # it cannot be lowered (no CAP_SYS_RESOURCE, as on the test machine) it is clamped.
        # containerd 1.7's NRI cannot adjust it: koordnode sets the process's after start.
        want_oom = expect_oom[cls] if OOM_FLOOR is None else max(expect_oom[cls], OOM_FLOOR)
        if nri_bed.containerd_major >= 2:
            assert spec["process"]["oomScoreAdj"] == want_oom, cls
        # Where the runtime did not apply it, it is written right after the PostStartContainer answer.
        wait_for(lambda cid=cid, want=want_oom: process_oom(cri, cid) == want, 5, f"{cls} oom_score_adj")
        # kubelet's own values travel in our annotation, for planning after restarts.
        assert "koordnode.io/kubelet-resources" in spec["annotations"], cls
        pod = by_sid[sid]
        assert pod["qos_class"] == cls and pod["qos_reason"]
        weight = {"LSE": "1000", "LSR": "800", "LS": "500", "BE": "100"}.get(cls)
        pod_cg = ccg.rsplit("/", 1)[0]
        if weight and (CG / "blkio" / pod_cg.lstrip("/") / "blkio.bfq.weight").exists():
            assert cg_read("blkio", pod_cg, "blkio.bfq.weight") == weight, cls
    lse_cpus = parse_cpu_list(cg_read("cpuset", f"{created['LSE'][0]}/{created['LSE'][2]}", "cpuset.cpus"))
    ls_cpus = parse_cpu_list(cg_read("cpuset", f"{created['LS'][0]}/{created['LS'][2]}", "cpuset.cpus"))
    assert len(lse_cpus) == 1 and not (lse_cpus & ls_cpus)


def cgroup_procs(controller: str, cgroup: str) -> set[int]:
    return {int(p) for p in cg_read(controller, cgroup, "cgroup.procs").split()}


def test_be_containers_run_in_the_idle_be_group(nri_bed, cri, koordnode, pods):
    """NRI cannot move a pod (its sandbox exists before any plugin is asked), but it can place
    each container: a BestEffort BE pod's containers get a cgroups path in koordnode's idle BE
    group, beside kubelet's tiers, while the sandbox stays in kubelet's pod cgroup. Everything
    stays removable by its owner: runc removes the container cgroups, koordnode the group's pod
    cgroup at RemovePodSandbox, kubelet its own (only the sandbox was in it)."""
    kubepods = nri_bed.kubepods_cgroup
    group = f"{kubepods}/koordnode_be"
    sb, sid, cid = pods.run("batch", qos="besteffort", cmd=("sh", "-c", "while :; do :; done"))
    _, _, ls_cid = pods.run("web", qos="burstable", resources={"cpu_shares": 512})
    kubelet_pod = sb.linux.cgroup_parent
    group_pod = f"{group}/pod{sb.metadata.uid}"
    assert kubelet_pod == f"{kubepods}/besteffort/pod{sb.metadata.uid}"
    # containerd's own record says where the container is: its spec, and the process's cgroups.
    assert spec_cgroup(cri, cid) == f"{group_pod}/{cid}"
    pid = json.loads(cri.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True)).info["info"])["pid"]
    for controller in ("cpu", "memory", "cpuset", "pids"):
        assert pid in cgroup_procs(controller, f"{group_pod}/{cid}"), controller
    # The group yields to LS: idle, or (LS quiet, cpu_suppress) at the lowest weight.
    wait_for(lambda: cg_read("cpu", group, "cpu.idle") == "1" or cg_read("cpu", group, "cpu.shares") == "2", 10,
             "the BE group gives way")
    assert cg_read("cpu", f"{kubepods}/besteffort", "cpu.idle") == "0"
    # The LS container stays where kubelet put it.
    assert spec_cgroup(cri, ls_cid).startswith(f"{kubepods}/burstable/")
    # kubelet's own cgroups: its pod cgroup holds the sandbox only, and its writes succeed.
    assert list((CG / "cpu" / kubelet_pod.lstrip("/")).iterdir())
    assert cgroup_procs("cpu", kubelet_pod) == set()
    cg_write("cpu", f"{kubepods}/besteffort", "cpu.shares", "2")
    cg_write("cpu", kubelet_pod, "cpu.shares", "2")
    # koordnode records the pod where its containers are, and applies the BE values there.
    pod = next(p for p in koordnode.status()["pods"] if p["sandbox_id"] == sid)
    assert pod["qos_class"] == "BE" and pod["cgroup_parent"] == group_pod
    wait_for(lambda: process_oom(cri, cid) == max(1000, OOM_FLOOR or 1000), 5, "BE oom_score_adj")
    # A koordnode restart finds the pod where its containers are (their cgroups paths in the
    # runtime's Synchronize), not where the runtime's sandbox record says.
    assert koordnode.stop() == 0
    koordnode.start()
    koordnode.wait_synchronized()
    pod = next(p for p in koordnode.status()["pods"] if p["sandbox_id"] == sid)
    assert pod["qos_class"] == "BE" and pod["cgroup_parent"] == group_pod
    pods.remove(sid)
    # runc removed the container cgroup, koordnode the group's pod cgroup (every hierarchy) ...
    for controller in ("cpu", "memory", "cpuset", "pids"):
        wait_for(lambda c=controller: not (CG / c / group_pod.lstrip("/")).exists(), 10,
                 f"the group's pod cgroup removed ({controller})")
    # ... and kubelet's pod cgroup is empty, so kubelet's removal succeeds.
    for controller in ("cpu", "memory", "cpuset", "pids"):
        path = CG / controller / kubelet_pod.lstrip("/")
        if path.exists():
            assert not [d for d in path.iterdir() if d.is_dir()], controller
            path.rmdir()


def test_lse_pool_changes_reach_running_containers_as_nri_updates(nri_bed, cri, koordnode, pods):
    ls_sb, _, ls_cid = pods.run("ls", qos="burstable", resources={"cpu_shares": 512})
    ls_cg = f"{ls_sb.linux.cgroup_parent}/{ls_cid}"

    def ls_runtime_cpus() -> frozenset[int]:
        return parse_cpu_list(runtime_spec(cri, ls_cid)["linux"]["resources"]["cpu"].get("cpus", ""))

    assert parse_cpu_list(cg_read("cpuset", ls_cg, "cpuset.cpus")) == ALL_CPUS
    sb, lse_sid, lse_cid = pods.run("lse", qos="guaranteed", labels=LSE, resources=GUARANTEED_1CPU)
    taken = parse_cpu_list(cg_read("cpuset", f"{sb.linux.cgroup_parent}/{lse_cid}", "cpuset.cpus"))
    assert len(taken) == 1
    # The LS container left the LSE core, and containerd knows: the update went through NRI
    # (in CreateContainer's answer), not only into the cgroup file.
    assert parse_cpu_list(cg_read("cpuset", ls_cg, "cpuset.cpus")) == ALL_CPUS - taken
    assert ls_runtime_cpus() == ALL_CPUS - taken
    assert koordnode.status()["nri"]["container_updates_in_answers"] == 1
    # The LSE pod goes (StopContainer's answer carries the LS container's wider cpuset).
    pods.remove(lse_sid)
    wait_for(lambda: ls_runtime_cpus() == ALL_CPUS, 5, "LS container back on every CPU in containerd's spec")
    assert parse_cpu_list(cg_read("cpuset", ls_cg, "cpuset.cpus")) == ALL_CPUS
    nri = koordnode.status()["nri"]
    assert nri["container_updates_in_answers"] == 2 and nri["container_updates_failed"] == 0
    assert koordnode.status()["qos"]["cpus"]["allocations"] == {}


def test_pool_changes_outside_an_nri_event_reach_containerd_as_update_containers(nri_bed, cri, koordnode, pods):
    """A pool change no NRI event answers for (here: a reload reserving a CPU, applied by the
    reconcile pass that follows it) goes to containerd as an UpdateContainers call: the engine
    publishes the move on the pool channel the daemon hands to it and to the plugin, the plugin
    sends it, and containerd updates the container's spec and cgroup."""
    if len(ALL_CPUS) < 2:
        pytest.skip("reserving a CPU needs two")
    ls_sb, _, ls_cid = pods.run("ls", qos="burstable", resources={"cpu_shares": 512})
    ls_cg = f"{ls_sb.linux.cgroup_parent}/{ls_cid}"

    def ls_runtime_cpus() -> frozenset[int]:
        return parse_cpu_list(runtime_spec(cri, ls_cid)["linux"]["resources"]["cpu"].get("cpus", ""))

    def reload(extra: str) -> None:
        koordnode.config_path.write_text(config + extra)
        koordnode.proc.send_signal(signal.SIGHUP)

    assert ls_runtime_cpus() == ALL_CPUS
    config = koordnode.config_path.read_text()
    reserved = min(ALL_CPUS)
    reload(f'[node]\nreserved_cpus = "{reserved}"\n')
    wait_for(lambda: ls_runtime_cpus() == ALL_CPUS - {reserved}, 10, "LS container off the reserved CPU in containerd")
    assert parse_cpu_list(cg_read("cpuset", ls_cg, "cpuset.cpus")) == ALL_CPUS - {reserved}
    nri = koordnode.status()["nri"]
    assert nri["container_updates_sent"] == 1 and nri["container_updates_failed"] == 0
    assert nri["container_updates_in_answers"] == 0
    reload("")
    wait_for(lambda: ls_runtime_cpus() == ALL_CPUS, 10, "LS container back on every CPU in containerd")
    assert parse_cpu_list(cg_read("cpuset", ls_cg, "cpuset.cpus")) == ALL_CPUS
    assert koordnode.status()["nri"]["container_updates_sent"] == 2


def test_a_kubelet_resize_keeps_the_class_values(nri_bed, cri, koordnode, pods):
    sb, _, cid = pods.run("lsr", qos="guaranteed", resources=GUARANTEED_1CPU)
    ccg = f"{sb.linux.cgroup_parent}/{cid}"
    # The class's shares go to the file after the start (PostStartContainer is answered before
    # its Post hooks run, the runtime's reported resources stay kubelet's).
    wait_for(lambda: cg_read("cpu", ccg, "cpu.shares") == "65536", 5, "LSR shares after the start")
    overwrites = koordnode.status()["qos"]["overwrites"]["counts"].get("cpu.shares", 0)
    # kubelet resizes the container to 2 CPUs: UpdateContainerResources straight to containerd.
    cri.rt.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
        container_id=cid, linux=pb.LinuxContainerResources(cpu_shares=2048, cpu_quota=200000, cpu_period=100000,
                                                            memory_limit_in_bytes=256 << 20)), timeout=30)
    # containerd applies kubelet's values (and reports them back); at PostUpdateContainer
    # koordnode writes the LSR scaling (2 x 65536) to the cgroup again.
    wait_for(lambda: cg_read("cpu", ccg, "cpu.shares") == "131072", 5, "LSR shares after the resize")
    assert runtime_spec(cri, cid)["linux"]["resources"]["cpu"]["shares"] == 2048
    assert cg_read("cpu", ccg, "cpu.cfs_quota_us") == "200000"
    # containerd's rewrite of kubelet's weight is not another writer's overwrite.
    assert koordnode.status()["qos"]["overwrites"]["counts"].get("cpu.shares", 0) == overwrites


def only_on_21(bed: ContainerdBed) -> None:
    if (bed.containerd_major, bed.containerd_minor) < (2, 0):
        pytest.skip("does not depend on the containerd release; run against 2.1")


def test_be_suppress_works_in_nri_mode(nri_bed, cri, pods, tmp_path):
    """The QoS manager knows LS and BE pods from NRI and holds the BE tier down while LS is busy.
    (The machine is shared: with other load the BE budget may be at its floor before LS moves,
    so what is asserted is the floor under LS load and that the LS pod's usage was counted.)"""
    only_on_21(nri_bed)
    kubepods = nri_bed.kubepods_cgroup
    be_tier = f"{kubepods}/koordnode_be"  # where the BE pods run, so where the quota goes
    if (CG / "cpu" / be_tier.lstrip("/")).exists():
        cg_write("cpu", be_tier, "cpu.cfs_quota_us", "-1")  # earlier tests' koordnodes wrote it
    kn = KoordnodeProcess(tmp_path / "kn", str(nri_bed.socket), nri_socket=str(nri_bed.nri_socket),
                          kubepods=kubepods).start()
    try:
        kn.wait_synchronized()
        pods.run("batch", qos="besteffort", cmd=("sh", "-c", "while :; do :; done"))
        _, _, ls_cid = pods.run("web", qos="burstable", labels={"koordinator.sh/qosClass": "LS"},
                                resources={"cpu_shares": 2048})
        def decision_inputs() -> dict:
            return (kn.status()["qos_manager"]["strategies"]["cpu_suppress"]["decision"] or {}).get("inputs", {})

        # LS quiet ([strategy.cpu_suppress] ls_quiet_percent): BE runs unthrottled. Not at the
        # first quiet decision: a decision before it may have throttled BE (a busy host, LS's
        # start), and the quota grows back by at most 10 % of the node a tick before it is lifted
        # (a cold CI run read 18333 right after the first quiet decision).
        wait_for(lambda: decision_inputs().get("ls_quiet") is True
                 and int(cg_read("cpu", be_tier, "cpu.cfs_quota_us")) == -1, 20, "BE unthrottled while LS is quiet")
        busy = "timeout 8 sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 &"
        cri.rt.ExecSync(pb.ExecSyncRequest(container_id=ls_cid, cmd=["sh", "-c", f"{busy} {busy} exit 0"],
                                           timeout=5), timeout=10)

        def ls_counted():
            inputs = decision_inputs()
            return inputs.get("ls_used_cpus", 0) >= 0.6 and inputs.get("ls_quiet") is False and inputs

        inputs = wait_for(ls_counted, 10, "the LS pod's busy loops counted by cpu_suppress")
        # The LS usage came off the BE budget (the share of the node is the decision's own:
        # 95 % while BE sits in koordnode's group and gives way, 65 % in kubelet's tier), and the
        # BE tier's quota follows the decision.
        share = inputs["node_cpus"] * inputs["threshold_percent"] / 100.0
        assert inputs["be_budget_cpus"] <= max(0.0, share - inputs["ls_used_cpus"]) + 0.01, inputs
        wait_for(lambda: 0 < int(cg_read("cpu", be_tier, "cpu.cfs_quota_us"))
                 <= max(2000, inputs.get("target_quota_us", 0)) * 1.1 + 1, 5, "BE quota down to the decision")
        assert kn.status()["qos_manager"]["strategies"]["cpu_suppress"]["last_write"]["value"] > 0
    finally:
        pods.cleanup()
        kn.stop()


def test_containerd_restart_reconnects_reregisters_and_resynchronizes(nri_bed, cri, koordnode, pods):
    sb, _, cid = pods.run("before", qos="guaranteed", labels=LSE, resources=GUARANTEED_1CPU)
    lse_cpus = cg_read("cpuset", f"{sb.linux.cgroup_parent}/{cid}", "cpuset.cpus")
    restart_containerd(nri_bed)
    st = koordnode.wait_synchronized(count=2, timeout_s=20)
    assert st["nri"]["registrations"] == 2
    # The running LSE container kept its core: ownership was rebuilt from the Synchronize.
    assert st["qos"]["cpus"]["allocations"]
    assert sorted(c for a in st["qos"]["cpus"]["allocations"].values() for c in a["cpus"]) == sorted(
        parse_cpu_list(lse_cpus))
    cri2 = Cri(nri_bed.address)
    try:
        pods.cri = cri2
        sb2, _, cid2 = pods.run("after", qos="besteffort", resources={"cpu_shares": 2})
        be_cg = spec_cgroup(cri2, cid2)
        assert be_cg == f"{be_group_parent(sb2.linux.cgroup_parent)}/{cid2}"
        wait_for(lambda: cg_read("cpu", be_cg.rsplit("/", 1)[0], "cpu.shares") == "2", 5, "new BE pod cpu.shares")
        # The new BE container is off the LSE core.
        be_cpus = parse_cpu_list(cg_read("cpuset", be_cg, "cpuset.cpus"))
        assert not (be_cpus & parse_cpu_list(lse_cpus))
    finally:
        pods.cleanup()
        cri2.close()


def test_koordnode_restart_synchronize_fixes_pods_created_in_the_gap(nri_bed, cri, pods, tmp_path):
    kn = KoordnodeProcess(tmp_path / "kn", str(nri_bed.socket), nri_socket=str(nri_bed.nri_socket),
                          kubepods=nri_bed.kubepods_cgroup).start()
    try:
        kn.wait_synchronized()
        ls_sb, _, ls_cid = pods.run("ls-before", qos="burstable", resources={"cpu_shares": 512})
        assert kn.stop() == 0
        # koordnode is away: containerd creates pods without it, as kubelet asked.
        lsr_sb, _, lsr_cid = pods.run("lsr-gap", qos="guaranteed", resources=GUARANTEED_1CPU)
        be_sb, _, be_cid = pods.run("be-gap", qos="besteffort", resources={"cpu_shares": 2})
        lsr_cg = f"{lsr_sb.linux.cgroup_parent}/{lsr_cid}"
        assert cg_read("cpu", lsr_cg, "cpu.shares") == "1024"
        assert cg_read("cpu", be_sb.linux.cgroup_parent, "cpu.shares") != "2"
        assert process_oom(cri, be_cid) == 0
        assert "koordnode.io/kubelet-resources" not in runtime_spec(cri, lsr_cid)["annotations"]

        kn.start()
        kn.wait_synchronized()
        # The reconcile pass after Synchronize wrote the gap pod's container weight; containerd's
        # spec (what it reports to kubelet) keeps kubelet's ...
        wait_for(lambda: cg_read("cpu", lsr_cg, "cpu.shares") == "65536", 10, "gap LSR container cpu.shares")
        assert runtime_spec(cri, lsr_cid)["linux"]["resources"]["cpu"]["shares"] == 1024
        # CPUs of its own are handed out at creation only, never to a running container: the
        # gap's LSR container shares the pool with the LS one (both told so by containerd).
        ls_cpus = parse_cpu_list(cg_read("cpuset", f"{ls_sb.linux.cgroup_parent}/{ls_cid}", "cpuset.cpus"))
        assert parse_cpu_list(cg_read("cpuset", lsr_cg, "cpuset.cpus")) == ls_cpus
        assert kn.status()["qos"]["cpus"]["allocations"] == {}
        # ... and the cgroup-level values NRI cannot carry came from the reconcile pass.
        wait_for(lambda: cg_read("cpu", be_sb.linux.cgroup_parent, "cpu.shares") == "2", 10, "gap BE pod cpu.shares")
        assert cg_read("cpu", be_sb.linux.cgroup_parent, "cpu.idle") == "0"  # [qos.BE] cpu_idle = 0
        # oom_score_adj, which NRI updates cannot carry, is set on the container's processes.
        wait_for(lambda: process_oom(cri, be_cid) == 1000, 5, "gap BE container's oom_score_adj")
        by_name = {p["name"]: p for p in kn.status()["pods"]}
        assert by_name["lsr-gap"]["qos_class"] == "LSR" and by_name["be-gap"]["qos_class"] == "BE"

        # A second restart plans from kubelet's values again (65536 never becomes kubelet's).
        assert kn.stop() == 0
        kn.start()
        kn.wait_synchronized()
        time.sleep(0.5)
        assert runtime_spec(cri, lsr_cid)["linux"]["resources"]["cpu"]["shares"] == 1024
        assert cg_read("cpu", lsr_cg, "cpu.shares") == "65536"
    finally:
        pods.cleanup()
        kn.stop()


class HangingCreateHook:
    name = "hangs"

    def stages(self):
        return [Stage.in_thread("CreateContainer", Phase.PRE, self.pre)]

    def pre(self, call) -> None:
        time.sleep(30)


def test_a_hanging_hook_does_not_hold_the_pod_past_containerds_timeout(nri_bed, cri, pods, tmp_path):
    # The chain's own timeout is set far above containerd's (2 s): the NRI answer deadline
    # must still let the container be created, as kubelet asked.
    only_on_21(nri_bed)
    kn = InProcessKoordnode(tmp_path, str(nri_bed.socket), extra_hooks=[HangingCreateHook()],
                            nri_socket=str(nri_bed.nri_socket))
    kn.config = dataclasses.replace(kn.config, proxy=dataclasses.replace(kn.config.proxy, hook_timeout_ms=60000))
    kn.start()
    try:
        wait_for(lambda: kn.call(lambda: kn.daemon.nri.stats.synchronizations), 20, "synchronized")
        sb = sandbox_config(nri_bed, "hang", qos="guaranteed", labels=LSE)
        sid = run_pod(cri, sb)
        pods.ids.append(sid)
        started = time.monotonic()
        cid = cri.rt.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=sid, sandbox_config=sb,
            config=container_config(nri_bed, "app", ["sleep", "60"], resources=GUARANTEED_1CPU)), timeout=30).container_id
        took = time.monotonic() - started
        cri.rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=30)
        assert took < 2.0, f"CreateContainer took {took:.2f} s"
        # No adjustment: kubelet's values.
        assert runtime_spec(cri, cid)["linux"]["resources"]["cpu"]["shares"] == 1024
        late = kn.call(lambda: dict(kn.daemon.nri.stats.late_answers))
        assert late.get("CreateContainer") == 1
    finally:
        pods.cleanup()
        kn.stop()


def test_nri_mode_and_the_proxy_refuse_to_run_at_once(nri_bed, tmp_path):
    only_on_21(nri_bed)
    sockdir = short_socket_dir()
    proxy = KoordnodeProcess(tmp_path / "proxy", str(nri_bed.socket), sockdir=sockdir).start()
    try:
        nri = KoordnodeProcess(tmp_path / "nri", str(nri_bed.socket), nri_socket=str(nri_bed.nri_socket),
                               sockdir=sockdir)
        nri.admin = str(sockdir / "admin-nri.sock")
        text = nri.config_path.read_text().replace(str(sockdir / "admin.sock"), nri.admin)
        nri.config_path.write_text(text)
        with pytest.raises(RuntimeError, match="exited early with 1"):
            nri.start()
        log = nri.log_text()
        assert "another koordnode already runs on this node" in log
        assert f"pid {proxy.proc.pid}, proxy mode" in log
        assert "the CRI proxy and the NRI plugin cannot run at once" in log
    finally:
        proxy.stop()
    # The other way round, and with the proxy gone the NRI instance starts.
    nri_kn = KoordnodeProcess(tmp_path / "nri2", str(nri_bed.socket), nri_socket=str(nri_bed.nri_socket),
                              sockdir=sockdir).start()
    try:
        nri_kn.wait_synchronized()
        proxy2 = KoordnodeProcess(tmp_path / "proxy2", str(nri_bed.socket), sockdir=sockdir)
        proxy2.admin = str(sockdir / "admin-proxy.sock")
        proxy2.listen = str(sockdir / "koordnode-2.sock")
        proxy2.config_path.write_text(proxy2.config_path.read_text()
                                      .replace(str(sockdir / "admin.sock"), proxy2.admin)
                                      .replace(str(sockdir / "koordnode.sock"), proxy2.listen))
        with pytest.raises(RuntimeError, match="exited early with 1"):
            proxy2.start()
        assert f"pid {nri_kn.proc.pid}, nri mode on {nri_bed.nri_socket}" in proxy2.log_text()
    finally:
        nri_kn.stop()
