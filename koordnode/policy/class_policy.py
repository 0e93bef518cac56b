"""QoS policy: from a pod's class and what kubelet asked for, the values koordnode wants.

Pure functions. For a container (CreateContainer / UpdateContainerResources) the result is
  - `cri`: LinuxContainerResources fields to override in the request,
  - `writes`: CgroupWrites applied by the executor once the cgroup exists: what the CRI cannot
    carry, and the class values of the fields kubelet reads back (REPORTED_BY_RUNTIME), which
    must reach the runtime as kubelet asked them,
  - `cri_mirror`: the CRI overrides again as container-cgroup writes, for reconcile/verify,
  - `notes`: why things were (not) set, for logs and `koordnode status`.
For a pod sandbox (RunPodSandbox) the result is the pod-cgroup writes.

All CgroupWrite values are in cgroup v1 units and spelling; the executor converts for v2.
Always feed kubelet's own resources in, never a request this module already rewrote.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from koordnode.policy.plan import CgroupWrite
from koordnode.model.annotations import BatchResources, ParseProblem, PodAnnotations, parse_pod_annotations
from koordnode.policy.cpuset import Allocation, CpusetAllocator, CpusetDecision, cpuset_owner_id
from koordnode.model.qos_class import ClassDecision, KubeQoS, QoSClass
from koordnode.config.node import NodeConfig
from koordnode.config.classes import QoSClassConfig
from koordnode.model.kernel import CPU_SHARES_MAX as MAX_SHARES
from koordnode.model.kernel import CPU_SHARES_MIN as MIN_SHARES
from koordnode.model.kernel import (
    CFS_PERIOD_MAX_US,
    CFS_PERIOD_MIN_US,
    CFS_QUOTA_MIN_US,
    CFS_RUNTIME_MAX_US,
    DEFAULT_CFS_PERIOD_US,
    KUBELET_SHARES_PER_CPU,
)

MIN_CFS_QUOTA_US = CFS_QUOTA_MIN_US
MAX_CFS_QUOTA_US = CFS_RUNTIME_MAX_US
CFS_PERIOD_RANGE_US = (CFS_PERIOD_MIN_US, CFS_PERIOD_MAX_US)
CGROUP_VERSIONS = ("v1", "v2")

# Container cgroup files the runtime writes from the CRI resources kubelet sent, and reports
# back in ContainerStatus: kubelet (1.33+) turns cpu_shares into status.containerStatuses[]
# .resources.requests.cpu, cpu_quota / cpu_period into limits.cpu and memory_limit_in_bytes
# into limits.memory (kuberuntime's toKubeContainerResources). Their class values therefore
# never go into a CRI request (nor an NRI adjustment): the request keeps kubelet's values, and
# the class value is written to the file by the executor after StartContainer and after each
# UpdateContainerResources (when the runtime has written kubelet's value again).
REPORTED_BY_RUNTIME = frozenset({"cpu.shares", "cpu.cfs_quota_us", "cpu.cfs_period_us", "memory.limit_in_bytes"})


# --- inputs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerResources:
    """LinuxContainerResources as kubelet sent them (0 / "" = not set)."""

    cpu_period: int = 0
    cpu_quota: int = 0
    cpu_shares: int = 0
    memory_limit_in_bytes: int = 0
    oom_score_adj: int = 0
    cpuset_cpus: str = ""
    cpuset_mems: str = ""
    unified: Mapping[str, str] = field(default_factory=dict)
    memory_swap_limit_in_bytes: int = 0


@dataclass(frozen=True)
class PodInput:
    uid: str = ""
    name: str = ""
    namespace: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    cgroup_parent: str = ""
    # container name -> memory request from the API server's pod spec; None: not known
    memory_requests: Mapping[str, int] | None = None


@dataclass(frozen=True)
class ContainerInput:
    name: str
    resources: ContainerResources = field(default_factory=ContainerResources)
    # Empty at CreateContainer (the runtime assigns it); known afterwards.
    id: str = ""


@dataclass(frozen=True)
class KernelFeatures:
    cgroup_version: str = "v1"  # "v1" or "v2"
    # Alibaba/Anolis group identity (cpu.bvt_warp_ns) instead of upstream cpu.idle.
    group_identity: bool = False

    def __post_init__(self) -> None:
        if self.cgroup_version not in CGROUP_VERSIONS:
            raise ValueError(f"cgroup_version must be one of {CGROUP_VERSIONS}, got {self.cgroup_version!r}")


# --- outputs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CriOverrides:
    """Fields to set in the CRI LinuxContainerResources; None = keep kubelet's value.

    `unified` entries are merged into kubelet's map (cgroup v2 only).
    """

    cpu_period: int | None = None
    cpu_quota: int | None = None
    cpu_shares: int | None = None
    memory_limit_in_bytes: int | None = None
    oom_score_adj: int | None = None
    cpuset_cpus: str | None = None
    cpuset_mems: str | None = None
    unified: Mapping[str, str] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return not self.unified and all(
            getattr(self, spec.name) is None for spec in fields(self) if spec.name != "unified"
        )

    def apply(self, resources: ContainerResources) -> ContainerResources:
        """kubelet's resources with these overrides applied."""
        changes: dict[str, Any] = {
            spec.name: getattr(self, spec.name)
            for spec in fields(self)
            if spec.name != "unified" and getattr(self, spec.name) is not None
        }
        if self.unified:
            changes["unified"] = {**resources.unified, **self.unified}
        return replace(resources, **changes)


