"""The class values a container's plan and its pod's plans share: CPU weight, CFS quota and
period, memory protection and watermarks, and the CRI overrides of kubelet's resources.

Pure functions. All CgroupWrite values are in cgroup v1 units and spelling; the executor
converts for v2.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from koordnode.policy.class_inputs import ContainerResources
from koordnode.policy.plan import CgroupWrite
from koordnode.model.annotations import BatchResources, PodAnnotations
from koordnode.model.qos_class import ClassDecision, KubeQoS, QoSClass
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
    PAGE_SIZE,
)

MIN_CFS_QUOTA_US = CFS_QUOTA_MIN_US
MAX_CFS_QUOTA_US = CFS_RUNTIME_MAX_US
CFS_PERIOD_RANGE_US = (CFS_PERIOD_MIN_US, CFS_PERIOD_MAX_US)


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
    high_bytes: int | None = None  # None = not written; MEMORY_HIGH_MAX (-1) = "max"


# --- CPU weight and CFS bandwidth ----------------------------------------------------------


def clamp_shares(shares: int) -> int:
    return max(MIN_SHARES, min(MAX_SHARES, shares))


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


def cfs_period(kubelet_period: int) -> int:
    """kubelet's CFS period when the kernel would accept it, else the default."""
    low, high = CFS_PERIOD_RANGE_US
    return kubelet_period if low <= kubelet_period <= high else DEFAULT_CFS_PERIOD_US


def batch_cpu_quota(limit_milli: int | None, period_us: int) -> int:
    """CFS quota for a batch-cpu limit in milli-cores: -1 when unlimited, at least 1000 µs."""
    if limit_milli is None or limit_milli <= 0:
        return -1
    return min(max(limit_milli * period_us // 1000, MIN_CFS_QUOTA_US), MAX_CFS_QUOTA_US)


# --- memory protection and watermarks ----------------------------------------------------


@dataclass(frozen=True)
class MemoryNumbers:
    """The class's memory QoS settings with the pod's memoryQOS annotation applied."""

    enabled: bool
    min_percent: int
    low_percent: int
    high_percent: int
    wmark: bool
    wmark_ratio: int
    wmark_scale_permill: int
    wmark_min_adj: int
    why_disabled: str = ""


def memory_numbers(
    qos_class: QoSClass, config: QoSClassConfig, annotations: PodAnnotations
) -> MemoryNumbers:
    override = annotations.memory_qos

    def pick(value: int | None, default: int) -> int:
        return default if value is None else value

    enabled = config.memory_qos
    why = "" if enabled else f"{qos_class.value}: memory QoS disabled for the class"
    if override is not None and override.policy == "none":
        enabled, why = False, 'memory QoS disabled by the pod\'s koordinator.sh/memoryQOS policy "none"'
    return MemoryNumbers(
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


def memory_request(
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


MEMORY_HIGH_MAX = -1  # memory.high "max": no throttling below memory.max


def memory_high(request: int | None, limit: int, percent: int, node_memory: int) -> tuple[int | None, str]:
    """Koordinator's memory.high: request + percent x (limit - request), whole pages, with the
    node's memory standing in for a missing limit; percent 0 resets it to "max". None: not set
    (no limit and the node's memory not known)."""
    if percent == 0:
        return MEMORY_HIGH_MAX, "memory.high max (throttling percent 0)"
    base = request or 0
    if limit > 0:
        bound, of = limit, f"limit {limit}"
    elif node_memory > 0:
        bound, of = node_memory, f"node memory {node_memory} (no limit)"
    else:
        return None, "memory.high not set: no memory limit and the node's memory not known"
    high = (base + (bound - base) * percent // 100) // PAGE_SIZE * PAGE_SIZE
    return high, f"memory.high = request {base} + {percent}% of ({of} - request)"


def memory_protection(numbers: MemoryNumbers, request: int | None, limit: int,
                      node_memory: int = 0) -> MemoryProtection:
    def cap(value: int) -> int:
        return min(value, limit) if limit > 0 else value

    base = request or 0
    min_bytes = cap(base * numbers.min_percent // 100)
    high, _ = memory_high(request, limit, numbers.high_percent, node_memory)
    if high is not None and high != MEMORY_HIGH_MAX:
        high = max(high, min_bytes)  # never throttled below what is protected
    return MemoryProtection(
        enabled=numbers.enabled,
        request_bytes=request,
        limit_bytes=limit,
        min_bytes=min_bytes,
        low_bytes=cap(base * numbers.low_percent // 100),
        high_bytes=high,
    )


def wmark_writes(cgroup: str, numbers: MemoryNumbers, level: str) -> list[CgroupWrite]:
    why = f"memory watermark ({level}; Anolis kernels)"
    return [
        CgroupWrite(cgroup, "memory.wmark_ratio", numbers.wmark_ratio, why),
        CgroupWrite(cgroup, "memory.wmark_scale_factor", numbers.wmark_scale_permill, why),
        CgroupWrite(cgroup, "memory.wmark_min_adj", numbers.wmark_min_adj, why),
    ]
