"""QoS policy: every class x every resource x cgroup v1/v2, BE batch resources, overrides, bad input."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordnode.policy.plan import CgroupWrite
from koordnode.executor.resources import get_resource
from koordnode.model.annotations import BATCH_CPU, BATCH_MEMORY, EXTENDED_RESOURCE_SPEC, MEMORY_QOS
from koordnode.model.cpu_topology import CpuTopology
from koordnode.policy.cpuset import CpusetAllocator
from koordnode.policy.class_inputs import ContainerInput, ContainerResources, KernelFeatures, PodInput
from koordnode.policy.class_values import (
    MEMORY_HIGH_MAX,
    CriOverrides,
    MemoryProtection,
    batch_cpu_quota,
    cpu_shares_for,
)
from koordnode.model.kernel import PAGE_SIZE
from support.koordinator_formulas import koordinator_memory_high
from koordnode.policy.container_policy import REPORTED_BY_RUNTIME, allocate_cpuset, plan_container, requested_cpus
from koordnode.policy.pod_policy import (
    plan_besteffort_tier,
    plan_pod_cpu_weight,
    plan_pod_memory,
    plan_pod_resources,
    plan_pod_sandbox,
)
from koordnode.model.qos_class import QOS_CLASS_LABEL, QoSClass, resolve_qos_class
from koordnode.config.classes import MIB, QoSConfig
from koordnode.config.node import NodeConfig

GIB = 1024 * MIB
UID = "1234"
GUARANTEED_PARENT = f"/kubepods/pod{UID}"
BURSTABLE_PARENT = f"/kubepods/burstable/pod{UID}"
BESTEFFORT_PARENT = f"/kubepods/besteffort/pod{UID}"
CONTAINER_CGROUP = f"{GUARANTEED_PARENT}/abc"
QOS = QoSConfig()
TOPOLOGY = CpuTopology.describe(sockets=1, numa_per_socket=2, cores_per_numa=4, threads_per_core=2)


def pod_of(
    qos_class: QoSClass | None, parent: str = GUARANTEED_PARENT, annotations: dict | None = None
) -> PodInput:
    labels = {QOS_CLASS_LABEL: qos_class.value} if qos_class else {}
    return PodInput(
        uid=UID, name="p", namespace="ns", labels=labels, annotations=annotations or {}, cgroup_parent=parent
    )


def plan(
    pod: PodInput,
    resources: ContainerResources,
    version: str = "v1",
    *,
    name: str = "main",
    cpuset=None,
    node: NodeConfig | None = None,
    container_cgroup: str | None = CONTAINER_CGROUP,
):
    decision = resolve_qos_class(pod.labels, pod.cgroup_parent)
    return plan_container(
        pod,
        ContainerInput(name=name, resources=resources, id="abc"),
        decision=decision,
        config=QOS.for_class(decision.qos_class),
        features=KernelFeatures(version),
        cpuset=cpuset,
        node=node,
        container_cgroup=container_cgroup,
    )


def by_resource(writes) -> dict[tuple[str, str], object]:
    result = {}
    for write in writes:
        assert isinstance(write, CgroupWrite)
        assert write.reason, write
        # Every planned value is one the executor accepts.
        get_resource(write.resource).validate(write.value)
        key = (write.cgroup, write.resource)
        if write.resource.startswith("blkio.throttle."):
            # One write per device ("MAJ:MIN value") to the same file.
            key = (write.cgroup, write.resource, str(write.value).split()[0])
        assert key not in result, f"duplicate write {key}"
        result[key] = write.value
    return result


def file_values(result) -> dict[str, object]:
    """The class values of the fields kubelet reads back from the runtime (REPORTED_BY_RUNTIME):
    written to the container's cgroup file, and never put into the CRI request."""
    assert all(getattr(result.cri, f) is None for f in ("cpu_shares", "cpu_quota", "cpu_period",
                                                        "memory_limit_in_bytes")), result.cri
    assert not any(w.resource in REPORTED_BY_RUNTIME for w in result.cri_mirror)
    return {resource: value for (cgroup, resource), value in by_resource(result.writes).items()
            if resource in REPORTED_BY_RUNTIME and cgroup == CONTAINER_CGROUP}


# Two requested CPUs (kubelet shares 2048), 1 GiB limit, Guaranteed: request = limit.
TWO_CPUS_1G = ContainerResources(
    cpu_period=100000, cpu_quota=200000, cpu_shares=2048, memory_limit_in_bytes=GIB, oom_score_adj=-997
)

