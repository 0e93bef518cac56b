"""A real Kubernetes node: kubelet (built from k8s.io/kubernetes) registered with a real
kube-apiserver + etcd, koordnode in front of containerd 2.x (built from its Go module), pods
created through the API. Nothing of kubelet is reproduced here: its cgroup layout, QoS-tier
writes, CRI call pattern and restarts are the real ones.

The example pods are the project's QoS class examples (``tests/data/qos-class-examples.yaml``).
They ask 2.7 CPUs together and the node has 2, so they run in two rounds on one node:
SYSTEM, LSE, LS and BE first, then LSR in LSE's place.

The tests of this module share one node and run in order (each builds on the pods the
previous one left); the host is cgroup v1, kubelet's cgroupfs driver.
"""

from __future__ import annotations

import re
import time

import pytest

from k8s_support import (
    EXAMPLES,
    SHARED_EXAMPLES,
    cg_read,
    container_cgroup,
    control_plane,  # noqa: F401 - the session's API server
    example_pods,
    find_pod_cgroup,
    require_component,
)
from koordnode.executor.executor import CgroupExecutor
from koordnode.model.cpulist import parse_cpu_list
from testbed.real_node import RealNode, real_node

pytestmark = pytest.mark.e2e

FIRST_ROUND = ("SYSTEM", "LSE", "LS", "BE")
# "cpu.shares=2 on /kubepods/koordnode_be/pod... (written)" — one entry of `applied` in koordnode status.
_APPLIED = re.compile(r"^(?P<resource>[a-z_]+\.[a-z_.]+)=(?P<value>.*) on (?P<cgroup>/\S*) \(")
# The class's cpu.shares per requested CPU (the QoS guide's weights; kubelet's is 1024).
CLASS_SHARES_PER_CPU = {"SYSTEM": 32768, "LSE": 262144, "LSR": 65536, "LS": 1024}


@pytest.fixture(scope="module")
def node(control_plane, tmp_path_factory):  # noqa: F811
    require_component("containerd")
    with real_node(tmp_path_factory.mktemp("k8s-node"), control_plane=control_plane) as n:
        yield n


def _pods_by_class(node: RealNode, classes) -> dict[str, dict]:
    pods = example_pods()
    return {cls: node.client().pod(pods[cls]["metadata"]["name"]) for cls in classes}


def _status_pod(node: RealNode, uid: str) -> dict:
    for pod in node.koordnode.status().get("pods", []):
        if pod.get("uid") == uid:
            return pod
    raise AssertionError(f"koordnode's status has no pod {uid}")


# koordnode's own lookup of the file behind a resource on this kernel (blkio.weight is
# blkio.bfq.weight here), used read-only.
_KERNEL = CgroupExecutor("/sys/fs/cgroup")


def _file_value(resource: str, cgroup: str) -> str:
    value = _KERNEL.read(cgroup, resource)
    assert value is not None, f"no file for {resource} on {cgroup}"
    return value


def _same_value(resource: str, expected: str, actual: str) -> bool:
    if resource.startswith("cpuset."):
        return parse_cpu_list(expected) == parse_cpu_list(actual)
    # BFQ's weight file reads "default 500"
    return expected.strip() == actual.strip() or actual.split() == ["default", expected.strip()]


def applied_values_hold(node: RealNode, uid: str) -> list[str]:
    """Every value koordnode says it applied to the pod and its containers, checked against
    the real file: the mismatches (empty when all hold)."""
    pod = _status_pod(node, uid)
    entries = list(pod.get("applied", []))
    for container in pod.get("containers", []):
        entries += container.get("applied", [])
    assert entries, f"koordnode applied nothing to pod {uid}: {pod}"
    wrong = []
    for entry in entries:
        match = _APPLIED.match(entry)
        assert match, f"unexpected status entry {entry!r}"
        resource, value, cgroup = match["resource"], match["value"], match["cgroup"]
        actual = _file_value(resource, cgroup)
        if not _same_value(resource, value, actual):
            wrong.append(f"{resource} on {cgroup}: koordnode applied {value}, the file holds {actual}")
    return wrong


def test_the_example_manifests_are_the_shared_ones():
    if not SHARED_EXAMPLES.exists():
        pytest.skip(f"{SHARED_EXAMPLES} is not beside this clone")
    assert EXAMPLES.read_text() == SHARED_EXAMPLES.read_text()


def test_node_is_ready_behind_koordnode(node):
    status = node.client().get(f"/api/v1/nodes/{node.name}")["status"]
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert ready["status"] == "True", ready
    assert status["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.")
    assert status["nodeInfo"]["kubeletVersion"].startswith("v1.")


def _pod_cgroups(node: RealNode, pod: dict) -> tuple[str, str]:
    pod_cg = find_pod_cgroup(node.kubepods, pod["metadata"]["uid"])
    cid = pod["status"]["containerStatuses"][0]["containerID"]
    return pod_cg, container_cgroup(pod_cg, cid)


def check_class_values(node: RealNode, classes) -> None:
    """The class's own values in the real files (not only "what koordnode says it applied")."""
    pods = _pods_by_class(node, classes)
    cgroups = {cls: _pod_cgroups(node, pod) for cls, pod in pods.items()}
    for cls, pod in pods.items():
        pod_cg, ctr_cg = cgroups[cls]
        requests = pod["spec"]["containers"][0].get("resources", {}).get("requests", {})
        if cls == "BE":
            assert "/koordnode_be/" in pod_cg, f"the BE pod is not in koordnode's BE group: {pod_cg}"
            assert cg_read("cpu", ctr_cg, "cpu.shares") == "2"
        else:
            kubelet_shares = _millicpu(requests["cpu"]) * 1024 // 1000  # what kubelet asks for the request
            expected = min(kubelet_shares * CLASS_SHARES_PER_CPU[cls] // 1024, 262144)
            assert int(cg_read("cpu", ctr_cg, "cpu.shares")) == expected, cls
        wrong = applied_values_hold(node, pod["metadata"]["uid"])
        assert not wrong, f"{cls}: {wrong}"
    if "LSE" in cgroups:
        lse_cpus = parse_cpu_list(cg_read("cpuset", cgroups["LSE"][1], "cpuset.cpus"))
        assert len(lse_cpus) == 1
        for cls in set(cgroups) - {"LSE"}:
            others = parse_cpu_list(cg_read("cpuset", cgroups[cls][1], "cpuset.cpus"))
            assert not lse_cpus & others, f"LSE's CPU {lse_cpus} is shared with {cls} ({others})"


def _millicpu(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def test_example_pods_run_with_their_class_values(node):
    pods = example_pods()
    for cls in FIRST_ROUND:
        node.create_pod(pods[cls])
    for cls in FIRST_ROUND:
        node.client().wait_pod_phase(pods[cls]["metadata"]["name"], "Running", timeout=120)
    check_class_values(node, FIRST_ROUND)
