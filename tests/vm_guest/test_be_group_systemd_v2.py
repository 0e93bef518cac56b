"""The idle BE group with kubelet's systemd driver on cgroup v2 (VM lane guest; see tests/vm_guest).

kubelet's part is reproduced: its tier and pod slices through systemd's D-Bus API, its CRI
calls, its property writes (systemctl set-property CPUWeight=, what its cgroup manager does
through systemd), its restart (the tiers started again). The rest is real: systemd 257 as PID 1,
containerd with runc's systemd driver, cgroup v2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from guestlib import CG, GuestKoordnode, Pod, free_port, make_pod, set_hook_timeout, wait_for
from koordnode.config.strategies import CpuSuppressConfig
from koordnode.cri import api_pb2 as pb
from support.cri import Cri, container_config, remove_pod, run_pod, sandbox_config, start_container
from testbed.systemd_bed import (
    KUBEPODS_SLICE, enable_controllers, kubelet_pod_slice, kubelet_tiers, set_properties, slice_path,
    start_transient_slice,
)

GROUP_SLICE = "kubepods-koordnode_be.slice"
GROUP_DIR = CG / KUBEPODS_SLICE / GROUP_SLICE


@pytest.fixture(scope="module")
def be_group_koordnode(systemd_bed, tmp_path_factory):
    # The default config with the systemd driver: the idle BE group is on by default there.
    # cpu_suppress without its quiet state (BE always suppressed, the group always idle) but
    # in the last test, which turns it on; and without the start allowance, which lifts the
    # group out of idle while a BE pod starts (a cold CI run read cpu.idle 0 right after a start:
    # the allowance's own guest test is test_real_kubelet_api_v2.py's).
    port = free_port()
    kn = GuestKoordnode(tmp_path_factory.mktemp("kn-be-group"), str(systemd_bed.socket),
                        extra_toml='[cgroup]\ndriver = "systemd"\nreconcile_interval_s = 3.0\n'
                                   '[strategy.cpu_suppress]\nls_quiet_percent = 0\npod_start_cpu_percent = 0\n',
                        metrics_listen=f"127.0.0.1:{port}", kubepods="/" + KUBEPODS_SLICE)
    # The hooks' 200 ms bound is for real machines: under TCG (host load 10-25) a RunPodSandbox
    # pre took 287 ms and, fail-open as designed, the BE pod stayed in kubelet's slice (the
    # "first BE pod missed the group" failures of the lane). These tests are about the group.
    set_hook_timeout(kn)
    kn.metrics_port = port
    kn.start()
    yield kn
    kn.stop()


def cgroup_of(pid: int) -> str:
    return next(line.split("::", 1)[1] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if line.startswith("0::"))


def systemd_property(unit: str, name: str) -> str:
    out = subprocess.run(["systemctl", "show", "-p", name, "--value", unit], capture_output=True, text=True,
                         timeout=30, check=True)
    return out.stdout.strip()


def group_idle() -> bool:
    return (GROUP_DIR / "cpu.idle").is_file() and (GROUP_DIR / "cpu.idle").read_text().strip() == "1"


def be_pod(cri: Cri, bed, name: str, cmd: list[str] | None = None) -> tuple[str, str, str, str]:
    """kubelet's sequence for a BestEffort pod: its pod slice, RunPodSandbox, the container.
    Returns (sandbox id, container id, kubelet's parent, the container's cgroup)."""
    uid = str(uuid.uuid4())
    parent = bed.pod_cgroup_parent("besteffort", uid)
    kubelet_pod_slice(parent, 1)  # kubelet's pod slice, CPUWeight 1 (cpu.shares 2)
    sb = sandbox_config(bed, name, qos="besteffort", uid=uid)
    sid = run_pod(cri, sb)
    cid = start_container(cri, sid, sb, container_config(bed, "main", cmd or ["sleep", "3600"]))
    info = cri.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True)).info
    return sid, cid, parent, cgroup_of(json.loads(info["info"])["pid"])


@pytest.mark.containerd("1.7", "2.1")  # once per release (conftest.py)
def test_be_pod_runs_in_the_idle_slice_and_kubelets_property_writes_succeed(systemd_bed, be_group_koordnode):
    kn = be_group_koordnode
    # koordnode made the group slice idle through systemd at start, before any BE pod.
    wait_for(group_idle, 15, "the BE group slice idle (prepared at start)")
    assert systemd_property(GROUP_SLICE, "CPUWeight") == "idle"
    cri = Cri(kn.listen)
    created: list[str] = []
    try:
        sid, cid, parent, cgroup = be_pod(cri, systemd_bed, "batch")
        created.append(sid)
        moved = parent.replace("-besteffort-", "-koordnode_be-")
        assert cgroup == f"{slice_path(moved)}/cri-containerd-{cid}.scope"
        sandbox = cri.rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=sid, verbose=True)).info
        assert cgroup_of(json.loads(sandbox["info"])["pid"]).startswith(slice_path(moved) + "/")
        assert group_idle(), "systemd realized the group again for the pod's scope: still idle"
        # kubelet's writes through systemd: its tiers and its own (empty) pod slice succeed.
        set_properties("kubepods-besteffort.slice", {"CPUWeight": ("t", 1)})
        set_properties("kubepods-burstable.slice", {"CPUWeight": ("t", 78)})
        set_properties(parent, {"CPUWeight": ("t", 1)})
        for unit in ("kubepods-besteffort.slice", "kubepods-burstable.slice", parent):
            assert (CG / slice_path(unit).lstrip("/") / "cpu.idle").read_text().strip() == "0"
        assert (CG / slice_path(parent).lstrip("/") / "cgroup.procs").read_text() == ""
        # kubelet restarting: its cgroup manager starts (updates) kubepods and the tiers again.
        kubelet_tiers(2)
        assert group_idle()
        # systemd reloading re-applies every unit's properties: the group's own say it is idle.
        subprocess.run(["systemctl", "daemon-reload"], check=True, timeout=120)
        assert systemd_property(GROUP_SLICE, "CPUWeight") == "idle"
        wait_for(group_idle, 5, "the group idle after daemon-reload")
        status = kn.status()
        assert next(p for p in status["pods"] if p["sandbox_id"] == sid)["qos_class"] == "BE"
        wait_for(lambda: kn.status()["qos_manager"]["be_tier"] == f"/{KUBEPODS_SLICE}/{GROUP_SLICE}", 10,
                 "the BE quota's target: the group")
        # Nothing koordnode owns on the idle path was found changed by systemd (the group's own
        # property says idle; pod slices' cpu.idle, which systemd rewrites, is not koordnode's).
        wait_for(lambda: kn.metric("koordnode_cgroup_overwrites_total") >= 0, 5, "metrics")
        assert kn.metric("koordnode_cgroup_overwrites_total", resource="cpu.idle") == 0
        # koordnode restarting: the pod stays recorded in the group, new BE pods go there at once.
        kn.stop()
        kn.start()
        wait_for(lambda: kn.status().get("rebuilt_at"), 30, "state rebuilt after the restart")
        cri.close()
        cri = Cri(kn.listen)
        sid2, cid2, parent2, cgroup2 = be_pod(cri, systemd_bed, "batch2")
        created.append(sid2)
        moved2 = parent2.replace("-besteffort-", "-koordnode_be-")
        assert cgroup2 == f"{slice_path(moved2)}/cri-containerd-{cid2}.scope"
        assert group_idle()
        assert any(p["sandbox_id"] == sid for p in kn.status()["pods"])
        # Removed pods: their slices in the group are stopped (systemd would keep them).
        for sandbox_id, pod_parent in ((sid, moved), (sid2, moved2)):
            remove_pod(cri, sandbox_id)
            created.remove(sandbox_id)
            wait_for(lambda p=pod_parent: not (CG / slice_path(p).lstrip("/")).exists(), 15,
                     f"{pod_parent} stopped")
            assert systemd_property(pod_parent, "ActiveState") == "inactive"
        assert group_idle()
    finally:
        for sandbox_id in created:
            remove_pod(cri, sandbox_id)
        cri.close()


# ---- The QoS manager with the idle group: its threshold, the LS usage wake-up, restarts ------------
#
# One BE pod busy in the group and one LS pod (Burstable), both through koordnode, for the three
# tests below (in this order; the module's koordnode). An LS "step" is reproduced by moving busy
# processes into the LS container's cgroup, as bench/qos_reaction.py does on the host: the kernel
# accounts them to the LS pod and the burstable tier like the container's own.

GROUP_CGROUP = f"/{KUBEPODS_SLICE}/{GROUP_SLICE}"
BURSTABLE_DIR = CG / KUBEPODS_SLICE / "kubepods-burstable.slice"
QOS_LABEL = "koordinator.sh/qosClass"
BUSY_LOOP = ["sh", "-c", "while :; do :; done"]
MIN_QUOTA_US = CpuSuppressConfig().min_quota_us  # cpu_suppress's floor (default config)
THRESHOLD = CpuSuppressConfig().threshold_percent  # 65
IDLE_THRESHOLD = CpuSuppressConfig().idle_group_threshold_percent  # 95


@dataclass
class Interference:
    be_sandbox: str
    be_parent: str  # kubelet's parent (in the besteffort tier); the pod runs in the group
    be_cgroup: str  # the BE container's cgroup (in the group)
    ls: Pod


@pytest.fixture(scope="module")
def interference(systemd_bed, be_group_koordnode):
    cri = Cri(be_group_koordnode.listen)
    cri.created = []
    try:
        sid, _cid, parent, cgroup = be_pod(cri, systemd_bed, "busy-batch", cmd=BUSY_LOOP)
        cri.created.append(sid)
        assert cgroup.startswith(GROUP_CGROUP + "/"), cgroup
        ls = make_pod(cri, systemd_bed, "web", "burstable", labels={QOS_LABEL: "LS"},
                      resources={"cpu_shares": 1024}, kubelet_weight=39)
        yield Interference(sid, parent, cgroup, ls)
    finally:
        cri.close()
        cleanup = Cri(be_group_koordnode.listen)  # the koordnode may have been restarted since
        for sandbox_id in cri.created:
            try:
                remove_pod(cleanup, sandbox_id)
            except Exception:  # noqa: BLE001 - cleanup
                pass
        cleanup.close()


def group_quota() -> tuple[int | None, int]:
    """(quota us or None for "max", period us) of the group slice's cpu.max."""
    quota, period = (GROUP_DIR / "cpu.max").read_text().split()
    return (None if quota == "max" else int(quota)), int(period)


