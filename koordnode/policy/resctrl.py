"""resctrl policy: hardware facts + per-class config -> the schemata text of each group.

Pure: no file access. The controller (koordnode/qos/resctrl_control.py) has the hardware facts read
from the mounted resctrl filesystem, calls :func:`plan_groups`, and has the executor
(koordnode/executor/resctrl.py) converge the groups.

Facts this relies on (Linux Documentation/arch/x86/resctrl.rst):

- A schemata line is ``<resource>:<id>=<value>;<id>=<value>...``; cache ids are unique per
  level but may have gaps (``L3:0=7ff;2=7ff``), so the ids are taken from the root group's
  schemata, never assumed to be 0..n-1. A write must end with a newline and may carry several
  lines; resources and domains left out keep their value.
- A cache capacity bitmask (CBM) must be one contiguous block of 1 bits inside
  ``info/<L3>/cbm_mask`` with at least ``min_cbm_bits`` bits. With CDP (``mount -o cdp``) the
  cache appears as two resources, L3CODE and L3DATA; both get the same mask here.
- Intel MB values are percentages; the kernel rounds a value up to a multiple of
  ``info/MB/bandwidth_gran`` and refuses values below ``min_bandwidth``. AMD MB values are
  absolute, in 1/8 GB/s units, where 2048 means "no limit".
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from koordnode.config.resctrl import RESCTRL_GROUP_CLASSES, ResctrlClassConfig

__all__ = [
    "AMD_MB_UNLIMITED",
    "CACHE_RESOURCES",
    "CacheInfo",
    "GroupPlan",
    "MB_RESOURCE",
    "MemBandwidthInfo",
    "ResctrlInfo",
    "SchemataError",
    "Vendor",
    "cache_mask",
    "group_name",
    "group_of_class",
    "group_schemata",
    "mb_value",
    "parse_schemata",
    "plan_groups",
    "render_schemata",
    "schemata_differences",
    "threads_to_move",
]

# Cache resources we allocate: plain L3, or its CDP halves.
CACHE_RESOURCES = ("L3", "L3CODE", "L3DATA")
MB_RESOURCE = "MB"
AMD_MB_UNLIMITED = 2048
# AMD MB units are 1/8 GB/s.
_AMD_UNITS_PER_GBPS = 8

# Which group a pod of each class goes to; SYSTEM (and unknown) pods stay in the root group.
_GROUP_CLASS_OF: Mapping[str, str] = MappingProxyType(
    {"LSE": "LSR", "LSR": "LSR", "LS": "LS", "BE": "BE"}
)


class SchemataError(ValueError):
    """A schemata text, or hardware facts, that cannot be used."""


class Vendor(str, enum.Enum):
    INTEL = "intel"
    AMD = "amd"


@dataclass(frozen=True)
class CacheInfo:
    """``info/L3`` (or L3CODE / L3DATA) of a resctrl mount."""

    cbm_mask: int
    min_cbm_bits: int
    num_closids: int

    def __post_init__(self) -> None:
        if self.cbm_mask <= 0:
            raise SchemataError(f"cbm_mask {self.cbm_mask:x} has no bits set")
        if not _contiguous(self.cbm_mask):
            raise SchemataError(f"cbm_mask {self.cbm_mask:x} is not one contiguous block of bits")
        if self.min_cbm_bits < 0 or self.min_cbm_bits > self.cbm_mask.bit_count():
            raise SchemataError(
                f"min_cbm_bits {self.min_cbm_bits} does not fit cbm_mask {self.cbm_mask:x}"
            )


@dataclass(frozen=True)
class MemBandwidthInfo:
    """``info/MB`` of a resctrl mount."""

    min_bandwidth: int
    bandwidth_gran: int
    delay_linear: bool
    num_closids: int


@dataclass(frozen=True)
class ResctrlInfo:
    """What the hardware and the mounted resctrl filesystem offer.

    ``domains`` maps each resource line of the root schemata to its domain ids, in the
    kernel's order; ``caches`` has an entry per allocatable cache resource present in it.
    """

    vendor: Vendor
    domains: Mapping[str, tuple[int, ...]]
    caches: Mapping[str, CacheInfo] = field(default_factory=dict)
    mb: MemBandwidthInfo | None = None

    @property
    def num_closids(self) -> int:
        """CLOSIDs usable by groups (the root group holds one): the smallest of all resources."""
        counts = [c.num_closids for c in self.caches.values()]
        if self.mb is not None:
            counts.append(self.mb.num_closids)
        return min(counts) if counts else 0

    @property
    def managed_resources(self) -> tuple[str, ...]:
        """Resources koordnode writes, in the root schemata's order."""
        return tuple(r for r in self.domains
                     if r in self.caches or (r == MB_RESOURCE and self.mb is not None))


