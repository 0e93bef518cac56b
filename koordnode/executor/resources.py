"""The table of cgroup resources the executor knows how to write.

A resource has a logical name (the cgroup v1 spelling, e.g. "cpu.shares") and a value in v1
units. For each cgroup version it lists candidate files (first present wins) and a
*format* that knows how to

- render the desired value into the text to write (given the file's current text, so that
  shared files such as v2 `cpu.max` and `io.max` keep their other fields),
- extract a comparable value from the file's text, and
- give the comparable form of the desired value,

so "is it already so?" and "did the kernel take it?" compare like with like ("max 100000"
vs quota -1, "0-3" vs "0,1,2,3", page rounding of memory limits).

Support is detected by file presence in the target cgroup: a file the running kernel does
not provide (Anolis-only files upstream, v1-only knobs on v2) is unsupported.
This module is pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from koordnode.model.cpulist import CpuListError, format_cpu_list
from koordnode.model.cpulist import parse_cpu_list as _model_parse_cpu_list
from koordnode.model.kernel import (
    CFS_PERIOD_MAX_US,
    CFS_PERIOD_MIN_US,
    CFS_QUOTA_MIN_US,
    CFS_RUNTIME_MAX_US,
    CPU_SHARES_MAX,
    CPU_SHARES_MIN,
    PAGE_SIZE,
    shares_to_weight,
)


class InvalidValueError(ValueError):
    """A value is malformed or outside the resource's range."""


class UnknownResourceError(KeyError):
    """A logical resource name that is not in the table."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "unknown resource"


class FileFormatError(ValueError):
    """A file's current content cannot be understood (needed to render a shared-file write)."""


UNLIMITED = -1

INT64_MAX = (1 << 63) - 1
# v1 reports "no limit" as PAGE_COUNTER_MAX * PAGE_SIZE (9223372036854771712 on x86_64);
# anything this large is unlimited for comparison purposes.
MEMORY_UNLIMITED_THRESHOLD = 1 << 62
MAX_VALUE_LENGTH = 4096

_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_INT = re.compile(r"^[+-]?\d+\Z", re.ASCII)
_DEVICE_VALUE = re.compile(r"^(\d+):(\d+)\s+(\d+|max)\Z", re.ASCII)


# --------------------------------------------------------------------------- value parsing