# class -> (cpu.shares, oom_score_adj, memory.min, memory.low, memory.high) for TWO_CPUS_1G; None = not set.
EXPECTED = {
    QoSClass.SYSTEM: (65536, -1000, None, None, None),
    QoSClass.LSE: (
        262144,
        -900,
        GIB,
        GIB,
        GIB,
    ),  # 2 x 262144 clamped; low 1.2x capped at the limit; memory.high: request = limit
    QoSClass.LSR: (131072, -700, GIB * 80 // 100, GIB, GIB),
    QoSClass.LS: (2048, -300, GIB // 2, GIB * 80 // 100, GIB),
    QoSClass.BE: (2, 1000, 0, 0, GIB),
}



@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("qos_class", list(QoSClass))
def test_container_values_per_class_and_cgroup_version(qos_class: QoSClass, version: str) -> None:
    shares, oom, memory_min, memory_low, memory_high = EXPECTED[qos_class]
    allocator = CpusetAllocator(TOPOLOGY, reserved={0, 8})
    cpuset = allocator.allocate("abc", qos_class, requested_cpus(TWO_CPUS_1G))
    result = plan(pod_of(qos_class), TWO_CPUS_1G, version, cpuset=cpuset)

    assert result.qos_class is qos_class
    # kubelet's quota and limit are left alone (no batch resources here).
    assert file_values(result) == {"cpu.shares": shares}
    assert result.cri.oom_score_adj == oom
    assert result.cri.cpuset_cpus == cpuset.cpuset_cpus
    assert result.cri.cpuset_mems is None  # only with cpuset_mems_follow_cpus
    if qos_class in (QoSClass.LSE, QoSClass.LSR):
        assert cpuset.exclusive and len(cpuset.cpus) == 2
    elif qos_class is QoSClass.BE:
        assert cpuset.cpus == allocator.be_pool()
    else:
        assert cpuset.cpus == allocator.share_pool()

    writes = by_resource(result.writes)
    mirror = by_resource(result.cri_mirror)
    assert mirror[(CONTAINER_CGROUP, "cpuset.cpus")] == cpuset.cpuset_cpus
    memory = {"memory.min": memory_min, "memory.low": memory_low, "memory.high": memory_high}
    for resource, value in memory.items():
        if value is None:
            assert resource not in result.cri.unified
            assert (CONTAINER_CGROUP, resource) not in writes
        elif version == "v2":
            # Carried by CRI in `unified`, mirrored for reconcile, not written directly.
            assert result.cri.unified[resource] == str(value)
            assert mirror[(CONTAINER_CGROUP, resource)] == value
            assert (CONTAINER_CGROUP, resource) not in writes
        else:
            # v1 runtimes reject `unified`: the executor writes them (Anolis files).
            assert result.cri.unified == {}
            assert writes[(CONTAINER_CGROUP, resource)] == value
    if memory_min is not None:
        assert result.memory == MemoryProtection(True, GIB, GIB, memory_min, memory_low, memory_high)
        assert writes[(CONTAINER_CGROUP, "memory.wmark_ratio")] == 95
        assert writes[(CONTAINER_CGROUP, "memory.wmark_scale_factor")] == 20
        assert writes[(CONTAINER_CGROUP, "memory.wmark_min_adj")] == (50 if qos_class is QoSClass.BE else -25)
    else:
        assert not result.memory.enabled
        assert not any(resource.startswith("memory.") for _, resource in writes)


# class -> (cpu.idle, cpu.bvt_warp_ns, blkio.weight or None, throttled)
POD_EXPECTED = {
    QoSClass.SYSTEM: (0, 0, None, False),
    QoSClass.LSE: (0, 0, 1000, False),
    QoSClass.LSR: (0, 0, 800, False),
    QoSClass.LS: (0, 0, 500, False),
    QoSClass.BE: (0, -1, 100, True),  # [qos.BE] cpu_idle = 0 by default (docs/design/2026-11-ls-latency.md, wake placement)
}


@pytest.mark.parametrize("group_identity", [False, True])
@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("qos_class", list(QoSClass))
def test_pod_sandbox_values(qos_class: QoSClass, version: str, group_identity: bool) -> None:
    idle, bvt, weight, throttled = POD_EXPECTED[qos_class]
    pod = pod_of(qos_class)
    decision = resolve_qos_class(pod.labels, pod.cgroup_parent)
    result = plan_pod_sandbox(
        pod,
        decision=decision,
        config=QOS.for_class(qos_class),
        features=KernelFeatures(version, group_identity=group_identity),
        pod_cgroup=GUARANTEED_PARENT,
        node=NodeConfig(blkio_devices=("8:0", "8:16")),
    )
    writes = by_resource(result.writes)
    if group_identity:
        assert writes[(GUARANTEED_PARENT, "cpu.bvt_warp_ns")] == bvt
        assert (GUARANTEED_PARENT, "cpu.idle") not in writes
    else:
        assert writes[(GUARANTEED_PARENT, "cpu.idle")] == idle
        assert (GUARANTEED_PARENT, "cpu.bvt_warp_ns") not in writes
    assert writes.get((GUARANTEED_PARENT, "blkio.weight")) == weight
    read_throttles = [w.value for w in result.writes if w.resource == "blkio.throttle.read_bps_device"]
    write_throttles = [w.value for w in result.writes if w.resource == "blkio.throttle.write_bps_device"]
    if throttled:
        assert read_throttles == [f"8:0 {500 * MIB}", f"8:16 {500 * MIB}"]
        assert write_throttles == [f"8:0 {200 * MIB}", f"8:16 {200 * MIB}"]
    else:
        assert read_throttles == write_throttles == []
    has_wmark = (GUARANTEED_PARENT, "memory.wmark_ratio") in writes
    assert has_wmark == (qos_class is not QoSClass.SYSTEM)


def test_throttle_without_devices_is_noted() -> None:
    pod = pod_of(QoSClass.BE, BESTEFFORT_PARENT)
    decision = resolve_qos_class(pod.labels, pod.cgroup_parent)
    result = plan_pod_sandbox(
        pod, decision=decision, config=QOS.BE, features=KernelFeatures(), pod_cgroup=BESTEFFORT_PARENT
    )
    assert not any(w.resource.startswith("blkio.throttle") for w in result.writes)
    assert any("blkio_devices" in note for note in result.notes)


# --- CPU shares --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("qos_class", "kubelet_shares", "expected"),
    [
        (QoSClass.LS, 512, 512),  # half a CPU
        (QoSClass.LS, 2, 2),  # kubelet's minimum (no request)
        (QoSClass.LS, 0, 2),  # nothing sent: clamped up
        (QoSClass.LS, 1000000, 262144),  # clamped down
        (QoSClass.LSR, 512, 32768),
        (QoSClass.LSE, 1024, 262144),
        (QoSClass.LSE, 2, 512),
        (QoSClass.SYSTEM, 100, 3200),
        (QoSClass.BE, 4096, 2),  # fixed
    ],
)
def test_cpu_shares(qos_class: QoSClass, kubelet_shares: int, expected: int) -> None:
    shares, reason = cpu_shares_for(qos_class, QOS.for_class(qos_class), kubelet_shares)
    assert shares == expected
    assert str(expected) in reason


@pytest.mark.parametrize(
    ("resources", "cpus"),
    [
        (ContainerResources(cpu_quota=200000, cpu_period=100000, cpu_shares=2048), 2),
        (ContainerResources(cpu_quota=150000, cpu_period=100000), 2),
        (ContainerResources(cpu_quota=50000), 1),
        (ContainerResources(cpu_shares=1536), 2),
        (ContainerResources(cpu_shares=2), 0),
        (ContainerResources(), 0),
    ],
)
def test_requested_cpus(resources: ContainerResources, cpus: int) -> None:
    assert requested_cpus(resources) == cpus


# --- BE batch resources ------------------------------------------------------------------


def batch_annotation(containers: dict) -> dict[str, str]:
    return {EXTENDED_RESOURCE_SPEC: json.dumps({"containers": containers})}


BATCH = batch_annotation(
    {
        "main": {
            "requests": {BATCH_CPU: "1500", BATCH_MEMORY: "1Gi"},
            "limits": {BATCH_CPU: "2000", BATCH_MEMORY: "2Gi"},
        },
        "side": {"requests": {BATCH_CPU: "500"}, "limits": {BATCH_CPU: "5"}},
    }
)
BE_RESOURCES = ContainerResources(cpu_period=100000, cpu_shares=2, oom_score_adj=1000)
IDLE_BE = dataclasses.replace(QOS.BE, cpu_idle=1)  # the idle BE pod, no longer the default


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_be_batch_container(version: str) -> None:
    result = plan(pod_of(None, BESTEFFORT_PARENT, BATCH), BE_RESOURCES, version)
    assert result.qos_class is QoSClass.BE
    assert file_values(result) == {"cpu.shares": 1500 * 1024 // 1000, "cpu.cfs_quota_us": 200000,
                                   "cpu.cfs_period_us": 100000, "memory.limit_in_bytes": 2 * GIB}
    assert result.memory.high_bytes == koordinator_memory_high(GIB, 2 * GIB, 70)  # the batch request and limit
    periods = [w.resource for w in result.writes if w.resource.startswith("cpu.cfs_")]
    assert periods == ["cpu.cfs_period_us", "cpu.cfs_quota_us"]  # the period the quota is for first


def test_be_batch_quota_floor_and_period() -> None:
    result = plan(pod_of(None, BESTEFFORT_PARENT, BATCH), ContainerResources(cpu_period=50000), name="side")
    # 5m x 50000 / 1000 = 250 -> floor 1000 µs; no batch-memory limit
    assert file_values(result) == {"cpu.shares": 512, "cpu.cfs_quota_us": 1000, "cpu.cfs_period_us": 50000}


def test_be_batch_unlimited_and_formulas() -> None:
    assert batch_cpu_quota(None, 100000) == -1
    assert batch_cpu_quota(0, 100000) == -1
    assert batch_cpu_quota(2500, 100000) == 250000
    assert batch_cpu_quota(10**18, 100000) == (1 << 44) - 1
    annotations = batch_annotation({"main": {"requests": {BATCH_CPU: "1M"}}})
    result = plan(pod_of(QoSClass.BE, BESTEFFORT_PARENT, annotations), BE_RESOURCES)
    # 1000 CPUs clamped
    assert file_values(result) == {"cpu.shares": 262144, "cpu.cfs_quota_us": -1, "cpu.cfs_period_us": 100000}


def test_be_container_missing_from_spec_gets_fixed_shares() -> None:
    result = plan(pod_of(None, BESTEFFORT_PARENT, BATCH), BE_RESOURCES, name="other")
    assert file_values(result) == {"cpu.shares": 2}
    assert any("no batch resources for container 'other'" in note for note in result.notes)


def test_batch_annotation_ignored_for_non_be() -> None:
    result = plan(pod_of(QoSClass.LS, BURSTABLE_PARENT, BATCH), ContainerResources(cpu_shares=1024))
    assert file_values(result) == {"cpu.shares": 1024}


def test_be_pod_sandbox_batch_sums() -> None:
    pod = pod_of(None, BESTEFFORT_PARENT, BATCH)
    decision = resolve_qos_class(pod.labels, pod.cgroup_parent)
    # With group identity the pod is not an idle group, so its weight can be set.
    result = plan_pod_sandbox(
        pod,
        decision=decision,
        config=QOS.BE,
        features=KernelFeatures("v2", True),
        pod_cgroup=BESTEFFORT_PARENT,
    )
    writes = by_resource(result.writes)
    assert writes[(BESTEFFORT_PARENT, "cpu.shares")] == 2000 * 1024 // 1000
    # The default BE pod (cpu_idle = 0) is not idle either: it gets its batch cpu.shares.
    for version in ("v1", "v2"):
        plain = plan_pod_sandbox(
            pod, decision=decision, config=QOS.BE, features=KernelFeatures(version), pod_cgroup=BESTEFFORT_PARENT
        )
        plain_writes = by_resource(plain.writes)
        assert plain_writes[(BESTEFFORT_PARENT, "cpu.idle")] == 0, version
        assert plain_writes[(BESTEFFORT_PARENT, "cpu.shares")] == 2000 * 1024 // 1000, version
        assert not any("idle" in note for note in plain.notes), version
    # With cpu_idle = 1 configured the kernel refuses cpu.shares: not planned, and said why.
    idle = plan_pod_sandbox(
        pod, decision=decision, config=IDLE_BE, features=KernelFeatures("v2"), pod_cgroup=BESTEFFORT_PARENT
    )
    assert (BESTEFFORT_PARENT, "cpu.shares") not in by_resource(idle.writes)
    assert by_resource(idle.writes)[(BESTEFFORT_PARENT, "cpu.idle")] == 1
    assert any("idle" in note for note in idle.notes)
    assert writes[(BESTEFFORT_PARENT, "cpu.cfs_quota_us")] == 200500
    assert writes[(BESTEFFORT_PARENT, "cpu.cfs_period_us")] == 100000
    # "side" has no batch-memory limit: the pod is not limited.
    assert (BESTEFFORT_PARENT, "memory.limit_in_bytes") not in writes
    assert any("batch-memory" in note for note in result.notes)

    limited = batch_annotation(
        {
            "a": {"limits": {BATCH_MEMORY: "1Gi"}},
            "b": {"limits": {BATCH_CPU: "1000", BATCH_MEMORY: "512Mi"}},
        }
    )
    pod = pod_of(None, BESTEFFORT_PARENT, limited)
    result = plan_pod_sandbox(
        pod, decision=decision, config=QOS.BE, features=KernelFeatures("v2"), pod_cgroup=BESTEFFORT_PARENT
    )
    writes = by_resource(result.writes)
    assert writes[(BESTEFFORT_PARENT, "memory.limit_in_bytes")] == GIB + 512 * MIB
    assert writes[(BESTEFFORT_PARENT, "cpu.cfs_quota_us")] == -1  # "a" has no cpu limit
    assert writes[(BESTEFFORT_PARENT, "cpu.shares")] == 2  # no batch-cpu request: BE's fixed shares


@pytest.mark.parametrize("group_identity", [False, True])
def test_a_be_pod_gets_the_class_weight_unless_idle(group_identity: bool) -> None:
    # A Burstable pod labelled BE sits beside the LS pods in kubelet's burstable tier with
    # kubelet's pod weight: not idle by default, it gets BE's fixed cpu.shares on the pod.
    pod = pod_of(QoSClass.BE, BURSTABLE_PARENT)
    decision = resolve_qos_class(pod.labels, pod.cgroup_parent)
    features = KernelFeatures("v1", group_identity)

    def sandbox(config):
        return plan_pod_sandbox(pod, decision=decision, config=config, features=features, pod_cgroup=BURSTABLE_PARENT)

    assert by_resource(sandbox(QOS.BE).writes)[(BURSTABLE_PARENT, "cpu.shares")] == 2
    fixed = dataclasses.replace(QOS.BE, cpu_shares_fixed=8)
    assert by_resource(sandbox(fixed).writes)[(BURSTABLE_PARENT, "cpu.shares")] == 8
    # cpu_shares_fixed = 0 (per requested CPU): the pod's request is not known here; kubelet's stays.
    per_cpu = dataclasses.replace(QOS.BE, cpu_shares_fixed=0)
    assert (BURSTABLE_PARENT, "cpu.shares") not in by_resource(sandbox(per_cpu).writes)
    idle = by_resource(sandbox(IDLE_BE).writes)
    if group_identity:
        assert idle[(BURSTABLE_PARENT, "cpu.shares")] == 2  # bvt, not cpu.idle: the weight can be set
    else:
        assert (BURSTABLE_PARENT, "cpu.shares") not in idle and idle[(BURSTABLE_PARENT, "cpu.idle")] == 1
    # Other classes keep kubelet's pod weight.
    ls = pod_of(QoSClass.LS, BURSTABLE_PARENT)
    ls_plan = plan_pod_sandbox(ls, decision=resolve_qos_class(ls.labels, ls.cgroup_parent), config=QOS.LS,
                               features=features, pod_cgroup=BURSTABLE_PARENT)
    assert (BURSTABLE_PARENT, "cpu.shares") not in by_resource(ls_plan.writes)


@pytest.mark.parametrize("group_identity", [False, True])
def test_be_pod_level_resize_keeps_the_batch_shares(group_identity: bool) -> None:
    # UpdatePodSandboxResources of a BE pod: the pod cgroup has one cpu.shares, the sum of the
    # batch-cpu requests that plan_pod_sandbox writes too (each reconcile pass applies both plans).
    pod = pod_of(None, BESTEFFORT_PARENT, BATCH)
    decision = resolve_qos_class(pod.labels, pod.cgroup_parent)
    features = KernelFeatures("v2", group_identity)
    kubelet = ContainerResources(cpu_shares=2)

    def resize(pod: PodInput, config=QOS.BE):
        return plan_pod_resources(pod, kubelet, decision=decision, config=config, features=features,
                                  pod_cgroup=BESTEFFORT_PARENT)

    sandbox = plan_pod_sandbox(pod, decision=decision, config=QOS.BE, features=features, pod_cgroup=BESTEFFORT_PARENT)
    resized = resize(pod)
    assert by_resource(resized.writes)[(BESTEFFORT_PARENT, "cpu.shares")] == 2000 * 1024 // 1000
    assert by_resource(sandbox.writes)[(BESTEFFORT_PARENT, "cpu.shares")] == 2000 * 1024 // 1000
    assert resized.cri.cpu_shares == 2000 * 1024 // 1000
    # Without batch resources: BE's fixed shares.
    plain = resize(pod_of(None, BESTEFFORT_PARENT))
    assert by_resource(plain.writes)[(BESTEFFORT_PARENT, "cpu.shares")] == 2 and plain.cri.cpu_shares == 2
    # cpu_idle = 1 configured: the idle pod's weight is pinned, so no cpu.shares at all.
    idle = resize(pod, IDLE_BE)
    if group_identity:
        assert by_resource(idle.writes)[(BESTEFFORT_PARENT, "cpu.shares")] == 2000 * 1024 // 1000
    else:
        assert (BESTEFFORT_PARENT, "cpu.shares") not in by_resource(idle.writes)
        assert idle.cri.cpu_shares is None
        assert any("idle" in note for note in idle.notes)


# --- memory request sources, overrides ----------------------------------------------------


def test_memory_request_from_kubelet_unified_memory_min() -> None:
    resources = ContainerResources(
        cpu_shares=1024, memory_limit_in_bytes=2 * GIB, unified={"memory.min": str(GIB)}
    )
    result = plan(pod_of(None, BURSTABLE_PARENT), resources, "v2")
    assert result.qos_class is QoSClass.LS
    assert result.memory.request_bytes == GIB
    assert result.cri.unified["memory.min"] == str(GIB // 2)
    assert result.cri.unified["memory.low"] == str(GIB * 80 // 100)
    assert result.cri.unified["memory.high"] == str(koordinator_memory_high(GIB, 2 * GIB, 90))
    # Merged over kubelet's map.
    assert CriOverrides(unified=result.cri.unified).apply(resources).unified["memory.min"] == str(GIB // 2)


def test_memory_request_from_kubelet_memory_qos_memory_low_for_burstable() -> None:
    """kubelet's Memory QoS (TieredReservation) sends a Burstable pod's request as unified memory.low."""
    resources = ContainerResources(
        cpu_shares=1024, memory_limit_in_bytes=2 * GIB, unified={"memory.low": str(GIB)}
    )
    result = plan(pod_of(None, BURSTABLE_PARENT), resources, "v2")
    assert result.qos_class is QoSClass.LS
    assert result.memory.request_bytes == GIB
    assert result.cri.unified["memory.min"] == str(GIB // 2)
    assert result.cri.unified["memory.low"] == str(GIB * 80 // 100)


def test_memory_request_from_annotation() -> None:
    annotations = batch_annotation({"main": {"requests": {BATCH_MEMORY: "1Gi"}}})
    result = plan(
        pod_of(QoSClass.BE, BURSTABLE_PARENT, annotations), ContainerResources(memory_limit_in_bytes=4 * GIB)
    )
    assert result.memory.request_bytes == GIB


def test_memory_request_unknown_means_zero_protection_with_reason() -> None:
    result = plan(pod_of(QoSClass.LS, BURSTABLE_PARENT), ContainerResources(cpu_shares=1024), "v2")
    assert result.memory.request_bytes is None
    assert result.cri.unified["memory.min"] == "0" and result.cri.unified["memory.low"] == "0"
    assert "memory.high" not in result.cri.unified  # no limit, the node's memory not known
    assert any(note.startswith("memory protection 0: no memory request known") for note in result.notes)
    assert any("no memory limit and the node's memory not known" in note for note in result.notes)


def test_unparseable_kubelet_memory_min_is_ignored() -> None:
    resources = ContainerResources(memory_limit_in_bytes=GIB, unified={"memory.min": "max"})
    assert plan(pod_of(QoSClass.LS, BURSTABLE_PARENT), resources).memory.request_bytes is None


def test_memory_qos_annotation_overrides_percentages() -> None:
    override = {
        MEMORY_QOS: json.dumps(
            {
                "minLimitPercent": 10,
                "lowLimitPercent": 20,
                "throttlingPercent": 50,
                "wmarkRatio": 80,
                "wmarkScalePermill": 40,
                "wmarkMinAdj": 10,
            }
        )
    }
    result = plan(pod_of(QoSClass.LSR, annotations=override), TWO_CPUS_1G, "v1")
    writes = by_resource(result.writes)
    assert writes[(CONTAINER_CGROUP, "memory.min")] == GIB // 10
    assert writes[(CONTAINER_CGROUP, "memory.low")] == GIB // 5
    assert writes[(CONTAINER_CGROUP, "memory.high")] == GIB  # request = limit (Guaranteed)
    assert writes[(CONTAINER_CGROUP, "memory.wmark_ratio")] == 80
    assert writes[(CONTAINER_CGROUP, "memory.wmark_scale_factor")] == 40
    assert writes[(CONTAINER_CGROUP, "memory.wmark_min_adj")] == 10


def test_throttling_percent_zero_resets_memory_high_to_max() -> None:
    """Koordinator writes "max" for 0, so a percent taken back undoes what it set."""
    override = {MEMORY_QOS: json.dumps({"throttlingPercent": 0})}
    result = plan(pod_of(QoSClass.LS, annotations=override), TWO_CPUS_1G, "v2")
    assert result.cri.unified["memory.high"] == "max" and result.memory.high_bytes == MEMORY_HIGH_MAX
    v1 = plan(pod_of(QoSClass.LS, annotations=override), TWO_CPUS_1G, "v1")
    assert by_resource(v1.writes)[(CONTAINER_CGROUP, "memory.high")] == MEMORY_HIGH_MAX
    pod = by_resource(plan_pod_memory("/pod", QoSClass.LS, [result.memory, result.memory]))
    assert pod[("/pod", "memory.high")] == MEMORY_HIGH_MAX


BURSTABLE_1G_2G = ContainerResources(cpu_shares=1024, memory_limit_in_bytes=2 * GIB + 12345,
                                     unified={"memory.low": str(GIB)})


@pytest.mark.parametrize("percent", [1, 50, 90, 120, 1000])
def test_memory_high_is_koordinators_request_plus_percent_of_the_headroom(percent: int) -> None:
    """request + percent x (limit - request), rounded down to a page; above 100 it is above the limit."""
    override = {MEMORY_QOS: json.dumps({"throttlingPercent": percent})}
    result = plan(pod_of(QoSClass.LS, BURSTABLE_PARENT, override), BURSTABLE_1G_2G, "v2")
    expected = koordinator_memory_high(GIB, 2 * GIB + 12345, percent)
    assert result.memory.high_bytes == expected and result.cri.unified["memory.high"] == str(expected)
    assert expected % PAGE_SIZE == 0 and (expected > 2 * GIB) == (percent > 100)


def test_memory_high_without_a_limit_takes_the_nodes_memory() -> None:
    node = 8 * GIB + 100
    resources = ContainerResources(cpu_shares=1024, unified={"memory.low": str(GIB)})
    result = plan_container(pod_of(QoSClass.LS, BURSTABLE_PARENT), ContainerInput("main", resources),
                            decision=resolve_qos_class({}, BURSTABLE_PARENT), config=QOS.LS,
                            features=KernelFeatures("v2", node_memory_bytes=node), container_cgroup=CONTAINER_CGROUP)
    assert result.memory.high_bytes == koordinator_memory_high(GIB, node, 90)
    assert any(f"node memory {node} (no limit)" in w.reason for w in result.cri_mirror if w.resource == "memory.high")
    # The pod is left to the BE memory strategy, which bounds pods without a limit.
    assert ("/pod", "memory.high") not in by_resource(plan_pod_memory("/pod", QoSClass.LS, [result.memory]))


def test_memory_high_is_never_below_memory_min() -> None:
    """Koordinator raises memory.high to memory.min: a protected amount is never throttled."""
    override = {MEMORY_QOS: json.dumps({"throttlingPercent": 1, "minLimitPercent": 100})}
    resources = ContainerResources(cpu_shares=1024, memory_limit_in_bytes=2 * GIB, unified={"memory.low": str(GIB)})
    result = plan(pod_of(QoSClass.LS, BURSTABLE_PARENT, override), resources, "v2")
    assert result.memory.min_bytes == GIB + 0 and result.memory.high_bytes == koordinator_memory_high(GIB, 2 * GIB, 1)
    small = ContainerResources(cpu_shares=1024, memory_limit_in_bytes=GIB + 1, unified={"memory.low": str(GIB + 1)})
    raised = plan(pod_of(QoSClass.LS, BURSTABLE_PARENT, override), small, "v2")
    assert raised.memory.high_bytes == raised.memory.min_bytes == GIB + 1  # not rounded below memory.min


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_memory_qos_policy_none_disables_memory_writes(version: str) -> None:
    override = {MEMORY_QOS: '{"policy": "none"}'}
    pod = pod_of(QoSClass.LS, annotations=override)
    result = plan(pod, TWO_CPUS_1G, version)
    assert result.cri.unified == {}
    assert not any(w.resource.startswith("memory.") for w in result.writes)
    assert not result.memory.enabled
    assert any('policy "none"' in note for note in result.notes)
    decision = resolve_qos_class(pod.labels, pod.cgroup_parent)
    sandbox = plan_pod_sandbox(
        pod, decision=decision, config=QOS.LS, features=KernelFeatures(version), pod_cgroup=GUARANTEED_PARENT
    )
    assert not any(w.resource.startswith("memory.") for w in sandbox.writes)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_malformed_annotations_use_class_defaults(version: str) -> None:
    annotations = {MEMORY_QOS: "{not json", EXTENDED_RESOURCE_SPEC: "[1,2"}
    result = plan(pod_of(QoSClass.LS, annotations=annotations), TWO_CPUS_1G, version)
    baseline = plan(pod_of(QoSClass.LS), TWO_CPUS_1G, version)
    assert result.cri == baseline.cri
    assert result.writes == baseline.writes
    assert {p.annotation for p in result.problems} == {MEMORY_QOS, EXTENDED_RESOURCE_SPEC}
    assert sum("class defaults used" in note for note in result.notes) == 2


def test_bad_label_falls_back_to_kubernetes_qos() -> None:
    pod = PodInput(labels={QOS_CLASS_LABEL: "PLATINUM"}, cgroup_parent=BESTEFFORT_PARENT)
    result = plan(pod, BE_RESOURCES)
    assert result.qos_class is QoSClass.BE and result.cri.oom_score_adj == 1000


# --- cpuset, cgroup paths ------------------------------------------------------------------


def test_cpuset_mems_follow_cpus() -> None:
    allocator = CpusetAllocator(TOPOLOGY)
    cpuset = allocator.allocate("abc", QoSClass.LSE, 2)
    result = plan(
        pod_of(QoSClass.LSE), TWO_CPUS_1G, cpuset=cpuset, node=NodeConfig(cpuset_mems_follow_cpus=True)
    )
    assert result.cri.cpuset_mems == cpuset.cpuset_mems and len(cpuset.mems) == 1
    assert by_resource(result.cri_mirror)[(CONTAINER_CGROUP, "cpuset.mems")] == cpuset.cpuset_mems


def test_fallback_cpuset_is_visible_in_notes() -> None:
    allocator = CpusetAllocator(TOPOLOGY)
    allocator.allocate("x", QoSClass.LSE, 16)
    cpuset = allocator.allocate("abc", QoSClass.LSE, 2)
    result = plan(pod_of(QoSClass.LSE), TWO_CPUS_1G, cpuset=cpuset)
    assert cpuset.fallback
    assert any("falling back to the share pool" in note for note in result.notes)


def test_without_cpuset_decision_kubelet_cpuset_is_kept() -> None:
    result = plan(pod_of(QoSClass.LS), TWO_CPUS_1G)
    assert result.cri.cpuset_cpus is None
    assert CriOverrides().apply(TWO_CPUS_1G) == TWO_CPUS_1G
    assert CriOverrides().is_empty() and not result.cri.is_empty()


def test_container_cgroup_unknown_defers_container_writes() -> None:
    result = plan(pod_of(QoSClass.LS), TWO_CPUS_1G, "v1", container_cgroup=None)
    assert result.writes == () and result.cri_mirror == ()
    assert result.cri.cpu_shares is None  # kubelet's stays in the request; the class value is a file write
    assert any("deferred" in note for note in result.notes)
    # v2: memory still travels in the CRI request.
    assert plan(pod_of(QoSClass.LS), TWO_CPUS_1G, "v2", container_cgroup=None).cri.unified[
        "memory.min"
    ] == str(GIB // 2)


def test_cri_overrides_apply() -> None:
    overrides = CriOverrides(cpu_shares=7, oom_score_adj=-5, unified={"memory.low": "1"})
    applied = overrides.apply(ContainerResources(cpu_shares=2, cpu_quota=50, unified={"memory.min": "3"}))
    assert applied.cpu_shares == 7 and applied.oom_score_adj == -5 and applied.cpu_quota == 50
    assert dict(applied.unified) == {"memory.min": "3", "memory.low": "1"}


def test_kernel_features_validation() -> None:
    with pytest.raises(ValueError):
        KernelFeatures("v3")


# --- pod-level sums, tier ------------------------------------------------------------------


def test_plan_pod_memory_sums_containers() -> None:
    containers = [
        MemoryProtection(True, GIB, GIB, 100, 200, 900),
        MemoryProtection(True, GIB, GIB, 10, 20, 90),
        MemoryProtection(False),
    ]
    writes = by_resource(plan_pod_memory("/pod", QoSClass.LS, containers))
    assert writes == {("/pod", "memory.min"): 110, ("/pod", "memory.low"): 220, ("/pod", "memory.high"): 990}
    unlimited = containers + [MemoryProtection(True, None, 0, 0, 0, None)]
    assert ("/pod", "memory.high") not in by_resource(plan_pod_memory("/pod", QoSClass.LS, unlimited))
    node_bound = containers + [MemoryProtection(True, None, 0, 0, 0, 5 * GIB)]  # of the node's memory
    assert ("/pod", "memory.high") not in by_resource(plan_pod_memory("/pod", QoSClass.LS, node_bound))
    assert plan_pod_memory("/pod", QoSClass.LS, [MemoryProtection(False)]) == ()


@pytest.mark.parametrize(
    ("qos_class", "kubelet_shares", "expected"),
    [
        # Two containers of 1 and 0.5 requested CPUs: the class weight per CPU, summed.
        (QoSClass.LS, (1024, 512), 1536),
        (QoSClass.LSR, (1024, 512), 65536 + 32768),
        (QoSClass.SYSTEM, (1024, 512), 32768 + 16384),
        # LSE's weight per CPU is the kernel's maximum: the sum is clamped as a container's is.
        (QoSClass.LSE, (1024, 512), 262144),
    ],
)
def test_pod_cpu_weight_is_the_sum_of_its_containers_class_weights(
    qos_class: QoSClass, kubelet_shares: tuple[int, ...], expected: int
) -> None:
    pod = pod_of(qos_class)
    container_shares = [
        plan(pod, ContainerResources(cpu_shares=shares)).cpu_shares for shares in kubelet_shares
    ]
    writes = plan_pod_cpu_weight(GUARANTEED_PARENT, qos_class, container_shares)
    assert by_resource(writes) == {(GUARANTEED_PARENT, "cpu.shares"): expected}
    assert "sum of its 2 container(s)" in writes[0].reason


def test_pod_cpu_weight_leaves_be_and_pods_without_containers_alone() -> None:
    # BE's pod weight is plan_pod_sandbox's (fixed or batch, none when idle), not a sum.
    assert plan_pod_cpu_weight(BESTEFFORT_PARENT, QoSClass.BE, [2, 2]) == ()
    # No running container: kubelet's pod weight stays until one starts.
    assert plan_pod_cpu_weight(GUARANTEED_PARENT, QoSClass.LSR, []) == ()
    # Containers that asked for nothing still give the pod the minimum, never 0.
    assert by_resource(plan_pod_cpu_weight(BURSTABLE_PARENT, QoSClass.LS, [])) == {}
    assert by_resource(plan_pod_cpu_weight(BURSTABLE_PARENT, QoSClass.LS, [0])) == {(BURSTABLE_PARENT, "cpu.shares"): 2}


@pytest.mark.parametrize(
    ("group_identity", "resource", "value"), [(False, "cpu.idle", 1), (True, "cpu.bvt_warp_ns", -1)]
)
def test_besteffort_tier(group_identity: bool, resource: str, value: int) -> None:
    tier = "/kubepods/besteffort"
    writes = plan_besteffort_tier(tier, QoSClass.BE, IDLE_BE, KernelFeatures("v1", group_identity))
    assert by_resource(writes) == {(tier, resource): value}


# --- hostile input -------------------------------------------------------------------------

text = st.text(max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    labels=st.dictionaries(st.sampled_from([QOS_CLASS_LABEL, "x"]), text),
    annotations=st.dictionaries(st.sampled_from([MEMORY_QOS, EXTENDED_RESOURCE_SPEC, "y"]), text),
    parent=text,
    shares=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    limit=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    unified=st.dictionaries(st.sampled_from(["memory.min", "memory.high"]), text),
    version=st.sampled_from(["v1", "v2"]),
)
def test_hostile_inputs_never_raise(labels, annotations, parent, shares, limit, unified, version) -> None:
    pod = PodInput(labels=labels, annotations=annotations, cgroup_parent=parent)
    resources = ContainerResources(cpu_shares=shares, memory_limit_in_bytes=limit, unified=unified)
    result = plan(pod, resources, version)
    assert 2 <= file_values(result)["cpu.shares"] <= 262144
    by_resource(result.writes)
    by_resource(result.cri_mirror)
    for write in result.writes + result.cri_mirror:
        if write.resource in ("memory.min", "memory.low", "memory.high", "memory.limit_in_bytes"):
            assert isinstance(write.value, int) and write.value >= 0
    decision = resolve_qos_class(pod.labels, pod.cgroup_parent)
    sandbox = plan_pod_sandbox(
        pod,
        decision=decision,
        config=QOS.for_class(decision.qos_class),
        features=KernelFeatures(version),
        pod_cgroup="/x",
    )
    by_resource(sandbox.writes)


def test_allocate_cpuset_uses_request_and_scheduler_choice() -> None:
    from koordnode.model.annotations import RESOURCE_STATUS
    from koordnode.policy.cpuset import allocator_from_config

    allocator, notes = allocator_from_config(TOPOLOGY, NodeConfig(reserved_cpus=2, system_cpus="0,99"))
    assert allocator.reserved == {0, 8} and "99" in notes[0]
    assert allocator.pool_for(QoSClass.SYSTEM).cpus == {0}
    lse = allocate_cpuset(allocator, pod_of(QoSClass.LSE), ContainerInput("main", TWO_CPUS_1G), QoSClass.LSE)
    # Pure: the allocation comes back to be recorded where the decision is applied.
    assert len(lse.cpus) == 2 and allocator.allocation_of(f"{UID}/main") is None
    assert lse.allocation is not None and lse.allocation.cpus == lse.cpus
    again = allocate_cpuset(allocator, pod_of(QoSClass.LSE), ContainerInput("other", TWO_CPUS_1G), QoSClass.LSE,
                            pending=[lse.allocation])
    assert not again.cpus & lse.cpus  # pending allocations count as held
    assert allocator.record(lse.allocation) is None and allocator.allocation_of(f"{UID}/main") is not None
    chosen = pod_of(QoSClass.LSR, annotations={RESOURCE_STATUS: '{"cpuset": "6-7"}'})
    for name in ("a", "b"):  # both containers share the pod's scheduler cpuset
        decision = allocate_cpuset(allocator, chosen, ContainerInput(name, TWO_CPUS_1G), QoSClass.LSR)
        assert decision.cpus == {6, 7}
        if decision.allocation is not None:
            assert allocator.record(decision.allocation) is None
    assert allocator.allocation_of(UID).cpus == {6, 7}
    ls = allocate_cpuset(allocator, pod_of(QoSClass.LS), ContainerInput("main", TWO_CPUS_1G), QoSClass.LS)
    assert ls.cpus == allocator.share_pool() and not ls.cpus & ({0, 8, 6, 7} | lse.cpus)


quantities = st.one_of(
    st.integers(min_value=-(10**20), max_value=10**20),
    st.sampled_from(["1Gi", "500m", "1e3", "9Ei", "-1", "x", ""]),
)


@settings(max_examples=100, deadline=None)
@given(
    cpu_request=quantities,
    cpu_limit=quantities,
    memory_request=quantities,
    memory_limit=quantities,
    period=st.integers(min_value=-5, max_value=2_000_000),
    version=st.sampled_from(["v1", "v2"]),
)
def test_any_batch_numbers_give_values_the_executor_accepts(
    cpu_request, cpu_limit, memory_request, memory_limit, period, version
) -> None:
    annotations = batch_annotation(
        {
            "main": {
                "requests": {BATCH_CPU: cpu_request, BATCH_MEMORY: memory_request},
                "limits": {BATCH_CPU: cpu_limit, BATCH_MEMORY: memory_limit},
            }
        }
    )
    pod = pod_of(QoSClass.BE, BESTEFFORT_PARENT, annotations)
    result = plan(pod, ContainerResources(cpu_period=period), version)
    by_resource(result.writes)
    by_resource(result.cri_mirror)
    assert 2 <= file_values(result)["cpu.shares"] <= 262144
    for group_identity in (False, True):
        decision = resolve_qos_class(pod.labels, pod.cgroup_parent)
        sandbox = plan_pod_sandbox(
            pod,
            decision=decision,
            config=QOS.BE,
            features=KernelFeatures(version, group_identity),
            pod_cgroup=BESTEFFORT_PARENT,
        )
        by_resource(sandbox.writes)
