"""/proc/meminfo: the node's memory total and what is available. Pure."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MemInfo", "parse_meminfo_text"]


@dataclass(frozen=True)
class MemInfo:
    total_bytes: int
    available_bytes: int
    free_bytes: int

    @property
    def used_bytes(self) -> int:
        return self.total_bytes - self.available_bytes

    @property
    def used_percent(self) -> float:
        return 100.0 * self.used_bytes / self.total_bytes if self.total_bytes else 0.0


def parse_meminfo_text(text: str) -> MemInfo:
    """ValueError when MemTotal is missing or a line is malformed."""
    wanted = {"MemTotal:": 0, "MemFree:": 0, "MemAvailable:": -1}
    found = 0
    for line in text.splitlines():
        key, _, rest = line.partition(" ")
        if key in wanted:
            parts = rest.split()
            try:
                value = int(parts[0])
            except (IndexError, ValueError):
                raise ValueError(f"/proc/meminfo: bad line {line!r}") from None
            unit = parts[1] if len(parts) > 1 else ""
            wanted[key] = value * 1024 if unit == "kB" else value
            found += 1
            if found == len(wanted):
                break
    if wanted["MemTotal:"] <= 0:
        raise ValueError("/proc/meminfo: no MemTotal")
    available = wanted["MemAvailable:"]
    if available < 0:  # kernels before 3.14: approximate with MemFree
        available = wanted["MemFree:"]
    return MemInfo(wanted["MemTotal:"], available, wanted["MemFree:"])
