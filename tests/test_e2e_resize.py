"""In-place resize through koordnode: UpdatePodSandboxResources (CRI v1.33) and UpdateContainerResources.

No kubelet here: the tests make kubelet's calls (and, for the pod-level resize, kubelet's
pod cgroup write before the call) themselves. UpdatePodSandboxResources runs against the
host's containerd 1.6 (which answers UNIMPLEMENTED, tolerated by kubelet) and containerd 2.1.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from koordnode.cri import api_pb2 as pb
from support.cri import Cri, container_config, remove_pod, run_pod, sandbox_config, start_container
from support.koordnode_runner import KoordnodeProcess
from testbed.fixtures import dist_bed

pytestmark = pytest.mark.e2e

CG = Path("/sys/fs/cgroup")
RECONCILE = '[cgroup]\nreconcile_interval_s = 1.0\n'
BACKENDS = {"containerd-host": None, "containerd-2.1": "forky"}


@pytest.fixture(scope="module", params=list(BACKENDS))
def resize_bed(request, containerd_bed, tmp_path_factory):
    suite = BACKENDS[request.param]
    if suite is None:
        yield containerd_bed
        return
    with dist_bed(suite, tmp_path_factory.mktemp(f"bed-{suite}")) as bed:
        yield bed


def cpu_file(cgroup: str, name: str) -> int:
    return int((CG / "cpu" / cgroup.lstrip("/") / name).read_text())


def wait_value(read, expected, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    seen = read()
    while seen != expected and time.monotonic() < deadline:
        time.sleep(0.1)
        seen = read()
    return seen


def test_pod_level_resize_gets_the_class_values_and_is_passed_on(resize_bed, tmp_path):
    bed = resize_bed
    kn = KoordnodeProcess(tmp_path / "kn", str(bed.socket), extra_toml=RECONCILE, kubepods=bed.kubepods_cgroup).start()
    cri, direct = Cri(kn.listen), Cri(bed.address)
    sb = sandbox_config(bed, "pod-resize", qos="guaranteed", labels={"koordinator.sh/qosClass": "LSR"})
    sandbox_id = run_pod(cri, sb)
    try:
        start_container(cri, sandbox_id, sb, container_config(
            bed, "app", ["sleep", "3600"],
            resources={"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000,
                       "memory_limit_in_bytes": 64 << 20}))
        pod_cgroup = sb.linux.cgroup_parent
        # kubelet resizes the pod cgroup itself (2 CPUs = 2048 shares), then tells the runtime.
        (CG / "cpu" / pod_cgroup.lstrip("/") / "cpu.shares").write_text("2048")
        request = pb.UpdatePodSandboxResourcesRequest(
            pod_sandbox_id=sandbox_id,
            resources=pb.LinuxContainerResources(cpu_shares=2048, cpu_quota=200000, cpu_period=100000,
                                                 memory_limit_in_bytes=128 << 20))
        try:
            expected = ("ok", direct.rt.UpdatePodSandboxResources(request, timeout=10))
        except grpc.RpcError as err:
            expected = ("error", err.code(), err.details())
        try:
            answer = ("ok", cri.rt.UpdatePodSandboxResources(request, timeout=10))
        except grpc.RpcError as err:
            answer = ("error", err.code(), err.details())
        assert answer == expected, "passed on: containerd's own answer comes back"
        # LSR: 65536 shares per requested CPU, on the pod cgroup, within a reconcile period.
        assert wait_value(lambda: cpu_file(pod_cgroup, "cpu.shares"), 2 * 65536) == 2 * 65536
        pod = next(p for p in kn.status()["pods"] if p["sandbox_id"] == sandbox_id)
        assert pod["qos_class"] == "LSR"
        # kubelet's periodic rewrite of the pod cgroup is undone by the reconcile pass as well.
        (CG / "cpu" / pod_cgroup.lstrip("/") / "cpu.shares").write_text("2048")
        assert wait_value(lambda: cpu_file(pod_cgroup, "cpu.shares"), 2 * 65536, 5) == 2 * 65536
    finally:
        remove_pod(cri, sandbox_id)
        cri.close()
        direct.close()
        kn.stop()


def test_container_resize_survives_a_koordnode_restart(containerd_bed, tmp_path):
    bed = containerd_bed
    kn = KoordnodeProcess(tmp_path / "kn", str(bed.socket), extra_toml=RECONCILE, kubepods=bed.kubepods_cgroup).start()
    cri = Cri(kn.listen)
    sb = sandbox_config(bed, "resize", qos="burstable", labels={"koordinator.sh/qosClass": "LSR"})
    sandbox_id = run_pod(cri, sb)
    try:
        cid = start_container(cri, sandbox_id, sb, container_config(
            bed, "app", ["sleep", "3600"],
            resources={"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000,
                       "memory_limit_in_bytes": 64 << 20}))
        cgroup = f"{sb.linux.cgroup_parent}/{cid}"
        assert wait_value(lambda: cpu_file(cgroup, "cpu.shares"), 65536) == 65536
        # kubelet's in-place resize: 2 CPUs, a doubled limit.
        cri.rt.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
            container_id=cid,
            linux=pb.LinuxContainerResources(cpu_shares=2048, cpu_quota=200000, cpu_period=100000,
                                             memory_limit_in_bytes=128 << 20)), timeout=30)
        # containerd wrote kubelet's 2048; the update's post hook writes the class value after it.
        assert wait_value(lambda: cpu_file(cgroup, "cpu.shares"), 2 * 65536, 5) == 2 * 65536
        assert cpu_file(cgroup, "cpu.cfs_quota_us") == 200000
        # containerd reports kubelet's values back (kubelet's pod status), and its rewrite of
        # the weight is not counted as another writer's.
        reported = cri.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid)).status.resources.linux
        assert (reported.cpu_shares, reported.cpu_quota) == (2048, 200000)
        assert "cpu.shares" not in kn.status()["qos"]["overwrites"]["counts"]

        assert kn.stop() == 0
        kn.start()
        kn.wait_rebuilt()
        time.sleep(3)  # several reconcile passes (1 s) of the restarted koordnode
        assert cpu_file(cgroup, "cpu.shares") == 2 * 65536, "the resized value survives the restart"
        assert cpu_file(cgroup, "cpu.cfs_quota_us") == 200000
    finally:
        remove_pod(cri, sandbox_id)
        cri.close()
        kn.stop()
