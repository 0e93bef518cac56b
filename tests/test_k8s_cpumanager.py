"""kubelet's CPU manager with the static policy behind koordnode: kubelet owns the cpusets.

kubelet (cm/internal_container_lifecycle_linux.go) puts its CPU manager's cpuset into every
CreateContainer under the static policy (the container's exclusive CPUs, else its shared default
set) and reconciles every ``cpuManagerReconcilePeriod`` with UpdateContainerResources carrying
only the cpuset. Before koordnode knew that, it allocated its own CPUs to the LSE pod and made the
CPU kubelet had given LSE exclusively its LS/BE pool: the BE pod ran on LSE's CPU, and the two
undid each other's cpusets. Now koordnode sees kubelet's cpuset and keeps it; this test runs
the real kubelet (its own node: the static policy needs kubelet's reservedSystemCPUs, which
leaves 1 allocatable CPU on this 2-CPU host: the LSE pod with 1 CPU and the BE pod).
"""

from __future__ import annotations

import json
import time

import pytest

from k8s_support import (
    cg_read,
    container_cgroup,
    control_plane,  # noqa: F401 - the session's API server
    example_pods,
    find_pod_cgroup,
    require_component,
    runtime_errors,
)
from koordnode.model.cpulist import parse_cpu_list
from test_k8s_node import STATS_FROM_CRI, check_class_values, run_example_pods
from testbed.real_node import NODE_NAMES, RealNode, real_node

pytestmark = pytest.mark.e2e

RECONCILE_S = 5
CPU_MANAGER = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0",
               "cpuManagerReconcilePeriod": f"{RECONCILE_S}s"}
CLASSES = ("LSE", "BE")


def _kubelet_state(node: RealNode) -> dict:
    return json.loads((node.kubelet.root_dir / "cpu_manager_state").read_text())


def _container_cpus(node: RealNode, classes=CLASSES) -> dict[str, frozenset[int]]:
    """The cpuset.cpus of each example pod's container (by class), as the kernel has it."""
    pods = example_pods()
    out = {}
    for cls in classes:
        pod = node.pod(pods[cls]["metadata"]["name"])
        pod_cg = find_pod_cgroup(node.kubepods, pod["metadata"]["uid"], "cpuset")
        cid = pod["status"]["containerStatuses"][0]["containerID"]
        out[cls] = parse_cpu_list(cg_read("cpuset", container_cgroup(pod_cg, cid), "cpuset.cpus"))
    return out


def _updates(node: RealNode, status: dict) -> int:
    """kubelet's UpdateContainerResources calls koordnode saw: through its proxy, or in NRI mode
    as NRI UpdateContainer events (counted by event name)."""
    if node.mode == "proxy":
        return status["proxy"]["calls_by_method"].get("UpdateContainerResources", 0)
    return status["nri"]["events"].get("UpdateContainer", 0)