@dataclass(frozen=True)
class MemoryProtection:
    """A container's memory numbers, kept so pod-level values can be summed."""

    enabled: bool = False
    request_bytes: int | None = None
    limit_bytes: int = 0  # 0 = unlimited
    min_bytes: int = 0
    low_bytes: int = 0
    high_bytes: int | None = None  # None = not set (memory.high stays "max")


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


@dataclass(frozen=True)
class PodPlan:
    qos_class: QoSClass
    writes: tuple[CgroupWrite, ...] = ()
    notes: tuple[str, ...] = ()
    problems: tuple[ParseProblem, ...] = ()
    # The pod's tasks share one core-scheduling cookie ([qos.<CLASS>] core_sched).
    core_sched: bool = False


# --- small formulas ----------------------------------------------------------------------


def clamp_shares(shares: int) -> int:
    return max(MIN_SHARES, min(MAX_SHARES, shares))


def requested_cpus(resources: ContainerResources) -> int:
    """Whole CPUs to reserve for an LSE/LSR container.

    The CFS limit (quota / period, = the request for Guaranteed pods) when set, else the request
    kubelet encoded in cpu_shares; rounded up. 0 when kubelet sent neither.
    """
    if resources.cpu_quota > 0:
        period = _cfs_period(resources.cpu_period)
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