def manager_status(kn) -> dict:
    return kn.status().get("qos_manager") or {}


def suppress_decision(kn) -> dict:
    """cpu_suppress's last decision as `koordnode status` shows it (inputs, decision, reason, at)."""
    strategy = manager_status(kn).get("strategies", {}).get("cpu_suppress") or {}
    return strategy.get("decision") or {}


def wait_decision(kn, check, timeout_s: float, what: str, after: float = 0.0) -> dict:
    """A decision of a tick that began after `after` (wall clock) and passes `check`. Polled once
    a second: a status call costs the TCG guest real CPU, which the manager counts as system use."""
    def found() -> dict | None:
        decision = suppress_decision(kn)
        inputs = decision.get("inputs") or {}
        return decision if decision.get("at", 0) > after and "threshold_percent" in inputs and check(inputs) else None
    try:
        return wait_for(found, timeout_s, what, interval=1.0)
    except AssertionError as err:
        raise AssertionError(f"{err}; last decision: {suppress_decision(kn)}") from None


def idle_threshold(inputs: dict) -> bool:
    return (inputs.get("be_tier") == GROUP_CGROUP and inputs.get("be_idle") is True
            and inputs.get("threshold_percent") == IDLE_THRESHOLD)


def expected_quota_us(inputs: dict, threshold_percent: float) -> int:
    """cpu_suppress's quota for these inputs (docs/architecture.md: node CPUs x threshold - LS - max(system,
    reserved), x the pressure ratio, floor min_quota_us), computed here independently."""
    budget = (inputs["node_cpus"] * threshold_percent / 100 - inputs["ls_used_cpus"]
              - max(inputs["system_used_cpus"], inputs["reserved_cpus"]))
    return max(MIN_QUOTA_US, round(max(0.0, budget) * inputs["pressure_ratio"] * inputs["period_us"]))


