"""koordnode against Koordinator's own control plane: the real koord-manager v1.8.0 (built from its
Go module, tests/testbed/koord_bed.py) renders the NodeSLO from ``slo-controller-config`` and
koordnode's ClusterLink takes it, as the daemon does (koordnode.config.with_nodeslo below a local
file). Every CRD, the namespace, the priority classes and koord-manager's RBAC come from the module.

The NodeSLO koord-manager renders holds every field of Koordinator's defaults besides what the
ConfigMap sets, so these tests see exactly what a Koordinator cluster sends a node.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kube_cluster_support import Node, _start, _stop, koordinator_plane
from testbed.koord_bed import NAMESPACE, SCHEDULER_NAME, KoordManager, KoordScheduler
from testbed.kube_bed import ControlPlane
from testbed.real_node import NODE_NAMES

from koordnode.kube.agent import NODEMETRICS, NODESLOS
from koordnode.kube.nodemetric import MetricRequest, PodUsage, aggregated_usages, node_metric_status
from koordnode.config.classes import QoSConfig
from koordnode.model.annotations import BATCH_CPU, BATCH_MEMORY, EXTENDED_RESOURCE_SPEC
from koordnode.model.qos_class import resolve_qos_class
from koordnode.policy.class_inputs import ContainerInput, ContainerResources, KernelFeatures, PodInput
from koordnode.policy.container_policy import plan_container

NODE = NODE_NAMES[0]
CONFIGMAP = f"/api/v1/namespaces/{NAMESPACE}/configmaps/slo-controller-config"
RENDER_BOUND_S = 60.0
DEGRADE_MINUTES = 1
CPU_RECLAIM_PERCENT, MEMORY_RECLAIM_PERCENT = 60, 65  # colocation-config's defaults in v1.8.0
NODE_CPUS, NODE_MEMORY = 2, 8 << 30  # koord-manager's first rendering after its start, on a loaded CI machine

# Shaped like the examples of Koordinator's QoS guide: CPU suppress by threshold, memory QoS for
# LS and LSR (LSR's throttlingPercent 120, above the limit), group identity per class.
THRESHOLD = {"clusterStrategy": {"enable": True, "cpuSuppressThresholdPercent": 60, "cpuSuppressPolicy": "cfsQuota",
                                 "memoryEvictThresholdPercent": 70}}
QOS = {"clusterStrategy": {
    "lsrClass": {"cpuQOS": {"enable": True, "groupIdentity": 2},
                 "memoryQOS": {"enable": True, "minLimitPercent": 100, "lowLimitPercent": 0, "throttlingPercent": 120,
                               "wmarkRatio": 95, "wmarkScalePermill": 20, "wmarkMinAdj": -25}},
    "lsClass": {"cpuQOS": {"enable": True, "groupIdentity": 2},
                "memoryQOS": {"enable": True, "minLimitPercent": 0, "lowLimitPercent": 80, "throttlingPercent": 90,
                              "wmarkRatio": 95, "wmarkScalePermill": 20, "wmarkMinAdj": -25}},
    "beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1},
                "memoryQOS": {"enable": True, "minLimitPercent": 0, "lowLimitPercent": 0, "throttlingPercent": 80,
                              "wmarkRatio": 95, "wmarkScalePermill": 20, "wmarkMinAdj": 50}}}}


# The guide's CPU burst and system examples, and a host application as its colocation guide has one.
CPU_BURST = {"clusterStrategy": {"policy": "auto", "cpuBurstPercent": 1000, "cfsQuotaBurstPercent": 300,
                                 "sharePoolThresholdPercent": 50, "cfsQuotaBurstPeriodSeconds": -1}}
SYSTEM = {"clusterStrategy": {"minFreeKbytesFactor": 100, "watermarkScaleFactor": 150}}
HOST_APPLICATIONS = {"applications": [{"name": "nginx", "priority": "koord-prod", "qos": "LS", "cgroupPath": {
    "base": "CgroupRoot", "parentDir": "host-latency-sensitive/", "relativePath": "nginx/"}}]}


def slo_configmap(threshold: dict[str, Any], qos: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "slo-controller-config", "namespace": NAMESPACE}, "data": {
        # degradeTimeMinutes 1: how long a NodeMetric may go without an update before koord-manager
        # takes the node's batch resources away (15 by default), so the test can see it happen.
        "colocation-config": json.dumps({"enable": True, "degradeTimeMinutes": DEGRADE_MINUTES}),
        "resource-threshold-config": json.dumps(threshold),
        "resource-qos-config": json.dumps(qos),
        "cpu-burst-config": json.dumps(CPU_BURST),
        "system-config": json.dumps(SYSTEM),
        "host-application-config": json.dumps(HOST_APPLICATIONS)}}


@pytest.fixture(scope="module")
def koordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, KoordManager]]:
    workdir = tmp_path_factory.mktemp("koordinator")
    with koordinator_plane(workdir, NODE, NODE_CPUS, NODE_MEMORY) as cp:
        cp.client().create(f"/api/v1/namespaces/{NAMESPACE}/configmaps", slo_configmap(THRESHOLD, QOS))
        with KoordManager(cp, workdir / "koord-manager") as manager:
            yield cp, manager


def _rendered(cp: ControlPlane, predicate: Any) -> dict[str, Any] | None:
    admin = cp.client()
    path = f"{NODESLOS}/{NODE}"
    if not admin.exists(path):
        return None
    nodeslo = admin.get(path)
    return nodeslo if predicate(nodeslo.get("spec", {})) else None


def test_koord_manager_renders_the_guides_nodeslo_and_koordnode_applies_all_of_it(
        koordinator: tuple[ControlPlane, KoordManager], tmp_path: Path) -> None:
    cp, manager = koordinator
    admin = cp.client()
    nodeslo = admin.wait_for("koord-manager's NodeSLO", lambda: _rendered(cp, lambda spec: (
        spec.get("resourceQOSStrategy", {}).get("lsrClass", {}).get("memoryQOS", {}).get("throttlingPercent") == 120)),
        timeout=RENDER_BOUND_S)
    print(f"koord-manager rendered: {json.dumps(nodeslo['spec'])[:3000]}")
    node = Node(cp, tmp_path, NODE)
    latency: list[float] = []

    async def scenario() -> None:
        stop, tasks = await _start(node)
        try:
            await node.wait("the rendered NodeSLO", lambda: node.link.nodeslo_status.get("state", "").startswith(
                "applied"), timeout=30)
            # The edit of the ConfigMap to the value in koordnode's config: koord-manager's watch and
            # rendering, the NodeSLO watch, the mapping and the config's validation.
            edited = admin.get(CONFIGMAP)
            edited["data"]["resource-threshold-config"] = json.dumps(
                {"clusterStrategy": {**THRESHOLD["clusterStrategy"], "cpuSuppressThresholdPercent": 55}})
            started = time.monotonic()
            await asyncio.to_thread(admin.request, "PUT", CONFIGMAP, edited)
            await node.wait("the ConfigMap edit", lambda: node.config.strategy.cpu_suppress.threshold_percent == 55,
                            timeout=RENDER_BOUND_S)
            latency.append(time.monotonic() - started)
        finally:
            await _stop(stop, tasks)

    asyncio.run(scenario())
    print(f"ConfigMap edit -> koord-manager's NodeSLO -> koordnode's config: {latency[0] * 1000:.0f} ms")
    status = node.link.nodeslo_status
    print(f"koordnode: {json.dumps({k: status[k] for k in ('state', 'not_applied', 'ignored')}, indent=1)}")
    assert "last_refused" not in status, status
    assert status["state"] == "applied" and status["not_applied"] == [], status["not_applied"]
    config = node.config
    assert config.qos.LSR.memory_qos and config.qos.LSR.memory_min_percent == 100
    assert config.qos.LSR.memory_high_percent == 120  # Koordinator's meaning: above the limit
    assert config.qos.LSE.memory_min_percent == 100  # Koordinator's LSE pods take lsrClass
    assert config.qos.LS.memory_low_percent == 80 and config.qos.LS.memory_high_percent == 90
    assert config.qos.BE.memory_high_percent == 80 and config.qos.BE.memory_wmark_min_adj == 50
    assert config.strategy.be_evict.memory_threshold_percent == 70
    # The rendered threshold holds in koordnode's idle BE group too (Koordinator's meaning).
    assert config.strategy.cpu_suppress.idle_group_threshold_percent == 55
    assert not any("throttlingPercent" in line for line in status["ignored"])
    # cpu-burst-config, system-config and host-application-config, rendered and taken
    assert config.strategy.cpu_burst.enable and config.strategy.cpu_burst.cfs_quota_burst
    assert config.strategy.cpu_burst.max_quota_percent == 300
    assert config.strategy.memory_qos.watermark_scale_factor == 150
    nginx = config.host_applications["nginx"]
    assert (nginx.qos, nginx.priority, nginx.cgroup) == ("LS", "koord-prod", "host-latency-sensitive/nginx")
    assert manager.running, manager.tail()


def _batch(cp: ControlPlane) -> dict[str, str]:
    allocatable = cp.client().get(f"/api/v1/nodes/{NODE}")["status"].get("allocatable", {})
    return {k: v for k, v in allocatable.items() if k.startswith("kubernetes.io/batch-")}


def test_koord_manager_puts_batch_resources_on_the_node_from_koordnodes_node_metric_and_takes_them_away(
        koordinator: tuple[ControlPlane, KoordManager], tmp_path: Path) -> None:
    """Koordinator's default policy ("usage"), as koord-manager v1.8.0 computes it:
    batch = capacity - capacity x (100 - reclaim %) / 100 - max(system used, kubelet reserved)
    - used by high-priority pods (here a prod pod koordnode reports and the API does not list).
    A NodeMetric not updated for degradeTimeMinutes takes them away at koord-manager's next look."""
    import datetime

    cp, manager = koordinator
    admin = cp.client()
    node = Node(cp, tmp_path, NODE, nodeslo=False, pod_facts=False, node_metric=True)
    system_cpu, system_memory = 0.5, 1 << 30
    prod_cpu, prod_memory = 0.3, 512 << 20

    requests: list[MetricRequest] = []
    samples = [(float(t), 1.0 + (t % 10) / 10) for t in range(1800)]  # half an hour, a sample a second

    def measured(request: MetricRequest) -> dict[str, Any]:
        requests.append(request)
        return node_metric_status(node_cpu_cores=1.2, node_memory_bytes=3 << 30, system_cpu_cores=system_cpu,
                                  system_memory_bytes=system_memory,
                                  pods=[PodUsage("default", "web", "LS", 9100, prod_cpu, prod_memory),
                                        PodUsage("batch", "job", "BE", 5100, 0.4, 1 << 30)],
                                  now=datetime.datetime.now(datetime.UTC),
                                  aggregated_node=aggregated_usages(samples, samples, 1800.0,
                                                                    request.aggregate_durations_s),
                                  aggregated_system=aggregated_usages(samples, None, 1800.0,
                                                                      request.aggregate_durations_s))

    node.link._node_metric_status = measured  # type: ignore[method-assign]
    admin.wait_for("koord-manager's NodeMetric for the node", lambda: admin.exists(f"{NODEMETRICS}/{NODE}"),
                   timeout=RENDER_BOUND_S)
    assert asyncio.run(node.link.report_once()) > 0
    # koord-manager's NodeMetric asks for percentiles over 5, 10 and 30 minutes; the API server's
    # schema for them keeps every field koordnode sends
    assert requests[-1].aggregate_durations_s == (300, 600, 1800)
    stored = admin.get(f"{NODEMETRICS}/{NODE}")["status"]["nodeMetric"]
    assert [u["duration"] for u in stored["aggregatedNodeUsages"]] == ["5m0s", "10m0s", "30m0s"]
    assert stored["aggregatedNodeUsages"][2]["usage"]["p90"] == {"resources": {"cpu": "1800m", "memory": "1"}}
    assert stored["aggregatedSystemUsages"][0]["usage"]["avg"] == {"resources": {"cpu": "1450m"}}
    batch = admin.wait_for("batch resources on the node", lambda: _batch(cp), timeout=RENDER_BOUND_S)
    cpu_milli = NODE_CPUS * 1000
    want_cpu = cpu_milli - cpu_milli * (100 - CPU_RECLAIM_PERCENT) // 100 - round(system_cpu * 1000) - round(prod_cpu * 1000)
    want_memory = NODE_MEMORY - NODE_MEMORY * (100 - MEMORY_RECLAIM_PERCENT) // 100 - system_memory - prod_memory
    print(f"koord-manager: {batch}; the formula: batch-cpu {want_cpu}, batch-memory {want_memory}")
    assert abs(int(batch["kubernetes.io/batch-cpu"]) - want_cpu) <= 1, (batch, want_cpu)
    assert abs(int(batch["kubernetes.io/batch-memory"]) - want_memory) <= 4096, (batch, want_memory)
    _batch_pod_placed_by_koord_scheduler(cp, tmp_path, int(batch["kubernetes.io/batch-cpu"]))
    # koordnode stops reporting: after degradeTimeMinutes the next reconcile (kubelet's node
    # status updates trigger it on a real node; a label here) resets them
    time.sleep(DEGRADE_MINUTES * 60 + 5)
    admin.patch(f"/api/v1/nodes/{NODE}", {"metadata": {"labels": {"koordnode-test/touch": str(int(time.time()))}}})
    admin.wait_for("batch resources taken away", lambda: _batch(cp) in ({}, {
        "kubernetes.io/batch-cpu": "0", "kubernetes.io/batch-memory": "0"}), timeout=RENDER_BOUND_S)
    assert manager.running, manager.tail()


