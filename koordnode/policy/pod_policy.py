"""Class policy for a pod's cgroup: the values kubelet does not set at RunPodSandbox (CPU
priority, BE batch limits, watermarks, blkio), the pod's CPU weight and memory protection
summed from its containers' plans, the values of a pod-level resize
(UpdatePodSandboxResources), and the CPU priority of kubelet's besteffort tier.

Pure functions. All CgroupWrite values are in cgroup v1 units and spelling; the executor
converts for v2.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from koordnode.policy.plan import CgroupWrite
from koordnode.policy.class_inputs import ContainerResources, KernelFeatures, PodInput
from koordnode.policy.class_values import (
    MEMORY_HIGH_MAX,
    CriOverrides,
    MemoryProtection,
    batch_cpu_quota,
    clamp_shares,
    cpu_shares_for,
    memory_numbers,
    memory_protection,
    memory_request,
    wmark_writes,
)
from koordnode.model.annotations import ParseProblem, PodAnnotations, parse_pod_annotations
from koordnode.model.qos_class import ClassDecision, QoSClass
from koordnode.config.node import NodeConfig
from koordnode.config.classes import QoSClassConfig
from koordnode.model.kernel import CPU_SHARES_MAX as MAX_SHARES
from koordnode.model.kernel import CPU_SHARES_MIN as MIN_SHARES
from koordnode.model.kernel import DEFAULT_CFS_PERIOD_US, KUBELET_SHARES_PER_CPU


@dataclass(frozen=True)
class PodPlan:
    qos_class: QoSClass
    writes: tuple[CgroupWrite, ...] = ()
    notes: tuple[str, ...] = ()
    problems: tuple[ParseProblem, ...] = ()
    # The pod's tasks share one core-scheduling cookie ([qos.<CLASS>] core_sched).
    core_sched: bool = False


def cpu_priority_write(
    cgroup: str, qos_class: QoSClass, config: QoSClassConfig, features: KernelFeatures, level: str
) -> CgroupWrite:
    if features.group_identity:
        return CgroupWrite(
            cgroup,
            "cpu.bvt_warp_ns",
            config.cpu_bvt_warp_ns,
            f"{qos_class.value}: group identity {config.cpu_bvt_warp_ns} ({level})",
        )
    return CgroupWrite(
        cgroup,
        "cpu.idle",
        config.cpu_idle,
        f"{qos_class.value}: cpu.idle {config.cpu_idle} ({level})",
    )


def _batch_pod_shares(annotations: PodAnnotations) -> tuple[int, str] | None:
    """A BE pod's cpu.shares from the sum of its containers' batch-cpu requests; None without any."""
    spec = annotations.extended_resources
    if spec is None:
        return None
    requests = [c.cpu_request_milli for c in spec.containers.values() if c.cpu_request_milli is not None]
    if not requests:
        return None
    shares = clamp_shares(sum(requests) * KUBELET_SHARES_PER_CPU // 1000)
    return shares, f"BE pod: sum of batch-cpu requests {sum(requests)}m"


def _batch_pod_writes(pod_cgroup: str, annotations: PodAnnotations) -> tuple[list[CgroupWrite], list[str]]:
    """BE pod cgroup limits from the sum of its containers' batch resources."""
    spec = annotations.extended_resources
    if spec is None or not spec.containers:
        return [], []
    containers = list(spec.containers.values())
    writes: list[CgroupWrite] = []
    notes: list[str] = []
    batch_shares = _batch_pod_shares(annotations)
    if batch_shares is not None:
        writes.append(CgroupWrite(pod_cgroup, "cpu.shares", *batch_shares))
    limits = [c.cpu_limit_milli for c in containers]
    if all(limit is not None and limit > 0 for limit in limits):
        total = sum(limit for limit in limits if limit is not None)
        quota = batch_cpu_quota(total, DEFAULT_CFS_PERIOD_US)
        reason = f"BE pod: cfs quota from the sum of batch-cpu limits {total}m"
    else:
        quota, reason = -1, "BE pod: a container has no batch-cpu limit: cfs quota unlimited"
    writes.append(CgroupWrite(pod_cgroup, "cpu.cfs_period_us", DEFAULT_CFS_PERIOD_US, reason))
    writes.append(CgroupWrite(pod_cgroup, "cpu.cfs_quota_us", quota, reason))
    memory_limits = [c.memory_limit_bytes for c in containers]
    if all(limit is not None and limit > 0 for limit in memory_limits):
        total_memory = sum(limit for limit in memory_limits if limit is not None)
        writes.append(
            CgroupWrite(
                pod_cgroup, "memory.limit_in_bytes", total_memory, "BE pod: sum of batch-memory limits"
            )
        )
    else:
        notes.append("BE pod: not every container has a batch-memory limit: pod memory limit left as is")
    return writes, notes