def written_quota(decision: dict) -> int | None:
    """The quota a decision left on the group: "quota A -> B" or "keep quota A"."""
    words = decision.get("decision", "").split()
    return int(words[-1]) if words and words[-1].lstrip("-").isdigit() else None


def wait_quota_at_idle_threshold(kn, timeout_s: float, what: str, after: float = 0.0) -> tuple[dict, int]:
    """A decision at the idle group threshold whose quota is the one the group's cpu.max holds and
    the one the threshold gives for the decision's inputs (not a step of the limited growth)."""
    seen: dict = {}

    def settled(inputs: dict) -> bool:
        decision = suppress_decision(kn)
        quota, _ = group_quota()
        seen.update(decision=decision, quota=quota)
        if decision.get("inputs") != inputs or written_quota(decision) != quota or quota is None:
            return False
        return abs(quota - expected_quota_us(inputs, IDLE_THRESHOLD)) <= 0.015 * quota
    try:
        decision = wait_decision(kn, lambda i: idle_threshold(i) and settled(i), timeout_s, what, after)
    except AssertionError as err:
        raise AssertionError(f"{err}; last seen: {seen}") from None
    return decision, seen["quota"]


def kubelet_restart(interference: Interference) -> None:
    """What kubelet does to its cgroups when it starts (systemd driver): its tiers started (updated)
    again with their weights, its QoS manager's tier writes, and each pod's slice (the BE pod's,
    left empty in the besteffort tier by the move) updated through systemd."""
    ncpu = os.cpu_count() or 1
    kubelet_tiers(ncpu)
    set_properties("kubepods-besteffort.slice", {"CPUWeight": ("t", 1)})
    set_properties("kubepods-burstable.slice", {"CPUWeight": ("t", 39 * ncpu)})
    set_properties(interference.be_parent, {"CPUWeight": ("t", 1)})
    set_properties(interference.ls.parent, {"CPUWeight": ("t", 39)})


