"""The node's memory that stands in for a missing limit in memory.high (hooks/node_memory.py):
kubelet's kubepods limit (the node's allocatable) when it has one below MemTotal, else MemTotal."""

from __future__ import annotations

from pathlib import Path

import pytest

from faketree import make_cgroup_tree, write_cgroup_file
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.hooks.node_memory import mem_total_bytes, node_memory_bytes

GIB = 1 << 30


def procfs(tmp_path: Path, meminfo: str) -> str:
    root = tmp_path / "proc"
    root.mkdir(exist_ok=True)
    (root / "meminfo").write_text(meminfo)
    return str(root)


MEMINFO_8G = "MemTotal:        8388608 kB\nMemFree:         1000 kB\nMemAvailable:    2000 kB\n"


@pytest.mark.parametrize("version,limit_file", [("v1", "memory.limit_in_bytes"), ("v2", "memory.max")])
def test_kubepods_limit_is_the_nodes_memory_when_kubelet_set_one(tmp_path: Path, version: str,
                                                                 limit_file: str) -> None:
    root = make_cgroup_tree(tmp_path, version, cgroups=["/kubepods"])
    executor = CgroupExecutor(root)
    proc = procfs(tmp_path, MEMINFO_8G)
    write_cgroup_file(root, "/kubepods", limit_file, str(6 * GIB), controller="memory")
    assert node_memory_bytes(executor, "/kubepods", proc) == 6 * GIB
    unlimited = "-1" if version == "v1" else "max"
    write_cgroup_file(root, "/kubepods", limit_file, unlimited, controller="memory")
    assert node_memory_bytes(executor, "/kubepods", proc) == 8 * GIB  # MemTotal
    assert node_memory_bytes(executor, "/not-yet", proc) == 8 * GIB  # kubelet has not made it
    write_cgroup_file(root, "/kubepods", limit_file, "junk", controller="memory")
    assert node_memory_bytes(executor, "/kubepods", proc) == 8 * GIB
    assert node_memory_bytes(executor, "/../escape", proc) == 8 * GIB


def test_meminfo_unreadable_or_without_memtotal_is_zero(tmp_path: Path) -> None:
    assert mem_total_bytes(str(tmp_path / "nowhere")) == 0
    assert mem_total_bytes(procfs(tmp_path, "MemFree: 5 kB\nMemTotal: lots kB\n")) == 0
    assert mem_total_bytes(procfs(tmp_path, MEMINFO_8G)) == 8 * GIB
