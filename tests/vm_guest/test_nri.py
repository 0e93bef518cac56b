"""NRI mode on containerd 1.7 (NRI enabled in its config: `[plugins."io.containerd.nri.v1.nri"]
disable = false`), cgroup v2 only, runc's systemd driver: the guest's platform. CRI calls go
straight to containerd, as kubelet's would; koordnode is its NRI plugin."""

from __future__ import annotations

import json
import os
import time

import pytest

from koordnode.cri import api_pb2 as pb
from koordnode.model.be_group import be_group_parent
from koordnode.model.cpulist import parse_cpu_list
from support.cri import Cri, container_config, remove_pod, run_pod, sandbox_config, start_container
from support.koordnode_runner import KoordnodeProcess, short_socket_dir
from testbed.systemd_bed import KUBEPODS_SLICE, SystemdBed, kubelet_tiers

GUARANTEED_1CPU = {"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000, "memory_limit_in_bytes": 256 << 20}


def weight(shares: int) -> int:
    return 1 + (shares - 2) * 9999 // 262142


def wait_for(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def nri_systemd_bed(tmp_path_factory):
    kubelet_tiers(os.cpu_count() or 1)
    bed = SystemdBed(tmp_path_factory.mktemp("nri-bed"), nri_socket=short_socket_dir() / "nri.sock")
    bed.start()
    yield bed
    bed.stop()


def spec_shares(cri: Cri, cid: str) -> int:
    info = cri.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True), timeout=10).info
    return json.loads(info["info"])["runtimeSpec"]["linux"]["resources"]["cpu"]["shares"]


def test_nri_on_containerd_17_with_cgroup_v2_and_systemd(nri_systemd_bed, tmp_path):
    bed = nri_systemd_bed
    kn = KoordnodeProcess(tmp_path / "kn", str(bed.socket), nri_socket=str(bed.nri_socket),
                          kubepods="/" + KUBEPODS_SLICE, extra_toml='[cgroup]\ndriver = "systemd"\n').start(timeout_s=120)
    cri = Cri(bed.address)
    sids = []

    def run(name, qos, labels=None, resources=None):
        sb = sandbox_config(bed, name, qos=qos, labels=labels)
        sids.append(run_pod(cri, sb))
        cid = start_container(cri, sids[-1], sb, container_config(bed, "app", ["sleep", "3600"], resources=resources))
        return sb.linux.cgroup_parent, cid

    try:
        st = kn.wait_synchronized(timeout_s=60)
        assert st["mode"] == "nri" and "1.7" in st["nri"]["runtime"]
        ls_parent, ls_cid = run("ls", "burstable", resources={"cpu_shares": 512})
        lse_parent, lse_cid = run("lse", "guaranteed", {"koordinator.sh/qosClass": "LSE"}, GUARANTEED_1CPU)
        be_parent, be_cid = run("be", "besteffort", resources={"cpu_shares": 2})
        lse_dir = bed.container_cgroup_dir(lse_parent, lse_cid)
        wait_for(lambda: (lse_dir / "cpu.weight").read_text().strip() == str(weight(262144)), 30, "LSE cpu.weight")
        # containerd's spec keeps kubelet's shares: kubelet reads them back as the container's CPU
        # request (docs/architecture.md "Where the values go"); the class weight is in the cgroup file.
        assert spec_shares(cri, lse_cid) == 1024
        lse_cpus = parse_cpu_list((lse_dir / "cpuset.cpus").read_text().strip())
        assert len(lse_cpus) == 1
        ls_cpus = parse_cpu_list((bed.container_cgroup_dir(ls_parent, ls_cid) / "cpuset.cpus").read_text().strip())
        assert ls_cpus and not (ls_cpus & lse_cpus)  # the running LS container left the core (NRI update)
        # The BE container runs in koordnode's idle group slice (CreateContainer's cgroups path);
        # the sandbox stays in kubelet's pod slice.
        group_parent = be_group_parent(be_parent)
        assert bed.container_cgroup_dir(group_parent, be_cid).is_dir()
        assert not bed.container_cgroup_dir(be_parent, be_cid).exists()
        group = bed.pod_cgroup_dir(group_parent).parent
        # The group gives way: idle, or (LS quiet, cpu_suppress) at the lowest weight.
        wait_for(lambda: (group / "cpu.idle").read_text().strip() == "1" or (group / "cpu.weight").read_text().strip() == "1",
                 30, "the BE group slice gives way")
        # Pod-level values (after StartContainer): BE's weight on the pod, not idle ([qos.BE] cpu_idle = 0).
        wait_for(lambda: (bed.pod_cgroup_dir(group_parent) / "cpu.weight").read_text().strip() == str(weight(2)), 10,
                 "BE pod cpu.weight")
        assert (bed.pod_cgroup_dir(group_parent) / "cpu.idle").read_text().strip() == "0"

        # koordnode away: a Guaranteed pod is created as kubelet asks; the next Synchronize fixes it.
        assert kn.stop() == 0
        gap_parent, gap_cid = run("lsr-gap", "guaranteed", resources=GUARANTEED_1CPU)
        gap_dir = bed.container_cgroup_dir(gap_parent, gap_cid)
        assert (gap_dir / "cpu.weight").read_text().strip() == str(weight(1024))
        kn.start(timeout_s=120)
        kn.wait_synchronized(timeout_s=60)
        wait_for(lambda: (gap_dir / "cpu.weight").read_text().strip() == str(weight(65536)), 30, "LSR cpu.weight")
        assert spec_shares(cri, gap_cid) == 1024  # kubelet's, as containerd reports it back
    finally:
        for sid in sids:
            try:
                remove_pod(cri, sid)
            except Exception:
                pass
        cri.close()
        kn.stop()