def _contiguous(mask: int) -> bool:
    if mask <= 0:
        return False
    shifted = mask >> ((mask & -mask).bit_length() - 1)
    return shifted & (shifted + 1) == 0


# ---------------------------------------------------------------------------------------------
# Values


def cache_mask(cache: CacheInfo, start_percent: int, end_percent: int) -> int:
    """The contiguous CBM for ``[start, end)`` percent of the cache ways.

    The edges round outwards (a class never gets less than it asked for), and the mask is
    widened to ``min_cbm_bits`` (at least one bit): first upwards, then downwards.
    """
    if not 0 <= start_percent < end_percent <= 100:
        raise SchemataError(f"bad cache range {start_percent}-{end_percent} percent")
    ways = cache.cbm_mask.bit_count()
    low_bit = (cache.cbm_mask & -cache.cbm_mask).bit_length() - 1
    start = (ways * start_percent) // 100
    end = -((-ways * end_percent) // 100)  # ceil
    need = max(cache.min_cbm_bits, 1)
    if end - start < need:
        end = min(ways, start + need)
        start = max(0, end - need)
    mask = ((1 << (end - start)) - 1) << (start + low_bit)
    assert mask & cache.cbm_mask == mask and _contiguous(mask)
    return mask


def mb_value(
    vendor: Vendor, mb: MemBandwidthInfo, percent: int, amd_max_bandwidth_gbps: float
) -> int:
    """The MB schemata value for ``percent`` of the memory bandwidth.

    Intel: the percentage itself, raised to ``min_bandwidth`` and rounded up to a multiple of
    ``bandwidth_gran``, exactly as the kernel will store it (so a read-back compares equal).
    AMD: 2048 (no limit) for 100 %, else ``percent`` of the configured per-domain bandwidth in
    1/8 GB/s units, rounded up, within 1..2047.
    """
    if not 1 <= percent <= 100:
        raise SchemataError(f"mba percent {percent} is outside 1..100")
    if vendor is Vendor.AMD:
        if percent == 100:
            return AMD_MB_UNLIMITED
        units = math.ceil(amd_max_bandwidth_gbps * _AMD_UNITS_PER_GBPS * percent / 100)
        return min(max(units, 1), AMD_MB_UNLIMITED - 1)
    gran = max(mb.bandwidth_gran, 1)
    value = max(percent, mb.min_bandwidth)
    value = -(-value // gran) * gran
    return min(value, 100)


# ---------------------------------------------------------------------------------------------
# Schemata text

_LINE = re.compile(r"^\s*([A-Za-z0-9_]+)\s*:(.*)$")


def parse_schemata(text: str) -> dict[str, dict[int, int]]:
    """Parse a schemata file as the kernel shows it (names and values may be space-padded).

    Cache values are hex masks, MB values decimal. Returns resource -> {domain id: value},
    domain ids in file order. Raises SchemataError on anything malformed.
    """
    result: dict[str, dict[int, int]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        match = _LINE.match(raw)
        if match is None:
            raise SchemataError(f"schemata line {number} has no resource name: {raw!r}")
        resource, rest = match.group(1), match.group(2)
        base = 10 if resource in (MB_RESOURCE, "SMBA") else 16
        domains: dict[int, int] = {}
        for item in rest.split(";"):
            if not item.strip():
                continue
            dom, sep, value = item.partition("=")
            try:
                dom_id = int(dom.strip(), 10)
                domains[dom_id] = int(value.strip(), base)
            except ValueError:
                raise SchemataError(f"schemata line {number}: bad domain entry {item!r}") from None
            if not sep:
                raise SchemataError(f"schemata line {number}: bad domain entry {item!r}")
        if resource in result:
            raise SchemataError(f"schemata lists {resource} twice")
        result[resource] = domains
    return result


def render_schemata(values: Mapping[str, Mapping[int, int]]) -> str:
    """Schemata text to write: one line per resource, newline-terminated (the kernel
    refuses a write without the final newline). Masks in lower-case hex, MB in decimal."""
    lines = []
    for resource, domains in values.items():
        if resource in (MB_RESOURCE, "SMBA"):
            items = ";".join(f"{dom}={value}" for dom, value in domains.items())
        else:
            items = ";".join(f"{dom}={value:x}" for dom, value in domains.items())
        lines.append(f"{resource}:{items}\n")
    return "".join(lines)


def schemata_differences(
    wanted: Mapping[str, Mapping[int, int]], current: Mapping[str, Mapping[int, int]]
) -> dict[str, dict[int, tuple[int | None, int]]]:
    """(resource, domain) entries of ``wanted`` that ``current`` does not hold: {res: {dom:
    (current or None, wanted)}}. Resources and domains only in ``current`` are not compared."""
    diff: dict[str, dict[int, tuple[int | None, int]]] = {}
    for resource, domains in wanted.items():
        have = current.get(resource, {})
        for dom, value in domains.items():
            if have.get(dom) != value:
                diff.setdefault(resource, {})[dom] = (have.get(dom), value)
    return diff


# ---------------------------------------------------------------------------------------------
# Groups


def group_name(prefix: str, group_class: str) -> str:
    return f"{prefix}{group_class}"


def group_of_class(qos_class: str | None) -> str | None:
    """The class whose group holds pods of ``qos_class`` (LSE -> LSR); None: the root group."""
    if qos_class is None:
        return None
    return _GROUP_CLASS_OF.get(str(qos_class))


def group_schemata(
    info: ResctrlInfo, config: ResctrlClassConfig, amd_max_bandwidth_gbps: float
) -> dict[str, dict[int, int]]:
    """Resource -> {domain: value} of one class's group, every domain of the root schemata."""
    values: dict[str, dict[int, int]] = {}
    for resource in info.managed_resources:
        ids = info.domains[resource]
        if resource in info.caches:
            mask = cache_mask(info.caches[resource], config.cat_range_start_percent,
                              config.cat_range_end_percent)
            values[resource] = {dom: mask for dom in ids}
        else:
            assert info.mb is not None
            value = mb_value(info.vendor, info.mb, config.mba_percent, amd_max_bandwidth_gbps)
            values[resource] = {dom: value for dom in ids}
    return values


@dataclass(frozen=True)
class GroupPlan:
    name: str  # directory name under the resctrl root
    group_class: str  # LSR, LS or BE
    values: Mapping[str, Mapping[int, int]]  # resource -> {domain: value}

    @property
    def text(self) -> str:
        return render_schemata(self.values)


def plan_groups(
    info: ResctrlInfo,
    class_configs: Mapping[str, ResctrlClassConfig],
    prefix: str,
    amd_max_bandwidth_gbps: float,
) -> list[GroupPlan]:
    """One GroupPlan per group class (LSR, LS, BE), in that order.

    ``class_configs`` maps class names to their ``[qos.<CLASS>.resctrl]``; a missing class
    uses ResctrlClassConfig's defaults (the caller passes BE's own defaults).
    """
    if not info.managed_resources:
        raise SchemataError("the resctrl root schemata offers neither L3 nor MB allocation")
    plans = []
    for group_class in RESCTRL_GROUP_CLASSES:
        config = class_configs.get(group_class) or ResctrlClassConfig()
        values = group_schemata(info, config, amd_max_bandwidth_gbps)
        plans.append(GroupPlan(group_name(prefix, group_class), group_class, values))
    return plans


def threads_to_move(wanted: Iterable[int], in_group: Iterable[int]) -> list[int]:
    """Thread ids of ``wanted`` not yet in the group, ascending (each one write)."""
    present = set(in_group)
    return sorted({tid for tid in wanted if tid not in present})
