"""``[resctrl]`` and ``[qos.<CLASS>.resctrl]``: L3 cache ways and memory bandwidth per class.

Off by default (``[resctrl] enable = false``). The per-class numbers are nested into each
class's config (koordnode.config.classes); class defaults: :func:`resctrl_class_defaults`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from koordnode.config.fields import setting

__all__ = [
    "RESCTRL_GROUP_CLASSES",
    "ResctrlClassConfig",
    "ResctrlConfig",
    "ResctrlVendor",
    "resctrl_class_defaults",
]

ResctrlVendor = Literal["auto", "intel", "amd"]

# Classes that own a resctrl group; LSE pods share the LSR group, SYSTEM pods stay in the
# root (default) group, which keeps the whole cache and full bandwidth.
RESCTRL_GROUP_CLASSES = ("LSR", "LS", "BE")

_GROUP_PREFIX = re.compile(r"^[A-Za-z0-9_.-]{1,40}\Z")


def _check_group_prefix(value: str) -> str | None:
    if not _GROUP_PREFIX.match(value) or value in (".", ".."):
        return ('expected 1-40 characters of letters, digits, "_", "." or "-" '
                f"(a directory name prefix), got {value!r}")
    if value in ("info", "mon_groups", "mon_data"):
        return f"{value!r} is a name the resctrl filesystem reserves"
    return None


def _check_absolute(value: str) -> str | None:
    if not value.startswith("/") or "\0" in value:
        return f"expected an absolute path, got {value!r}"
    return None


@dataclass(frozen=True)
class ResctrlConfig:
    enable: bool = setting(
        False,
        doc="put pods into one resctrl group per class (LSR and LSE, LS, BE) with the L3 "
        "cache ways and memory bandwidth of [qos.<CLASS>.resctrl]; false removes the groups",
    )
    vendor: ResctrlVendor = setting(
        "auto",
        doc='CPU vendor deciding the memory bandwidth format: "auto" (from /proc/cpuinfo), '
        '"intel" (percent) or "amd" (absolute, 1/8 GB/s units)',
    )
    root: str = setting(
        "/sys/fs/resctrl",
        doc="where the resctrl filesystem is mounted (koordnode never mounts it)",
        check=_check_absolute,
    )
    procfs_root: str = setting(
        "/proc", doc="procfs mount read for cpuinfo (vendor_id, cat_l3 and mba flags)",
        check=_check_absolute,
    )
    group_prefix: str = setting(
        "koordnode-",
        doc="name prefix of the resctrl groups koordnode owns (<prefix>LSR, <prefix>LS, "
        "<prefix>BE); directories with other names are never touched",
        check=_check_group_prefix,
    )
    amd_max_bandwidth_gbps: float = setting(
        32.0,
        min=0.125,
        max=256.0,
        doc="AMD only: memory bandwidth in GB/s one L3 domain can draw, i.e. what "
        "mba_percent = 100 means; a lower percent is written as that share of it",
    )


@dataclass(frozen=True)
class ResctrlClassConfig:
    """``[qos.<CLASS>.resctrl]``: the share of L3 cache and memory bandwidth of a class.

    Used for LSR (LSE pods share its group), LS and BE; ignored for SYSTEM and LSE.
    """

    cat_range_start_percent: int = setting(
        0, min=0, max=100,
        doc="start of the class's contiguous slice of L3 cache ways, percent of the cache",
    )
    cat_range_end_percent: int = setting(
        100, min=0, max=100,
        doc="end of the class's slice of L3 cache ways, percent (at least min_cbm_bits "
        "ways are always given)",
    )
    mba_percent: int = setting(
        100, min=1, max=100,
        doc="memory bandwidth the class may use, percent (Intel: rounded up to the "
        "hardware's granularity; AMD: share of resctrl.amd_max_bandwidth_gbps)",
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