@pytest.mark.containerd("1.7", "2.1")
def test_the_idle_group_gets_the_idle_threshold_and_an_ls_step_wakes_the_manager(
        systemd_bed, be_group_koordnode, interference):
    """[strategy.cpu_suppress] idle_group_threshold_percent on the real group slice, and the LS
    usage watch (perf cgroup events on cgroup2) waking the manager on an LS step."""
    kn = be_group_koordnode
    ncpu = os.cpu_count() or 1
    wait_for(group_idle, 15, "the BE group slice idle")
    # The usage watch: perf events on the burstable tier's cgroup2 directory, armed.
    usage = wait_for(lambda: (lambda u: u if u.get("armed") else None)(manager_status(kn).get("usage_watch") or {}),
                     30, "the LS usage watch armed", interval=1.0)
    assert usage["mode"] == "perf-events", usage
    assert str(BURSTABLE_DIR) in usage["targets"].values(), usage
    # LS idle: the group's quota is idle_group_threshold_percent of the node minus what LS and
    # the system use (or reserve). Under TCG the system's use (koordnode, containerd, this test)
    # is large and moves, so the quota is checked against the decision's own inputs.
    decision, quota = wait_quota_at_idle_threshold(kn, 90, "the group's quota at the idle group threshold")
    print(f"LS idle: group cpu.max {quota}; {decision['decision']}: {decision['reason']}")
    assert 0 < kn.metric("koordnode_be_cpu_quota_cores") <= IDLE_THRESHOLD / 100 * ncpu
    status = manager_status(kn)
    assert status["be_tier"] == GROUP_CGROUP
    wakeups, usage_ticks = status["usage_watch"]["wakeups"], status["ticks"]["woken_by_usage"]
    skipped = status["ticks"]["pressure_wakes_skipped"]  # every skipped wake, usage ones included
    # The LS step: ncpu + 1 busy loops in the LS container's cgroup.
    hogs = [subprocess.Popen(BUSY_LOOP) for _ in range(ncpu + 1)]
    try:
        for hog in hogs:
            (interference.ls.container_dir / "cgroup.procs").write_text(str(hog.pid))
        wait_for(lambda: group_quota()[0] == MIN_QUOTA_US, 30, "the group's quota at its floor after the LS step",
                 interval=0.5)
        status = manager_status(kn)
        print(f"after the LS step: usage watch {status['usage_watch']}; ticks {status['ticks']}")
        assert status["usage_watch"]["wakeups"] > wakeups, status["usage_watch"]
        # The wakes reached the tick thread: a tick they woke, or (under TCG a regular tick can
        # react to the step first) wakes skipped because BE was already at its floor. Not when
        # the guest's own system use had the quota at its floor before the step (a loaded CI
        # host: system 1.64 of 2 vCPUs seen): then a wake that lands during a running tick
        # leaves nothing to do and neither count moves.
        if quota != MIN_QUOTA_US:
            assert (status["ticks"]["woken_by_usage"] > usage_ticks
                    or status["ticks"]["pressure_wakes_skipped"] > skipped), status["ticks"]
        decision = suppress_decision(kn)
        assert idle_threshold(decision["inputs"]), decision
        # ncpu + 1 loops, but under TCG the guest's own system use (koordnode, containerd, this
        # test) takes a share of the 2 vCPUs that moves with the host's load (0.85 CPUs for LS seen).
        assert decision["inputs"]["ls_used_cpus"] > 0.5, decision
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(timeout=30)


