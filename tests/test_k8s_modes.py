"""The real kubelet in koordnode's other set-ups: standalone (no API server, static pods, kubelet's
default feature gates) and with koordnode as containerd's NRI plugin instead of a proxy.
tests/test_k8s_node.py has the proxy mode with an API server in full."""

from __future__ import annotations

import time

import pytest

from k8s_support import cg_dir, cg_read, control_plane, example_pods, find_pod_cgroup, require_component  # noqa: F401
from koordnode.cri.kubelet_calls import STATS_GATE
from test_k8s_node import (
    FIRST_ROUND,
    STATS_FROM_CRI,
    _pod_cgroups,
    _pods_by_class,
    _summary_by_pod,
    applied_values_hold,
    check_class_values,
    resize_ls_to_700m_and_check,
    run_example_pods,
)
from testbed.real_node import NODE_NAMES, real_node

pytestmark = pytest.mark.e2e


def test_standalone_kubelet_runs_static_pods_with_their_class_values(tmp_path):
    """kubelet without an API server (static pods) behind koordnode, with kubelet's default
    feature gates: the pods get their class values, and koordnode's status warns that kubelet
    takes pod stats from cadvisor while BE pods live in koordnode's group."""
    require_component("kubernetes")
    require_component("containerd")
    pods = example_pods()
    with real_node(tmp_path, node_name=NODE_NAMES[3]) as node:
        for cls in ("SYSTEM", "LS", "BE"):
            node.kubelet.add_static_pod(cls.lower(), pods[cls])

        def running():
            items = node.kubelet.get("/pods").get("items") or []  # null until kubelet has a pod
            phases = {p["metadata"]["labels"]["koordinator.sh/qosClass"]: p.get("status", {}).get("phase")
                      for p in items}
            return items if phases == {"SYSTEM": "Running", "LS": "Running", "BE": "Running"} else None
        deadline = time.monotonic() + 120
        while not running() and time.monotonic() < deadline:
            time.sleep(1)
        items = running()
        assert items, node.kubelet.get("/pods")
        for pod in items:
            cls = pod["metadata"]["labels"]["koordinator.sh/qosClass"]
            uid = pod["metadata"]["uid"]
            assert ("/koordnode_be/" in find_pod_cgroup(node.kubepods, uid)) == (cls == "BE")
            assert not applied_values_hold(node, uid), cls
        node.kubelet.stats_summary()  # kubelet's stats calls, as its eviction manager makes them
        view = node.koordnode.status()["kubelet"]
        assert view["pod_stats_from"] == "cadvisor"
        assert STATS_GATE in view["note"]


@pytest.fixture(scope="module")
def nri_node(control_plane, tmp_path_factory):  # noqa: F811
    require_component("containerd")
    with real_node(tmp_path_factory.mktemp("k8s-nri"), mode="nri", control_plane=control_plane,
                   node_name=NODE_NAMES[3], namespace="nri", feature_gates=STATS_FROM_CRI) as node:
        yield node


def test_nri_mode_behind_the_real_kubelet_gives_the_same_class_values(nri_node):
    run_example_pods(nri_node, FIRST_ROUND)
    check_class_values(nri_node, FIRST_ROUND)
    assert nri_node.koordnode.status()["kubelet"] is None  # kubelet's calls do not pass through koordnode


def test_nri_mode_resize_through_the_api(nri_node):
    resize_ls_to_700m_and_check(nri_node)


def test_nri_mode_kubelet_reports_the_resources_it_allocated(nri_node):
    """What containerd reports in ContainerStatus (kubelet's status.containerStatuses[].resources)
    comes from the spec, which NRI adjustments change: the class weights are never adjusted."""
    for cls, pod in _pods_by_class(nri_node, FIRST_ROUND).items():
        status = pod["status"]["containerStatuses"][0]
        allocated = status.get("allocatedResources", {})
        reported = status.get("resources", {}).get("requests", {})
        assert {k: reported.get(k) for k in allocated} == allocated, (cls, reported, allocated)


def test_nri_mode_be_containers_run_in_the_group_and_kubelet_counts_them(nri_node):
    """NRI mode places the BE pod's containers in koordnode's idle group (CreateContainer's
    cgroups path); kubelet's own pod cgroup keeps the sandbox. kubelet's container stats come from
    containerd, which reads each container's real cgroup, so the busy BE container is counted (its
    eviction manager ranks pods by their containers' memory). Its pod-level figures are read from
    the sandbox's cgroup parent, kubelet's: docs/operations.md says so."""
    pods = _pods_by_class(nri_node, FIRST_ROUND)
    be = pods["BE"]
    uid = be["metadata"]["uid"]
    pod_cg, container_cg = _pod_cgroups(nri_node, be)
    assert pod_cg == f"{nri_node.kubepods}/koordnode_be/pod{uid}", pod_cg
    kubelet_pod_cg = f"{nri_node.kubepods}/besteffort/pod{uid}"
    assert [d.name for d in cg_dir("cpu", kubelet_pod_cg).iterdir() if d.is_dir()], "the sandbox's cgroup"
    assert cg_read("cpu", f"{nri_node.kubepods}/besteffort", "cpu.idle") == "0"
    by_name = _summary_by_pod(nri_node, [p["metadata"]["name"] for p in pods.values()])
    container = by_name[be["metadata"]["name"]]["containers"][0]
    assert container["memory"]["workingSetBytes"] > 0, container
    assert container["cpu"]["usageNanoCores"] > 0, container  # the busy loop, in the group
    pod_level = by_name[be["metadata"]["name"]]["cpu"]
    print(f"BE pod-level CPU in kubelet's summary (the sandbox's cgroup): {pod_level}; container: {container['cpu']}")
    status = next(p for p in nri_node.koordnode.status()["pods"] if p["uid"] == uid)
    assert status["cgroup_parent"].endswith(f"/koordnode_be/pod{uid}"), status
