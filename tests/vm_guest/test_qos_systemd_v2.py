"""koordnode on cgroup v2 with kubelet's systemd driver, containerd 1.7 and 2.1, for real (VM lane guest).

Tests marked ``containerd("1.7", "2.1")`` run on both releases (tests/vm_guest/conftest.py:
one bed and one koordnode per release, the releases one after the other); the others on 1.7.

No kubelet binary exists here: kubelet's part is reproduced by what it writes and calls —
its QoS tier slices and each pod's slice created through systemd's D-Bus API
(testbed.systemd_bed), its CRI calls through koordnode, its cgroup writes (tiers every
minute, pod slices at creation and in-place resize, Memory QoS's memory.min/low).
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from guestlib import CG, RECONCILE_S, Pod, disk_dev, make_pod, reload_config, wait_for
from koordnode.cri import api_pb2 as pb
from koordnode.executor.process import oom_score_adj_floor
from koordnode.model.kernel import shares_to_weight
from support.cri import Cri, remove_pod
from support.koordinator_formulas import koordinator_memory_high
from testbed.systemd_bed import set_properties

MIB = 1 << 20
PAGE = 4096
BE_TIER = CG / "kubepods.slice" / "kubepods-besteffort.slice"
BURSTABLE_TIER = CG / "kubepods.slice" / "kubepods-burstable.slice"
KUBEPODS = CG / "kubepods.slice"
QOS_LABEL = "koordinator.sh/qosClass"


@pytest.fixture
def cri(guest_koordnode):
    client = Cri(guest_koordnode.listen)
    created: list[str] = []
    client.created = created
    yield client
    for sandbox_id in created:
        try:
            remove_pod(client, sandbox_id)
        except Exception:  # noqa: BLE001 - cleanup of a failed test
            pass
    client.close()


def pod_status(kn, sandbox_id: str) -> dict:
    return next(p for p in kn.status()["pods"] if p["sandbox_id"] == sandbox_id)


def near(value: str, expected: int) -> bool:
    """The kernel keeps memory.min/low/high in whole pages."""
    return abs(int(value) - expected) < PAGE


def be_throttle(pod: Pod) -> str:
    """The pod's io.max line of the scratch disk (BE's throttles, written by koordnode); "" if none."""
    return next((line for line in (pod.pod_dir / "io.max").read_text().splitlines()
                 if line.startswith(disk_dev() + " ")), "")


def pod_value(pod: Pod, name: str, check, what: str) -> str:
    """A pod-slice value koordnode owns. systemd re-applies the slice's own properties (IOWeight,
    MemoryMin, ... defaults) whenever it realizes the slice again, e.g. when runc starts a scope in
    it: koordnode restores its value within a reconcile period (and counts the overwrite)."""
    return wait_for(lambda: (lambda v: v if check(v) else None)(pod.read(name, "pod")), RECONCILE_S * 2 + 5, what)


@pytest.mark.containerd("1.7", "2.1")
def test_containers_land_in_kubelets_systemd_slices_and_scopes(systemd_bed, guest_koordnode, cri,
                                                              containerd_release):
    assert systemd_bed.version().runtime_version.startswith(containerd_release + ".")
    if containerd_release == "2.1":
        assert "version = 3" in systemd_bed.config_path.read_text()  # 2.x's config schema
    pod = make_pod(cri, systemd_bed, "layout", "burstable", labels={QOS_LABEL: "LS"},
                   resources={"cpu_shares": 1024}, kubelet_weight=39)
    assert pod.parent.startswith("kubepods-burstable-pod") and pod.parent.endswith(".slice")
    assert pod.container_dir.name == f"cri-containerd-{pod.container_id}.scope"
    assert pod.container_dir.is_dir(), f"missing {pod.container_dir}"
    assert str(pod.pid()) in (pod.container_dir / "cgroup.procs").read_text()
    assert pod_status(guest_koordnode, pod.sandbox_id)["qos_class"] == "LS"


@pytest.mark.containerd("1.7", "2.1")
def test_ls_and_be_values_in_the_v2_files(systemd_bed, guest_koordnode, cri):
    request, limit = 128 * MIB, 256 * MIB
    # kubelet Memory QoS (TieredReservation): a Burstable pod's request arrives as unified memory.low.
    ls = make_pod(cri, systemd_bed, "web", "burstable", labels={QOS_LABEL: "LS"}, kubelet_weight=39,
                  resources={"cpu_shares": 1024, "memory_limit_in_bytes": limit,
                             "unified": {"memory.low": str(request)}})
    be = make_pod(cri, systemd_bed, "batch", "besteffort", resources={"cpu_shares": 2})

    def settled() -> bool:
        return ls.read("memory.min") != "0" and be_throttle(be) != ""

    wait_for(settled, 15, "koordnode's writes after StartContainer")
    # LS: 1024 shares per requested CPU -> cpu.weight; memory.min/low = 50 % / 80 % of the request.
    assert ls.read("cpu.weight") == str(shares_to_weight(1024))
    assert near(ls.read("memory.min"), request * 50 // 100)
    assert near(ls.read("memory.low"), request * 80 // 100)
    assert near(ls.read("memory.high"), koordinator_memory_high(request, limit, 90))
    pod_value(ls, "memory.min", lambda v: near(v, request * 50 // 100), "pod memory.min = sum of its containers")
    assert ls.read("cpu.idle", "pod") == "0"
    pod_value(ls, "io.weight", lambda v: v.split()[:2] == ["default", "500"], "LS pod io.weight 500")
    # BE: pod not idle ([qos.BE] cpu_idle = 0), minimum weight on pod and container,
    # oom_score_adj 1000, the BE disk throttles on the real disk.
    assert be.read("cpu.idle", "pod") == "0"
    assert be.read("cpu.weight", "pod") == str(shares_to_weight(2))
    assert be.read("cpu.weight") == str(shares_to_weight(2))
    assert Path(f"/proc/{be.pid()}/oom_score_adj").read_text().strip() == "1000"
    pod_value(be, "io.weight", lambda v: v.split()[:2] == ["default", "100"], "BE pod io.weight 100")
    io_max = wait_for(lambda: be_throttle(be), 10, "io.max line of vdb")
    assert "rbps=524288000" in io_max and "wbps=209715200" in io_max, io_max
    # Same pool for both while no LSE/LSR pod holds CPUs.
    assert ls.read("cpuset.cpus") == be.read("cpuset.cpus")


def test_class_falls_back_to_the_slice_name_without_a_label(systemd_bed, guest_koordnode, cri):
    expected = {"besteffort": "BE", "burstable": "LS", "guaranteed": "LSR"}
    pods = {qos: make_pod(cri, systemd_bed, f"nolabel-{qos}", qos,
                          resources={"cpu_shares": 2 if qos == "besteffort" else 512,
                                     **({"cpu_quota": 50000, "cpu_period": 100000,
                                         "memory_limit_in_bytes": 64 * MIB} if qos == "guaranteed" else {})})
            for qos in expected}
    for qos, pod in pods.items():
        status = pod_status(guest_koordnode, pod.sandbox_id)
        assert status["qos_class"] == expected[qos], status
        assert pod.parent in status["qos_reason"] or "tier" in status["qos_reason"], status["qos_reason"]
    wait_for(lambda: be_throttle(pods["besteffort"]), 10, "BE pod's disk throttle")  # BE's pod values
    assert pods["besteffort"].read("cpu.idle", "pod") == "0"  # [qos.BE] cpu_idle = 0
    wait_for(lambda: pods["guaranteed"].read("cpu.weight") == str(shares_to_weight(512 * 65536 // 1024)), 30,
             "LSR class weight from the slice name")


@pytest.mark.containerd("1.7", "2.1")
def test_lse_gets_an_exclusive_cpu_and_the_pools_shrink_and_come_back(systemd_bed, guest_koordnode, cri):
    ncpu = os.cpu_count() or 1
    if ncpu < 2:
        pytest.fail("the VM needs 2 CPUs for an exclusive core plus a share pool")
    ls = make_pod(cri, systemd_bed, "pool-ls", "burstable", labels={QOS_LABEL: "LS"},
                  resources={"cpu_shares": 512})
    be = make_pod(cri, systemd_bed, "pool-be", "besteffort")
    everything = f"0-{ncpu - 1}"
    wait_for(lambda: ls.read("cpuset.cpus") == everything, 10, "LS on all CPUs")
    lse = make_pod(cri, systemd_bed, "exclusive", "guaranteed", labels={QOS_LABEL: "LSE"},
                   resources={"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000,
                              "memory_limit_in_bytes": 64 * MIB})
    # Read once it is there: a CI run read "" once right after the container started (1.7).
    mine = wait_for(lambda: lse.read("cpuset.cpus"), 10, "the LSE container's cpuset")
    assert "," not in mine and "-" not in mine, f"one exclusive CPU, got {mine!r}"
    # the class weight goes to the file after StartContainer (containerd's spec keeps kubelet's shares)
    wait_for(lambda: lse.read("cpu.weight") == str(shares_to_weight(262144)), 30, "LSE class weight")
    rest = wait_for(lambda: ls.read("cpuset.cpus") if mine not in ls.read("cpuset.cpus").split(",") and
                    ls.read("cpuset.cpus") != everything else "", 10, "LS moved off the LSE CPU")
    assert be.read("cpuset.cpus") == rest, "BE follows the pool"
    allocations = guest_koordnode.status()["qos"]["cpus"]["allocations"]
    assert any(a["class"] == "LSE" and a["cpus"] == [int(mine)] for a in allocations.values()), allocations
    remove_pod(cri, lse.sandbox_id)
    cri.created.remove(lse.sandbox_id)
    wait_for(lambda: ls.read("cpuset.cpus") == everything, 10, "LS back on all CPUs")
    wait_for(lambda: be.read("cpuset.cpus") == everything, 10, "BE back on all CPUs")


@pytest.mark.containerd("1.7", "2.1")
def test_lsr_memory_protection_from_the_guaranteed_limit(systemd_bed, guest_koordnode, cri):
    limit = 96 * MIB
    lsr = make_pod(cri, systemd_bed, "reserved", "guaranteed", labels={QOS_LABEL: "LSR"},
                   resources={"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000,
                              "memory_limit_in_bytes": limit, "unified": {"memory.min": str(limit)}})
    # runc writes kubelet's unified memory.min (the limit) at creation; koordnode's 80 % follows.
    wait_for(lambda: near(lsr.read("memory.min"), limit * 80 // 100), 10, "LSR memory.min = 80 % of the limit")
    assert near(lsr.read("memory.low"), limit)
    # the class weight goes to the file after StartContainer (containerd's spec keeps kubelet's shares)
    wait_for(lambda: lsr.read("cpu.weight") == str(shares_to_weight(65536)), 30, "LSR class weight")
    assert lsr.read("cpu.max") == "100000 100000"
    pod_value(lsr, "memory.min", lambda v: near(v, limit * 80 // 100), "LSR pod memory.min")


def test_system_class_values_in_the_v2_files(systemd_bed, guest_koordnode, cri):
    """SYSTEM (by label): 32768 shares per requested CPU, kubelet's quota and limit kept, no memory
    protection or io weight of its own, oom_score_adj -1000, the share pool (no [node] system_cpus)."""
    ls = make_pod(cri, systemd_bed, "system-peer", "burstable", labels={QOS_LABEL: "LS"},
                  resources={"cpu_shares": 512})
    system = make_pod(cri, systemd_bed, "system", "guaranteed", labels={QOS_LABEL: "SYSTEM"},
                      resources={"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000,
                                 "memory_limit_in_bytes": 64 * MIB})
    status = pod_status(guest_koordnode, system.sandbox_id)
    assert status["qos_class"] == "SYSTEM", status
    assert status["containers"][0]["resources"]["oom_score_adj"] == -1000
    wait_for(lambda: system.read("cpu.weight") == str(shares_to_weight(32768)), 30, "SYSTEM class weight")
    assert system.read("cpu.max") == "100000 100000"
    assert system.read("memory.max") == str(64 * MIB)
    for name in ("memory.min", "memory.low"):
        assert system.read(name) == "0", name
    assert system.read("memory.high") == "max"
    assert system.read("cpu.idle", "pod") == "0"
    assert system.read("io.weight", "pod").split()[:2] == ["default", "100"], "systemd's default, not a class weight"
    wait_for(lambda: system.read("cpuset.cpus") == ls.read("cpuset.cpus"), 10, "SYSTEM in the LS share pool")
    # containerd's restrict_oom_score_adj keeps a container at or above containerd's own score;
    # koordnode then gives its processes the class value where it may lower it (as root here:
    # CAP_SYS_RESOURCE), at the container's start and at every reconcile pass.
    own = int(Path(f"/proc/{systemd_bed._process.pid}/oom_score_adj").read_text())
    expected = -1000 if oom_score_adj_floor() is None else max(-1000, own)
    wait_for(lambda: int(Path(f"/proc/{system.pid()}/oom_score_adj").read_text()) == expected, RECONCILE_S + 5,
             "SYSTEM's oom_score_adj")


@pytest.mark.containerd("1.7", "2.1")
def test_be_tier_cpu_max_is_suppressed(systemd_bed, guest_koordnode, cri):
    # The tier's quota as systemd has it ("max"): a quota seen below is this koordnode's, not one
    # left by the previous release's koordnode (nothing resets the tier when koordnode stops).
    set_properties("kubepods-besteffort.slice", {"CPUQuota": ("s", "")})
    make_pod(cri, systemd_bed, "suppress-be", "besteffort", cmd=["sh", "-c", "while :; do :; done"])
    quota = wait_for(lambda: (lambda q: q if q[0] != "max" else None)((BE_TIER / "cpu.max").read_text().split()),
                     20, "a quota on the BE tier's cpu.max")
    ncpu = os.cpu_count() or 1
    assert 2000 <= int(quota[0]) <= ncpu * int(quota[1]), quota
    # The gauge follows the tick's writes (its on_tick): a read right after the file changed can
    # still see the tick before (-1, unlimited), as one lane run did under TCG.
    wait_for(lambda: guest_koordnode.metric("koordnode_be_cpu_quota_cores") > 0, 10, "the BE quota gauge")


def _overwrites(kn) -> float:
    return kn.metric("koordnode_cgroup_overwrites_total")


def test_systemd_set_property_overwrite_is_restored_and_counted(systemd_bed, guest_koordnode, cri):
    make_pod(cri, systemd_bed, "overwrite-be", "besteffort")
    owned = wait_for(lambda: (BE_TIER / "cpu.max").read_text().split()[0] != "max" and
                     (BE_TIER / "cpu.max").read_text().strip(), 20, "koordnode's BE tier quota")
    before = _overwrites(guest_koordnode)
    # An operator (or a config tool) resets the tier through systemd: CPUQuota= means "max".
    set_properties("kubepods-besteffort.slice", {"CPUQuota": ("s", "")})
    set_properties("kubepods-besteffort.slice", {"CPUWeight": ("t", 1)})
    restored = wait_for(lambda: (BE_TIER / "cpu.max").read_text().split()[0] != "max", RECONCILE_S + 5,
                        "the BE tier quota restored")
    assert restored
    wait_for(lambda: _overwrites(guest_koordnode) > before, RECONCILE_S + 5, "the overwrite counted")
    status = guest_koordnode.status()["qos"]["overwrites"]
    assert sum(status["counts"].values()) >= 1, status
    print(f"BE tier cpu.max owned {owned!r}; overwrites {status}")

    # systemctl daemon-reload re-applies every unit's properties.
    subprocess.run(["systemctl", "daemon-reload"], check=True, timeout=120)
    wait_for(lambda: (BE_TIER / "cpu.max").read_text().split()[0] != "max", RECONCILE_S + 5,
             "the BE tier quota after daemon-reload")


def test_kubelet_like_writes_are_restored_and_counted(systemd_bed, guest_koordnode, cri):
    request = 64 * MIB
    ls = make_pod(cri, systemd_bed, "kubelet-writes", "burstable", labels={QOS_LABEL: "LS"}, kubelet_weight=39,
                  resources={"cpu_shares": 1024, "memory_limit_in_bytes": 2 * request,
                             "unified": {"memory.low": str(request)}})
    wait_for(lambda: ls.read("memory.min", "pod") != "0", 10, "koordnode's pod memory.min")
    ours_min, ours_weight = ls.read("memory.min", "pod"), ls.read("cpu.weight")
    before = _overwrites(guest_koordnode)
    # kubelet's Memory QoS writes the request as the pod's memory.min; runc-like write of the weight.
    (ls.pod_dir / "memory.min").write_text(str(request))
    (ls.container_dir / "cpu.weight").write_text("100")
    wait_for(lambda: ls.read("memory.min", "pod") == ours_min and ls.read("cpu.weight") == ours_weight,
             RECONCILE_S * 2 + 5, "koordnode's values back within a reconcile period")
    wait_for(lambda: _overwrites(guest_koordnode) >= before + 2, 5, "both overwrites counted")
    body = guest_koordnode.metrics()
    assert 'koordnode_cgroup_overwrites_total{resource="memory.min"}' in body


@pytest.fixture
def idle_be_pods(guest_koordnode):
    """[qos.BE] cpu_idle = 1 (not the default) for one test: reloaded in, and out again after."""
    original = guest_koordnode.config_path.read_text()
    reload_config(guest_koordnode, original + "[qos.BE]\ncpu_idle = 1\n")
    try:
        yield guest_koordnode
    finally:
        reload_config(guest_koordnode, original)


def test_kubelets_writes_still_succeed_after_koordnodes(systemd_bed, guest_koordnode, idle_be_pods, cri):
    """Koordinator #2732: an idle cgroup refuses cpu.weight; kubelet's tier and pod writes must not
    (with an idle BE pod, `[qos.BE] cpu_idle = 1`)."""
    be = make_pod(cri, systemd_bed, "idle-safety-be", "besteffort")
    ls = make_pod(cri, systemd_bed, "idle-safety-ls", "burstable", labels={QOS_LABEL: "LS"}, kubelet_weight=39,
                  resources={"cpu_shares": 1024, "memory_limit_in_bytes": 128 * MIB})
    wait_for(lambda: be.read("cpu.idle", "pod") == "1", 10, "BE pod idle")
    failures = []

    def kubelet_write(path: Path, value: str) -> None:
        try:
            path.write_text(value)
        except OSError as err:
            failures.append(f"{path} <- {value!r}: {err}")

    # kubelet's QoS manager at start and every minute: tier weights and memory.
    for tier, weight in ((KUBEPODS, "100"), (BURSTABLE_TIER, "39"), (BE_TIER, "1")):
        kubelet_write(tier / "cpu.weight", weight)
        kubelet_write(tier / "memory.min", "0")
        kubelet_write(tier / "memory.low", "0")
    kubelet_write(KUBEPODS / "memory.max", str(1024 * MIB))
    kubelet_write(KUBEPODS / "cpu.max", "max 100000")
    # The same through systemd, as the systemd driver does.
    for unit, weight in (("kubepods.slice", 100), ("kubepods-burstable.slice", 39), ("kubepods-besteffort.slice", 1)):
        try:
            set_properties(unit, {"CPUWeight": ("t", weight)})
        except subprocess.CalledProcessError as err:
            failures.append(f"systemctl set-property {unit} CPUWeight={weight}: {err.stderr}")
    # In-place resize of the LS pod: kubelet writes the pod slice, then UpdateContainerResources.
    kubelet_write(ls.pod_dir / "cpu.weight", str(shares_to_weight(2048)))
    kubelet_write(ls.pod_dir / "cpu.max", "200000 100000")
    kubelet_write(ls.pod_dir / "memory.max", str(256 * MIB))
    for pod, shares in ((ls, 2048), (be, 2)):
        try:
            cri.rt.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
                container_id=pod.container_id,
                linux=pb.LinuxContainerResources(cpu_shares=shares, memory_limit_in_bytes=256 * MIB)), timeout=30)
        except Exception as err:  # noqa: BLE001 - collected
            failures.append(f"UpdateContainerResources {pod.container_id[:12]}: {err}")
    assert not failures, "\n".join(failures)
    assert be.read("cpu.idle", "pod") == "1", "BE pod still idle"
    assert (BE_TIER / "cpu.idle").read_text().strip() == "0", "the tier itself is never made idle"
    wait_for(lambda: ls.read("cpu.weight") == str(shares_to_weight(2048)), 10, "resized LS weight")


def test_psi_trigger_with_a_500ms_window_fires_on_real_pressure(systemd_bed, guest_koordnode):
    """As root (CAP_SYS_RESOURCE) the kernel accepts 500 ms windows; measure the trigger's reaction."""
    from koordnode.qos.psi import PsiTrigger

    status = guest_koordnode.status()["qos_manager"]
    assert status["trigger_mode"].startswith("psi-trigger"), status["trigger_mode"]
    group = CG / f"koordnode-psi-{uuid.uuid4().hex[:6]}"
    group.mkdir()
    hogs: list[subprocess.Popen] = []
    try:
        (group / "cpu.max").write_text("10000 100000")  # 10 % of one CPU for two busy loops
        trigger = PsiTrigger(str(group / "cpu.pressure"), stall_us=100_000, window_us=500_000)
        assert not trigger.wait(0.6), "no pressure yet: no event"
        started = time.monotonic()
        for _ in range(2):
            hog = subprocess.Popen(["sh", "-c", "echo $$ > " + str(group / "cgroup.procs") + "; while :; do :; done"])
            hogs.append(hog)
        fired = trigger.wait(10)
        reaction = time.monotonic() - started
        trigger.close()
        assert fired, "the trigger never fired"
        print(f"PSI trigger 'some 100000 500000' fired {reaction * 1000:.0f} ms after the load started "
              "(TCG guest: scale down by the emulation factor)")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(timeout=10)
        group.rmdir()