def cpu_shares_for(
    qos_class: QoSClass,
    config: QoSClassConfig,
    kubelet_shares: int,
    batch: BatchResources | None = None,
) -> tuple[int, str]:
    """cpu.shares for a container of the class, and the reason."""
    if qos_class is QoSClass.BE and batch is not None and batch.cpu_request_milli is not None:
        shares = clamp_shares(batch.cpu_request_milli * KUBELET_SHARES_PER_CPU // 1000)
        return shares, f"BE: cpu.shares {shares} from batch-cpu request {batch.cpu_request_milli}m"
    if config.cpu_shares_fixed > 0:
        shares = clamp_shares(config.cpu_shares_fixed)
        return shares, f"{qos_class.value}: fixed cpu.shares {shares}"
    requested = max(kubelet_shares, 0)
    # shares_per_cpu x (kubelet shares / 1024), rounded to nearest, in integers.
    shares = clamp_shares(
        (requested * config.cpu_shares_per_cpu + KUBELET_SHARES_PER_CPU // 2) // KUBELET_SHARES_PER_CPU
    )
    reason = (
        f"{qos_class.value}: cpu.shares {shares} = {config.cpu_shares_per_cpu} per requested CPU"
        f" x {requested / KUBELET_SHARES_PER_CPU:.3f} CPU (kubelet cpu_shares {kubelet_shares}),"
        f" clamped to [{MIN_SHARES}, {MAX_SHARES}]"
    )
    return shares, reason


def _cfs_period(kubelet_period: int) -> int:
    """kubelet's CFS period when the kernel would accept it, else the default."""
    low, high = CFS_PERIOD_RANGE_US
    return kubelet_period if low <= kubelet_period <= high else DEFAULT_CFS_PERIOD_US


def batch_cpu_quota(limit_milli: int | None, period_us: int) -> int:
    """CFS quota for a batch-cpu limit in milli-cores: -1 when unlimited, at least 1000 µs."""
    if limit_milli is None or limit_milli <= 0:
        return -1
    return min(max(limit_milli * period_us // 1000, MIN_CFS_QUOTA_US), MAX_CFS_QUOTA_US)


@dataclass(frozen=True)
class _MemoryNumbers:
    enabled: bool
    min_percent: int
    low_percent: int
    high_percent: int
    wmark: bool
    wmark_ratio: int
    wmark_scale_permill: int
    wmark_min_adj: int
    why_disabled: str = ""


def _memory_numbers(
    qos_class: QoSClass, config: QoSClassConfig, annotations: PodAnnotations
) -> _MemoryNumbers:
    override = annotations.memory_qos

    def pick(value: int | None, default: int) -> int:
        return default if value is None else value

    enabled = config.memory_qos
    why = "" if enabled else f"{qos_class.value}: memory QoS disabled for the class"
    if override is not None and override.policy == "none":
        enabled, why = False, 'memory QoS disabled by the pod\'s koordinator.sh/memoryQOS policy "none"'
    return _MemoryNumbers(
        enabled=enabled,
        min_percent=pick(override.min_limit_percent if override else None, config.memory_min_percent),
        low_percent=pick(override.low_limit_percent if override else None, config.memory_low_percent),
        high_percent=pick(override.throttling_percent if override else None, config.memory_high_percent),
        wmark=config.memory_wmark,
        wmark_ratio=pick(override.wmark_ratio if override else None, config.memory_wmark_ratio),
        wmark_scale_permill=pick(
            override.wmark_scale_permill if override else None, config.memory_wmark_scale_permill
        ),
        wmark_min_adj=pick(override.wmark_min_adj if override else None, config.memory_wmark_min_adj),
        why_disabled=why,
    )


def _memory_request(
    decision: ClassDecision,
    resources: ContainerResources,
    limit: int,
    batch: BatchResources | None,
    api_request: int | None = None,
) -> tuple[int | None, str]:
    """The container's memory request (not in CRI), and where it came from."""
    if decision.kube_qos is KubeQoS.GUARANTEED and limit > 0:
        return limit, "request = limit (Guaranteed)"
    # kubelet's Memory QoS (TieredReservation) puts the request into `unified`: memory.min
    # for Guaranteed, memory.low for Burstable pods.
    for key in ("memory.min", "memory.low"):
        raw = resources.unified.get(key)
        if raw is None:
            continue
        try:
            value = int(str(raw).strip())
        except ValueError:
            value = -1
        if value > 0:
            return value, f"request from kubelet's unified {key}"
    if api_request is not None and api_request > 0:
        return api_request, "request from the pod spec (API server)"
    if batch is not None and batch.memory_request_bytes is not None:
        return batch.memory_request_bytes, "request from the batch-memory request annotation"
    sources = [f"{decision.kube_qos.value}", "no memory.min/low in unified", "no annotation",
               "not known to the API server" if api_request is None else "no request in the pod spec"]
    return None, "no memory request known (" + ", ".join(sources) + ")"


def _memory_protection(numbers: _MemoryNumbers, request: int | None, limit: int) -> MemoryProtection:
    def cap(value: int) -> int:
        return min(value, limit) if limit > 0 else value

    base = request or 0
    high = limit * numbers.high_percent // 100 if limit > 0 and numbers.high_percent > 0 else None
    return MemoryProtection(
        enabled=numbers.enabled,
        request_bytes=request,
        limit_bytes=limit,
        min_bytes=cap(base * numbers.min_percent // 100),
        low_bytes=cap(base * numbers.low_percent // 100),
        high_bytes=high,
    )


def _wmark_writes(cgroup: str, numbers: _MemoryNumbers, level: str) -> list[CgroupWrite]:
    why = f"memory watermark ({level}; Anolis kernels)"
    return [
        CgroupWrite(cgroup, "memory.wmark_ratio", numbers.wmark_ratio, why),
        CgroupWrite(cgroup, "memory.wmark_scale_factor", numbers.wmark_scale_permill, why),
        CgroupWrite(cgroup, "memory.wmark_min_adj", numbers.wmark_min_adj, why),
    ]


# --- containers --------------------------------------------------------------------------


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
        period = _cfs_period(resources.cpu_period)
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
    numbers = _memory_numbers(qos_class, config, annotations)
    memory = MemoryProtection()
    if not numbers.enabled:
        notes.append(numbers.why_disabled)
    else:
        api_request = pod.memory_requests.get(container.name, 0) if pod.memory_requests is not None else None
        request, request_source = _memory_request(decision, resources, limit, batch, api_request)
        memory = _memory_protection(numbers, request, limit)
        if request is None and (numbers.min_percent or numbers.low_percent):
            notes.append(f"memory protection 0: {request_source}")
        protect_reason = (
            f"{qos_class.value}: memory.min {numbers.min_percent}% / memory.low {numbers.low_percent}%"
            f" of request {request} ({request_source})"
        )
        high_reason = f"{qos_class.value}: memory.high {numbers.high_percent}% of limit {limit}"
        memory_values: list[tuple[str, int, str]] = [
            ("memory.min", memory.min_bytes, protect_reason),
            ("memory.low", memory.low_bytes, protect_reason),
        ]
        if memory.high_bytes is not None:
            memory_values.append(("memory.high", memory.high_bytes, high_reason))
        elif limit <= 0:
            notes.append("memory.high not set: the container has no memory limit")
        for resource, value, reason in memory_values:
            if features.cgroup_version == "v2":
                # The runtime writes unified keys when it creates the cgroup.
                unified[resource] = str(value)
                mirrored(resource, value, reason)
            elif container_cgroup is not None:
                # v1 has these only on Anolis kernels; the executor skips them elsewhere.
                writes.append(CgroupWrite(container_cgroup, resource, value, reason))
        if numbers.wmark and container_cgroup is not None:
            writes.extend(_wmark_writes(container_cgroup, numbers, "container"))
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


# --- pods --------------------------------------------------------------------------------


def _cpu_priority_write(
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
    writes: list[CgroupWrite] = [_cpu_priority_write(pod_cgroup, qos_class, config, features, "pod")]

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

    numbers = _memory_numbers(qos_class, config, annotations)
    if numbers.enabled and numbers.wmark:
        writes += _wmark_writes(pod_cgroup, numbers, "pod")

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
    is set only when every container has one (one unlimited container leaves the pod unlimited).
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
    highs = [memory.high_bytes for memory in members]
    if all(high is not None for high in highs):
        writes.append(CgroupWrite(pod_cgroup, "memory.high", sum(h for h in highs if h is not None), reason))
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
    numbers = _memory_numbers(qos_class, config, annotations)
    limit = max(resources.memory_limit_in_bytes, 0)
    request, request_why = _memory_request(decision, resources, limit, None)
    memory = _memory_protection(numbers, request, limit)
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
                unified["memory.high"] = str(memory.high_bytes)
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
    return (_cpu_priority_write(tier_cgroup, qos_class, config, features, "besteffort tier"),)
