"""Pure parsers of the kernel's statistics files: text in, dataclass out.

Fast on purpose (they run for every cgroup on every tick): one split, keys looked up in a
dict, no regular expressions. Malformed text raises ParseError with the file kind in the
message; unknown extra fields and lines are ignored, as the kernel adds them over time.
"""

from __future__ import annotations

from dataclasses import dataclass

from koordnode.model.meminfo import MemInfo, parse_meminfo_text


class ParseError(ValueError):
    """A statistics file's text is not in the expected format."""


# ------------------------------------------------------------------------------ /proc/stat


@dataclass(frozen=True)
class CpuTimes:
    """Aggregate CPU time of the node in USER_HZ ticks, and the online CPU ids."""

    busy: int  # user + nice + system + irq + softirq + steal
    total: int  # busy + idle + iowait
    cpus: frozenset[int]


def parse_proc_stat(text: str) -> CpuTimes:
    busy = total = -1
    cpus: list[int] = []
    for line in text.splitlines():
        if not line.startswith("cpu"):
            if cpus:
                break  # the cpu lines come first; skip intr/ctxt/... entirely
            continue
        name, _, rest = line.partition(" ")
        if name == "cpu":
            fields = rest.split()
            if len(fields) < 4:
                raise ParseError(f"/proc/stat: short cpu line {line!r}")
            try:
                values = [int(v) for v in fields[:8]]
            except ValueError:
                raise ParseError(f"/proc/stat: non-numeric cpu line {line!r}") from None
            values += [0] * (8 - len(values))
            user, nice, system, idle, iowait, irq, softirq, steal = values
            # guest and guest_nice are already inside user and nice.
            busy = user + nice + system + irq + softirq + steal
            total = busy + idle + iowait
        else:
            try:
                cpus.append(int(name[3:]))
            except ValueError:
                raise ParseError(f"/proc/stat: bad cpu line {line!r}") from None
    if busy < 0:
        raise ParseError("/proc/stat: no aggregate cpu line")
    return CpuTimes(busy, total, frozenset(cpus))


# ------------------------------------------------------------------------------ /proc/meminfo


def parse_meminfo(text: str) -> MemInfo:
    try:
        return parse_meminfo_text(text)
    except ValueError as err:
        raise ParseError(str(err)) from None


# ------------------------------------------------------------------------------ PSI


@dataclass(frozen=True)
class PressureLine:
    avg10: float
    avg60: float
    avg300: float
    total_us: int


@dataclass(frozen=True)
class Pressure:
    some: PressureLine
    # None where the kernel has no "full" line (cpu before 5.13).
    full: PressureLine | None = None


def _pressure_line(line: str, kind: str) -> PressureLine:
    values: dict[str, str] = {}
    for token in line.split()[1:]:
        key, sep, value = token.partition("=")
        if sep:
            values[key] = value
    try:
        return PressureLine(
            float(values["avg10"]), float(values["avg60"]), float(values["avg300"]), int(values["total"])
        )
    except (KeyError, ValueError):
        raise ParseError(f"{kind}: bad pressure line {line!r}") from None


def parse_pressure(text: str, kind: str = "pressure") -> Pressure:
    some = full = None
    for line in text.splitlines():
        if line.startswith("some "):
            some = _pressure_line(line, kind)
        elif line.startswith("full "):
            full = _pressure_line(line, kind)
    if some is None:
        raise ParseError(f"{kind}: no 'some' line")
    return Pressure(some, full)


def pressure_total_some(text: str) -> int:
    """Only the `some` total (microseconds): the cheap read the pressure watch polls."""
    start = text.find("total=")
    if start < 0 or not text.startswith("some"):
        raise ParseError(f"pressure: no 'some ... total=' in {text[:60]!r}")
    end = start + 6
    while end < len(text) and text[end].isdigit():
        end += 1
    if end == start + 6:
        raise ParseError(f"pressure: bad total in {text[:60]!r}")
    return int(text[start + 6:end])


# ------------------------------------------------------------------------------ cgroup files


