"""``[strategy.<name>]``: the QoS manager's strategies, one section each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from koordnode.config.fields import section, setting

SuppressPolicy = Literal["cfs_quota", "cpuset"]
PressureCurve = tuple[tuple[float, ...], ...]

DEFAULT_PRESSURE_CURVE: PressureCurve = ((40.0, 1.0), (80.0, 0.3), (95.0, 0.1))


def check_pressure_curve(curve: PressureCurve) -> str | None:
    """Points [pressure %, ratio]: pressures strictly increasing in [0, 100], ratios in [0, 1]."""
    if not curve:
        return "needs at least one [pressure_percent, ratio] point"
    previous = -1.0
    for index, point in enumerate(curve):
        if len(point) != 2:
            return f"point {index} must be [pressure_percent, ratio], got {list(point)}"
        pressure, ratio = point
        if not 0.0 <= pressure <= 100.0:
            return f"point {index}: pressure {pressure} is outside [0, 100]"
        if not 0.0 <= ratio <= 1.0:
            return f"point {index}: ratio {ratio} is outside [0, 1]"
        if pressure <= previous:
            return f"point {index}: pressures must increase ({pressure} after {previous})"
        previous = pressure
    return None


@dataclass(frozen=True)
class CpuSuppressConfig:
    enable: bool = setting(True, doc="limit the BE tier's CPU to what the LS side leaves over")
    policy: SuppressPolicy = setting(
        "cfs_quota",
        doc='"cfs_quota": CFS quota of the BE tier cgroup; "cpuset": the CPUs BE may run on',
    )
    threshold_percent: float = setting(
        65.0, min=1, max=100,
        doc="share of the node's CPUs that LS + system + BE together may use, percent "
        "(BE in kubelet's besteffort tier)",
    )
    idle_group_threshold_percent: float = setting(
        95.0, min=1, max=100,
        doc="threshold_percent while the BE pods are in koordnode's idle BE group ([cgroup] be_idle_group): "
        "the kernel already makes BE yield to LS at once, so BE may use nearly all the CPU LS leaves idle",
    )
    ls_quiet_percent: float = setting(
        25.0, min=0, max=100,
        doc="while the LS pods use at most this share of the node's CPUs and LS CPU pressure stays "
        "below the pressure curve's first point, BE runs unthrottled, and koordnode's BE group not idle "
        "at the lowest weight (cpu.shares 2, v2 cpu.weight 1): an idle flag sends LS wake-ups to CPUs "
        "running BE and a quota's refills let BE delay LS (bench/wake_placement.py); above it the quota "
        "and the group's cpu.idle = 1 apply at once; back to quiet once the quota has grown to its "
        "target; cfs_quota policy only; 0 = always suppress",
    )
    pressure_curve: PressureCurve = setting(
        DEFAULT_PRESSURE_CURVE,
        check=check_pressure_curve,
        doc="[LS CPU pressure %, BE budget ratio] points, linear in between, flat outside",
    )
    min_quota_us: int = setting(2000, min=1000, max=1_000_000, doc="floor of the BE tier's CFS quota, microseconds")
    min_cpus: int = setting(2, min=1, max=4096, doc="cpuset policy: fewest CPUs BE keeps")
    max_growth_percent: float = setting(
        10.0, min=0.1, max=100,
        doc="most the BE budget grows per tick, percent of the node's CPUs (shrinking is immediate)",
    )
    min_change_percent: float = setting(
        1.0, min=0, max=50, doc="changes smaller than this (percent of the current value) are not written",
    )
    pod_start_cpu_percent: float = setting(
        25.0, min=0, max=400,
        doc="while the runtime starts a BE pod's sandbox or container (proxy: its RunPodSandbox, "
        "CreateContainer and StartContainer calls; NRI: from CreateContainer to the container's start), "
        "the BE quota is at least this share of one CPU, and once a start has run pod_start_lift_after_s "
        "koordnode's BE group leaves idle at pod_start_shares, so that a start beside busy LS pods does "
        "not outlast kubelet's runtime request timeout; percent of one CPU, cfs_quota policy; 0 = off",
    )
    pod_start_lift_after_s: float = setting(
        5.0, min=0, max=600,
        doc="how long a BE start runs with the allowance's quota alone, koordnode's BE group still idle "
        "(LS still runs first; the start uses what LS leaves), before the group leaves idle at "
        "pod_start_shares as well; seconds, 0 = at once",
    )
    pod_start_shares: int = setting(
        64, min=32, max=262144,
        doc="koordnode's BE group's cpu.shares while a BE pod starts (v2: the cpu.weight of it; 32 is v2's "
        "weight 2, above the lowest weight of the quiet state); its share of a CPU that LS keeps busy, so "
        "the start's speed, against LS's wake-up latency meanwhile",
    )
    pod_start_max_s: float = setting(
        120.0, min=1, max=600,
        doc="longest one BE start counts, seconds: kubelet's runtime request timeout (2 min by default), "
        "after which kubelet gives the call up (bounds a start whose answer never came)",
    )


@dataclass(frozen=True)
class CpuBurstConfig:
    enable: bool = setting(False, doc="let LS containers with a CPU limit burst above it")
    burst_percent: float = setting(
        1000.0, min=0, max=100000,
        doc="cfs_burst_us as percent of a period's quota (capped by the kernel at 100 %)",
    )
    cfs_quota_burst: bool = setting(True, doc="also raise the CFS quota of throttled LS pods")
    max_quota_percent: float = setting(
        300.0, min=100, max=10000, doc="highest CFS quota as percent of the pod's limit",
    )
    share_pool_threshold_percent: float = setting(
        50.0, min=1, max=100,
        doc="quota grows only while the share pool's CPU use is below this; above it the node is overloaded",
    )
    scale_up: float = setting(1.2, min=1.0, max=10.0, doc="quota factor per tick for a throttled pod")
    scale_down: float = setting(0.8, min=0.01, max=1.0, doc="quota factor per tick while the node is overloaded")


@dataclass(frozen=True)
class MemoryQoSConfig:
    enable: bool = setting(True, doc="keep the hooks' memory.min/low/high and watermarks applied")
    min_free_kbytes: int = setting(
        0, min=0, max=(1 << 31) - 1, doc="node vm.min_free_kbytes to keep; 0 leaves it alone",
    )
    watermark_scale_factor: int = setting(
        0, min=0, max=3000, doc="node vm.watermark_scale_factor to keep; 0 leaves it alone",
    )


@dataclass(frozen=True)
class BeEvictConfig:
    enable: bool = setting(False, doc="stop BE containers when the node runs short of memory or BE of CPU")
    memory_threshold_percent: float = setting(
        70.0, min=10, max=100, doc="node memory use (MemTotal - MemAvailable) that starts evictions, percent",
    )
    memory_margin_percent: float = setting(
        2.0, min=0, max=50, doc="evict until memory use is this far below the threshold, percent of MemTotal",
    )
    cpu_satisfaction_floor_percent: float = setting(
        0.0, min=0, max=100,
        doc="evict when BE's CPU budget / BE CPU requests stays below this, percent; 0 disables",
    )
    cpu_satisfaction_duration_s: float = setting(
        60.0, min=0, max=3600, doc="seconds the satisfaction must stay below its floor",
    )
    cpu_busy_percent: float = setting(
        90.0, min=0, max=100, doc="and BE must use at least this share of its CPU budget, percent",
    )
    cooldown_s: float = setting(60.0, min=0, max=86400, doc="seconds after an eviction round before the next")


@dataclass(frozen=True)
class BeMemoryConfig:
    enable: bool = setting(
        True, doc="bound BE memory by a node-level budget: on the BE tier (koordnode's BE group) and on "
        "BE pods without a memory limit",
    )
    budget_percent: float = setting(
        65.0, min=1, max=100,
        doc="share of node memory (MemTotal) LS, the system and BE together may use, percent; BE's budget "
        "is this less the LS pods' working set and the larger of the system's use and reserved_mib",
    )
    reserved_mib: int = setting(
        0, min=0, max=1 << 30,
        doc="memory reserved for the system and kubelet (their system-reserved and kube-reserved), MiB; "
        "the budget subtracts it when the system uses less",
    )
    min_budget_mib: int = setting(256, min=0, max=1 << 30, doc="floor of the BE budget, MiB")
    pod_high_percent: int = setting(
        70, min=1, max=100,
        doc="memory.high (v1: memory.soft_limit_in_bytes) of a BE pod without a memory limit, percent of "
        "the budget",
    )


@dataclass(frozen=True)
class StrategyConfig:
    cpu_suppress: CpuSuppressConfig = section(CpuSuppressConfig, doc="BE CPU suppression")
    cpu_burst: CpuBurstConfig = section(CpuBurstConfig, doc="CPU burst for LS")
    memory_qos: MemoryQoSConfig = section(MemoryQoSConfig, doc="memory protection reconcile")
    be_evict: BeEvictConfig = section(BeEvictConfig, doc="BE eviction under memory or CPU shortage")
    be_memory: BeMemoryConfig = section(BeMemoryConfig, doc="BE memory bounded by a node-level budget")
