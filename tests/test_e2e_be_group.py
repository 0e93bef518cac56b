"""BE pods in koordnode's idle group beside kubelet's QoS tiers, on the real containerd and cgroup v1.

No kubelet binary exists here: its cgroup writes (tier cpu.shares, pod cgroup creation,
pod-level resize writes, pod cgroup removal) are reproduced by tests/support/kubelet_tiers.py
at the moments kubelet makes them, and each must succeed.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from koordnode.cri import api_pb2 as pb
from support.cri import Cri, container_config, remove_pod, run_pod, sandbox_config, start_container
from support.koordnode_runner import KoordnodeProcess
from support.kubelet_tiers import (
    KUBELET_V1_CONTROLLERS,
    kubelet_destroy_pod_cgroup,
    kubelet_ensure_pod_cgroup,
    kubelet_set_pod_config,
    kubelet_update_qos_cgroups,
    prepare_qos_tiers,
)

pytestmark = pytest.mark.e2e

CG = Path("/sys/fs/cgroup")


def cg_read(controller: str, cgroup: str, name: str) -> str:
    return (CG / controller / cgroup.lstrip("/") / name).read_text().strip()


def cpu_cgroup_of(cri: Cri, cid: str) -> str:
    info = cri.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True)).info
    pid = json.loads(info["info"])["pid"]
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    raise AssertionError(f"no cpu cgroup for pid {pid}")


def kubelet_pod(bed, cri: Cri, name: str, tier: str, labels=None) -> tuple[pb.PodSandboxConfig, str, str, str]:
    """kubelet's sequence for a new pod: its pod cgroup, RunPodSandbox, CreateContainer, Start."""
    uid = uuid.uuid4().hex
    kubelet_cgroup = kubelet_ensure_pod_cgroup(bed.kubepods_cgroup, tier, uid)
    sb = sandbox_config(bed, name, qos=tier or "guaranteed", labels=labels, uid=uid)
    assert sb.linux.cgroup_parent == kubelet_cgroup
    sid = run_pod(cri, sb)
    cid = start_container(cri, sid, sb, container_config(bed, "app", ["sleep", "3600"]))
    return sb, sid, cid, kubelet_cgroup


def kubelets_writes(bed, *pod_cgroups: str) -> None:
    """Everything kubelet writes to its cgroups while pods run; any refusal raises OSError."""
    kubelet_update_qos_cgroups(bed.kubepods_cgroup)
    for pod in pod_cgroups:
        kubelet_set_pod_config(pod, cpu_shares=2)
    assert cg_read("cpu", f"{bed.kubepods_cgroup}/besteffort", "cpu.shares") == "2"
    for pod in pod_cgroups:
        assert cg_read("cpu", pod, "cpu.shares") == "2"
    # kubelet refuses to start on an idle tier (Koordinator #2732): none of its cgroups is idle.
    for cgroup in (bed.kubepods_cgroup, f"{bed.kubepods_cgroup}/besteffort",
                   f"{bed.kubepods_cgroup}/burstable", *pod_cgroups):
        assert cg_read("cpu", cgroup, "cpu.idle") == "0", cgroup


def gives_way(group: str) -> bool:
    """The BE group yields to LS: idle, or (cpu_suppress's quiet state) the lowest weight."""
    return cg_read("cpu", group, "cpu.idle") == "1" or cg_read("cpu", group, "cpu.shares") == "2"