def _key_values(text: str, kind: str) -> dict[str, int]:
    """ "key value" lines -> dict; a line that is not "<word> <int>" raises."""
    parts = text.split()
    if len(parts) % 2:
        raise ParseError(f"{kind}: odd number of fields")
    try:
        return {parts[i]: int(parts[i + 1]) for i in range(0, len(parts), 2)}
    except ValueError:
        raise ParseError(f"{kind}: non-numeric value") from None


@dataclass(frozen=True)
class CpuStat:
    """cpu.stat of one cgroup: usage (v2 only) and CFS bandwidth throttling."""

    usage_ns: int | None = None  # v2 usage_usec x 1000; v1 has it in cpuacct.usage instead
    nr_periods: int = 0
    nr_throttled: int = 0
    throttled_ns: int = 0


def parse_cpu_stat(text: str) -> CpuStat:
    """v1 (nr_periods, nr_throttled, throttled_time ns) or v2 (usage_usec, throttled_usec)."""
    values = _key_values(text, "cpu.stat")
    usage = values.get("usage_usec")
    if "throttled_usec" in values:
        throttled = values["throttled_usec"] * 1000
    else:
        throttled = values.get("throttled_time", 0)
    return CpuStat(
        usage_ns=usage * 1000 if usage is not None else None,
        nr_periods=values.get("nr_periods", 0),
        nr_throttled=values.get("nr_throttled", 0),
        throttled_ns=throttled,
    )


def parse_cpuacct_usage(text: str) -> int:
    """v1 cpuacct.usage: nanoseconds."""
    try:
        return int(text)
    except ValueError:
        raise ParseError(f"cpuacct.usage: not an integer: {text.strip()[:40]!r}") from None


@dataclass(frozen=True)
class MemoryStat:
    """The memory.stat numbers koordnode uses, in bytes (hierarchical on v1)."""

    anon: int
    file: int
    inactive_file: int

    def working_set(self, usage: int) -> int:
        """What kubelet calls the working set: usage less what is easily reclaimed."""
        return max(0, usage - self.inactive_file)


def _stat_field(text: str, key: str) -> int | None:
    """The value of the "<key> <int>" line of a stat file, None when there is no such line."""
    prefix = key + " "
    if text.startswith(prefix):
        start = len(prefix)
    else:
        at = text.find("\n" + prefix)
        if at < 0:
            return None
        start = at + 1 + len(prefix)
    end = text.find("\n", start)
    value = text[start:] if end < 0 else text[start:end]
    try:
        return int(value)
    except ValueError:
        raise ParseError(f"memory.stat: {key}: non-numeric value {value.strip()[:40]!r}") from None


# (anon, file, inactive_file) keys, in the order they are tried: v1 hierarchical totals, v2,
# v1 without use_hierarchy.
_MEMORY_STAT_KEYS = (
    ("total_rss", "total_cache", "total_inactive_file"),
    ("anon", "file", "inactive_file"),
    ("rss", "cache", "inactive_file"),
)


def parse_memory_stat(text: str) -> MemoryStat:
    """v1 (total_rss / total_cache / total_inactive_file, hierarchical) or v2 (anon / file).
    Only the lines used are read (a v1 file has ~70; this runs every tick for each BE tier)."""
    for anon_key, file_key, inactive_key in _MEMORY_STAT_KEYS:
        anon = _stat_field(text, anon_key)
        if anon is not None:
            return MemoryStat(anon, _stat_field(text, file_key) or 0, _stat_field(text, inactive_key) or 0)
    raise ParseError("memory.stat: neither v1 (total_rss/rss) nor v2 (anon) fields")


def parse_int(text: str, kind: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ParseError(f"{kind}: not an integer: {text.strip()[:40]!r}") from None


def parse_cpu_max(text: str) -> tuple[int, int]:
    """v2 cpu.max "<quota|max> <period>" -> (quota_us or -1, period_us)."""
    parts = text.split()
    if len(parts) != 2:
        raise ParseError(f"cpu.max: expected '<quota|max> <period>', got {text.strip()!r}")
    try:
        quota = -1 if parts[0] == "max" else int(parts[0])
        return quota, int(parts[1])
    except ValueError:
        raise ParseError(f"cpu.max: bad value {text.strip()!r}") from None
