"""The memory the pods may use together, which stands in for the limit of a container without
one in memory.high (Koordinator takes the Node's allocatable memory): kubelet's kubepods limit,
which kubelet sets to the node's allocatable, else MemTotal. Read by the QoS engine at start and
at each reconcile pass (kubelet makes kubepods after koordnode starts)."""

from __future__ import annotations

from pathlib import Path

from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.executor.paths import UnsafePathError
from koordnode.executor.resources import InvalidValueError, parse_memory_bytes
from koordnode.model.meminfo import parse_meminfo_text


def mem_total_bytes(procfs_root: str) -> int:
    """MemTotal of /proc/meminfo in bytes; 0 when unreadable."""
    try:
        return parse_meminfo_text(Path(procfs_root, "meminfo").read_text(encoding="ascii", errors="replace")).total_bytes
    except (OSError, ValueError):
        return 0


def node_memory_bytes(executor: CgroupExecutor, kubepods: str, procfs_root: str) -> int:
    """kubepods' memory limit when it has one below MemTotal, else MemTotal; 0: neither known."""
    total = mem_total_bytes(procfs_root)
    try:
        text = executor.read(kubepods, "memory.limit_in_bytes")
        limit = parse_memory_bytes(text, "memory.limit_in_bytes") if text is not None else -1
    except (OSError, UnsafePathError, InvalidValueError):
        limit = -1
    if limit > 0 and (total == 0 or limit < total):
        return limit
    return total