def _as_text(value: object, resource: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidValueError(f"{resource}: value must be int or str, got {type(value).__name__}")
    text = str(value)
    if len(text) > MAX_VALUE_LENGTH:
        raise InvalidValueError(f"{resource}: value too long ({len(text)} characters)")
    # A newline would let one write smuggle a second command into multi-key files.
    if _CONTROL_CHARS.search(text.strip()) or "\x00" in text:
        raise InvalidValueError(f"{resource}: value contains control characters: {text!r}")
    return text.strip()


def _parse_int(value: object, resource: str) -> int:
    text = _as_text(value, resource)
    if not _INT.match(text) or len(text) > 20:
        raise InvalidValueError(f"{resource}: not an integer: {text!r}")
    return int(text)


def int_range(lo: int, hi: int, *, clamp: bool = False) -> Callable[[object, str], int]:
    def parse(value: object, resource: str) -> int:
        number = _parse_int(value, resource)
        if clamp:
            return max(lo, min(hi, number))
        if not lo <= number <= hi:
            raise InvalidValueError(f"{resource}: {number} outside [{lo}, {hi}]")
        return number

    return parse


def parse_cfs_quota(value: object, resource: str) -> int:
    quota = _parse_int(value, resource)
    if quota == UNLIMITED:
        return quota
    if not CFS_QUOTA_MIN_US <= quota <= CFS_RUNTIME_MAX_US:
        raise InvalidValueError(
            f"{resource}: {quota} must be -1 (unlimited) or in [{CFS_QUOTA_MIN_US}, {CFS_RUNTIME_MAX_US}]"
        )
    return quota


def parse_memory_bytes(value: object, resource: str) -> int:
    """Bytes, or -1 / "max" for unlimited. Huge values mean unlimited too."""
    text = _as_text(value, resource)
    if text == "max":
        return UNLIMITED
    if not _INT.match(text) or len(text) > 20:
        raise InvalidValueError(f"{resource}: not a byte count: {text!r}")
    number = int(text)
    if number == UNLIMITED or number >= MEMORY_UNLIMITED_THRESHOLD:
        return UNLIMITED
    if number < 0:
        raise InvalidValueError(f"{resource}: {number} must be -1 (unlimited) or >= 0")
    return number


def parse_cpu_list(text: str) -> frozenset[int]:
    """Kernel list format ("0-3,8,10-11"); empty means no CPUs. The model's parser, with the
    executor's error type."""
    try:
        return _model_parse_cpu_list(text)
    except CpuListError as err:
        raise InvalidValueError(str(err)) from None


def _parse_cpuset(value: object, resource: str) -> frozenset[int]:
    text = _as_text(value, resource)
    try:
        return parse_cpu_list(text)
    except InvalidValueError as err:
        raise InvalidValueError(f"{resource}: {err}") from None


@dataclass(frozen=True)
class DeviceLimit:
    """A per-device limit in v1 units; value 0 means "no limit"."""

    major: int
    minor: int
    value: int

    @property
    def device(self) -> str:
        return f"{self.major}:{self.minor}"

    def __str__(self) -> str:
        return f"{self.device} {self.value}"


def _parse_device_limit(value: object, resource: str) -> DeviceLimit:
    text = _as_text(value, resource)
    match = _DEVICE_VALUE.match(text)
    if not match:
        raise InvalidValueError(f"{resource}: expected 'MAJ:MIN N', got {text!r}")
    major, minor, amount = match.groups()
    if max(len(major), len(minor), len(amount)) > 20:
        raise InvalidValueError(f"{resource}: number too long in {text!r}")
    number = 0 if amount == "max" else int(amount)
    if number > INT64_MAX:
        raise InvalidValueError(f"{resource}: {number} too large")
    return DeviceLimit(int(major), int(minor), number)


# --------------------------------------------------------------------------- file formats


class FileFormat(Protocol):
    """How one logical value maps onto one kernel file."""

    @property
    def filename(self) -> str: ...  # read-only: the formats are frozen dataclasses

    def render(self, value: Any, current: str) -> str:
        """Text to write for `value`, given the file's current text."""

    def expected(self, value: Any) -> Hashable:
        """Comparable form of `value` as the kernel will show it."""

    def extract(self, text: str, value: Any) -> Hashable | None:
        """Comparable form of the file's text (None when it cannot be understood)."""


def _int_or_none(text: str) -> int | None:
    text = text.strip()
    return int(text) if _INT.match(text) else None


@dataclass(frozen=True)
class PlainInt:
    filename: str

    def render(self, value: int, current: str) -> str:
        return str(value)

    def expected(self, value: int) -> Hashable:
        return value

    def extract(self, text: str, value: int) -> Hashable | None:
        return _int_or_none(text)


@dataclass(frozen=True)
class CpuWeight:
    """v2 cpu.weight holding a v1 cpu.shares value."""

    filename: str = "cpu.weight"

    def render(self, value: int, current: str) -> str:
        return str(shares_to_weight(value))

    def expected(self, value: int) -> Hashable:
        return shares_to_weight(value)

    def extract(self, text: str, value: int) -> Hashable | None:
        return _int_or_none(text)


@dataclass(frozen=True)
class MemoryBytes:
    """Byte counts, unlimited spelled `unlimited_text` when written; read "max" or a huge
    number as unlimited; compared at page granularity (the kernel rounds down)."""

    filename: str
    unlimited_text: str = "max"

    @staticmethod
    def _canonical(number: int) -> int:
        if number == UNLIMITED or number >= MEMORY_UNLIMITED_THRESHOLD:
            return UNLIMITED
        return number - number % PAGE_SIZE

    def render(self, value: int, current: str) -> str:
        return self.unlimited_text if value == UNLIMITED else str(value)

    def expected(self, value: int) -> Hashable:
        return self._canonical(value)

    def extract(self, text: str, value: int) -> Hashable | None:
        text = text.strip()
        if text == "max":
            return UNLIMITED
        number = _int_or_none(text)
        return None if number is None else self._canonical(number)


def _parse_cpu_max(text: str) -> tuple[str, int]:
    fields = text.split()
    if len(fields) != 2 or not (fields[0] == "max" or _INT.match(fields[0])) or not _INT.match(fields[1]):
        raise FileFormatError(f"cannot parse cpu.max content {text.strip()!r}")
    return fields[0], int(fields[1])


@dataclass(frozen=True)
class CpuMaxField:
    """One field of v2 `cpu.max` ("<quota|max> <period>"); the other field is preserved."""

    field_name: str  # "quota" or "period"
    filename: str = "cpu.max"

    def render(self, value: int, current: str) -> str:
        quota, period = _parse_cpu_max(current)
        if self.field_name == "quota":
            quota = "max" if value == UNLIMITED else str(value)
        else:
            period = value
        return f"{quota} {period}"

    def expected(self, value: int) -> Hashable:
        return value

    def extract(self, text: str, value: int) -> Hashable | None:
        try:
            quota, period = _parse_cpu_max(text)
        except FileFormatError:
            return None
        if self.field_name == "quota":
            return UNLIMITED if quota == "max" else int(quota)
        return period


@dataclass(frozen=True)
class CpuList:
    filename: str

    def render(self, value: frozenset[int], current: str) -> str:
        return format_cpu_list(value)

    def expected(self, value: frozenset[int]) -> Hashable:
        return value

    def extract(self, text: str, value: frozenset[int]) -> Hashable | None:
        try:
            return parse_cpu_list(text)
        except InvalidValueError:
            return None


@dataclass(frozen=True)
class Weight:
    """A default weight: v1 "N", v2 "default N" (per-device lines are left alone).

    The value is clamped to the file's own range (CFQ's blkio.weight starts at 10, BFQ at 1).
    """

    filename: str
    lo: int
    hi: int
    default_prefix: bool

    def _clamped(self, value: int) -> int:
        return max(self.lo, min(self.hi, value))

    def render(self, value: int, current: str) -> str:
        weight = self._clamped(value)
        return f"default {weight}" if self.default_prefix else str(weight)

    def expected(self, value: int) -> Hashable:
        return self._clamped(value)

    def extract(self, text: str, value: int) -> Hashable | None:
        for line in text.splitlines():
            fields = line.split()
            if len(fields) == 1 and _INT.match(fields[0]):
                return int(fields[0])
            if len(fields) == 2 and fields[0] == "default" and _INT.match(fields[1]):
                return int(fields[1])
        return None


def _device_lines(text: str) -> dict[str, list[str]]:
    lines: dict[str, list[str]] = {}
    for line in text.splitlines():
        fields = line.split()
        if fields and ":" in fields[0]:
            lines[fields[0]] = fields[1:]
    return lines


@dataclass(frozen=True)
class V1DeviceThrottle:
    """v1 blkio.throttle.*_device: lines "MAJ:MIN N"; writing N=0 removes the rule."""

    filename: str

    def render(self, value: DeviceLimit, current: str) -> str:
        return f"{value.device} {value.value}"

    def expected(self, value: DeviceLimit) -> Hashable:
        return value.value

    def extract(self, text: str, value: DeviceLimit) -> Hashable | None:
        fields = _device_lines(text).get(value.device)
        if not fields:
            return 0  # no rule for this device: unlimited
        return _int_or_none(fields[0])


IO_MAX_KEYS = ("rbps", "wbps", "riops", "wiops")


@dataclass(frozen=True)
class IoMaxField:
    """One key of a device's line in v2 `io.max`; the device's other keys are preserved."""

    key: str
    filename: str = "io.max"

    @staticmethod
    def _pairs(fields: list[str]) -> dict[str, str]:
        pairs: dict[str, str] = {}
        for item in fields:
            name, sep, amount = item.partition("=")
            if sep:
                pairs[name] = amount
        return pairs

    def render(self, value: DeviceLimit, current: str) -> str:
        pairs = self._pairs(_device_lines(current).get(value.device, []))
        pairs[self.key] = "max" if value.value == 0 else str(value.value)
        return value.device + " " + " ".join(f"{name}={amount}" for name, amount in pairs.items())

    def expected(self, value: DeviceLimit) -> Hashable:
        return value.value

    def extract(self, text: str, value: DeviceLimit) -> Hashable | None:
        pairs = self._pairs(_device_lines(text).get(value.device, []))
        amount = pairs.get(self.key, "max")
        return 0 if amount == "max" else _int_or_none(amount)


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Resource:
    name: str
    # Validates and canonicalises a value in v1 units; raises InvalidValueError.
    parse: Callable[[object, str], Any]
    # v1 controller hierarchy the file lives in (None: not available on v1).
    v1_controller: str | None
    # Candidate files, first present wins; empty = not available on that version.
    v1_files: tuple[FileFormat, ...]
    v2_files: tuple[FileFormat, ...]
    # How support is detected, for humans (status output, skip reasons).
    support: str = "file present in the cgroup"
    writable: bool = True
    # Writes whose parent/child ordering matters on v1 (cpuset subset rule).
    hierarchical_subset: bool = False
    # (sibling file, content): while the cgroup's sibling file holds that content the kernel
    # refuses this resource, so the write is skipped for now (not cached as unsupported).
    blocked_when: tuple[tuple[str, str, str], ...] = ()

    def files(self, v2: bool) -> tuple[FileFormat, ...]:
        return self.v2_files if v2 else self.v1_files

    def validate(self, value: object) -> Any:
        if not self.writable:
            raise InvalidValueError(f"{self.name} is read-only")
        return self.parse(value, self.name)


def _read_only(value: object, resource: str) -> Any:
    raise InvalidValueError(f"{resource} is read-only")


_MEMORY_PROTECTION_SUPPORT = "cgroup v2; on v1 only Anolis/Alibaba Cloud Linux kernels (file present)"
_ANOLIS_SUPPORT = "Anolis/Alibaba Cloud Linux kernels only (file present)"

_TABLE: tuple[Resource, ...] = (
    Resource(
        "cpu.shares", int_range(CPU_SHARES_MIN, CPU_SHARES_MAX, clamp=True),
        "cpu", (PlainInt("cpu.shares"),), (CpuWeight(),),
        # An idle group's weight is pinned by the kernel (reads 3) and writes get EINVAL.
        blocked_when=(("cpu.idle", "1", "cpu.idle=1: the kernel pins an idle group's weight"),),
    ),
    Resource(
        "cpu.cfs_quota_us", parse_cfs_quota,
        "cpu", (PlainInt("cpu.cfs_quota_us"),), (CpuMaxField("quota"),),
    ),
    Resource(
        "cpu.cfs_period_us", int_range(CFS_PERIOD_MIN_US, CFS_PERIOD_MAX_US),
        "cpu", (PlainInt("cpu.cfs_period_us"),), (CpuMaxField("period"),),
    ),
    Resource(
        "cpu.cfs_burst_us", int_range(0, CFS_RUNTIME_MAX_US),
        "cpu", (PlainInt("cpu.cfs_burst_us"),), (PlainInt("cpu.max.burst"),),
        support="kernel >= 5.14 (file present)",
    ),
    Resource(
        "cpu.idle", int_range(0, 1),
        "cpu", (PlainInt("cpu.idle"),), (PlainInt("cpu.idle"),),
        support="upstream kernel >= 5.15 (file present)",
    ),
    Resource(
        "cpu.bvt_warp_ns", int_range(-1, 2),
        "cpu", (PlainInt("cpu.bvt_warp_ns"),), (PlainInt("cpu.bvt_warp_ns"),),
        support="group identity, " + _ANOLIS_SUPPORT,
    ),
    Resource(
        "cpuset.cpus", _parse_cpuset,
        "cpuset", (CpuList("cpuset.cpus"),), (CpuList("cpuset.cpus"),),
        hierarchical_subset=True,
    ),
    Resource(
        "cpuset.mems", _parse_cpuset,
        "cpuset", (CpuList("cpuset.mems"),), (CpuList("cpuset.mems"),),
        hierarchical_subset=True,
    ),
    Resource(
        "memory.limit_in_bytes", parse_memory_bytes,
        "memory", (MemoryBytes("memory.limit_in_bytes", unlimited_text="-1"),),
        (MemoryBytes("memory.max"),),
    ),
    Resource(
        # v1 only: reclaimed first under node memory pressure above it (v2 has memory.high).
        "memory.soft_limit_in_bytes", parse_memory_bytes,
        "memory", (MemoryBytes("memory.soft_limit_in_bytes", unlimited_text="-1"),), (),
        support="cgroup v1 (v2: memory.high)",
    ),
    Resource(
        "memory.min", parse_memory_bytes,
        "memory", (MemoryBytes("memory.min"),), (MemoryBytes("memory.min"),),
        support=_MEMORY_PROTECTION_SUPPORT,
    ),
    Resource(
        "memory.low", parse_memory_bytes,
        "memory", (MemoryBytes("memory.low"),), (MemoryBytes("memory.low"),),
        support=_MEMORY_PROTECTION_SUPPORT,
    ),
    Resource(
        "memory.high", parse_memory_bytes,
        "memory", (MemoryBytes("memory.high"),), (MemoryBytes("memory.high"),),
        support=_MEMORY_PROTECTION_SUPPORT,
    ),
    Resource(
        "memory.wmark_ratio", int_range(0, 100),
        "memory", (PlainInt("memory.wmark_ratio"),), (PlainInt("memory.wmark_ratio"),),
        support=_ANOLIS_SUPPORT,
    ),
    Resource(
        "memory.wmark_scale_factor", int_range(1, 1000),
        "memory", (PlainInt("memory.wmark_scale_factor"),), (PlainInt("memory.wmark_scale_factor"),),
        support=_ANOLIS_SUPPORT,
    ),
    Resource(
        "memory.wmark_min_adj", int_range(-25, 50),
        "memory", (PlainInt("memory.wmark_min_adj"),), (PlainInt("memory.wmark_min_adj"),),
        support=_ANOLIS_SUPPORT,
    ),
    Resource(
        "blkio.weight", int_range(1, 1000),
        "blkio",
        (Weight("blkio.weight", 10, 1000, False), Weight("blkio.bfq.weight", 1, 1000, False)),
        (Weight("io.weight", 1, 10000, True), Weight("io.bfq.weight", 1, 1000, True)),
        support="CFQ blkio.weight or BFQ blkio.bfq.weight (v1), io.weight or io.bfq.weight (v2)",
    ),
    Resource(
        "blkio.throttle.read_bps_device", _parse_device_limit,
        "blkio", (V1DeviceThrottle("blkio.throttle.read_bps_device"),), (IoMaxField("rbps"),),
    ),
    Resource(
        "blkio.throttle.write_bps_device", _parse_device_limit,
        "blkio", (V1DeviceThrottle("blkio.throttle.write_bps_device"),), (IoMaxField("wbps"),),
    ),
    Resource(
        "blkio.throttle.read_iops_device", _parse_device_limit,
        "blkio", (V1DeviceThrottle("blkio.throttle.read_iops_device"),), (IoMaxField("riops"),),
    ),
    Resource(
        "blkio.throttle.write_iops_device", _parse_device_limit,
        "blkio", (V1DeviceThrottle("blkio.throttle.write_iops_device"),), (IoMaxField("wiops"),),
    ),
    # Read-only membership files. v1 has them in every hierarchy; we read the cpu one.
    Resource(
        "cgroup.procs", _read_only,
        "cpu", (PlainInt("cgroup.procs"),), (PlainInt("cgroup.procs"),), writable=False,
    ),
    Resource(
        "tasks", _read_only,
        "cpu", (PlainInt("tasks"),), (PlainInt("cgroup.threads"),), writable=False,
    ),
)

RESOURCES: Mapping[str, Resource] = MappingProxyType({resource.name: resource for resource in _TABLE})


def get_resource(name: str) -> Resource:
    try:
        return RESOURCES[name]
    except (KeyError, TypeError):
        raise UnknownResourceError(f"unknown cgroup resource {name!r}") from None


# --------------------------------------------------------------------------- procfs (sysctl)


@dataclass(frozen=True)
class Sysctl:
    name: str
    relative_path: str  # under the procfs root
    parse: Callable[[object, str], int]

    @property
    def fmt(self) -> FileFormat:
        return PlainInt(self.relative_path.rsplit("/", 1)[-1])


SYSCTLS: Mapping[str, Sysctl] = MappingProxyType({
    "vm.min_free_kbytes": Sysctl("vm.min_free_kbytes", "sys/vm/min_free_kbytes", int_range(0, (1 << 31) - 1)),
    # 1..1000 before kernel 5.x; 1..3000 since. The kernel rejects what it does not take.
    "vm.watermark_scale_factor": Sysctl("vm.watermark_scale_factor", "sys/vm/watermark_scale_factor", int_range(1, 3000)),
})


def get_sysctl(name: str) -> Sysctl:
    try:
        return SYSCTLS[name]
    except (KeyError, TypeError):
        raise UnknownResourceError(f"unknown sysctl {name!r}") from None