@pytest.mark.containerd("1.7", "2.1")
def test_a_group_made_non_idle_through_systemd_gets_threshold_percent(systemd_bed, be_group_koordnode, interference):
    """An operator's `systemctl set-property kubepods-koordnode_be.slice CPUWeight=100`: the group
    reads cpu.idle 0, and BE is held to threshold_percent again. koordnode makes the group idle
    again at its next reconcile pass (BE pods must stay where BE yields in the kernel), so the
    pass is paused by a config reload while the non-idle group is looked at."""
    kn = be_group_koordnode
    ncpu = os.cpu_count() or 1
    original = kn.config_path.read_text()
    assert "reconcile_interval_s = 3.0" in original
    reload_config(kn, original.replace("reconcile_interval_s = 3.0", "reconcile_interval_s = 0"))
    sets = 0

    def make_non_idle() -> None:
        nonlocal sets
        set_properties(GROUP_SLICE, {"CPUWeight": ("t", 100)})
        sets += 1

    def non_idle_threshold(inputs: dict) -> bool:
        # The reload's own reconcile pass may still be running (it waits for a pass in progress):
        # a group it made idle again gets CPUWeight=100 again. With the passes paused, no more.
        if group_idle():
            assert sets < 3, f"the group made idle again {sets} times with the reconcile pass off"
            make_non_idle()
            return False
        return inputs["be_tier"] == GROUP_CGROUP and inputs["be_idle"] is False and inputs["threshold_percent"] == THRESHOLD

    try:
        make_non_idle()
        changed = time.time()
        try:
            decision = wait_decision(kn, non_idle_threshold, 30, "a decision at threshold_percent", after=changed)
        except AssertionError as err:
            lines = [line for line in kn.log_text().splitlines()[-400:]
                     if "be_group" in line or "reload" in line or "reconcile" in line]
            raise AssertionError(f"{err}\nkoordnode log:\n" + "\n".join(lines[-20:])) from None
        print(f"group not idle: {decision['decision']}: {decision['reason']}")
        _, period = group_quota()
        wait_for(lambda: (group_quota()[0] or 1 << 62) <= THRESHOLD / 100 * ncpu * period, 15,
                 f"the group's quota within {THRESHOLD}% of the node")
        assert manager_status(kn)["be_tier"] == GROUP_CGROUP
    finally:
        reload_config(kn, original)  # the reload runs a reconcile pass at once
    # Through systemd (its property, which it re-applies), not only by the pass's cpu.idle write.
    wait_for(lambda: group_idle() and systemd_property(GROUP_SLICE, "CPUWeight") == "idle", 30,
             "the group made idle again through systemd by koordnode's reconcile pass", interval=1.0)
    wait_decision(kn, idle_threshold, 30, "the idle group threshold back", after=time.time())


def reload_config(kn, text: str) -> None:
    """Rewrite koordnode's config file and SIGHUP it; wait until the reload is applied."""
    before = kn.status()["config"]["last_reload"].get("at", 0)
    kn.config_path.write_text(text)
    kn.proc.send_signal(signal.SIGHUP)
    result = wait_for(lambda: (lambda r: r if r.get("at", 0) > before else None)(kn.status()["config"]["last_reload"]),
                      30, "the config reloaded", interval=0.5)
    assert result["result"] == "applied", result


