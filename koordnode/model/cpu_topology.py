"""The node's CPU topology: online CPUs, their physical cores (SMT siblings), sockets, NUMA nodes.

Read once from sysfs (read_cpu_topology) or described for tests (CpuTopology.describe).
A core is identified by its lowest online CPU id, which is unique on the node even where
core_id repeats across sockets or is meaningless (some VMs and ARM machines).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

from koordnode.model.cpulist import CpuListError, parse_cpu_list


class TopologyError(RuntimeError):
    """sysfs could not be read into a usable topology."""


@dataclass(frozen=True, order=True)
class CpuInfo:
    cpu: int
    socket: int
    # Lowest online CPU id among this CPU's SMT siblings.
    core: int
    numa_node: int


@dataclass(frozen=True)
class CpuTopology:
    cpu_infos: tuple[CpuInfo, ...]

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for info in self.cpu_infos:
            if info.cpu in seen:
                raise ValueError(f"CPU {info.cpu} described twice")
            seen.add(info.cpu)
        object.__setattr__(self, "cpu_infos", tuple(sorted(self.cpu_infos)))

    # --- views (cached: the dataclass is immutable) ---

    @cached_property
    def by_cpu(self) -> Mapping[int, CpuInfo]:
        return {info.cpu: info for info in self.cpu_infos}

    @cached_property
    def online(self) -> frozenset[int]:
        return frozenset(info.cpu for info in self.cpu_infos)

    @cached_property
    def cores(self) -> Mapping[int, frozenset[int]]:
        """core id -> its online CPUs, in ascending core id order."""
        grouped: dict[int, set[int]] = {}
        for info in self.cpu_infos:
            grouped.setdefault(info.core, set()).add(info.cpu)
        return {core: frozenset(cpus) for core, cpus in sorted(grouped.items())}

    @cached_property
    def numa_nodes(self) -> Mapping[int, frozenset[int]]:
        grouped: dict[int, set[int]] = {}
        for info in self.cpu_infos:
            grouped.setdefault(info.numa_node, set()).add(info.cpu)
        return {node: frozenset(cpus) for node, cpus in sorted(grouped.items())}

    @cached_property
    def sockets(self) -> Mapping[int, frozenset[int]]:
        grouped: dict[int, set[int]] = {}
        for info in self.cpu_infos:
            grouped.setdefault(info.socket, set()).add(info.cpu)
        return {socket: frozenset(cpus) for socket, cpus in sorted(grouped.items())}

    @property
    def threads_per_core(self) -> int:
        return max((len(cpus) for cpus in self.cores.values()), default=1)

    def siblings(self, cpu: int) -> frozenset[int]:
        """The online CPUs sharing cpu's physical core (cpu included)."""
        return self.cores[self.by_cpu[cpu].core]

    def core_of(self, cpu: int) -> int:
        return self.by_cpu[cpu].core

    def numa_node_of(self, cpu: int) -> int:
        return self.by_cpu[cpu].numa_node

    def numa_nodes_of(self, cpus: Iterable[int]) -> frozenset[int]:
        return frozenset(self.by_cpu[cpu].numa_node for cpu in cpus if cpu in self.by_cpu)

    # --- construction for tests and simulations ---

    @classmethod
    def describe(
        cls,
        sockets: int = 1,
        numa_per_socket: int = 1,
        cores_per_numa: int = 2,
        threads_per_core: int = 1,
        sibling_layout: str = "spread",
        offline: Iterable[int] = (),
    ) -> CpuTopology:
        """A regular machine, numbered as Linux does.

        sibling_layout "spread" (usual x86): CPU ids first run over thread 0 of every core,
        then thread 1 ... (on 1 socket x 8 cores x 2 threads, CPU 0 and CPU 8 are siblings).
        "adjacent": siblings are consecutive (CPU 0 and 1).
        """
        if min(sockets, numa_per_socket, cores_per_numa, threads_per_core) < 1:
            raise ValueError("every topology dimension must be >= 1")
        if sibling_layout not in ("spread", "adjacent"):
            raise ValueError(f"unknown sibling_layout {sibling_layout!r}")
        total_cores = sockets * numa_per_socket * cores_per_numa
        offline_set = frozenset(offline)
        placed: list[tuple[int, int, int, int]] = []  # cpu, socket, physical core index, node
        for core_index in range(total_cores):
            socket = core_index // (numa_per_socket * cores_per_numa)
            node = core_index // cores_per_numa
            for thread in range(threads_per_core):
                if sibling_layout == "spread":
                    cpu = thread * total_cores + core_index
                else:
                    cpu = core_index * threads_per_core + thread
                placed.append((cpu, socket, core_index, node))
        online = [entry for entry in placed if entry[0] not in offline_set]
        lowest_of_core: dict[int, int] = {}
        for cpu, _, core_index, _ in online:
            lowest_of_core[core_index] = min(cpu, lowest_of_core.get(core_index, cpu))
        return cls(
            tuple(
                CpuInfo(cpu=cpu, socket=socket, core=lowest_of_core[core_index], numa_node=node)
                for cpu, socket, core_index, node in online
            )
        )


