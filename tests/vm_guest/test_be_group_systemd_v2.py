"""The idle BE group with kubelet's systemd driver on cgroup v2 (VM lane guest; see tests/vm_guest).

kubelet's part is reproduced: its tier and pod slices through systemd's D-Bus API, its CRI
calls, its property writes (systemctl set-property CPUWeight=, what its cgroup manager does
through systemd), its restart (the tiers started again). The rest is real: systemd 257 as PID 1,
containerd with runc's systemd driver, cgroup v2.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from guestlib import CG, GuestKoordnode, free_port, wait_for
from koordnode.cri import api_pb2 as pb
from support.cri import Cri, container_config, remove_pod, run_pod, sandbox_config, start_container
from testbed.systemd_bed import KUBEPODS_SLICE, kubelet_pod_slice, kubelet_tiers, set_properties, slice_path

GROUP_SLICE = "kubepods-koordnode_be.slice"
GROUP_DIR = CG / KUBEPODS_SLICE / GROUP_SLICE


@pytest.fixture(scope="module")
def be_group_koordnode(systemd_bed, tmp_path_factory):
    # The default config with the systemd driver: the idle BE group is on by default there.
    port = free_port()
    kn = GuestKoordnode(tmp_path_factory.mktemp("kn-be-group"), str(systemd_bed.socket),
                        extra_toml='[cgroup]\ndriver = "systemd"\nreconcile_interval_s = 3.0\n',
                        metrics_listen=f"127.0.0.1:{port}", kubepods="/" + KUBEPODS_SLICE)
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


def be_pod(cri: Cri, bed, name: str) -> tuple[str, str, str, str]:
    """kubelet's sequence for a BestEffort pod: its pod slice, RunPodSandbox, the container.
    Returns (sandbox id, container id, kubelet's parent, the container's cgroup)."""
    uid = str(uuid.uuid4())
    parent = bed.pod_cgroup_parent("besteffort", uid)
    kubelet_pod_slice(parent, 1)  # kubelet's pod slice, CPUWeight 1 (cpu.shares 2)
    sb = sandbox_config(bed, name, qos="besteffort", uid=uid)
    sid = run_pod(cri, sb)
    cid = start_container(cri, sid, sb, container_config(bed, "main", ["sleep", "3600"]))
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