def plan_pod_sandbox(
    pod: PodInput,
    *,
    decision: ClassDecision,
    config: QoSClassConfig,
    features: KernelFeatures,
    pod_cgroup: str,
    node: NodeConfig | None = None,
) -> PodPlan:
    """Pod-cgroup values kubelet does not set: CPU priority, BE batch limits, watermarks, blkio."""
    qos_class = decision.qos_class
    node = node or NodeConfig()
    annotations = parse_pod_annotations(pod.annotations)
    notes: list[str] = [str(problem) + "; class defaults used" for problem in annotations.problems]
    writes: list[CgroupWrite] = [cpu_priority_write(pod_cgroup, qos_class, config, features, "pod")]

    if qos_class is QoSClass.BE:
        batch_writes, batch_notes = _batch_pod_writes(pod_cgroup, annotations)
        if not features.group_identity and config.cpu_idle == 1:
            # The kernel refuses cpu.shares on an idle group (its weight is pinned), and an
            # idle pod loses to every non-idle sibling anyway.
            if any(write.resource == "cpu.shares" for write in batch_writes):
                batch_notes.append("BE pod: pod cpu.shares not set: the pod cgroup is idle (cpu.idle=1)")
            batch_writes = [write for write in batch_writes if write.resource != "cpu.shares"]
        elif config.cpu_shares_fixed > 0 and not any(write.resource == "cpu.shares" for write in batch_writes):
            # Not idle, so the pod competes with its siblings by weight: a Burstable pod labelled
            # BE sits beside the LS pods in kubelet's burstable tier with kubelet's weight per
            # requested CPU unless the pod gets BE's own.
            shares = clamp_shares(config.cpu_shares_fixed)
            batch_writes.append(CgroupWrite(pod_cgroup, "cpu.shares", shares, f"BE pod: fixed cpu.shares {shares}"))
        writes += batch_writes
        notes += batch_notes

    numbers = memory_numbers(qos_class, config, annotations)
    if numbers.enabled and numbers.wmark:
        writes += wmark_writes(pod_cgroup, numbers, "pod")

    if config.blkio_weight > 0:
        writes.append(
            CgroupWrite(
                pod_cgroup,
                "blkio.weight",
                config.blkio_weight,
                f"{qos_class.value}: blkio weight {config.blkio_weight}",
            )
        )
    throttles = [
        ("blkio.throttle.read_bps_device", config.blkio_read_bps, "read"),
        ("blkio.throttle.write_bps_device", config.blkio_write_bps, "write"),
    ]
    if any(bps > 0 for _, bps, _ in throttles) and not node.blkio_devices:
        notes.append(f"{qos_class.value}: disk throttle configured but no [node] blkio_devices: not applied")
    for device in node.blkio_devices:
        for resource, bps, direction in throttles:
            if bps > 0:
                writes.append(
                    CgroupWrite(
                        pod_cgroup,
                        resource,
                        f"{device} {bps}",
                        f"{qos_class.value}: {direction} throttle {bps} B/s on {device}",
                    )
                )

    if config.core_sched:
        notes.append(f"{qos_class.value}: core scheduling: the pod's tasks share one cookie, no other pod's"
                     " task runs on an SMT sibling of their core at the same time")
    return PodPlan(
        qos_class=qos_class, writes=tuple(writes), notes=tuple(notes), problems=annotations.problems,
        core_sched=config.core_sched,
    )


def plan_pod_cpu_weight(
    pod_cgroup: str, qos_class: QoSClass, container_shares: Iterable[int]
) -> tuple[CgroupWrite, ...]:
    """The pod cgroup's cpu.shares: the sum of its containers' class weights.

    The pod cgroup, not the container, is what competes with other pods and with kubelet's
    tiers, so a class weight that stops at the container ranks the pod's containers only among
    themselves. kubelet gives every pod 1024 per requested CPU; the class's weight per CPU
    replaces it here as it does on the containers. BE pods are left to plan_pod_sandbox
    (BE's fixed or batch weight, none on an idle pod); no running container: kubelet's stays.
    """
    if qos_class is QoSClass.BE:
        return ()
    shares = list(container_shares)
    if not shares:
        return ()
    total = clamp_shares(sum(shares))
    reason = (f"{qos_class.value} pod: cpu.shares {total} = sum of its {len(shares)} container(s)'"
              f" class weights, clamped to [{MIN_SHARES}, {MAX_SHARES}]")
    return (CgroupWrite(pod_cgroup, "cpu.shares", total, reason),)


def plan_pod_memory(
    pod_cgroup: str, qos_class: QoSClass, containers: Iterable[MemoryProtection]
) -> tuple[CgroupWrite, ...]:
    """Pod-cgroup memory.min/low/high from its containers' plans.

    A child's protection only counts up to its parent's, so the pod needs the sum. memory.high
    (which Koordinator leaves alone on pods) is the sum of the containers' when each has a memory
    limit, "max" when one of them is "max"; a pod with a container without a limit is left to
    the BE memory strategy, which bounds such BE pods.
    """
    members = [memory for memory in containers if memory.enabled]
    if not members:
        return ()
    total_min = sum(memory.min_bytes for memory in members)
    total_low = sum(memory.low_bytes for memory in members)
    reason = f"{qos_class.value} pod: sum of {len(members)} container(s)"
    writes = [
        CgroupWrite(pod_cgroup, "memory.min", total_min, reason),
        CgroupWrite(pod_cgroup, "memory.low", total_low, reason),
    ]
    if all(memory.limit_bytes > 0 and memory.high_bytes is not None for memory in members):
        highs = [memory.high_bytes or 0 for memory in members]
        total = MEMORY_HIGH_MAX if MEMORY_HIGH_MAX in highs else sum(highs)
        writes.append(CgroupWrite(pod_cgroup, "memory.high", total, reason))
    return tuple(writes)