def test_restarts_in_any_order_keep_the_group_idle_and_the_idle_threshold(
        systemd_bed, be_group_koordnode, interference):
    """kubelet (its writes, as it makes them when it starts) and koordnode restarting while the
    pods run, in each order: the group slice stays idle, BE stays in it, the manager keeps the
    idle group threshold and its usage watch."""
    kn = be_group_koordnode
    be_pid = int((CG / interference.be_cgroup.lstrip("/") / "cgroup.procs").read_text().split()[0])
    # kubelet restarts while koordnode runs.
    restarted = time.time()
    kubelet_restart(interference)
    assert group_idle()
    wait_decision(kn, idle_threshold, 30, "the idle group threshold after kubelet's restart", after=restarted)
    # koordnode stops; kubelet restarts while it is away; koordnode starts again.
    kn.stop()
    assert group_idle(), "koordnode's stop leaves the group idle"
    kubelet_restart(interference)
    assert group_idle() and systemd_property(GROUP_SLICE, "CPUWeight") == "idle"
    assert cgroup_of(be_pid) == interference.be_cgroup, "the BE pod still runs in the group"
    kn.start()
    started = time.time()
    wait_for(lambda: kn.status().get("rebuilt_at"), 30, "state rebuilt after the restart")
    # The classes are recorded by the adoption pass that follows the rebuild.
    wanted = {interference.be_sandbox: "BE", interference.ls.sandbox_id: "LS"}
    wait_for(lambda: {p["sandbox_id"]: p["qos_class"] for p in kn.status()["pods"]
                      if p["sandbox_id"] in wanted} == wanted, 30, "the pods' classes after the restart", interval=1.0)
    wait_decision(kn, idle_threshold, 30, "the idle group threshold after koordnode's restart", after=started)
    decision, quota = wait_quota_at_idle_threshold(kn, 90, "the group's quota at the idle threshold again",
                                                   after=started)
    print(f"after koordnode's restart: group cpu.max {quota}; {decision['reason']}")
    usage = wait_for(lambda: (lambda u: u if u.get("armed") else None)(manager_status(kn).get("usage_watch") or {}),
                     30, "the LS usage watch armed again", interval=1.0)
    assert usage["mode"] == "perf-events", usage
    # kubelet restarts after koordnode did.
    restarted = time.time()
    kubelet_restart(interference)
    assert group_idle()
    wait_decision(kn, idle_threshold, 30, "the idle group threshold after kubelet's second restart", after=restarted)
    assert cgroup_of(be_pid) == interference.be_cgroup


def group_state() -> tuple[str, str, str]:
    """The group slice's (cpu.max quota, cpu.idle, cpu.weight)."""
    return ((GROUP_DIR / "cpu.max").read_text().split()[0], (GROUP_DIR / "cpu.idle").read_text().strip(),
            (GROUP_DIR / "cpu.weight").read_text().strip())


QUIET = ("max", "0", "1")