def test_be_pods_run_in_the_idle_group_and_kubelets_writes_succeed(containerd_bed, tmp_path):
    bed = containerd_bed
    kubepods = bed.kubepods_cgroup
    group = f"{kubepods}/koordnode_be"
    prepare_qos_tiers(kubepods)
    kubelet_update_qos_cgroups(kubepods)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kn = KoordnodeProcess(tmp_path / "kn", str(bed.socket), kubepods=kubepods,
                          metrics_listen=f"127.0.0.1:{port}").start()
    cri = Cri(kn.listen)
    sids: list[str] = []
    try:
        be_sb, be_sid, be_cid, be_kubelet = kubelet_pod(bed, cri, "batch", "besteffort")
        sids.append(be_sid)
        ls_sb, ls_sid, ls_cid, ls_kubelet = kubelet_pod(bed, cri, "web", "burstable")
        sids.append(ls_sid)
        uid = be_sb.metadata.uid

        # The BE container runs in the idle group, a sibling of kubelet's tiers; LS where kubelet said.
        assert cpu_cgroup_of(cri, be_cid) == f"{group}/pod{uid}/{be_cid}"
        assert cpu_cgroup_of(cri, ls_cid) == f"{ls_kubelet}/{ls_cid}"
        assert gives_way(group)
        # kubelet's own pod cgroup stays, empty and writable.
        assert cg_read("cpu", be_kubelet, "cgroup.procs") == ""
        kubelets_writes(bed, be_kubelet, ls_kubelet)
        status = kn.wait_rebuilt()
        pods = {p["sandbox_id"]: p for p in status["pods"]}
        assert pods[be_sid]["qos_class"] == "BE" and pods[ls_sid]["qos_class"] == "LS"
        # The BE quota follows the BE pods into the group from the QoS manager's next tick on.
        deadline = time.monotonic() + 10
        while status["qos_manager"]["be_tier"] != group and time.monotonic() < deadline:
            time.sleep(0.2)
            status = kn.status()
        assert status["qos_manager"]["be_tier"] == group
        # Interference as the LS pod feels it, from its real cpu.pressure / cpu.stat (BE: none).
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'koordnode_pod_cpu_pressure_seconds_total{class="LS",namespace="default",pod="web"}' in body
        assert 'koordnode_pod_cpu_throttled_seconds_total{class="LS",namespace="default",pod="web"}' in body
        assert 'koordnode_class_cpu_pressure_seconds_total{class="LS"}' in body
        assert 'pod="batch"' not in "".join(line for line in body.splitlines() if "cpu_pressure_seconds" in line)

        # koordnode restarts: kubelet keeps writing while it is down, the pod is found again (BE,
        # in the group), and a container kubelet (re)creates with its own parent follows the pod.
        kn.stop()
        kubelets_writes(bed, be_kubelet, ls_kubelet)
        kn.start()
        status = kn.wait_rebuilt()
        # Recovered pods get their class when the loop records what the adopt pass found.
        deadline = time.monotonic() + 10
        while ({p["sandbox_id"]: p["qos_class"] for p in status["pods"]}[be_sid] is None
               and time.monotonic() < deadline):
            time.sleep(0.2)
            status = kn.status()
        assert {p["sandbox_id"]: p["qos_class"] for p in status["pods"]}[be_sid] == "BE"
        second = start_container(cri, be_sid, be_sb, container_config(bed, "again", ["sleep", "3600"]))
        assert cpu_cgroup_of(cri, second) == f"{group}/pod{uid}/{second}"
        kubelets_writes(bed, be_kubelet, ls_kubelet)

        # Someone resets the group to the defaults (cpu.idle 0, the kernel's weight; clearing the
        # flag alone puts back the weight before it, the lowest if cpu_suppress's quiet state was
        # the last): after a restart it gives way again (idle from the reconcile pass, or the
        # lowest weight of the quiet state, whichever comes first).
        (CG / "cpu" / group.lstrip("/") / "cpu.idle").write_text("0")
        (CG / "cpu" / group.lstrip("/") / "cpu.shares").write_text("1024")
        assert not gives_way(group)
        kn.stop()
        kn.start()
        kn.wait_rebuilt()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not gives_way(group):
            time.sleep(0.1)
        assert gives_way(group)

        # Pod removal: koordnode removes the pod cgroup in the group, kubelet removes its own.
        remove_pod(cri, be_sid)
        sids.remove(be_sid)
        kubelet_destroy_pod_cgroup(be_kubelet)
        deadline = time.monotonic() + 5
        left = [c for c in KUBELET_V1_CONTROLLERS if (CG / c / group.lstrip("/") / f"pod{uid}").exists()]
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [c for c in KUBELET_V1_CONTROLLERS if (CG / c / group.lstrip("/") / f"pod{uid}").exists()]
        assert not left, f"pod cgroup left in the BE group in {left}"
        kubelets_writes(bed, ls_kubelet)
    finally:
        for sid in sids:
            try:
                remove_pod(cri, sid)
            except Exception:
                pass
        cri.close()
        kn.stop()


