"""``[qos.<CLASS>]`` (the per-class numbers) and ``[qos_mapping]`` (class of unlabelled pods).

Plain frozen dataclasses with defaults; every numeric field carries its accepted range in its
metadata (min/max) for the generic loader, and __post_init__ re-checks so a dataclass built in
code is validated too. Each class has its own subclass so that the loader fills the fields the
user left out with that class's defaults (``[qos.BE] cpu_shares_fixed = 4`` keeps BE's other
numbers), not LS's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from koordnode.model.qos_class import KubeQoS, QoSClass
from koordnode.config.resctrl import ResctrlClassConfig
from koordnode.model.kernel import CPU_SHARES_MAX as MAX_SHARES
from koordnode.model.kernel import CPU_SHARES_MIN as MIN_SHARES
from koordnode.model.kernel import MEMORY_HIGH_PERCENT_MAX

MIB = 1024 * 1024
_INT64_MAX = 2**63 - 1

# name -> (min, max, help). One table so the per-class subclasses repeat only defaults.
_CLASS_FIELDS: dict[str, tuple[int, int, str]] = {
    "cpu_shares_per_cpu": (MIN_SHARES, MAX_SHARES, "cpu.shares per requested CPU (kubelet shares / 1024); "
                           "with [cgroup] pod_class_weight the pod cgroup gets the sum of its containers'"),
    "cpu_shares_fixed": (0, MAX_SHARES, "fixed cpu.shares regardless of request; 0 = use cpu_shares_per_cpu"),
    "oom_score_adj": (-1000, 1000, "oom_score_adj of the container processes (kept by the reconcile pass)"),
    "memory_min_percent": (0, 100, "memory.min as percent of the memory request"),
    "memory_low_percent": (0, 200, "memory.low as percent of the memory request"),
    "memory_high_percent": (0, MEMORY_HIGH_PERCENT_MAX, "memory.high = request + this percent of (limit - request), whole pages, as "
                            "Koordinator's throttlingPercent; no limit: of the node's memory; 0 = max"),
    "memory_wmark_ratio": (0, 100, "memory.wmark_ratio (Anolis async reclaim); 0 disables it"),
    "memory_wmark_scale_permill": (1, 1000, "memory.wmark_scale_factor in permill"),
    "memory_wmark_min_adj": (-25, 50, "memory.wmark_min_adj (Anolis)"),
    "blkio_weight": (0, 1000, "blkio.weight (10..1000) of the pod; 0 = leave unset"),
    "blkio_read_bps": (0, _INT64_MAX, "read throttle in bytes/s per configured device; 0 = none"),
    "blkio_write_bps": (0, _INT64_MAX, "write throttle in bytes/s per configured device; 0 = none"),
    "cpu_idle": (0, 1, "cpu.idle of the pod cgroup (upstream kernels >= 5.15); 1 ranks the pod only "
                 "against its sibling pods, drops its cpu.shares and draws LS network wake-ups to its CPUs"),
    "cpu_bvt_warp_ns": (-1, 2, "cpu.bvt_warp_ns of the pod cgroup (group identity kernels)"),
    "sched_slice_us": (0, 100000, "EEVDF slice of the class's tasks in microseconds (sched_attr, Linux 6.12+; "
                       "100 = the kernel's shortest: a task past it gives the CPU back at the next "
                       "scheduling event); 0 = the kernel's default"),
}


def _class_field(name: str, default: int) -> Any:
    low, high, help_text = _CLASS_FIELDS[name]
    return field(default=default, metadata={"min": low, "max": high, "doc": help_text})


def _check_ranges(instance: object, prefix: str = "") -> None:
    """Check every field that declares min/max, and reject bools posing as ints."""
    for spec in dataclasses.fields(instance):  # type: ignore[arg-type]
        value = getattr(instance, spec.name)
        low = spec.metadata.get("min")
        high = spec.metadata.get("max")
        if low is None and high is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{prefix}{spec.name} must be an integer, got {value!r}")
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(f"{prefix}{spec.name} = {value} is out of range [{low}, {high}]")


@dataclass(frozen=True)
class QoSClassConfig:
    """Numbers for one QoS class. The base defaults are the LS class's."""

    cpu_shares_per_cpu: int = _class_field("cpu_shares_per_cpu", 1024)
    cpu_shares_fixed: int = _class_field("cpu_shares_fixed", 0)
    oom_score_adj: int = _class_field("oom_score_adj", -300)
    # False: no memory.min/low/high nor watermark writes for this class.
    memory_qos: bool = field(default=True, metadata={"doc": "apply memory.min/low/high to this class"})
    memory_min_percent: int = _class_field("memory_min_percent", 50)
    memory_low_percent: int = _class_field("memory_low_percent", 80)
    memory_high_percent: int = _class_field("memory_high_percent", 90)
    # False: no memory.wmark_* writes (they exist only on Anolis kernels).
    memory_wmark: bool = field(default=True, metadata={"doc": "apply the Anolis memory watermark files to this class"})
    memory_wmark_ratio: int = _class_field("memory_wmark_ratio", 95)
    memory_wmark_scale_permill: int = _class_field("memory_wmark_scale_permill", 20)
    memory_wmark_min_adj: int = _class_field("memory_wmark_min_adj", -25)
    blkio_weight: int = _class_field("blkio_weight", 500)
    blkio_read_bps: int = _class_field("blkio_read_bps", 0)
    blkio_write_bps: int = _class_field("blkio_write_bps", 0)
    cpu_idle: int = _class_field("cpu_idle", 0)
    cpu_bvt_warp_ns: int = _class_field("cpu_bvt_warp_ns", 0)
    sched_slice_us: int = _class_field("sched_slice_us", 0)
    resctrl: ResctrlClassConfig = field(
        default_factory=ResctrlClassConfig,
        metadata={"doc": "[qos.<CLASS>.resctrl]: share of L3 cache ways and memory bandwidth"},
    )
    # Meant for LSE (whole cores): a pod's tasks then never share a physical core with another
    # pod's or untagged work at the same time; the sibling idles instead (a throughput cost).
    core_sched: bool = field(default=False, metadata={
        "doc": "core scheduling: the tasks of each pod of the class share one PR_SCHED_CORE cookie, so no "
               "other pod's task runs on an SMT sibling of their core at the same time (needs SMT and a "
               "kernel with CONFIG_SCHED_CORE)"})
    # Koordinator's coreExpeller: BE tasks get one cookie of their own, shared with the classes
    # without core_expeller, so the kernel never runs them on an SMT sibling of this class's tasks.
    core_expeller: bool = field(default=False, metadata={
        "doc": "core scheduling against BE: BE tasks never run on an SMT sibling of a core this class's "
               "tasks run on (BE, and classes without core_expeller, share one PR_SCHED_CORE cookie; "
               "not for SYSTEM or BE; needs SMT and a kernel with CONFIG_SCHED_CORE)"})

    def __post_init__(self) -> None:
        _check_ranges(self)
        for name in ("memory_qos", "memory_wmark", "core_sched", "core_expeller"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if 0 < self.blkio_weight < 10:
            raise ValueError(f"blkio_weight = {self.blkio_weight}: must be 0 (unset) or 10..1000")
        if 0 < self.sched_slice_us < 100:
            raise ValueError(f"sched_slice_us = {self.sched_slice_us}: must be 0 (the kernel's default) or "
                             "100..100000 (the kernel's range)")


@dataclass(frozen=True)
class SystemClassConfig(QoSClassConfig):
    cpu_shares_per_cpu: int = _class_field("cpu_shares_per_cpu", 32768)
    oom_score_adj: int = _class_field("oom_score_adj", -1000)
    memory_qos: bool = field(default=False, metadata={"doc": "apply memory.min/low/high to this class"})
    memory_wmark: bool = field(default=False, metadata={"doc": "apply the Anolis memory watermark files to this class"})
    blkio_weight: int = _class_field("blkio_weight", 0)


@dataclass(frozen=True)
class LSEClassConfig(QoSClassConfig):
    cpu_shares_per_cpu: int = _class_field("cpu_shares_per_cpu", 262144)
    oom_score_adj: int = _class_field("oom_score_adj", -900)
    memory_min_percent: int = _class_field("memory_min_percent", 100)
    memory_low_percent: int = _class_field("memory_low_percent", 120)
    blkio_weight: int = _class_field("blkio_weight", 1000)


@dataclass(frozen=True)
class LSRClassConfig(QoSClassConfig):
    cpu_shares_per_cpu: int = _class_field("cpu_shares_per_cpu", 65536)
    oom_score_adj: int = _class_field("oom_score_adj", -700)
    memory_min_percent: int = _class_field("memory_min_percent", 80)
    memory_low_percent: int = _class_field("memory_low_percent", 100)
    blkio_weight: int = _class_field("blkio_weight", 800)


@dataclass(frozen=True)
class LSClassConfig(QoSClassConfig):
    pass


@dataclass(frozen=True)
class BEClassConfig(QoSClassConfig):
    cpu_shares_per_cpu: int = _class_field("cpu_shares_per_cpu", 2)
    cpu_shares_fixed: int = _class_field("cpu_shares_fixed", 2)
    oom_score_adj: int = _class_field("oom_score_adj", 1000)
    memory_min_percent: int = _class_field("memory_min_percent", 0)
    memory_low_percent: int = _class_field("memory_low_percent", 0)
    memory_high_percent: int = _class_field("memory_high_percent", 70)
    memory_wmark_min_adj: int = _class_field("memory_wmark_min_adj", 50)
    blkio_weight: int = _class_field("blkio_weight", 100)
    blkio_read_bps: int = _class_field("blkio_read_bps", 500 * MIB)
    blkio_write_bps: int = _class_field("blkio_write_bps", 200 * MIB)
    # 0: cpu.idle on the BE pod does not protect LS (SCHED_IDLE ranks a cgroup only against its
    # siblings; BE pods meet LS one level up, where koordnode's BE group decides), and any
    # SCHED_IDLE on BE hurts LS request/response: the kernel's wake-up placement counts a CPU
    # running only idle work as idle (sched_idle_cpu()), so an LS server's network wake-ups went
    # to the CPU running BE in 53-75% of round trips (non-idle BE: 98-100% stayed local), LS
    # p99.9 2.7-6.0x its alone value (bench/wake_placement.py). 1 still works: the pod is idle
    # and its batch cpu.shares are dropped (the kernel pins an idle group's weight).
    cpu_idle: int = _class_field("cpu_idle", 0)
    resctrl: ResctrlClassConfig = field(
        default_factory=lambda: ResctrlClassConfig(cat_range_end_percent=30),
        metadata={"doc": "[qos.<CLASS>.resctrl]: share of L3 cache ways and memory bandwidth"},
    )
    cpu_bvt_warp_ns: int = _class_field("cpu_bvt_warp_ns", -1)
    # The shortest slice: BE picked while LS waits (EEVDF, after an LS burst past its share)
    # gives the CPU back at the next scheduling event instead of the next tick (4 ms at HZ=250).
    sched_slice_us: int = _class_field("sched_slice_us", 100)


@dataclass(frozen=True)
class QoSConfig:
    """All classes; TOML `[qos.<CLASS>]` tables map onto the upper-case fields."""

    SYSTEM: SystemClassConfig = field(default_factory=SystemClassConfig)
    LSE: LSEClassConfig = field(default_factory=LSEClassConfig)
    LSR: LSRClassConfig = field(default_factory=LSRClassConfig)
    LS: LSClassConfig = field(default_factory=LSClassConfig)
    BE: BEClassConfig = field(default_factory=BEClassConfig)

    def __post_init__(self) -> None:
        for name in ("SYSTEM", "BE"):
            if getattr(self, name).core_expeller:
                raise ValueError(f"[qos.{name}] core_expeller: only LSE, LSR and LS can expel BE from their cores"
                                 " (SYSTEM pods are never tagged, BE is what is expelled)")

    def for_class(self, qos_class: QoSClass) -> QoSClassConfig:
        config: QoSClassConfig = getattr(self, qos_class.value)
        return config

    def as_dict(self) -> dict[QoSClass, QoSClassConfig]:
        return {qos_class: self.for_class(qos_class) for qos_class in QoSClass}



_CLASS_NAMES = tuple(qos_class.value for qos_class in QoSClass)
ClassName = Literal["SYSTEM", "LSE", "LSR", "LS", "BE"]


@dataclass(frozen=True)
class KubeQoSMapping:
    """[qos_mapping]: class of pods without a valid koordinator.sh/qosClass label."""

    guaranteed: ClassName = field(default="LSR", metadata={"doc": "class of Guaranteed pods"})
    burstable: ClassName = field(default="LS", metadata={"doc": "class of Burstable pods"})
    best_effort: ClassName = field(default="BE", metadata={"doc": "class of BestEffort pods"})

    def __post_init__(self) -> None:
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            if value not in _CLASS_NAMES:
                raise ValueError(
                    f"{spec.name} = {value!r}: expected one of {', '.join(_CLASS_NAMES)}"
                )

    def as_mapping(self) -> Mapping[KubeQoS, QoSClass]:
        return MappingProxyType(
            {
                KubeQoS.GUARANTEED: QoSClass(self.guaranteed),
                KubeQoS.BURSTABLE: QoSClass(self.burstable),
                KubeQoS.BEST_EFFORT: QoSClass(self.best_effort),
            }
        )
