"""Batch pods end to end on a real node: koordnode (proxy or NRI mode, [kubernetes] on) behind a
real kubelet reports its NodeMetric, the real koord-manager v1.8 turns it into the Node's batch
allocatable, the real koord-scheduler places a BE pod written as Koordinator's users write one
(`koordinator.sh/qosClass: BE`, priority class koord-batch, `kubernetes.io/batch-cpu` /
`batch-memory` requests and limits, the extended-resource-spec annotation its webhook would add,
set by hand since the webhook is off) on that allocatable, kubelet admits and runs it, and
koordnode gives its container the BE values derived from those batch resources.

The batch allocatable is what koord-manager computes from this host's real use, which CI's own
builds raise: the test takes the CPU share of `cpuReclaimThresholdPercent` 100 (the most the
formula can give) and sizes the pod to what koord-manager offers, never to a fixed figure.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k8s_support import cg_read, require_component
from kube_cluster_support import kubeconfig_for, koordinator_plane
from test_k8s_node import _pod_cgroups, applied_values_hold
from testbed.images import BUSYBOX_IMAGE_REF
from testbed.koord_bed import NAMESPACE, SCHEDULER_NAME, KoordManager, KoordScheduler
from testbed.kube_bed import ControlPlane
from testbed.real_node import NODE_NAMES, real_node

from koordnode.model.annotations import BATCH_CPU, BATCH_MEMORY, EXTENDED_RESOURCE_SPEC
from koordnode.model.kernel import KUBELET_SHARES_PER_CPU
from koordnode.policy.class_values import batch_cpu_quota, clamp_shares

pytestmark = pytest.mark.e2e

NODE = NODE_NAMES[1]
BATCH_MEMORY_BYTES = 64 << 20
MAX_BATCH_CPU_MILLI = 500
OFFER_BOUND_S = 240.0  # NodeMetric every 10 s, koord-manager's reconcile, a busy host's windows


@pytest.fixture(scope="module")
def koordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, Path]]:
    require_component("containerd")
    workdir = tmp_path_factory.mktemp("kbatch")  # short: containerd's socket paths live under it
    with koordinator_plane(workdir, NODE) as cp:
        colocation = {"enable": True, "cpuReclaimThresholdPercent": 100, "memoryReclaimThresholdPercent": 100,
                      "metricReportIntervalSeconds": 10, "metricAggregateDurationSeconds": 10,
                      "updateTimeThresholdSeconds": 10}
        cp.client().create(f"/api/v1/namespaces/{NAMESPACE}/configmaps", {
            "metadata": {"name": "slo-controller-config", "namespace": NAMESPACE},
            "data": {"colocation-config": json.dumps(colocation)}})
        with KoordManager(cp, workdir / "koord-manager"), KoordScheduler(cp, workdir / "koord-scheduler"):
            yield cp, workdir


def _batch_cpu_offered(cp: ControlPlane) -> int:
    allocatable = cp.client().get(f"/api/v1/nodes/{NODE}").get("status", {}).get("allocatable", {})
    return int(allocatable.get(BATCH_CPU, "0") or 0)


def batch_pod(name: str, cpu_milli: int) -> dict[str, Any]:
    amount = {BATCH_CPU: str(cpu_milli), BATCH_MEMORY: str(BATCH_MEMORY_BYTES)}
    spec = {"containers": {"main": {"requests": amount, "limits": amount}}}
    return {"metadata": {"name": name, "labels": {"koordinator.sh/qosClass": "BE"},
                         "annotations": {EXTENDED_RESOURCE_SPEC: json.dumps(spec)}},
            "spec": {"schedulerName": SCHEDULER_NAME, "priorityClassName": "koord-batch",
                     "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": BUSYBOX_IMAGE_REF, "imagePullPolicy": "Never",
                                     "command": ["sleep", "3600"],
                                     "resources": {"requests": amount, "limits": amount}}]}}


@pytest.mark.parametrize("mode", ["proxy", "nri"])
def test_a_batch_pod_placed_by_koord_scheduler_runs_with_be_values_from_its_batch_resources(
        koordinator: tuple[ControlPlane, Path], mode: str) -> None:
    cp, workdir = koordinator
    kubeconfig = kubeconfig_for(cp, workdir / f"identity-{mode}", cp.tokens["koordnode"])
    toml = (f'[kubernetes]\nenable = true\nkubeconfig = "{kubeconfig}"\nnode_name = "{NODE}"\n'
            "node_topology = false\nbackoff_max_s = 2.0\n")
    admin = cp.client()
    if admin.exists(f"/api/v1/nodes/{NODE}"):  # the other mode's node: its batch allocatable is not this one's
        admin.delete(f"/api/v1/nodes/{NODE}")
    with real_node(workdir / mode, mode=mode, control_plane=cp, node_name=NODE, koordnode_toml=toml) as node:
        # Ready, yet with the not-ready taint the admission gave the new Node: no node controller
        # runs in the bed to take it away once kubelet reports Ready, so the test does
        admin.patch(f"/api/v1/nodes/{NODE}", {"spec": {"taints": None}})
        deadline = time.monotonic() + OFFER_BOUND_S
        while (offered := _batch_cpu_offered(cp)) <= 0 and time.monotonic() < deadline:
            time.sleep(2)
        metric = admin.get(f"/apis/slo.koordinator.sh/v1alpha1/nodemetrics/{NODE}").get("status", {})
        print(f"{mode}: koord-manager offers batch-cpu {offered}m from koordnode's NodeMetric "
              f"{json.dumps(metric.get('nodeMetric', {}))[:300]}")
        assert offered > 0, f"no batch-cpu on {NODE} after {OFFER_BOUND_S:.0f} s; NodeMetric {metric}"
        # the NodeMetric as koordlet fills it, prodReclaimableMetric in the CRD's shape (kept, not pruned)
        assert {"nodeMetric", "podsMetric", "prodReclaimableMetric"} <= set(metric), metric.keys()
        cpu_milli = min(offered, MAX_BATCH_CPU_MILLI)
        name = f"batch-{mode}"
        admin.create(f"/api/v1/namespaces/{node.namespace}/pods", batch_pod(name, cpu_milli))
        try:
            pod = node.wait_running(name, timeout=120)
        except TimeoutError:
            print(f"{mode}: {name}: {json.dumps(admin.get(f'/api/v1/namespaces/{node.namespace}/pods/{name}')['status'])}; "
                  f"node allocatable {admin.get(f'/api/v1/nodes/{NODE}')['status']['allocatable']}")
            raise
        assert pod["spec"]["nodeName"] == NODE  # koord-scheduler bound it
        pod_cgroup, container_cgroup = _pod_cgroups(node, pod)
        assert "/koordnode_be/" in pod_cgroup, pod_cgroup  # BE: in koordnode's idle BE group
        shares = clamp_shares(cpu_milli * KUBELET_SHARES_PER_CPU // 1000)
        quota = batch_cpu_quota(cpu_milli, 100000)
        assert (cg_read("cpu", container_cgroup, "cpu.shares"), cg_read("cpu", container_cgroup, "cpu.cfs_quota_us"),
                cg_read("memory", container_cgroup, "memory.limit_in_bytes")) == (
            str(shares), str(quota), str(BATCH_MEMORY_BYTES)), f"{mode}: batch-cpu {cpu_milli}m"
        wrong = applied_values_hold(node, pod["metadata"]["uid"])
        assert not wrong, wrong
        print(f"{mode}: {name} on {NODE} with batch-cpu {cpu_milli}m: cpu.shares {shares}, "
              f"cfs_quota_us {quota}, memory limit {BATCH_MEMORY_BYTES}")