def batch_pod(name: str, cpu_milli: int, memory: str) -> dict[str, Any]:
    """A BE pod as Koordinator's users write one, what its webhook would add set by hand: batch
    resources in the spec and in the extended-resource-spec annotation koordnode reads."""
    amount = {BATCH_CPU: str(cpu_milli), BATCH_MEMORY: memory}
    spec = {"containers": {"main": {"requests": amount, "limits": amount}}}
    return {"metadata": {"name": name, "namespace": "default", "labels": {"koordinator.sh/qosClass": "BE"},
                         "annotations": {EXTENDED_RESOURCE_SPEC: json.dumps(spec)}},
            "spec": {"schedulerName": SCHEDULER_NAME, "priorityClassName": "koord-batch",
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": amount, "limits": amount}}]}}


def _batch_pod_placed_by_koord_scheduler(cp: ControlPlane, tmp_path: Path, batch_cpu_milli: int) -> None:
    """koord-scheduler places a BE pod on the batch allocatable koord-manager derived from
    koordnode's NodeMetric, refuses one larger than it, and koordnode's policy gives the placed
    one BE values from its batch resources."""
    admin = cp.client()
    scheduler = KoordScheduler(cp, tmp_path / "koord-scheduler").start()
    try:
        pods = "/api/v1/namespaces/default/pods"
        admin.create(pods, batch_pod("batch-fits", 200, "256Mi"))
        admin.create(pods, batch_pod("batch-too-big", batch_cpu_milli + 1000, "256Mi"))
        placed = admin.wait_for("the batch pod bound", lambda: (lambda pod: pod if pod["spec"].get("nodeName") == NODE
                                                                else None)(admin.get(f"{pods}/batch-fits")),
                                timeout=RENDER_BOUND_S)

        def refused() -> str | None:
            conditions = admin.get(f"{pods}/batch-too-big").get("status", {}).get("conditions") or []
            return next((c.get("message") for c in conditions if c.get("reason") == "Unschedulable"), None)

        message = admin.wait_for("the larger one refused", refused, timeout=RENDER_BOUND_S)
        print(f"koord-scheduler on the too large batch pod: {message}")
        assert BATCH_CPU in message and admin.get(f"{pods}/batch-too-big")["spec"].get("nodeName") is None
    except Exception:
        print(f"koord-scheduler log tail:{scheduler.tail()}")
        raise
    finally:
        scheduler.stop()
    meta = placed["metadata"]
    parent = f"/kubepods/besteffort/pod{meta['uid']}"
    pod_input = PodInput(uid=meta["uid"], name="batch-fits", namespace="default", labels=meta["labels"],
                         annotations=meta["annotations"], cgroup_parent=parent)
    decision = resolve_qos_class(meta["labels"], parent)
    plan = plan_container(pod_input, ContainerInput("main", ContainerResources(cpu_period=100000, cpu_shares=2)),
                          decision=decision, config=QoSConfig().for_class(decision.qos_class),
                          features=KernelFeatures("v1"), container_cgroup="/c")
    files = {w.resource: w.value for w in plan.writes}
    assert plan.qos_class.value == "BE"
    assert files["cpu.shares"] == 200 * 1024 // 1000 and files["cpu.cfs_quota_us"] == 20000  # from batch-cpu 200
    assert files["memory.limit_in_bytes"] == 256 << 20  # from batch-memory
