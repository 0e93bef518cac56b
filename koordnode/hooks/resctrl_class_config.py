"""Per-class resctrl numbers, `[qos.<CLASS>.resctrl]`.

Its own module without koordnode.config imports, because the per-class QoS config nests it
and koordnode.config imports that: plain field metadata (min/max/doc) as the loader reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class ResctrlClassConfig:
    """``[qos.<CLASS>.resctrl]``: the share of L3 cache and memory bandwidth of a class.

    Used for LSR (LSE pods share its group), LS and BE; ignored for SYSTEM and LSE.
    """

    cat_range_start_percent: int = field(default=0, metadata={"min": 0, "max": 100, "doc":
        "start of the class's contiguous slice of L3 cache ways, percent of the cache"},
    )
    cat_range_end_percent: int = field(default=100, metadata={"min": 0, "max": 100, "doc":
        "end of the class's slice of L3 cache ways, percent (at least min_cbm_bits "
        "ways are always given)"},
    )
    mba_percent: int = field(default=100, metadata={"min": 1, "max": 100, "doc":
        "memory bandwidth the class may use, percent (Intel: rounded up to the "
        "hardware's granularity; AMD: share of resctrl.amd_max_bandwidth_gbps)"},
    )

    def validate(self) -> list[str]:
        if self.cat_range_start_percent >= self.cat_range_end_percent:
            return ["cat_range_end_percent: must be greater than cat_range_start_percent "
                    f"({self.cat_range_end_percent} <= {self.cat_range_start_percent})"]
        return []


_RESCTRL_CLASS_DEFAULTS: Mapping[str, ResctrlClassConfig] = MappingProxyType({
    "SYSTEM": ResctrlClassConfig(),
    "LSE": ResctrlClassConfig(),
    "LSR": ResctrlClassConfig(),
    "LS": ResctrlClassConfig(),
    "BE": ResctrlClassConfig(cat_range_end_percent=30),
})


def resctrl_class_defaults(class_name: str) -> ResctrlClassConfig:
    """Default ``[qos.<CLASS>.resctrl]`` of a class: BE gets 0-30 % of L3, others all."""
    return _RESCTRL_CLASS_DEFAULTS[str(class_name)]
