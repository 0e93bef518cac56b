"""Kernel and kubelet constants that more than one layer needs: CFS bandwidth bounds, cpu.shares
and cpu.weight ranges and the conversion between them. The one place these numbers live."""

from __future__ import annotations

import os

# cpu.shares (cgroup v1) and cpu.weight (cgroup v2) ranges the kernel accepts.
CPU_SHARES_MIN = 2
CPU_SHARES_MAX = 262144
CPU_WEIGHT_MIN = 1
CPU_WEIGHT_MAX = 10000
# kubelet gives 1024 shares per requested CPU.
KUBELET_SHARES_PER_CPU = 1024

# CFS bandwidth: the period the kernel accepts, the smallest quota, the largest runtime
# ((1 << 44) - 1 microseconds), and the period kubelet and runc use when none is given.
CFS_PERIOD_MIN_US = 1000
CFS_PERIOD_MAX_US = 1_000_000
CFS_QUOTA_MIN_US = 1000
CFS_RUNTIME_MAX_US = (1 << 44) - 1
DEFAULT_CFS_PERIOD_US = 100_000

# Memory counters count pages: memory.high and the like are kept to whole pages.
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# memory.high = request + percent x (limit - request) (Koordinator's throttlingPercent, which has
# no maximum): the largest percent taken; that far above the limit it never throttles anyway.
MEMORY_HIGH_PERCENT_MAX = 1000


def is_lowest_cpu_weight(text: str | None, v2: bool) -> bool | None:
    """Whether a cpu.shares (v1) / cpu.weight (v2) file's content is the kernel's lowest weight;
    None when missing or unreadable."""
    try:
        return None if text is None else int(text) <= (CPU_WEIGHT_MIN if v2 else CPU_SHARES_MIN)
    except ValueError:
        return None


def shares_to_weight(shares: int) -> int:
    """cgroup v1 cpu.shares -> v2 cpu.weight, the conversion runc and kubelet use."""
    shares = max(CPU_SHARES_MIN, min(CPU_SHARES_MAX, shares))
    return CPU_WEIGHT_MIN + ((shares - CPU_SHARES_MIN) * (CPU_WEIGHT_MAX - CPU_WEIGHT_MIN)) // (
        CPU_SHARES_MAX - CPU_SHARES_MIN)
