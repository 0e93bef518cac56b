"""Class policy for a container: from its pod's class and what kubelet asked for, the values
koordnode wants (CreateContainer / UpdateContainerResources).

Pure functions. The result is
  - `cri`: LinuxContainerResources fields to override in the request,
  - `writes`: CgroupWrites applied by the executor once the cgroup exists: what the CRI cannot
    carry, and the class values of the fields kubelet reads back (REPORTED_BY_RUNTIME), which
    must reach the runtime as kubelet asked them,
  - `cri_mirror`: the CRI overrides again as container-cgroup writes, for reconcile/verify,
  - `notes`: why things were (not) set, for logs and `koordnode status`.
The pod cgroup's values are pod_policy.py's.

All CgroupWrite values are in cgroup v1 units and spelling; the executor converts for v2.
Always feed kubelet's own resources in, never a request this module already rewrote.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from koordnode.policy.plan import CgroupWrite
from koordnode.policy.class_inputs import ContainerInput, ContainerResources, KernelFeatures, PodInput
from koordnode.policy.class_values import (
    MEMORY_HIGH_MAX,
    CriOverrides,
    MemoryProtection,
    batch_cpu_quota,
    cfs_period,
    cpu_shares_for,
    memory_high,
    memory_numbers,
    memory_protection,
    memory_request,
    wmark_writes,
)
from koordnode.model.annotations import ParseProblem, parse_pod_annotations
from koordnode.policy.cpuset import Allocation, CpusetAllocator, CpusetDecision, cpuset_owner_id
from koordnode.model.qos_class import ClassDecision, QoSClass
from koordnode.config.node import NodeConfig
from koordnode.config.classes import QoSClassConfig
from koordnode.model.kernel import CPU_SHARES_MIN as MIN_SHARES
from koordnode.model.kernel import KUBELET_SHARES_PER_CPU

# Container cgroup files the runtime writes from the CRI resources kubelet sent, and reports
# back in ContainerStatus: kubelet (1.33+) turns cpu_shares into status.containerStatuses[]
# .resources.requests.cpu, cpu_quota / cpu_period into limits.cpu and memory_limit_in_bytes
# into limits.memory (kuberuntime's toKubeContainerResources). Their class values therefore
# never go into a CRI request (nor an NRI adjustment): the request keeps kubelet's values, and
# the class value is written to the file by the executor after StartContainer and after each
# UpdateContainerResources (when the runtime has written kubelet's value again).
REPORTED_BY_RUNTIME = frozenset({"cpu.shares", "cpu.cfs_quota_us", "cpu.cfs_period_us", "memory.limit_in_bytes"})


@dataclass(frozen=True)
class ContainerPlan:
    qos_class: QoSClass
    cri: CriOverrides
    writes: tuple[CgroupWrite, ...] = ()
    cri_mirror: tuple[CgroupWrite, ...] = ()
    memory: MemoryProtection = field(default_factory=MemoryProtection)
    notes: tuple[str, ...] = ()
    problems: tuple[ParseProblem, ...] = ()
    # The container's class weight (written to its cgroup, not in the CRI request), for its pod's.
    cpu_shares: int | None = None


def requested_cpus(resources: ContainerResources) -> int:
    """Whole CPUs to reserve for an LSE/LSR container.

    The CFS limit (quota / period, = the request for Guaranteed pods) when set, else the request
    kubelet encoded in cpu_shares; rounded up. 0 when kubelet sent neither.
    """
    if resources.cpu_quota > 0:
        period = cfs_period(resources.cpu_period)
        return math.ceil(resources.cpu_quota / period)
    if resources.cpu_shares > MIN_SHARES:
        return math.ceil(resources.cpu_shares / KUBELET_SHARES_PER_CPU)
    return 0


def allocate_cpuset(
    allocator: CpusetAllocator, pod: PodInput, container: ContainerInput, qos_class: QoSClass,
    pending: Iterable[Allocation] = (),
) -> CpusetDecision:
    """A container's CPUs from its class, whole-CPU request and the scheduler's resource-status
    cpuset if any; pools for LS/BE/SYSTEM. Changes nothing: a new allocation comes back in the
    decision's `allocation`, for the caller to record where the decision is applied.
    `pending`: allocations decided but not recorded yet (their CPUs count as held)."""
    preferred = parse_pod_annotations(pod.annotations).scheduler_cpuset
    owner = cpuset_owner_id(pod.uid, container.name, preferred is not None)
    return allocator.decide(owner, qos_class, requested_cpus(container.resources), preferred, pending)


def plan_container(
    pod: PodInput,
    container: ContainerInput,
    *,
    decision: ClassDecision,
    config: QoSClassConfig,
    features: KernelFeatures,
    cpuset: CpusetDecision | None = None,
    node: NodeConfig | None = None,
    container_cgroup: str | None = None,
) -> ContainerPlan:
    """What a container of `decision.qos_class` should get.

    `cpuset`: the allocator's decision (None: leave kubelet's cpuset). `container_cgroup`:
    the container's cgroup path relative to the hierarchy root; without it (before the
    container exists) container-level writes are left out and only `cri` is meaningful.
    """
    qos_class = decision.qos_class
    resources = container.resources
    annotations = parse_pod_annotations(pod.annotations)
    notes: list[str] = [str(problem) + "; class defaults used" for problem in annotations.problems]
    node = node or NodeConfig()
    batch = annotations.batch_resources(container.name) if qos_class is QoSClass.BE else None
    if qos_class is QoSClass.BE and annotations.extended_resources is not None and batch is None:
        notes.append(f"no batch resources for container {container.name!r} in the extended-resource-spec")

    cri: dict[str, Any] = {}
    unified: dict[str, str] = {}
    writes: list[CgroupWrite] = []
    mirror: list[CgroupWrite] = []
    memory_limit = resources.memory_limit_in_bytes

    def mirrored(resource: str, value: int | str, reason: str) -> None:
        if container_cgroup is not None:
            mirror.append(CgroupWrite(container_cgroup, resource, value, reason))

    def written(resource: str, value: int | str, reason: str) -> None:
        """A field kubelet reads back from the runtime: the file only (REPORTED_BY_RUNTIME)."""
        if container_cgroup is not None:
            writes.append(CgroupWrite(container_cgroup, resource, value, reason))

    # CPU weight.
    shares, shares_reason = cpu_shares_for(qos_class, config, resources.cpu_shares, batch)
    written("cpu.shares", shares, shares_reason)
    notes.append(shares_reason)

    # BE batch resources: quota and memory limit from the annotation.
    if batch is not None:
        period = cfs_period(resources.cpu_period)
        quota = batch_cpu_quota(batch.cpu_limit_milli, period)
        quota_reason = (
            f"BE: cfs quota {quota} µs per {period} µs from batch-cpu limit {batch.cpu_limit_milli}m"
            if quota > 0
            else "BE: no batch-cpu limit: cfs quota unlimited (-1)"
        )
        written("cpu.cfs_period_us", period, quota_reason)
        written("cpu.cfs_quota_us", quota, quota_reason)
        notes.append(quota_reason)
        if batch.memory_limit_bytes is not None and batch.memory_limit_bytes > 0:
            memory_limit = batch.memory_limit_bytes
            reason = f"BE: memory limit {batch.memory_limit_bytes} from batch-memory limit"
            written("memory.limit_in_bytes", batch.memory_limit_bytes, reason)
            notes.append(reason)

    # OOM preference: a process attribute, so CRI only (no cgroup file to mirror).
    cri["oom_score_adj"] = config.oom_score_adj
    notes.append(
        f"{qos_class.value}: oom_score_adj {config.oom_score_adj} (kubelet sent {resources.oom_score_adj})"
    )

    # CPU set.
    if cpuset is not None:
        cri["cpuset_cpus"] = cpuset.cpuset_cpus
        mirrored("cpuset.cpus", cpuset.cpuset_cpus, cpuset.reason)
        notes.append(f"cpuset {cpuset.cpuset_cpus}: {cpuset.reason}")
        if node.cpuset_mems_follow_cpus and cpuset.mems:
            cri["cpuset_mems"] = cpuset.cpuset_mems
            mirrored("cpuset.mems", cpuset.cpuset_mems, "memory nodes of the container's CPUs")

    # Memory protection and throttling.
    limit = max(int(memory_limit or 0), 0)
    numbers = memory_numbers(qos_class, config, annotations)
    memory = MemoryProtection()
    if not numbers.enabled:
        notes.append(numbers.why_disabled)
    else:
        api_request = pod.memory_requests.get(container.name, 0) if pod.memory_requests is not None else None
        request, request_source = memory_request(decision, resources, limit, batch, api_request)
        memory = memory_protection(numbers, request, limit, features.node_memory_bytes)
        if request is None and (numbers.min_percent or numbers.low_percent):
            notes.append(f"memory protection 0: {request_source}")
        protect_reason = (
            f"{qos_class.value}: memory.min {numbers.min_percent}% / memory.low {numbers.low_percent}%"
            f" of request {request} ({request_source})"
        )
        high_reason = f"{qos_class.value}: " + memory_high(request, limit, numbers.high_percent,
                                                          features.node_memory_bytes)[1]
        memory_values: list[tuple[str, int, str]] = [
            ("memory.min", memory.min_bytes, protect_reason),
            ("memory.low", memory.low_bytes, protect_reason),
        ]
        if memory.high_bytes is not None:
            memory_values.append(("memory.high", memory.high_bytes, high_reason))
        else:
            notes.append(high_reason)
        for resource, value, reason in memory_values:
            if features.cgroup_version == "v2":
                # The runtime writes unified keys when it creates the cgroup.
                unified[resource] = "max" if value == MEMORY_HIGH_MAX else str(value)
                mirrored(resource, value, reason)
            elif container_cgroup is not None:
                # v1 has these only on Anolis kernels; the executor skips them elsewhere.
                writes.append(CgroupWrite(container_cgroup, resource, value, reason))
        if numbers.wmark and container_cgroup is not None:
            writes.extend(wmark_writes(container_cgroup, numbers, "container"))
        notes.append(protect_reason)

    if container_cgroup is None:
        notes.append("container cgroup not known yet: container-level writes deferred")

    overrides = CriOverrides(unified=unified, **cri)
    return ContainerPlan(
        qos_class=qos_class,
        cri=overrides,
        writes=tuple(writes),
        cri_mirror=tuple(mirror),
        memory=memory,
        notes=tuple(notes),
        problems=annotations.problems,
        cpu_shares=shares,
    )