@pytest.mark.containerd("1.7", "2.1")
def test_while_ls_is_quiet_the_group_slice_runs_unthrottled_at_the_lowest_weight(
        systemd_bed, be_group_koordnode, interference):
    """[strategy.cpu_suppress] ls_quiet_percent (the default, 25%) on the real group slice: with LS
    quiet the group reads cpu.max "max", cpu.idle 0, cpu.weight 1, written to the files (systemd's
    property stays CPUWeight=idle, what the slice falls back to without koordnode); systemd
    realizing the slice again (a new BE pod's scope, daemon-reload) makes it idle until the
    manager's next tick; kubelet's property writes succeed; an LS step makes it idle at the
    quota's floor."""
    kn = be_group_koordnode
    original = kn.config_path.read_text()
    assert "ls_quiet_percent = 0" in original
    reload_config(kn, original.replace("ls_quiet_percent = 0", "ls_quiet_percent = 25"))
    cri = Cri(kn.listen)
    created: list[str] = []
    hogs: list[subprocess.Popen] = []
    try:
        # From the suppressed state the quota first grows back to its target (10% of the node
        # per tick), then the quiet state lifts it.
        wait_for(lambda: group_state() == QUIET, 90, "the group quiet: unthrottled, not idle, lowest weight",
                 interval=1.0)
        assert suppress_decision(kn)["inputs"]["ls_quiet"] is True
        assert systemd_property(GROUP_SLICE, "CPUWeight") == "idle"
        # A new BE pod: its scope makes systemd realize the group again; the pod still goes in.
        sid, cid, parent, cgroup = be_pod(cri, systemd_bed, "quiet-batch")
        created.append(sid)
        assert cgroup.startswith(GROUP_CGROUP + "/"), cgroup
        wait_for(lambda: group_state() == QUIET, 15, "the group quiet again after the new pod", interval=0.5)
        # kubelet's writes through systemd still succeed, the group stays koordnode's.
        set_properties("kubepods-besteffort.slice", {"CPUWeight": ("t", 1)})
        set_properties("kubepods-burstable.slice", {"CPUWeight": ("t", 78)})
        set_properties(parent, {"CPUWeight": ("t", 1)})
        subprocess.run(["systemctl", "daemon-reload"], check=True, timeout=120)
        wait_for(lambda: group_state() == QUIET, 15, "the group quiet again after daemon-reload", interval=0.5)
        # The LS step: the group idle at the quota's floor in the tick that sees it.
        ncpu = os.cpu_count() or 1
        hogs = [subprocess.Popen(BUSY_LOOP) for _ in range(ncpu + 1)]
        for hog in hogs:
            (interference.ls.container_dir / "cgroup.procs").write_text(str(hog.pid))
        wait_for(lambda: group_state()[:2] == (str(MIN_QUOTA_US), "1"), 30,
                 "the group idle at the quota's floor after the LS step", interval=0.5)
        decision = suppress_decision(kn)
        assert decision["inputs"]["ls_quiet"] is False, decision
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(timeout=30)
        if hogs:
            # The new pod shares the group with the busy BE pod: at the quota's floor (2 ms per
            # 100 ms) under TCG its sandbox did not die within containerd's 60 s (StopPodSandbox:
            # "failed to kill sandbox container: context deadline exceeded"). LS is quiet again:
            # the manager lifts the quota within a few ticks.
            try:
                wait_for(lambda: group_state()[0] != str(MIN_QUOTA_US), 60, "the group off the quota's floor",
                         interval=1.0)
            except AssertionError:
                pass  # the removal below says what is wrong
        for sandbox_id in created:
            remove_pod(cri, sandbox_id)
        cri.close()
        reload_config(kn, original)


def test_systemd_keeps_cpuset_for_an_empty_slice_only_with_allowed_memory_nodes():
    """Why the real kubelet killed BE pods moved into the group (tests/vm_guest/test_real_kubelet_v2.py),
    and koordnode's remedy, on systemd alone. kubelet makes a pod slice the way it is done here
    (a transient unit with its properties through D-Bus, then every controller enabled from the
    root down to the slice's parent); systemd drops a controller from the parent's
    cgroup.subtree_control when it realizes the parent again and no unit below needs it, and an
    empty slice with kubelet's properties (CPUWeight, the accounting flags) needs no cpuset. With
    AllowedMemoryNodes (executor.systemd, what koordnode gives kubelet's empty pod slice) it
    needs cpuset: systemd enables it again at once and keeps it."""
    from koordnode.executor.systemd import set_allowed_memory_nodes

    tier, pod = "kntier.slice", "kntier-pod1.slice"
    pod_dir = CG / slice_path(pod).lstrip("/")

    def controllers() -> set[str]:
        return set((pod_dir / "cgroup.controllers").read_text().split())

    try:
        start_transient_slice(tier, {"CPUWeight": ("t", 100)})
        start_transient_slice(pod, {"CPUWeight": ("t", 1)})
        enable_controllers(slice_path(pod))
        assert {"cpuset", "cpu", "memory", "pids"} <= controllers()
        set_properties(tier, {"CPUWeight": ("t", 90)})  # systemd realizes the tier again
        assert "cpuset" not in controllers(), "systemd kept cpuset for a slice that does not need it"
        assert {"cpu", "memory", "pids"} <= controllers()
        nodes = (CG / "cpuset.mems.effective").read_text().strip()
        assert set_allowed_memory_nodes(pod, nodes) is None
        assert "cpuset" in controllers() and (pod_dir / "cpuset.mems").read_text().strip() == nodes
        set_properties(tier, {"CPUWeight": ("t", 80)})
        assert "cpuset" in controllers(), "systemd dropped cpuset although the slice has AllowedMemoryNodes"
        assert set_allowed_memory_nodes(pod, "0; rm -rf /") is not None  # refused before systemctl runs
    finally:
        subprocess.run(["systemctl", "stop", tier], capture_output=True, timeout=60)
