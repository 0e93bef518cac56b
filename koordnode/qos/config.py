"""Configuration of the QoS manager and its strategies (TOML `[qos_manager]`, `[strategy.*]`).

Sections are frozen dataclasses read by the generic loader in koordnode.config; the lead
adds them to `Config` as

    strategy: StrategyConfig = section(StrategyConfig, doc=...)
    qos_manager: QoSManagerConfig = section(QoSManagerConfig, doc=...)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from koordnode.configfield import section, setting

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


def _absolute_cgroup(value: str) -> str | None:
    if value == "":
        return None
    if not value.startswith("/") or "\0" in value or "\n" in value:
        return f"expected an absolute cgroup path such as \"/kubepods\", got {value!r}"
    if any(part == ".." for part in value.split("/")):
        return "a cgroup path cannot contain '..'"
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
        doc="share of the node's CPUs that LS + system + BE together may use, percent",
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
class StrategyConfig:
    cpu_suppress: CpuSuppressConfig = section(CpuSuppressConfig, doc="BE CPU suppression")
    cpu_burst: CpuBurstConfig = section(CpuBurstConfig, doc="CPU burst for LS")
    memory_qos: MemoryQoSConfig = section(MemoryQoSConfig, doc="memory protection reconcile")
    be_evict: BeEvictConfig = section(BeEvictConfig, doc="BE eviction under memory or CPU shortage")


@dataclass(frozen=True)
class QoSManagerConfig:
    tick_ms: int = setting(1000, min=50, max=60000, doc="milliseconds between two regular ticks")
    kubepods_cgroup: str = setting(
        "", check=_absolute_cgroup,
        doc='kubelet\'s top pod cgroup, e.g. "/kubepods" (cgroupfs) or "/kubepods.slice" (systemd); '
        '"": from [cgroup] driver (auto: whichever of the two exists)',
    )
    psi_triggers: bool = setting(True, doc="wake up on LS CPU pressure between ticks")
    psi_stall_us: int = setting(
        20000, min=1, max=10_000_000, doc="stall time within the window that wakes the manager, microseconds",
    )
    psi_window_us: int = setting(
        500000, min=500000, max=10_000_000,
        doc="PSI trigger window, microseconds; without CAP_SYS_RESOURCE the kernel wants a multiple of 2 s",
    )
    psi_poll_ms: int = setting(
        50, min=0, max=10000,
        doc="when the kernel refuses triggers: how often pressure is polled instead; 0 = ticks only",
    )
    usage_wake_cpu_ms: float = setting(
        10.0, min=0, max=1000,
        doc="wake up when LS pods use this much CPU time on one CPU at half a CPU or more (kernel perf "
        "events on their cgroups, no polling); 0 = off",
    )
    wake_sample_ms: int = setting(
        20, min=0, max=1000,
        doc="a tick woken by pressure first samples LS usage for this long, to see the load as it is now",
    )
    reconcile_interval_s: float = setting(
        10.0, min=1, max=3600,
        doc="seconds between passes re-asserting values that only change on events (memory, bursts)",
    )
    history_length: int = setting(300, min=2, max=100000, doc="samples kept per series (ring buffer)")

    def validate(self) -> list[str]:
        if self.psi_stall_us > self.psi_window_us:
            return ["psi_stall_us: must not exceed psi_window_us"]
        return []


@dataclass(frozen=True)
class QoSSettings:
    """The two sections the manager reads: a stand-in for the daemon's Config (tests, benchmarks)."""

    strategy: StrategyConfig = StrategyConfig()
    qos_manager: QoSManagerConfig = QoSManagerConfig()