_CPU_DIR = re.compile(r"^cpu(\d+)$")
_NODE_DIR = re.compile(r"^node(\d+)$")


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: str, default: int) -> int:
    text = _read_text(path)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        return default


def read_cpu_topology(sysfs_root: str = "/sys") -> CpuTopology:
    """Read the online CPUs' topology from <sysfs_root>/devices/system/{cpu,node}.

    Missing details degrade instead of failing: no topology dir -> the CPU is its own core on
    socket 0; no NUMA dirs -> everything on node 0; physical_package_id -1 -> socket 0.
    """
    cpu_root = os.path.join(sysfs_root, "devices", "system", "cpu")
    node_root = os.path.join(sysfs_root, "devices", "system", "node")
    online = _online_cpus(cpu_root)
    if not online:
        raise TopologyError(f"no online CPUs found under {cpu_root}")

    cpu_to_node: dict[int, int] = {}
    try:
        node_entries = os.listdir(node_root)
    except OSError:
        node_entries = []
    for entry in sorted(node_entries):
        match = _NODE_DIR.match(entry)
        if not match:
            continue
        text = _read_text(os.path.join(node_root, entry, "cpulist"))
        if text is None:
            continue
        try:
            node_cpus = parse_cpu_list(text)
        except CpuListError:
            continue
        for cpu in node_cpus:
            cpu_to_node.setdefault(cpu, int(match.group(1)))
    fallback_node = min(cpu_to_node.values(), default=0)

    infos: list[CpuInfo] = []
    for cpu in sorted(online):
        topology_dir = os.path.join(cpu_root, f"cpu{cpu}", "topology")
        socket = max(_read_int(os.path.join(topology_dir, "physical_package_id"), 0), 0)
        siblings_text = _read_text(os.path.join(topology_dir, "thread_siblings_list"))
        siblings = {cpu}
        if siblings_text:
            try:
                siblings |= parse_cpu_list(siblings_text)
            except CpuListError:
                pass
        core = min(siblings & online | {cpu})
        infos.append(
            CpuInfo(cpu=cpu, socket=socket, core=core, numa_node=cpu_to_node.get(cpu, fallback_node))
        )
    return CpuTopology(tuple(infos))


def _online_cpus(cpu_root: str) -> frozenset[int]:
    text = _read_text(os.path.join(cpu_root, "online"))
    if text is not None:
        try:
            return parse_cpu_list(text)
        except CpuListError as error:
            raise TopologyError(f"cannot parse {cpu_root}/online: {error}") from None
    # No "online" file: every cpuN dir whose own "online" flag is not 0 (cpu0 often has none).
    try:
        entries = os.listdir(cpu_root)
    except OSError as error:
        raise TopologyError(f"cannot list {cpu_root}: {error}") from None
    cpus: set[int] = set()
    for entry in entries:
        match = _CPU_DIR.match(entry)
        if match and _read_text(os.path.join(cpu_root, entry, "online")) != "0":
            cpus.add(int(match.group(1)))
    return frozenset(cpus)


def read_numa_memory(sysfs_root: str, nodes: Iterable[int]) -> dict[int, int]:
    """Each NUMA node's MemTotal in bytes (<sysfs_root>/devices/system/node/node<N>/meminfo,
    "Node N MemTotal: X kB"); a node without the file is left out."""
    found: dict[int, int] = {}
    for node in nodes:
        text = _read_text(os.path.join(sysfs_root, "devices", "system", "node", f"node{node}", "meminfo"))
        for line in (text or "").splitlines():
            words = line.split()
            if len(words) >= 4 and words[2] == "MemTotal:" and words[3].isdigit():
                found[node] = int(words[3]) * (1024 if words[4:5] == ["kB"] else 1)
                break
    return found