@dataclass(frozen=True)
class PodResourcesPlan:
    """A pod's class values recomputed from its pod-level resources (UpdatePodSandboxResources)."""

    qos_class: QoSClass
    cri: CriOverrides
    writes: tuple[CgroupWrite, ...] = ()
    memory: MemoryProtection = field(default_factory=MemoryProtection)
    notes: tuple[str, ...] = ()


def plan_pod_resources(
    pod: PodInput,
    resources: ContainerResources,
    *,
    decision: ClassDecision,
    config: QoSClassConfig,
    features: KernelFeatures,
    pod_cgroup: str,
) -> PodResourcesPlan:
    """Pod-cgroup CPU weight and memory protection from kubelet's pod-level resources.

    kubelet has already written its own values to the pod cgroup when it sends the call; the
    class's numbers replace them the way they do for a container: cpu.shares per requested
    CPU (a BE pod with batch-cpu requests: their sum, as plan_pod_sandbox has it; none for an
    idle BE pod, whose weight the kernel pins), memory.min/low from the pod's
    memory request (Guaranteed: its limit; Memory QoS: unified memory.min/low) and memory.high
    from its limit.
    """
    qos_class = decision.qos_class
    annotations = parse_pod_annotations(pod.annotations)
    notes: list[str] = []
    writes: list[CgroupWrite] = []
    shares: int | None = None
    idle_be = qos_class is QoSClass.BE and not features.group_identity and config.cpu_idle == 1
    batch_shares = _batch_pod_shares(annotations) if qos_class is QoSClass.BE else None
    if batch_shares is not None and not idle_be:
        # The same value plan_pod_sandbox writes: the pod cgroup has one cpu.shares.
        shares, why = batch_shares
        notes.append(why)
        writes.append(CgroupWrite(pod_cgroup, "cpu.shares", shares, "pod-level resize: " + why))
    elif resources.cpu_shares > 0 and not idle_be:
        shares, why = cpu_shares_for(qos_class, config, resources.cpu_shares, None)
        notes.append("pod: " + why)
        writes.append(CgroupWrite(pod_cgroup, "cpu.shares", shares, "pod-level resize: " + why))
    elif idle_be:
        notes.append("BE pod: pod cpu.shares not set: the pod cgroup is idle (cpu.idle=1)")
    numbers = memory_numbers(qos_class, config, annotations)
    limit = max(resources.memory_limit_in_bytes, 0)
    request, request_why = memory_request(decision, resources, limit, None)
    # A pod without a limit keeps memory.high as plan_pod_memory leaves it (the BE strategy's).
    memory = memory_protection(numbers, request, limit)
    if limit <= 0:
        memory = replace(memory, high_bytes=None)
    unified: dict[str, str] = {}
    if numbers.enabled:
        reason = f"{qos_class.value} pod-level resize: {request_why}"
        writes += [CgroupWrite(pod_cgroup, "memory.min", memory.min_bytes, reason),
                   CgroupWrite(pod_cgroup, "memory.low", memory.low_bytes, reason)]
        if memory.high_bytes is not None:
            writes.append(CgroupWrite(pod_cgroup, "memory.high", memory.high_bytes, reason))
        if features.cgroup_version == "v2":
            unified = {"memory.min": str(memory.min_bytes), "memory.low": str(memory.low_bytes)}
            if memory.high_bytes is not None:
                unified["memory.high"] = "max" if memory.high_bytes == MEMORY_HIGH_MAX else str(memory.high_bytes)
        notes.append(f"pod memory protection from {request_why}")
    else:
        notes.append(numbers.why_disabled)
    return PodResourcesPlan(qos_class, CriOverrides(cpu_shares=shares, unified=unified), tuple(writes),
                            memory, tuple(notes))


def plan_besteffort_tier(
    tier_cgroup: str, qos_class: QoSClass, config: QoSClassConfig, features: KernelFeatures
) -> tuple[CgroupWrite, ...]:
    """CPU priority of the kubepods besteffort tier, for the class BestEffort pods map to.

    cpu.idle on a BE pod only ranks it against its sibling BE pods; on the tier it ranks all
    of them against the burstable tier and Guaranteed pods, which is what BE means.
    Caveat: kubelet rewrites the tier's cpu.shares (2) when it updates QoS cgroups; the kernel
    refuses that on an idle group, so kubelet logs a QoS cgroup update error (nothing else
    breaks: the weight of an idle group is pinned anyway). Apply it only if that is acceptable.
    """
    return (cpu_priority_write(tier_cgroup, qos_class, config, features, "besteffort tier"),)
