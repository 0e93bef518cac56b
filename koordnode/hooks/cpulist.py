"""Linux CPU list syntax ("0-3,8,10-11"), as used by cpuset.cpus, sysfs and annotations.

Parsing is strict: anything but comma-separated numbers and ascending ranges is an error,
because a mis-read cpuset pins a workload to the wrong CPUs.
"""

from __future__ import annotations

from collections.abc import Iterable

# Far above any real NR_CPUS (the kernel's maximum is 8192); guards against a hostile
# "0-4000000000" building a huge set.
MAX_CPU_ID = 65535


class CpuListError(ValueError):
    """A CPU list that cannot be parsed; the message says which part and why."""


def parse_cpu_list(text: str) -> frozenset[int]:
    """Parse "0-3,8" into {0, 1, 2, 3, 8}. Whitespace around items and an empty list are allowed."""
    if not isinstance(text, str):
        raise CpuListError(f"CPU list must be a string, got {type(text).__name__}")
    cpus: set[int] = set()
    stripped = text.strip()
    if not stripped:
        return frozenset()
    for item in stripped.split(","):
        item = item.strip()
        if not item:
            raise CpuListError(f"empty item in CPU list {text!r}")
        if "-" in item:
            first_text, _, last_text = item.partition("-")
            first = _parse_cpu_id(first_text, text)
            last = _parse_cpu_id(last_text, text)
            if last < first:
                raise CpuListError(f"descending range {item!r} in CPU list {text!r}")
            cpus.update(range(first, last + 1))
        else:
            cpus.add(_parse_cpu_id(item, text))
    return frozenset(cpus)


def _parse_cpu_id(token: str, whole: str) -> int:
    token = token.strip()
    if not token.isascii() or not token.isdigit():
        raise CpuListError(f"{token!r} is not a CPU number in CPU list {whole!r}")
    value = int(token)
    if value > MAX_CPU_ID:
        raise CpuListError(f"CPU {value} exceeds the maximum CPU id {MAX_CPU_ID} in {whole!r}")
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
