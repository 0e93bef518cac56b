"""CPU pools of the QoS engine: who holds which CPUs (the allocator, its reservations and the
containers owning allocations), the pools running containers are moved between, adoption of
allocations after a restart, and who owns the cpusets at all (koordnode, or kubelet's static
CPU manager).

Called under the engine's lock (hooks/qos_engine.py), apart from CpuReservation, which the event
loop settles without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Set
from typing import Any

import structlog

from koordnode.config.components import EngineSettings
from koordnode.cri.koordnode_annotations import (
    CPU_ALLOCATION_ANNOTATION,
    KUBELET_RESOURCES_ANNOTATION,
    allocation_from_annotation,
    fallback_from_annotation,
    resources_from_annotation,
)
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.executor.write_result import WriteResult, WriteStatus
from koordnode.executor.paths import UnsafePathError, container_cgroup_path
from koordnode.hooks.chain import skip_requested
from koordnode.hooks.pool_updates import PoolUpdates
from koordnode.hooks.resized import ResizedResources
from koordnode.model.annotations import parse_pod_annotations
from koordnode.model.cpu_topology import CpuTopology
from koordnode.model.cpulist import format_cpu_list, parse_cpu_list
from koordnode.model.qos_class import CPU_OWNING_CLASSES, ClassDecision, KubeQoS, QoSClass
from koordnode.model.state import CONTAINER_CREATED, CONTAINER_RUNNING, NodeView, PodRecord
from koordnode.policy.class_inputs import ContainerInput, ContainerResources, PodInput
from koordnode.policy.container_policy import allocate_cpuset
from koordnode.policy.cpuset import Allocation, CpusetAllocator, CpusetDecision, allocator_from_config, cpuset_owner_id
from koordnode.policy.plan import CgroupWrite

log = structlog.get_logger("koordnode.qos")

# `koordnode status` qos.cpus.owner: who decides the containers' cpusets.
CPUS_OWNER_KOORDNODE = "koordnode"
CPUS_OWNER_KUBELET = "kubelet (static CPU manager)"
KUBELET_CPUS_NOTE = (
    "kubelet's CPU manager policy is static: kubelet owns the containers' cpusets (exclusive CPUs for"
    " Guaranteed containers with whole CPUs, its shared pool for the others, reconciled every"
    " cpuManagerReconcilePeriod). koordnode keeps kubelet's cpuset in every CreateContainer and"
    " UpdateContainerResources, allocates no CPUs for LSE/LSR and moves no container to a pool; every"
    " other class value applies. LSE's whole cores (no SMT sibling shared) need kubelet's"
    " cpuManagerPolicyOptions full-pcpus-only: \"true\"")

Decide = Callable[[PodRecord], ClassDecision]


def kubelet_cpuset_only(res: ContainerResources) -> bool:
    """Whether an UpdateContainerResources carries nothing but a cpuset: kubelet's CPU manager
    reconcile (cpumanager updateContainerCPUSet sends LinuxContainerResources{CpusetCpus} alone),
    which changes the cpuset and nothing else. A resize always carries cpu_shares (>= 2)."""
    return bool(res.cpuset_cpus) and not (res.cpu_shares or res.cpu_quota or res.cpu_period
                                          or res.memory_limit_in_bytes or res.memory_swap_limit_in_bytes
                                          or res.unified)


def _whole_cpus(res: ContainerResources) -> bool:
    """kubelet's static policy gives exclusive CPUs to Guaranteed containers with an integral
    CPU limit (= request): quota a whole multiple of the period, or no quota at all (-1: kubelet
    lifts the quota of containers with exclusive CPUs, feature DisableCPUQuotaWithExclusiveCPUs,
    on by default)."""
    return res.cpu_quota < 0 or (res.cpu_quota > 0 and res.cpu_period > 0 and res.cpu_quota % res.cpu_period == 0)


def owner_id(pod: PodInput | PodRecord, container_name: str) -> str:
    """The allocator's owner of a container's CPUs (a pod's containers share one with a scheduler cpuset)."""
    return cpuset_owner_id(pod.uid, container_name, parse_pod_annotations(pod.annotations).has_scheduler_cpuset)


class CpuReservation:
    """CPUs a CreateContainer Pre hook set aside for the request it rewrote (a PreEffect, see
    hooks/chain.py): committed where the chain keeps the rewritten request, cancelled where it
    drops it. Quick and lock-light: the event loop calls it."""

    def __init__(self, allocator: CpusetAllocator, allocation: Allocation,
                 on_settled: Callable[[], None]) -> None:
        self._allocator = allocator
        self.allocation = allocation
        self._on_settled = on_settled

    def commit(self) -> None:
        self._allocator.commit(self.allocation)
        self._on_settled()

    def release(self) -> None:
        self._allocator.cancel(self.allocation)
        self._on_settled()


@dataclasses.dataclass(frozen=True)
class CreateCpuset:
    """What CreateContainer gets: its cpuset decision, the CPUs reserved for it (None: none) and the
    allocation its record annotation names (None: no exclusive CPUs)."""

    cpuset: CpusetDecision
    reservation: CpuReservation | None
    allocation: Allocation | None


class CpuPools:
    """The allocator and the containers' claims on it.

    `be_cpuset()`: the CPUs the QoS manager confines BE to (its cpuset policy), None: the BE
    pool; the QoS manager is then the one writer of BE containers' cpusets. `pool_updates` (NRI
    mode): where pool moves of running containers go instead of their cgroups."""

    def __init__(self, settings: EngineSettings, topology: CpuTopology, *,
                 be_cpuset: Callable[[], frozenset[int] | None] | None = None,
                 pool_updates: PoolUpdates | None = None) -> None:
        self.topology = topology
        self.be_cpuset = be_cpuset
        self.pool_updates = pool_updates
        self.cpu_owner: dict[str, str] = {}  # container id -> its allocation's owner
        self._sandbox_of: dict[str, str] = {}  # container id (of cpu_owner) -> its sandbox id
        # LSE/LSR containers whose recorded allocation was refused at restore: they ask again.
        self.reallocate: set[str] = set()
        # LSE/LSR containers that got no CPUs at creation -> why (from their record annotation).
        self.fallback_reason: dict[str, str] = {}
        # Who owns the cpusets: None while koordnode does; else why kubelet does (its static CPU
        # manager puts a cpuset in every CreateContainer; under "none" it sends none). Sticky for
        # the daemon's life (a client other than kubelet creating containers without a cpuset
        # must not hand the CPUs back); rebuilt at restart from the containers' records.
        self.kubelet_cpus: str | None = None
        self._kubelet_cpus_notes: list[str] = []
        self.kubelet_cpu_view: dict[str, Any] = {}
        self.notes: list[str] = []
        # The pools as the last whole refresh left the running containers (None: not refreshed).
        self._refreshed_pools: tuple[Any, ...] | None = None
        self.configure(settings)

    def configure(self, settings: EngineSettings) -> None:
        """The sections in use; the allocations of the allocator before (a reload) move over."""
        self.settings = settings
        old: CpusetAllocator | None = getattr(self, "allocator", None)
        allocator, notes = allocator_from_config(self.topology, settings.node)
        if old is not None:
            for owner, allocation in old.allocations().items():
                result = allocator.restore(owner, allocation.qos_class, allocation.cpus)
                if not result.accepted:
                    notes.append(f"allocation of {owner} dropped on reload: {result.reason}")
        self.allocator: CpusetAllocator = allocator
        self.notes = notes

    @property
    def reserved(self) -> frozenset[int]:
        """The CPUs kept from every pod ([node] reserved_cpus, resolved)."""
        return frozenset(self.allocator.reserved)

    # ---- the BE cpuset of the QoS manager's cpuset policy ---------------------------------

    def be_override(self, qos_class: QoSClass) -> CpusetDecision | None:
        if qos_class is not QoSClass.BE or self.be_cpuset is None:
            return None
        cpus = self.be_cpuset()
        if not cpus:
            return None
        return CpusetDecision(cpus=frozenset(cpus), exclusive=False, fallback=False,
                              reason="BE cpuset set by the cpu_suppress strategy (policy cpuset)")

    def be_cpus(self) -> frozenset[int] | None:
        cpus = self.be_cpuset() if self.be_cpuset is not None else None
        return frozenset(cpus) if cpus else None

    # ---- containers' claims ---------------------------------------------------------------

    def for_create(self, pod: PodInput, container: ContainerInput, decision: ClassDecision,
                   owner: str, on_settled: Callable[[], None]) -> CreateCpuset:
        """CreateContainer's cpuset while koordnode owns the cpusets, its CPUs reserved."""
        cpuset = self.be_override(decision.qos_class) or allocate_cpuset(
            self.allocator, pod, container, decision.qos_class)
        reservation: CpuReservation | None = None
        if cpuset.allocation is not None:
            problem = self.allocator.reserve(cpuset.allocation)
            if problem is None:
                reservation = CpuReservation(self.allocator, cpuset.allocation, on_settled)
            else:  # cannot happen: decisions count reservations as held
                cpuset = dataclasses.replace(self.allocator.pool_for(QoSClass.LS), fallback=True,
                                             reason=f"{decision.qos_class.value}: {problem}")
        allocation = None
        if cpuset.exclusive:
            allocation = (cpuset.allocation or self.allocator.allocation_of(owner)
                          or self.allocator.reservation_of(owner))
        return CreateCpuset(cpuset, reservation, allocation)

    def _own(self, container_id: str, owner: str, sandbox_id: str) -> None:
        self.cpu_owner[container_id] = owner
        self._sandbox_of[container_id] = sandbox_id

    def containers_of(self, sandbox_id: str) -> list[str]:
        """The containers of a pod holding an allocation."""
        return [cid for cid, sid in self._sandbox_of.items() if sid == sandbox_id]

    def created(self, container_id: str | None, sandbox_id: str, owner: str, annotations: Mapping[str, str]) -> None:
        """After CreateContainer: the container owns the allocation its forwarded record names,
        or the CPUs go back (the call failed, or went on without the rewritten request)."""
        text = annotations.get(CPU_ALLOCATION_ANNOTATION)
        record = allocation_from_annotation(text)
        forwarded = record is not None and record[0] == owner
        if container_id:
            if forwarded and self.allocator.allocation_of(owner) is not None:
                self._own(container_id, owner, sandbox_id)
            fallback = fallback_from_annotation(text)
            if fallback is not None:
                self.fallback_reason[container_id] = fallback
        if (not container_id or not forwarded) and owner not in self.cpu_owner.values():
            self.allocator.release(owner)

    def drop(self, container_id: str) -> None:
        owner = self.cpu_owner.pop(container_id, None)
        self._sandbox_of.pop(container_id, None)
        self.reallocate.discard(container_id)
        self.fallback_reason.pop(container_id, None)
        if owner is not None and owner not in self.cpu_owner.values():
            self.allocator.release(owner)

    def cpuset_for(self, pod: PodRecord, pod_input: PodInput, decision: ClassDecision, container_id: str,
                   name: str, kubelet: ContainerResources) -> CpusetDecision | None:
        """A running container's cpuset; None: kubelet's cpuset stays (kubelet's static CPU
        manager owns the cpusets)."""
        if self.kubelet_cpus is not None:
            return None
        owner = self.cpu_owner.get(container_id)
        if owner is not None:
            allocation = self.allocator.allocation_of(owner)
            if allocation is not None:
                return self.allocator.allocate(owner, allocation.qos_class, len(allocation.cpus))
        if decision.qos_class in CPU_OWNING_CLASSES and container_id in self.reallocate:
            # Its recorded allocation was refused at restore (e.g. CPUs gone offline): ask again.
            cpuset = allocate_cpuset(self.allocator, pod_input, ContainerInput(name=name, resources=kubelet),
                                     decision.qos_class)
            if cpuset.allocation is not None and self.allocator.record(cpuset.allocation) is not None:
                cpuset = self.allocator.pool_for(QoSClass.LS)  # taken meanwhile: ask again next pass
            owner = owner_id(pod, name)
            if cpuset.exclusive and self.allocator.allocation_of(owner) is not None:
                self._own(container_id, owner, pod.sandbox_id)
                self.reallocate.discard(container_id)
            return cpuset
        if decision.qos_class in CPU_OWNING_CLASSES:
            # No allocation: it fell back at creation and stays a share-pool container (CPUs
            # are handed out at CreateContainer, never to a running container later).
            pool = self.allocator.pool_for(decision.qos_class)
            why = self.fallback_reason.get(container_id) or (
                f"{decision.qos_class.value}: no CPUs allocated at creation")
            return dataclasses.replace(pool, reason=f"{why}; now on: {pool.reason}")
        return self.be_override(decision.qos_class) or self.allocator.pool_for(decision.qos_class)

    def _pools_now(self) -> tuple[Any, ...]:
        """What a shared-pool container's cpuset follows: the pools and the QoS manager's BE cpuset."""
        return (self.allocator.share_pool(), self.allocator.be_pool(), self.be_cpus(),
                self.allocator.pool_for(QoSClass.SYSTEM).cpus)

    def refresh(self, view: NodeView, executor: CgroupExecutor, decide: Decide, driver: str,
                skip: Set[str] = frozenset(), *, if_moved: bool = False) -> list[WriteResult]:
        """Move running shared-pool containers to the pools as they are now (NRI mode: published
        as container updates). `skip`: containers whose cpuset was just written from their plan.
        `if_moved`: only when the pools moved since the last refresh that ended without a failed
        write (after every CreateContainer and removal, where an allocation may have changed; a
        container started since got its pool's cpuset from its own plan, and the reconcile pass
        refreshes whatever happens). Returns the results of the writes."""
        if self.kubelet_cpus is not None:
            return []  # kubelet's static CPU manager places every container: no pool here
        pools = self._pools_now()
        if if_moved and pools == self._refreshed_pools:
            return []
        writes = []
        moves: dict[str, str] = {}
        for c in view.containers.values():
            if c.state != CONTAINER_RUNNING or c.container_id in self.cpu_owner or c.container_id in skip:
                continue
            pod = view.pods.get(c.sandbox_id)
            if pod is None or skip_requested(pod.labels):
                continue
            decision = decide(pod)
            # LSE/LSR containers without an allocation (the fail-open fallback) share the pool
            # too, so they must leave cores handed out since; pool_for gives them the share pool.
            if self.be_override(decision.qos_class) is not None:
                continue  # the QoS manager owns BE cpusets while its cpuset policy runs
            pool = self.allocator.pool_for(decision.qos_class)
            if self.pool_updates is not None:
                moves[c.container_id] = pool.cpuset_cpus
                continue
            try:
                cgroup = container_cgroup_path(pod.cgroup_parent, c.container_id, driver)
            except UnsafePathError:
                continue
            writes.append(CgroupWrite(cgroup, "cpuset.cpus", pool.cpuset_cpus,
                                      f"{decision.qos_class.value} pool: {pool.reason}"))
        if moves and self.pool_updates is not None:  # moves are only made for NRI mode
            self.pool_updates.publish(moves)
        results = executor.apply(writes) if writes else []
        # A failed write is tried again by the next refresh, not only by the reconcile pass.
        self._refreshed_pools = None if any(r.status is WriteStatus.FAILED for r in results) else pools
        return results

    # ---- after a restart ------------------------------------------------------------------

    def adopt(self, view: NodeView, resized: ResizedResources, decide: Decide) -> None:
        """Restore CPU allocations from the allocator's own records (the annotation written at
        CreateContainer), never from cpusets found on containers."""
        self._kubelet_cpus_from_records(view, resized)
        for c in view.containers.values():
            if self.kubelet_cpus is not None:
                break  # kubelet owns the cpusets: no allocation of koordnode's to restore
            if c.state not in (CONTAINER_RUNNING, CONTAINER_CREATED) or c.container_id in self.cpu_owner:
                continue
            pod = view.pods.get(c.sandbox_id)
            if pod is None:
                continue
            text = c.annotations.get(CPU_ALLOCATION_ANNOTATION)
            fallback = fallback_from_annotation(text)
            if fallback is not None:
                self.fallback_reason[c.container_id] = fallback
            record = allocation_from_annotation(text)
            if record is None:
                continue  # never held CPUs (another class, or it fell back to the share pool)
            owner, qos_class, cpus = record
            if decide(pod).qos_class not in CPU_OWNING_CLASSES:
                continue  # its class changed (config): a pool container now
            result = self.allocator.restore(owner, qos_class, cpus)
            held = self.allocator.allocation_of(owner)
            if result.accepted or (held is not None and held.cpus == cpus):
                self._own(c.container_id, owner, c.sandbox_id)
            else:
                self.reallocate.add(c.container_id)
                log.warning("cpu_allocation_not_restored", detail="will allocate again",
                            container_id=c.container_id, reason=result.reason)

    # ---- who owns the cpusets -------------------------------------------------------------

    def kubelet_owns_cpus(self, why: str) -> bool:
        """kubelet's static CPU manager gave a container its cpuset: from now on kubelet owns
        them. Allocations koordnode held are dropped (their containers keep running where they
        are until kubelet moves them). True when this changed the owner (plans are made again)."""
        if self.kubelet_cpus is not None:
            return False
        self.kubelet_cpus = why
        log.warning("kubelet_owns_cpusets", detail="kubelet's static CPU manager sets cpusets: koordnode keeps"
                    " them and allocates no CPUs", evidence=why)
        for owner in list(self.allocator.allocations()):
            self.allocator.release(owner)
        self.cpu_owner.clear()
        self._sandbox_of.clear()
        self.reallocate.clear()
        return True

    def note_no_kubelet_cpuset(self, container: str) -> None:
        note = (f"container {container} was created without a cpuset from kubelet (a client other than"
                " kubelet, or kubelet's CPU manager policy changed): cpusets stay kubelet's until koordnode"
                " restarts")
        if note not in self._kubelet_cpus_notes:
            self._kubelet_cpus_notes = [*self._kubelet_cpus_notes[-4:], note]

    def _kubelet_cpus_from_records(self, view: NodeView, resized: ResizedResources) -> None:
        """At start: kubelet owns the cpusets when a live container's recorded kubelet values
        (our annotation from its CreateContainer, or kubelet's latest resize) hold a cpuset. The
        runtime's own view is not evidence: in proxy mode it holds koordnode's pool cpusets."""
        for c in view.containers.values():
            if c.state not in (CONTAINER_RUNNING, CONTAINER_CREATED):
                continue
            recorded = resized.get(c.container_id) or resources_from_annotation(
                c.annotations.get(KUBELET_RESOURCES_ANNOTATION))
            if recorded is not None and recorded.cpuset_cpus:
                pod = view.pods.get(c.sandbox_id)
                where = f"{pod.namespace}/{pod.name}/{c.name}" if pod is not None else c.container_id[:12]
                self.kubelet_owns_cpus(f"container {where} was created with kubelet's cpuset {recorded.cpuset_cpus}")
                return

    @staticmethod
    def kubelet_cpuset_note(decision: ClassDecision, kubelet: ContainerResources) -> str:
        cpus = kubelet.cpuset_cpus or "(none: the runtime's default)"
        if decision.qos_class not in CPU_OWNING_CLASSES:
            return f"cpuset {cpus}: kubelet's (static CPU manager)"
        if decision.kube_qos is KubeQoS.GUARANTEED and _whole_cpus(kubelet):
            return f"cpuset {cpus}: kubelet's exclusive CPUs (static CPU manager); koordnode allocates none"
        return (f"cpuset {cpus}: kubelet's shared pool, not exclusive: {decision.qos_class.value} gets exclusive"
                " CPUs from kubelet's static CPU manager only as a Guaranteed container with whole CPUs")

    def update_kubelet_view(self, view: NodeView, kubelet_resources: dict[str, ContainerResources],
                            decide: Decide) -> None:
        """While kubelet owns the cpusets: the cpusets it gave (from what it asked, as recorded),
        LSE/LSR containers by name, `exclusive` when no other container has any of their CPUs, and
        the CPUs of everyone else (kubelet's shared pool)."""
        if self.kubelet_cpus is None:
            return
        exclusive: dict[str, Any] = {}
        shared: set[int] = set()
        by_container: dict[str, frozenset[int]] = {}
        for cid, res in list(kubelet_resources.items()):
            c = view.containers.get(cid)
            pod = view.pods.get(c.sandbox_id) if c is not None else None
            if c is None or pod is None or c.state != CONTAINER_RUNNING or not res.cpuset_cpus:
                continue
            try:
                cpus = parse_cpu_list(res.cpuset_cpus)
            except ValueError:
                continue
            by_container[cid] = cpus
            decision = decide(pod)
            if decision.qos_class in CPU_OWNING_CLASSES:
                exclusive[cid] = (f"{pod.namespace}/{pod.name}/{c.name}", decision.qos_class.value, cpus)
            else:
                shared |= cpus
        lse_lsr = {}
        for cid, (name, cls, cpus) in exclusive.items():
            others = frozenset().union(*(v for k, v in by_container.items() if k != cid))
            lse_lsr[name] = {"class": cls, "cpus": sorted(cpus), "exclusive": not cpus & others}
        self.kubelet_cpu_view = {"lse_lsr_containers": lse_lsr, "others_run_on": sorted(shared)}

    # ---- status ---------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """CPU pools and allocations as containers really get them (reads only the allocator)."""
        if self.kubelet_cpus is not None:
            return {"owner": CPUS_OWNER_KUBELET, "evidence": self.kubelet_cpus,
                    "kubelet": dict(self.kubelet_cpu_view),
                    "notes": [KUBELET_CPUS_NOTE, *self._kubelet_owner_notes(), *self._kubelet_cpus_notes]}
        allocator = self.allocator
        share_pool, be_pool = allocator.share_pool(), allocator.be_pool()
        ls_runs_on = allocator.pool_for(QoSClass.LS).cpus
        be_runs_on = allocator.pool_for(QoSClass.BE).cpus
        notes = []
        if not share_pool:
            notes.append(f"the share pool is empty: LS and fallback containers run on CPUs"
                         f" {format_cpu_list(ls_runs_on)}, which are not exclusive any more")
        if not be_pool:
            notes.append(f"the BE pool is empty: BE containers run on CPUs {format_cpu_list(be_runs_on)}")
        allocations = {}
        held = {**{o: a for o, a in allocator.reservations().items()}, **allocator.allocations()}
        for owner, a in held.items():
            # LSR cores are shared with BE by design; LSE cores with nobody.
            shared_with = ls_runs_on | (be_runs_on if a.qos_class is QoSClass.LSE else frozenset())
            overlap = a.cpus & shared_with
            allocations[owner] = {"class": a.qos_class.value, "cpus": sorted(a.cpus),
                                  "exclusive": not overlap,
                                  **({"shared_cpus": sorted(overlap)} if overlap else {}),
                                  # held for a CreateContainer not forwarded yet
                                  **({"reserved": True} if allocator.allocation_of(owner) is None else {})}
        return {
            "owner": CPUS_OWNER_KOORDNODE,
            "share_pool": sorted(share_pool),
            "be_pool": sorted(be_pool),
            "reserved": sorted(allocator.reserved),
            "min_shared_cpus": allocator.min_shared_cpus,
            "ls_containers_run_on": sorted(ls_runs_on),
            "be_containers_run_on": sorted(be_runs_on),
            "allocations": allocations,
            "notes": notes,
        }

    def _kubelet_owner_notes(self) -> list[str]:
        """koordnode's own CPU settings that do not apply while kubelet owns the cpusets."""
        node = self.settings.node
        unused = [name for name, value in (("reserved_cpus", node.reserved_cpus), ("system_cpus", node.system_cpus))
                  if value]
        if not unused:
            return []
        return [f"[node] {' and '.join(unused)} not applied: kubelet places the containers (its"
                " reservedSystemCPUs keeps CPUs from pods)"]
