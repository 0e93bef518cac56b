"""Hook timeouts far below what the hooks take, against the real containerd and koordnode
(kubelet's calls reproduced in kubelet's order through the CRI socket):

- the books stay right: every removed pod leaves koordnode's state and its exclusive CPUs;
- failure_policy = "fail" never fails a call the hooks do not change.
"""

from __future__ import annotations

import concurrent.futures
import time

import grpc
import pytest

from koordnode.cri import api_pb2 as pb
from support.cri import Cri, container_config, remove_pod, run_pod, sandbox_config, start_container
from support.koordnode_runner import InProcessKoordnode, KoordnodeProcess

pytestmark = pytest.mark.e2e

GUARANTEED_1CPU = {"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000,
                   "memory_limit_in_bytes": 256 << 20}


def _wait(predicate, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    return predicate()


def test_removed_lse_pods_leave_state_and_cpus_at_a_1ms_hook_timeout(containerd_bed, tmp_path):
    kn = KoordnodeProcess(tmp_path / "kn", str(containerd_bed.socket),
                          extra_toml="", kubepods=containerd_bed.kubepods_cgroup)
    kn.config_path.write_text(kn.config_path.read_text().replace(
        '[proxy]\n', '[proxy]\nhook_timeout_ms = 1\n', 1))
    kn.start()
    cri = Cri(kn.listen)
    try:
        kn.wait_rebuilt()

        def churn(worker: int) -> None:  # kubelet's pod workers run in parallel
            for i in range(4):
                sb = sandbox_config(containerd_bed, f"lse-{worker}-{i}", qos="guaranteed",
                                    labels={"koordinator.sh/qosClass": "LSE"})
                sid = run_pod(cri, sb)
                start_container(cri, sid, sb, container_config(containerd_bed, "app", ["sleep", "3600"],
                                                               resources=GUARANTEED_1CPU))
                remove_pod(cri, sid)

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(churn, range(4)))
        status = _wait(lambda: (lambda s: s if not s["pods"] and not s["qos"]["cpus"]["allocations"]
                                else None)(kn.status()))
        status = status or kn.status()
        assert status["pods"] == [], status["pods"]
        assert status["qos"]["cpus"]["allocations"] == {}
    finally:
        cri.close()
        kn.stop()


def test_failure_policy_fail_never_fails_calls_the_hooks_do_not_change(containerd_bed, cri_direct, tmp_path):
    kn = KoordnodeProcess(tmp_path / "kn", str(containerd_bed.socket), kubepods=containerd_bed.kubepods_cgroup)
    kn.config_path.write_text(kn.config_path.read_text().replace(
        '[proxy]\n', '[proxy]\nhook_timeout_ms = 1\nfailure_policy = "fail"\n', 1))
    kn.start()
    cri = Cri(kn.listen)
    try:
        for i in range(5):
            # Created directly: RunPodSandbox and CreateContainer are calls the hooks change, and
            # may rightly fail under "fail" when the hooks cannot keep up.
            sb = sandbox_config(containerd_bed, f"pod-{i}")
            sid = run_pod(cri_direct, sb)
            cid = cri_direct.rt.CreateContainer(pb.CreateContainerRequest(
                pod_sandbox_id=sid, sandbox_config=sb,
                config=container_config(containerd_bed, "app", ["sleep", "3600"])), timeout=60).container_id
            try:
                cri.rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=30)
                cri.rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=1), timeout=30)
                cri.rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=30)
                cri.rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=30)
                cri.rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=30)
            except grpc.RpcError as exc:
                remove_pod(cri_direct, sid)
                pytest.fail(f"{exc.code()}: {exc.details()}")
        assert "failed in pre" not in kn.log_text()
    finally:
        cri.close()
        kn.stop()


def test_cpu_release_queued_behind_busy_hook_threads_still_runs(containerd_bed, tmp_path):
    """The reported leak, made deterministic: when the pod is removed every hook thread is busy,
    so the QoS Post hook that releases its CPU is still queued when the timeout fires."""
    kn = InProcessKoordnode(tmp_path, str(containerd_bed.socket)).start()
    cri = Cri(kn.listen)
    try:
        kn.wait_rebuilt()
        sb = sandbox_config(containerd_bed, "lse", qos="guaranteed", labels={"koordinator.sh/qosClass": "LSE"})
        sid = run_pod(cri, sb)
        start_container(cri, sid, sb, container_config(containerd_bed, "app", ["sleep", "3600"],
                                                       resources=GUARANTEED_1CPU))

        def allocations():
            return kn.call(lambda: kn.daemon.status_report.status())["qos"]["cpus"]["allocations"]

        assert _wait(allocations), "the LSE pod got no exclusive CPU"
        chain = kn.daemon.chain
        kn.call(lambda: chain.configure(timeout_s=0.02, failure_policy="ignore"))
        for _ in range(chain._pool._max_workers):
            chain._pool.submit(time.sleep, 1.0)
        remove_pod(cri, sid)
        assert _wait(lambda: not allocations(), 10), allocations()
        assert _wait(lambda: not kn.call(lambda: sid in kn.daemon.state.pods), 10)
    finally:
        cri.close()
        kn.stop()


def test_failure_policy_fail_with_busy_hook_threads_fails_no_bookkeeping_call(containerd_bed, cri_direct, tmp_path):
    """The reported failures, made deterministic: every hook thread busy, a short timeout and
    failure_policy = "fail" failed StartContainer, StopPodSandbox and RemovePodSandbox."""
    kn = InProcessKoordnode(tmp_path, str(containerd_bed.socket)).start()
    cri = Cri(kn.listen)
    try:
        kn.wait_rebuilt()
        sb = sandbox_config(containerd_bed, "pod")
        sid = run_pod(cri_direct, sb)
        cid = cri_direct.rt.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=sid, sandbox_config=sb,
            config=container_config(containerd_bed, "app", ["sleep", "3600"])), timeout=60).container_id
        chain = kn.daemon.chain
        kn.call(lambda: chain.configure(timeout_s=0.02, failure_policy="fail"))
        calls = (("StartContainer", pb.StartContainerRequest(container_id=cid)),
                 ("StopContainer", pb.StopContainerRequest(container_id=cid, timeout=1)),
                 ("RemoveContainer", pb.RemoveContainerRequest(container_id=cid)),
                 ("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sid)),
                 ("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sid)))
        failed = []
        for method, request in calls:
            for _ in range(chain._pool._max_workers):
                chain._pool.submit(time.sleep, 0.3)
            try:
                getattr(cri.rt, method)(request, timeout=30)
            except grpc.RpcError as exc:
                failed.append(f"{method}: {exc.code()} {exc.details()}")
        if failed:
            remove_pod(cri_direct, sid)
        assert failed == []
    finally:
        cri.close()
        kn.stop()
