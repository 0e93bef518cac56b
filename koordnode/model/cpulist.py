"""Linux CPU list syntax ("0-3,8,10-11"), as used by cpuset.cpus, sysfs and annotations.

Parsing is strict: anything but comma-separated numbers and ascending ranges is an error,
because a mis-read cpuset pins a workload to the wrong CPUs.
"""

from __future__ import annotations

from collections.abc import Iterable

# The kernel's largest NR_CPUS is 8192: no real CPU id is above 8191. The bound keeps a
# hostile "0-4000000000" (or thousands of repeated "0-8191") from costing more than one
# pass over the text plus one set of at most 8192 ids.
MAX_CPU_ID = 8191
# Longest list accepted: every CPU up to MAX_CPU_ID listed one by one ("0,1,...,8191") fits.
MAX_CPU_LIST_CHARS = 48 * 1024


class CpuListError(ValueError):
    """A CPU list that cannot be parsed; the message says which part and why."""


def parse_cpu_list(text: str, *, max_cpu_id: int = MAX_CPU_ID) -> frozenset[int]:
    """Parse "0-3,8" into {0, 1, 2, 3, 8}. Whitespace around items and an empty list are allowed.

    Cost is linear in the text (capped at MAX_CPU_LIST_CHARS) plus the distinct CPUs (at most
    max_cpu_id + 1): overlapping and repeated ranges are merged before any set is built.
    """
    if not isinstance(text, str):
        raise CpuListError(f"CPU list must be a string, got {type(text).__name__}")
    if len(text) > MAX_CPU_LIST_CHARS:
        raise CpuListError(f"CPU list of {len(text)} characters is longer than {MAX_CPU_LIST_CHARS}")
    stripped = text.strip()
    if not stripped:
        return frozenset()
    ranges: list[tuple[int, int]] = []
    for item in stripped.split(","):
        item = item.strip()
        if not item:
            raise CpuListError(f"empty item in CPU list {_short(text)}")
        if "-" in item:
            first_text, _, last_text = item.partition("-")
            first = _parse_cpu_id(first_text, text, max_cpu_id)
            last = _parse_cpu_id(last_text, text, max_cpu_id)
            if last < first:
                raise CpuListError(f"descending range {item!r} in CPU list {_short(text)}")
            ranges.append((first, last))
        else:
            cpu = _parse_cpu_id(item, text, max_cpu_id)
            ranges.append((cpu, cpu))
    ranges.sort()
    cpus: list[int] = []
    covered = -1  # highest id already added
    for first, last in ranges:
        if last > covered:
            cpus.extend(range(max(first, covered + 1), last + 1))
            covered = last
    return frozenset(cpus)


def _short(text: str, limit: int = 80) -> str:
    """A CPU list for an error message: hostile ones are long."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


def _parse_cpu_id(token: str, whole: str, max_cpu_id: int) -> int:
    token = token.strip()
    if not token.isascii() or not token.isdigit() or len(token) > 9:
        raise CpuListError(f"{token[:20]!r} is not a CPU number in CPU list {_short(whole)}")
    value = int(token)
    if value > max_cpu_id:
        raise CpuListError(f"CPU {value} exceeds the maximum CPU id {max_cpu_id} in {_short(whole)}")
    return value


def format_cpu_list(cpus: Iterable[int]) -> str:
    """Canonical form: sorted, consecutive runs collapsed ("0-3,8"); "" for no CPUs."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    index = 0
    while index < len(ordered):
        start = ordered[index]
        end = start
        while index + 1 < len(ordered) and ordered[index + 1] == end + 1:
            index += 1
            end = ordered[index]
        parts.append(str(start) if start == end else f"{start}-{end}")
        index += 1
    return ",".join(parts)
