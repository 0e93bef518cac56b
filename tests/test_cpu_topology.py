"""CPU list syntax and CPU topology (described and read from a fake sysfs)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koordnode.model.cpu_topology import CpuInfo, CpuTopology, TopologyError, read_cpu_topology
from koordnode.model.cpulist import MAX_CPU_ID, CpuListError, format_cpu_list, parse_cpu_list

# --- cpu lists ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("", set()),
        ("  \n", set()),
        ("0", {0}),
        ("0-3", {0, 1, 2, 3}),
        ("0-3,8", {0, 1, 2, 3, 8}),
        ("8,0-1\n", {0, 1, 8}),
        (" 2 - 3 , 5 ", {2, 3, 5}),
        ("4-4", {4}),
        ("1,1,1", {1}),
    ],
)
def test_parse_cpu_list(text: str, cpus: set[int]) -> None:
    assert parse_cpu_list(text) == frozenset(cpus)


@pytest.mark.parametrize(
    "text", ["a", "0-", "-1", "3-1", "0,,1", "0-3,", "1.5", "0x3", "٣", f"0-{MAX_CPU_ID + 1}", "1-2-3"]
)
def test_parse_cpu_list_rejects(text: str) -> None:
    with pytest.raises(CpuListError):
        parse_cpu_list(text)


def test_parse_cpu_list_rejects_non_string() -> None:
    with pytest.raises(CpuListError):
        parse_cpu_list(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cpus", "text"),
    [(set(), ""), ({0}, "0"), ({0, 1, 2, 3, 8}, "0-3,8"), ({5, 1, 2}, "1-2,5"), ({0, 2, 4}, "0,2,4")],
)
def test_format_cpu_list(cpus: set[int], text: str) -> None:
    assert format_cpu_list(cpus) == text


@given(st.sets(st.integers(min_value=0, max_value=300), max_size=80))
def test_cpu_list_round_trip(cpus: set[int]) -> None:
    text = format_cpu_list(cpus)
    assert parse_cpu_list(text) == frozenset(cpus)
    # Canonical: formatting the parse of a canonical string gives the same string.
    assert format_cpu_list(parse_cpu_list(text)) == text


# --- described topologies ------------------------------------------------------------------


def test_describe_two_sockets_two_numa_eight_cores_two_threads() -> None:
    topology = CpuTopology.describe(sockets=2, numa_per_socket=2, cores_per_numa=8, threads_per_core=2)
    assert len(topology.online) == 64
    assert len(topology.cores) == 32
    assert topology.threads_per_core == 2
    assert sorted(topology.numa_nodes) == [0, 1, 2, 3]
    assert sorted(topology.sockets) == [0, 1]
    # x86 numbering: thread 1 of core 0 is CPU 32.
    assert topology.siblings(0) == {0, 32}
    assert topology.siblings(32) == {0, 32}
    assert topology.numa_nodes[0] == frozenset(range(0, 8)) | frozenset(range(32, 40))
    assert topology.numa_nodes[3] == frozenset(range(24, 32)) | frozenset(range(56, 64))
    assert topology.sockets[1] == frozenset(range(16, 32)) | frozenset(range(48, 64))
    assert topology.numa_nodes_of({0, 31}) == {0, 3}
    for cores_cpus in topology.cores.values():
        assert len(cores_cpus) == 2
        assert len(topology.numa_nodes_of(cores_cpus)) == 1


def test_describe_adjacent_siblings_and_offline_cpu() -> None:
    topology = CpuTopology.describe(
        cores_per_numa=4, threads_per_core=2, sibling_layout="adjacent", offline=[2]
    )
    assert topology.online == frozenset(range(8)) - {2}
    assert topology.siblings(0) == {0, 1}
    # The core's id is its lowest *online* CPU.
    assert topology.siblings(3) == {3}
    assert topology.core_of(3) == 3


def test_describe_rejects_bad_dimensions() -> None:
    with pytest.raises(ValueError):
        CpuTopology.describe(sockets=0)
    with pytest.raises(ValueError):
        CpuTopology.describe(sibling_layout="weird")


def test_duplicate_cpu_rejected() -> None:
    with pytest.raises(ValueError):
        CpuTopology((CpuInfo(0, 0, 0, 0), CpuInfo(0, 0, 0, 0)))


# --- sysfs ---------------------------------------------------------------------------------


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text + "\n")


def _fake_sysfs(
    root: str, *, online: str | None, cpus: dict[int, tuple[int, int, str]], nodes: dict[int, str]
) -> None:
    """cpus: cpu -> (physical_package_id, core_id, thread_siblings_list)."""
    cpu_root = os.path.join(root, "devices/system/cpu")
    os.makedirs(cpu_root, exist_ok=True)
    if online is not None:
        _write(f"{cpu_root}/online", online)
    for cpu, (package, core, siblings) in cpus.items():
        topo = f"{cpu_root}/cpu{cpu}/topology"
        _write(f"{topo}/physical_package_id", str(package))
        _write(f"{topo}/core_id", str(core))
        _write(f"{topo}/thread_siblings_list", siblings)
    for node, cpulist in nodes.items():
        _write(os.path.join(root, f"devices/system/node/node{node}/cpulist"), cpulist)


def test_read_fake_sysfs(tmp_path) -> None:
    # 1 socket, 2 NUMA nodes, 4 cores x 2 threads, CPU 7 offline.
    cpus = {cpu: (0, cpu % 4, f"{cpu % 4},{cpu % 4 + 4}") for cpu in range(8)}
    _fake_sysfs(str(tmp_path), online="0-6", cpus=cpus, nodes={0: "0-1,4-5", 1: "2-3,6-7"})
    topology = read_cpu_topology(str(tmp_path))
    assert topology.online == frozenset(range(7))
    assert topology.siblings(0) == {0, 4}
    assert topology.siblings(3) == {3}  # sibling 7 offline
    assert topology.numa_nodes == {0: frozenset({0, 1, 4, 5}), 1: frozenset({2, 3, 6})}


def test_read_sysfs_degrades_gracefully(tmp_path) -> None:
    # No "online" file, no NUMA dirs, package id -1, cpu1 without topology, cpu2 offline.
    cpus = {0: (-1, 0, "0")}
    _fake_sysfs(str(tmp_path), online=None, cpus=cpus, nodes={})
    cpu_root = tmp_path / "devices/system/cpu"
    (cpu_root / "cpu1").mkdir()
    (cpu_root / "cpu2").mkdir()
    (cpu_root / "cpu2" / "online").write_text("0\n")
    topology = read_cpu_topology(str(tmp_path))
    assert topology.online == {0, 1}
    assert topology.by_cpu[0].socket == 0
    assert topology.numa_nodes == {0: frozenset({0, 1})}
    assert topology.siblings(1) == {1}


def test_read_sysfs_errors(tmp_path) -> None:
    with pytest.raises(TopologyError):
        read_cpu_topology(str(tmp_path))
    _write(str(tmp_path / "devices/system/cpu/online"), "garbage")
    with pytest.raises(TopologyError):
        read_cpu_topology(str(tmp_path))


def test_read_real_sysfs() -> None:
    topology = read_cpu_topology("/sys")
    assert topology.online
    assert os.sched_getaffinity(0) <= topology.online
    assert frozenset().union(*topology.cores.values()) == topology.online
    assert frozenset().union(*topology.numa_nodes.values()) == topology.online
