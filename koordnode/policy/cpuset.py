"""Node-local CPU set allocator: exclusive cores for LSE, reserved cores for LSR, pools for the rest.

The only state is inside a CpusetAllocator object (owner id -> CPUs); every method is a pure
function of that state and the topology, and nothing here touches the kernel. Invariant: the
CPUs of all owners are pairwise disjoint, online, and outside the node-reserved set.

Pools:
  share pool (LS, and SYSTEM without system_cpus) = online - LSE - LSR - reserved
  BE pool                                           = online - LSE - reserved
(BE may run on LSR cores: LSR keeps them away from LS, not from best effort work.)

Owner ids are opaque; cpuset_owner_id() gives the recommended ones, known already at
CreateContainer (before the runtime assigns a container id) and again after a restart.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from koordnode.model.cpu_topology import CpuTopology
from koordnode.model.cpulist import CpuListError, format_cpu_list, parse_cpu_list
from koordnode.model.qos_class import CPU_OWNING_CLASSES, QoSClass
from koordnode.config.node import NodeConfig


@dataclass(frozen=True)
class Allocation:
    owner_id: str
    qos_class: QoSClass
    cpus: frozenset[int]
    # "allocated" (by this allocator), "scheduler" (resource-status honoured) or "restored".
    source: str


@dataclass(frozen=True)
class CpusetDecision:
    """The CPUs a container should run on, and why."""

    cpus: frozenset[int]
    # True: the CPUs are owned by this owner (LSE/LSR); False: a shared pool.
    exclusive: bool
    # True: an LSE/LSR request could not be satisfied and the share pool was used instead.
    fallback: bool
    reason: str
    # NUMA nodes of `cpus` (for cpuset_mems when the node config asks for it).
    mems: frozenset[int] = frozenset()
    # A new allocation this decision needs recorded (CpusetAllocator.record) to hold; None
    # for pools, fallbacks and an owner's existing CPUs.
    allocation: Allocation | None = None

    @property
    def cpuset_cpus(self) -> str:
        return format_cpu_list(self.cpus)

    @property
    def cpuset_mems(self) -> str:
        return format_cpu_list(self.mems)


@dataclass(frozen=True)
class RestoreResult:
    accepted: bool
    reason: str


def reserved_cpus_from_config(value: str | int, topology: CpuTopology) -> tuple[frozenset[int], list[str]]:
    """Resolve `[node] reserved_cpus` into CPUs, with notes on anything dropped.

    A string is a CPU list (offline CPUs are dropped). An int is a count: that many CPUs taken
    from the lowest-numbered cores, whole cores (all SMT siblings) first so reserved work does
    not share a core with pods; only the last core may be split when the count is odd.
    """
    notes: list[str] = []
    if isinstance(value, bool):
        return frozenset(), [f"reserved_cpus {value!r} is neither a CPU list nor a count; nothing reserved"]
    if isinstance(value, int):
        if value <= 0:
            return frozenset(), notes
        count = min(value, len(topology.online))
        if count < value:
            notes.append(f"reserved_cpus = {value} exceeds the {len(topology.online)} online CPUs")
        chosen: list[int] = []
        for cpus in topology.cores.values():
            if len(chosen) >= count:
                break
            chosen.extend(sorted(cpus)[: count - len(chosen)])
        return frozenset(chosen), notes
    try:
        cpus = parse_cpu_list(value)
    except CpuListError as error:
        return frozenset(), [f"reserved_cpus: {error}; nothing reserved"]
    offline = cpus - topology.online
    if offline:
        notes.append(f"reserved_cpus: CPUs {format_cpu_list(offline)} are not online and are ignored")
    return cpus & topology.online, notes


def cpuset_owner_id(pod_uid: str, container_name: str, scheduler_cpuset: bool) -> str:
    """The pod UID when the scheduler chose the pod's cpuset (all its containers share it),
    else "<pod uid>/<container name>"."""
    return pod_uid if scheduler_cpuset else f"{pod_uid}/{container_name}"


def allocator_from_config(topology: CpuTopology, node: NodeConfig) -> tuple[CpusetAllocator, list[str]]:
    """An empty allocator with `[node]` reserved and system CPUs resolved; notes on what was dropped."""
    reserved, notes = reserved_cpus_from_config(node.reserved_cpus, topology)
    system = node.system_cpu_set
    offline = system - topology.online
    if offline:
        notes.append(f"system_cpus: CPUs {format_cpu_list(offline)} are not online and are ignored")
    allocator = CpusetAllocator(topology, reserved=reserved, system_cpus=system & topology.online,
                                min_shared_cpus=node.min_shared_cpus)
    return allocator, notes


class CpusetAllocator:
    def __init__(
        self,
        topology: CpuTopology,
        reserved: Iterable[int] = (),
        system_cpus: Iterable[int] = (),
        min_shared_cpus: int = 0,
    ) -> None:
        self._topology = topology
        # CPUs the share pool keeps whatever LSE/LSR ask for ([node] min_shared_cpus).
        self._min_shared = max(0, min_shared_cpus)
        self._reserved = frozenset(reserved) & topology.online
        # SYSTEM pods run on these when set; they are not removed from the pools.
        self._system_cpus = frozenset(system_cpus) & topology.online
        # Copy-on-write (replaced, never changed in place) under _lock: readers in other threads
        # always see a whole dict. _reservations: allocations decided for a request that is not
        # forwarded yet (reserve/commit/cancel); their CPUs count as held for new decisions.
        self._lock = threading.Lock()
        self._allocations: dict[str, Allocation] = {}
        self._reservations: dict[str, Allocation] = {}
        # Bumped on every change, so the caller knows the pools moved and running LS/BE
        # containers need their cpuset updated.
        self.version = 0

    # --- read-only views ---

    @property
    def topology(self) -> CpuTopology:
        return self._topology

    @property
    def reserved(self) -> frozenset[int]:
        return self._reserved

    @property
    def min_shared_cpus(self) -> int:
        return self._min_shared

    def allocations(self) -> Mapping[str, Allocation]:
        return MappingProxyType(dict(self._allocations))

    def allocation_of(self, owner_id: str) -> Allocation | None:
        return self._allocations.get(owner_id)

    def _owned(self, *classes: QoSClass, excluding: str | None = None) -> frozenset[int]:
        cpus: set[int] = set()
        for owner, allocation in self._allocations.items():
            if owner != excluding and allocation.qos_class in classes:
                cpus |= allocation.cpus
        return frozenset(cpus)

    def taken(self) -> frozenset[int]:
        """CPUs owned by LSE/LSR allocations."""
        return self._owned(QoSClass.LSE, QoSClass.LSR)

    def share_pool(self) -> frozenset[int]:
        return self._topology.online - self._owned(QoSClass.LSE, QoSClass.LSR) - self._reserved

    def be_pool(self) -> frozenset[int]:
        return self._topology.online - self._owned(QoSClass.LSE) - self._reserved

    def free_cpus(self) -> frozenset[int]:
        """CPUs an LSE/LSR allocation could still get."""
        return self._topology.online - self.taken() - self._reserved

    # --- decisions ---

    def pool_for(self, qos_class: QoSClass) -> CpusetDecision:
        """The shared CPUs a container of a non-owning class runs on (never empty)."""
        if qos_class is QoSClass.SYSTEM and self._system_cpus:
            return self._decision(self._system_cpus, False, False, "SYSTEM: configured system CPUs")
        if qos_class is QoSClass.BE:
            return self._non_empty(self.be_pool(), "BE pool (all CPUs - LSE - reserved)")
        return self._non_empty(
            self.share_pool(), f"{qos_class.value}: share pool (all CPUs - LSE - LSR - reserved)"
        )

    def _non_empty(self, cpus: frozenset[int], reason: str, fallback: bool = False) -> CpusetDecision:
        # An empty cpuset is rejected by the kernel; rather share CPUs than fail the container.
        if cpus:
            return self._decision(cpus, False, fallback, reason)
        for candidate, why in (
            (self.be_pool(), "BE pool"),
            (self._reserved, "node-reserved CPUs"),
            (self._topology.online, "all online CPUs"),
        ):
            if candidate:
                return self._decision(candidate, False, fallback, f"{reason} is empty; using {why}")
        raise AssertionError("a topology always has online CPUs")

    def _decision(self, cpus: frozenset[int], exclusive: bool, fallback: bool, reason: str) -> CpusetDecision:
        return CpusetDecision(
            cpus=cpus,
            exclusive=exclusive,
            fallback=fallback,
            reason=reason,
            mems=self._topology.numa_nodes_of(cpus),
        )

    def allocate(
        self,
        owner_id: str,
        qos_class: QoSClass,
        n_cpus: int,
        preferred: Iterable[int] | None = None,
    ) -> CpusetDecision:
        """decide() and record() at once."""
        decision = self.decide(owner_id, qos_class, n_cpus, preferred)
        if decision.allocation is not None:
            problem = self.record(decision.allocation)
            if problem is not None:  # another thread took the CPUs in between
                return self._fallback(qos_class, [problem])
        return decision

    def decide(
        self,
        owner_id: str,
        qos_class: QoSClass,
        n_cpus: int,
        preferred: Iterable[int] | None = None,
        pending: Iterable[Allocation] = (),
    ) -> CpusetDecision:
        """CPUs for an owner of `qos_class`, without changing anything: a new allocation comes back
        in the decision's `allocation`, for record(). `pending`: allocations decided but not
        recorded yet, whose CPUs count as held. Never raises for lack of CPUs: falls back to the
        pool.

        LSE: whole free cores (all SMT siblings), at least n_cpus CPUs, one NUMA node if
        possible, else one socket, else anywhere. LSR: n_cpus CPUs, whole free cores first.
        `preferred` (the scheduler's resource-status cpuset) is honoured if every CPU is online,
        not node-reserved and not owned by another owner. Other classes get their pool.
        Deciding again for an owner that holds CPUs returns them.
        """
        probe = self._with(pending)
        return probe._decide(owner_id, qos_class, n_cpus, preferred)

    def _with(self, pending: Iterable[Allocation]) -> CpusetAllocator:
        """A copy of this allocator with the reservations and `pending` held too (decisions run
        on it, so the allocator itself does not change)."""
        probe = CpusetAllocator.__new__(CpusetAllocator)
        probe.__dict__.update(self.__dict__)
        held = dict(self._allocations)
        for allocation in (*self._reservations.values(), *pending):
            held.setdefault(allocation.owner_id, allocation)
        probe._allocations = held
        probe._reservations = {}
        return probe

    def _refusal(self, allocation: Allocation) -> str | None:
        existing = self._allocations.get(allocation.owner_id) or self._reservations.get(allocation.owner_id)
        if existing is not None:
            return None if existing == allocation else (
                f"{allocation.owner_id} already holds {format_cpu_list(existing.cpus)}")
        return self._with(())._preferred_problem(allocation.cpus, allocation.owner_id)

    def record(self, allocation: Allocation) -> str | None:
        """Hold a decided allocation; refused (the problem comes back) if its CPUs are no longer
        free, so a CPU is never owned twice."""
        with self._lock:
            problem = self._refusal(allocation)
            if problem is None and allocation.owner_id not in self._allocations:
                self._record(allocation)
            return problem

    def reserve(self, allocation: Allocation) -> str | None:
        """Hold a decided allocation for a request not forwarded yet: commit() makes it an
        allocation (the request goes on), cancel() drops it (the request was dropped). Refused
        like record()."""
        with self._lock:
            problem = self._refusal(allocation)
            if problem is None and allocation.owner_id not in self._allocations:
                self._reservations = {**self._reservations, allocation.owner_id: allocation}
            return problem

    def commit(self, allocation: Allocation) -> bool:
        """The reserved allocation's request went on: it becomes the owner's allocation."""
        with self._lock:
            if self._reservations.get(allocation.owner_id) is not allocation:
                return False
            self._reservations = {k: v for k, v in self._reservations.items() if k != allocation.owner_id}
            self._record(allocation)
            return True

    def cancel(self, allocation: Allocation) -> bool:
        """The reserved allocation's request was dropped: its CPUs are free again."""
        with self._lock:
            if self._reservations.get(allocation.owner_id) is not allocation:
                return False
            self._reservations = {k: v for k, v in self._reservations.items() if k != allocation.owner_id}
            return True

    def reservation_of(self, owner_id: str) -> Allocation | None:
        return self._reservations.get(owner_id)

    def reservations(self) -> Mapping[str, Allocation]:
        return MappingProxyType(dict(self._reservations))

    def _decide(
        self,
        owner_id: str,
        qos_class: QoSClass,
        n_cpus: int,
        preferred: Iterable[int] | None,
    ) -> CpusetDecision:
        if qos_class not in CPU_OWNING_CLASSES:
            return self.pool_for(qos_class)
        existing = self._allocations.get(owner_id)
        if existing is not None:
            held = format_cpu_list(existing.cpus)
            reason = f"{existing.qos_class.value}: already holds {held} ({existing.source})"
            return self._decision(existing.cpus, True, False, reason)

        notes: list[str] = []
        if preferred is not None:
            wanted = frozenset(preferred)
            problem = self._preferred_problem(wanted, owner_id) or self._share_floor_problem(wanted)
            if problem is None:
                reason = f"{qos_class.value}: scheduler's cpuset {format_cpu_list(wanted)} (resource-status)"
                return replace(self._decision(wanted, True, False, reason),
                               allocation=Allocation(owner_id, qos_class, wanted, "scheduler"))
            notes.append(f"scheduler's cpuset {format_cpu_list(wanted)} not usable ({problem})")

        if n_cpus <= 0:
            return self._fallback(qos_class, notes + [f"no whole-CPU request ({n_cpus})"])
        chosen = self._choose(qos_class, n_cpus)
        if chosen is None:
            free = self.free_cpus()
            detail = f"{n_cpus} CPUs wanted, {len(free)} free"
            if qos_class is QoSClass.LSE:
                detail += f" ({len(self._free_cores(free))} whole free cores)"
            return self._fallback(qos_class, notes + [detail])
        floor = self._share_floor_problem(chosen)
        if floor is not None:
            return self._fallback(qos_class, notes + [floor])
        shape = "whole cores" if qos_class is QoSClass.LSE else "reserved"
        nodes = format_cpu_list(self._topology.numa_nodes_of(chosen))
        reason = (
            f"{qos_class.value}: {shape} {format_cpu_list(chosen)} for {n_cpus} CPUs on NUMA node(s) {nodes}"
        )
        if notes:
            reason += "; " + "; ".join(notes)
        return replace(self._decision(chosen, True, False, reason),
                       allocation=Allocation(owner_id, qos_class, chosen, "allocated"))

    def _fallback(self, qos_class: QoSClass, notes: list[str]) -> CpusetDecision:
        reason = f"{qos_class.value}: not enough free CPUs, falling back to the share pool: " + "; ".join(
            notes
        )
        return self._non_empty(self.share_pool(), reason, fallback=True)

    def _preferred_problem(self, wanted: frozenset[int], owner_id: str) -> str | None:
        if not wanted:
            return "empty"
        offline = wanted - self._topology.online
        if offline:
            return f"CPUs {format_cpu_list(offline)} are not online"
        reserved = wanted & self._reserved
        if reserved:
            return f"CPUs {format_cpu_list(reserved)} are node-reserved"
        for other, allocation in self._allocations.items():
            clash = wanted & allocation.cpus
            if other != owner_id and clash:
                return f"CPUs {format_cpu_list(clash)} are held by {other} ({allocation.qos_class.value})"
        return None

    def _share_floor_problem(self, wanted: frozenset[int]) -> str | None:
        """Why taking `wanted` would leave the share pool below [node] min_shared_cpus."""
        left = self.share_pool() - wanted
        if len(left) >= self._min_shared:
            return None
        return (f"it would leave the share pool {len(left)} CPUs, below"
                f" [node] min_shared_cpus = {self._min_shared}")

    def _record(self, allocation: Allocation) -> None:
        # Callers hold _lock (restore takes it itself).
        self._allocations = {**self._allocations, allocation.owner_id: allocation}
        self.version += 1

    def release(self, owner_id: str) -> frozenset[int]:
        """Give the owner's CPUs back; returns them (empty if it held none)."""
        with self._lock:
            allocation = self._allocations.get(owner_id)
            if allocation is None:
                return frozenset()
            self._allocations = {k: v for k, v in self._allocations.items() if k != owner_id}
            self.version += 1
            return allocation.cpus

    def restore(self, owner_id: str, qos_class: QoSClass, cpus: Iterable[int]) -> RestoreResult:
        """Re-register a running container's CPUs after a restart.

        Refused (the caller should re-allocate that owner) when the CPUs are offline,
        node-reserved or held by an owner restored earlier: a CPU is never owned twice.
        """
        wanted = frozenset(cpus)
        if qos_class not in CPU_OWNING_CLASSES:
            return RestoreResult(False, f"{qos_class.value} does not own CPUs; nothing to restore")
        existing = self._allocations.get(owner_id)
        if existing is not None:
            if existing.cpus == wanted:
                return RestoreResult(True, "already registered with the same CPUs")
            return RestoreResult(False, f"{owner_id} already holds {format_cpu_list(existing.cpus)}")
        problem = self._preferred_problem(wanted, owner_id)
        if problem is not None:
            return RestoreResult(False, f"cannot restore {format_cpu_list(wanted)} for {owner_id}: {problem}")
        with self._lock:
            self._record(Allocation(owner_id, qos_class, wanted, "restored"))
        return RestoreResult(True, f"restored {qos_class.value} {format_cpu_list(wanted)}")

    # --- the choice of CPUs ---

    def _free_cores(self, free: frozenset[int]) -> dict[int, frozenset[int]]:
        """Cores whose every online CPU is free."""
        return {core: cpus for core, cpus in self._topology.cores.items() if cpus <= free}

    def _choose(self, qos_class: QoSClass, n_cpus: int) -> frozenset[int] | None:
        free = self.free_cpus()
        whole_only = qos_class is QoSClass.LSE
        usable = frozenset().union(*self._free_cores(free).values()) if whole_only else free
        if len(usable) < n_cpus:
            return None
        topology = self._topology
        # Narrowest scope first: one NUMA node, then one socket, then the whole node.
        # Within a level pick the tightest fit, so big free blocks stay for big requests.
        for groups in (topology.numa_nodes, topology.sockets):
            fitting = [
                (len(usable & cpus), key, cpus)
                for key, cpus in groups.items()
                if len(usable & cpus) >= n_cpus
            ]
            if fitting:
                _, _, scope = min(fitting)
                return self._pick(usable & scope, free, n_cpus, whole_only)
        return self._pick_spread(usable, free, n_cpus, whole_only)

    def _pick_spread(
        self, usable: frozenset[int], free: frozenset[int], n_cpus: int, whole_only: bool
    ) -> frozenset[int]:
        # Across NUMA nodes: drain the nodes with the most usable CPUs first (fewest nodes).
        nodes = sorted(self._topology.numa_nodes.items(), key=lambda item: (-len(usable & item[1]), item[0]))
        chosen: set[int] = set()
        for _, node_cpus in nodes:
            remaining = n_cpus - len(chosen)
            if remaining <= 0:
                break
            in_node = usable & node_cpus
            take = min(remaining, len(in_node))
            if take:
                chosen |= self._pick(in_node, free, take, whole_only)
        return frozenset(chosen)

    def _pick(
        self, scope: frozenset[int], free: frozenset[int], n_cpus: int, whole_only: bool
    ) -> frozenset[int]:
        """n_cpus CPUs out of scope (which has enough), keeping SMT siblings together."""
        cores = self._topology.cores
        whole = [cpus for cpus in cores.values() if cpus <= scope and cpus <= free]
        chosen: list[int] = []
        if whole_only:
            for cpus in whole:
                if len(chosen) >= n_cpus:
                    break
                chosen.extend(cpus)
            return frozenset(chosen)
        # Whole cores while they fit entirely...
        for cpus in whole:
            if n_cpus - len(chosen) >= len(cpus):
                chosen.extend(cpus)
        # ...then CPUs of already-split cores (their siblings are taken anyway), smallest first,
        # then split a free core as the last resort.
        rest = scope - set(chosen)
        by_core: dict[int, set[int]] = {}
        for cpu in rest:
            by_core.setdefault(self._topology.core_of(cpu), set()).add(cpu)
        ordered = sorted(
            by_core.items(), key=lambda item: (item[1] == set(cores[item[0]]), len(item[1]), item[0])
        )
        for _, split in ordered:
            for cpu in sorted(split):
                if len(chosen) >= n_cpus:
                    break
                chosen.append(cpu)
        return frozenset(chosen)