@pytest.mark.parametrize("mode", ["proxy", "nri"])
def test_kubelets_static_cpu_manager_owns_the_cpusets_and_nobody_undoes_anybody(control_plane, tmp_path, mode):  # noqa: F811
    """Proxy mode: kubelet's cpuset arrives in the CRI requests. NRI mode: in the container's OCI
    spec (CreateContainer) and in NRI's UpdateContainer (kubelet's reconcile, through containerd)."""
    require_component("containerd")
    pods = example_pods()
    namespace = "cpumanager" if mode == "proxy" else "cpumanager-nri"
    with real_node(tmp_path, mode=mode, control_plane=control_plane, node_name=NODE_NAMES[2], namespace=namespace,
                   feature_gates=STATS_FROM_CRI, kubelet_config=CPU_MANAGER) as node:
        run_example_pods(node, CLASSES)
        lse = node.pod(pods["LSE"]["metadata"]["name"])
        container = pods["LSE"]["spec"]["containers"][0]["name"]

        # kubelet's own record: the LSE container's exclusive CPU, the rest in its default set.
        state = _kubelet_state(node)
        assert state["policyName"] == "static", state
        exclusive = parse_cpu_list(state["entries"][lse["metadata"]["uid"]][container])
        shared = parse_cpu_list(state["defaultCpuSet"])
        assert len(exclusive) == 1 and not exclusive & shared, state

        # Over three of kubelet's reconcile periods and koordnode's reconcile passes (10 s):
        # LSE stays on kubelet's CPU, BE stays off it; nobody moves anybody.
        samples = []
        deadline = time.monotonic() + 3 * RECONCILE_S + 12
        while time.monotonic() < deadline:
            cpus = _container_cpus(node)
            samples.append(cpus)
            assert cpus["LSE"] == exclusive, (samples, state)
            assert not cpus["BE"] & exclusive, (samples, state)
            assert cpus["BE"] == shared, (samples, state)
            time.sleep(1)
        assert _kubelet_state(node)["entries"] == state["entries"]

        # The class's other values hold (LSE's and BE's cpu.shares, memory, the BE group...).
        check_class_values(node, CLASSES)
        status = node.koordnode.status()
        cpus_status = status["qos"]["cpus"]
        assert cpus_status["owner"] == "kubelet (static CPU manager)", cpus_status
        lse_key = f"{node.namespace}/{lse['metadata']['name']}/{container}"
        assert cpus_status["kubelet"]["lse_lsr_containers"] == {
            lse_key: {"class": "LSE", "cpus": sorted(exclusive), "exclusive": True}}, cpus_status
        assert not (set(cpus_status["kubelet"]["others_run_on"]) & exclusive), cpus_status
        # kubelet's reconcile did reach koordnode: an UpdateContainerResources with the cpuset alone
        # for each container on its shared set the first time it sees it running (BE here; a
        # container with exclusive CPUs got them at creation and is sent nothing until they
        # change), and koordnode restored no cpuset kubelet wrote.
        updates_before = _updates(node, status)
        assert updates_before >= 1, status["proxy"]
        assert "cpuset.cpus" not in status["qos"]["overwrites"]["counts"], status["qos"]["overwrites"]
        errors = [e for e in runtime_errors(node.kubelet.log_text()) if "cpu" in e.lower()]
        assert not errors, errors
        print("kubelet's cpu_manager_state:", state, "koordnode:", cpus_status)

        # The LSE pod goes, an LS pod comes (500m: it fits the 1 allocatable CPU now): kubelet's
        # reconcile gives its shared set back CPU 1 with cpuset-only updates (BE's, and the LS
        # container's first). Both follow kubelet, and the LS container keeps its class's
        # cpu.shares (planned from kubelet's CreateContainer values, not the update's zeros).
        node.client().delete(node.pod_path(lse["metadata"]["name"]), grace_seconds=0)
        node.client().wait_for("the LSE pod gone", lambda: not node.client().exists(
            node.pod_path(lse["metadata"]["name"])), timeout=60)
        node.create_pod(pods["LS"])
        node.wait_running(pods["LS"]["metadata"]["name"], timeout=120)
        everything = shared | exclusive
        node.client().wait_for("kubelet's shared set back to every CPU", lambda: parse_cpu_list(
            _kubelet_state(node)["defaultCpuSet"]) == everything, timeout=30)
        node.client().wait_for("BE and LS on kubelet's whole shared set", lambda: set(
            _container_cpus(node, ("LS", "BE")).values()) == {everything}, timeout=3 * RECONCILE_S)
        time.sleep(2 * RECONCILE_S + 2)  # two more of kubelet's reconciles, one of koordnode's passes
        assert set(_container_cpus(node, ("LS", "BE")).values()) == {everything}
        check_class_values(node, ("LS", "BE"))
        status = node.koordnode.status()
        assert _updates(node, status) >= updates_before + 2, status["proxy"]
        assert status["qos"]["cpus"]["kubelet"] == {"lse_lsr_containers": {}, "others_run_on": sorted(everything)}
        assert "cpuset.cpus" not in status["qos"]["overwrites"]["counts"], status["qos"]["overwrites"]