def test_option_off_and_non_besteffort_be_pods_stay_where_kubelet_put_them(containerd_bed, tmp_path):
    bed = containerd_bed
    kubepods = bed.kubepods_cgroup
    prepare_qos_tiers(kubepods)
    kn = KoordnodeProcess(tmp_path / "kn", str(bed.socket), kubepods=kubepods,
                          extra_toml="[cgroup]\nbe_idle_group = false\n").start()
    cri = Cri(kn.listen)
    sids: list[str] = []
    try:
        sb, sid, cid, kubelet_cgroup = kubelet_pod(bed, cri, "batch-off", "besteffort")
        sids.append(sid)
        assert cpu_cgroup_of(cri, cid) == f"{kubelet_cgroup}/{cid}"
    finally:
        for s in sids:
            remove_pod(cri, s)
        cri.close()
        kn.stop()
    kn = KoordnodeProcess(tmp_path / "kn2", str(bed.socket), kubepods=kubepods).start()
    cri = Cri(kn.listen)
    sids = []
    try:
        # A Burstable pod labelled BE keeps kubelet's pod cgroup, whose limits it needs.
        sb, sid, cid, kubelet_cgroup = kubelet_pod(bed, cri, "batch-burstable", "burstable",
                                                   labels={"koordinator.sh/qosClass": "BE"})
        sids.append(sid)
        assert cpu_cgroup_of(cri, cid) == f"{kubelet_cgroup}/{cid}"
    finally:
        for s in sids:
            remove_pod(cri, s)
        cri.close()
        kn.stop()


def test_leftover_pod_cgroups_in_the_group_are_swept(containerd_bed, tmp_path):
    """A pod cgroup left in the group (koordnode stopped between a pod's removal and its clean-up)
    goes at a reconcile pass once it is a minute old; a fresh one (a pod being created) stays."""
    bed = containerd_bed
    kubepods = bed.kubepods_cgroup
    group = f"{kubepods}/koordnode_be"
    prepare_qos_tiers(kubepods)
    kn = KoordnodeProcess(tmp_path / "kn", str(bed.socket), kubepods=kubepods,
                          extra_toml="[cgroup]\nreconcile_interval_s = 0.5\n").start()
    cri = Cri(kn.listen)
    sids: list[str] = []
    leftover, fresh = f"{group}/pod{uuid.uuid4().hex}", f"{group}/pod{uuid.uuid4().hex}"
    try:
        sb, sid, cid, _ = kubelet_pod(bed, cri, "batch", "besteffort")
        sids.append(sid)
        for cgroup in (leftover, fresh):
            for controller in ("cpu", "cpuacct"):
                (CG / controller / cgroup.lstrip("/")).mkdir()
        old = time.time() - 120
        for controller in ("cpu", "cpuacct"):
            os.utime(CG / controller / leftover.lstrip("/"), (old, old))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (CG / "cpu" / leftover.lstrip("/")).exists():
            time.sleep(0.2)
        assert not (CG / "cpu" / leftover.lstrip("/")).exists()
        assert not (CG / "cpuacct" / leftover.lstrip("/")).exists()
        assert (CG / "cpu" / fresh.lstrip("/")).is_dir()
        assert cpu_cgroup_of(cri, cid) == f"{group}/pod{sb.metadata.uid}/{cid}"  # the live pod stays
    finally:
        for s in sids:
            remove_pod(cri, s)
        for controller in ("cpu", "cpuacct"):
            for cgroup in (leftover, fresh):
                if (CG / controller / cgroup.lstrip("/")).is_dir():
                    (CG / controller / cgroup.lstrip("/")).rmdir()
        cri.close()
        kn.stop()
