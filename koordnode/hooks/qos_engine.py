"""Applies the QoS policy to real pods: the glue between CRI calls, policy, allocator and executor.

Policy (policy/class_policy.py) is pure; this module owns the state that policy needs across calls
(CPU allocations, kubelet's original resources, what was applied and verified) and hands the
plans to the executor. Hook threads and the reconcile pass call it concurrently, so every entry
point takes one lock: plans and writes for a node are cheap, and serialising them keeps the
allocator and cgroup cpusets consistent.

Threads: the engine never changes NodeState. Each entry point reads one immutable NodeView
(taken by the event loop for the reconcile pass), and what the loop must record (the class of
each pod) is returned. What `koordnode status` shows is published as an immutable snapshot at
the end of each locked section, so the event loop reads it without ever waiting for the lock.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Set
from pathlib import Path
from typing import Any, NamedTuple

import structlog

from koordnode.config.components import EngineSettings
from koordnode.cri import api_pb2 as pb
from koordnode.executor.executor import CgroupExecutor, WriteResult, WriteStatus
from koordnode.executor.paths import CgroupVersion, UnsafePathError, container_cgroup_path, pod_cgroup_path
from koordnode.executor.core_sched import CoreScheduling
from koordnode.executor.process import ProcessExecutor, ProcessResult, oom_score_adj_floor
from koordnode.hooks.core_sched import keep_pod_cookie, node_status
from koordnode.policy.plan import CgroupWrite
from koordnode.model.cpu_topology import CpuTopology, TopologyError, read_cpu_topology
from koordnode.policy.cpuset import (
    Allocation,
    CpusetAllocator,
    CpusetDecision,
    allocator_from_config,
    cpuset_owner_id,
)
from koordnode.model.annotations import MAX_ANNOTATION_CHARS, parse_pod_annotations
from koordnode.model.be_group import (
    be_group_of, be_group_parent, in_be_group, systemd_group_of_kubepods, systemd_group_slice,
)
from koordnode.hooks.be_slices import MAX_STOPS_PER_PASS, SystemdBeGroup
from koordnode.hooks.chain import skip_requested
from koordnode.model.cpulist import format_cpu_list, parse_cpu_list
from koordnode.model.kernel import is_lowest_cpu_weight, shares_to_weight
from koordnode.policy.class_policy import (
    ContainerInput,
    ContainerPlan,
    ContainerResources,
    KernelFeatures,
    REPORTED_BY_RUNTIME,
    PodInput,
    PodResourcesPlan,
    allocate_cpuset,
    plan_container,
    plan_pod_cpu_weight,
    plan_pod_memory,
    plan_pod_resources,
    plan_pod_sandbox,
)
from koordnode.hooks.resized import ResizedResources
from koordnode.hooks.pool_updates import PoolUpdates
from koordnode.metrics import METRICS
from koordnode.policy.strategies.memory_qos import MEMORY_QOS_RESOURCES
from koordnode.model.qos_class import CPU_OWNING_CLASSES, ClassDecision, KubeQoS, QoSClass, resolve_qos_class
from koordnode.model.state import CONTAINER_CREATED, CONTAINER_RUNNING, POD_READY, NodeState, NodeView, PodRecord
from koordnode.model.pod_facts import PodFacts

log = structlog.get_logger("koordnode.qos")

# Container annotation carrying kubelet's own resources, so that after a koordnode restart the
# policy starts again from what kubelet asked, not from what koordnode made of it.
KUBELET_RESOURCES_ANNOTATION = "koordnode.io/kubelet-resources"
# Container annotation carrying the allocator's own record of an exclusive allocation
# ({"owner", "class", "cpus"}), written into the CreateContainer request the runtime stores.
# After a restart ownership is rebuilt from these records only: a cpuset found on a container
# (e.g. a fallback container's share-pool set) is never taken for an allocation.
CPU_ALLOCATION_ANNOTATION = "koordnode.io/cpu-allocation"
_MAX_ALLOCATION_RECORD_CHARS = 64 * 1024


def allocation_to_annotation(owner: str, qos_class: QoSClass, cpus: frozenset[int]) -> str:
    return json.dumps({"owner": owner, "class": qos_class.value, "cpus": format_cpu_list(cpus)},
                      sort_keys=True, separators=(",", ":"))


def fallback_to_annotation(reason: str) -> str:
    """The record of an LSE/LSR container that got no CPUs: why, for status after restarts."""
    return json.dumps({"fallback": reason[:1000]}, separators=(",", ":"))


def _allocation_doc(text: str | None) -> dict[str, Any] | None:
    if not text or not isinstance(text, str) or len(text) > _MAX_ALLOCATION_RECORD_CHARS:
        return None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def fallback_from_annotation(text: str | None) -> str | None:
    doc = _allocation_doc(text)
    reason = doc.get("fallback") if doc is not None else None
    return reason if isinstance(reason, str) else None


def allocation_from_annotation(text: str | None) -> tuple[str, QoSClass, frozenset[int]] | None:
    """(owner, class, CPUs) of our allocation record; None when absent or not what we write."""
    doc = _allocation_doc(text)
    if doc is None:
        return None
    try:
        owner, cls, cpus = doc["owner"], QoSClass(doc["class"]), parse_cpu_list(doc["cpus"])
    except (ValueError, TypeError, KeyError, RecursionError):
        return None
    if not isinstance(owner, str) or not owner or cls not in CPU_OWNING_CLASSES or not cpus:
        return None
    return owner, cls, cpus

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


# A pod cgroup in the BE group with no pod recorded is removed by the reconcile pass once older
# than this: RunPodSandbox creates it before koordnode records the pod.
BE_GROUP_SWEEP_AGE_S = 60.0

_RESOURCE_FIELDS = ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes", "oom_score_adj",
                    "cpuset_cpus", "cpuset_mems", "memory_swap_limit_in_bytes")


def resources_from_pb(res: pb.LinuxContainerResources) -> ContainerResources:
    return ContainerResources(
        **{f: getattr(res, f) for f in _RESOURCE_FIELDS}, unified=dict(res.unified)
    )


def resources_to_annotation(res: ContainerResources) -> str:
    doc = {f: getattr(res, f) for f in _RESOURCE_FIELDS if getattr(res, f)}
    if res.unified:
        doc["unified"] = dict(sorted(res.unified.items()))
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def resources_from_annotation(text: str | None) -> ContainerResources | None:
    """kubelet's resources from our annotation; None when absent or not what we wrote."""
    if not text or not isinstance(text, str) or len(text) > MAX_ANNOTATION_CHARS:
        return None
    try:
        doc = json.loads(text)
        unified = {str(k): str(v) for k, v in (doc.pop("unified", None) or {}).items()}
        values = {k: v for k, v in doc.items() if k in _RESOURCE_FIELDS}
        # The annotation can come back from the runtime written by someone else: a wrong type
        # here would only fail later, inside the policy.
        for k, v in values.items():
            wanted = str if k in ("cpuset_cpus", "cpuset_mems") else int
            if isinstance(v, bool) or not isinstance(v, wanted):
                return None
        return ContainerResources(**values, unified=unified)
    except (ValueError, TypeError, AttributeError, RecursionError):
        return None


def apply_overrides(target: pb.LinuxContainerResources, plan: ContainerPlan) -> None:
    cri = plan.cri
    for f in ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes", "oom_score_adj",
              "cpuset_cpus", "cpuset_mems"):
        value = getattr(cri, f)
        if value is not None:
            setattr(target, f, value)
    for key, value in cri.unified.items():
        target.unified[key] = value


def _oom_lines(results: Iterable[tuple[str, ProcessResult]]) -> dict[str, tuple[str, ...]]:
    """Status lines per container for its processes' oom_score_adj, one per outcome."""
    outcomes: dict[str, dict[str, list[int]]] = {}
    values: dict[str, int] = {}
    for cid, r in results:
        if r.status is WriteStatus.MISSING:
            continue  # exited meanwhile
        label = "restored" if r.overwritten else r.status.value
        if r.status is WriteStatus.FAILED:
            label = f"failed: {r.detail}"
        outcomes.setdefault(cid, {}).setdefault(label, []).append(r.write.pid)
        values[cid] = r.write.value
    return {cid: tuple(f"oom_score_adj={values[cid]} on {len(pids)} process(es)"
                       + (f" ({label})" if not label.startswith("failed") else
                          f", pid {','.join(map(str, pids[:5]))}: {label}")
                       for label, pids in sorted(by_label.items()))
            for cid, by_label in outcomes.items()}


def _summarise(results: Iterable[WriteResult]) -> tuple[list[str], list[str]]:
    applied, skipped = [], []
    for r in results:
        w = r.cgroup_write
        where = f"{w.resource}={w.value} on {w.cgroup}"
        if r.ok:
            applied.append(f"{where} ({r.status.value}{', ' + r.detail if r.detail else ''})")
        else:
            skipped.append(f"{where}: {r.status.value}: {r.detail}")
    return applied, skipped


@dataclasses.dataclass(frozen=True)
class Record:
    """What koordnode decided and applied for one pod or container, for `koordnode status`.

    Frozen: a published status snapshot holds these while workers make new ones."""

    qos_class: str = ""
    why: str = ""
    applied: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    verified_at: float | None = None
    # A pod's cpu.shares as koordnode keeps it (its containers' class weights summed; BE: BE's);
    # None: kubelet's (no running container yet, or an idle BE pod).
    pod_cpu_shares: int | None = None
    # A pod's core-scheduling state ("" when its class does not ask for it).
    core_sched: str = ""
    # A container's values kept on its processes (oom_score_adj), one line per outcome.
    processes: tuple[str, ...] = ()

    def with_results(self, results: list[WriteResult], notes: Iterable[str] = ()) -> Record:
        applied, skipped = _summarise(results)
        return dataclasses.replace(self, applied=tuple(applied), skipped=tuple(skipped),
                                   notes=tuple(dict.fromkeys(notes)), verified_at=time.time())

    def checked_at(self, when: float) -> Record:
        """The same record, verified again at `when` (the reconcile pass's cheap copy)."""
        record = object.__new__(Record)
        record.__dict__.update(self.__dict__)
        record.__dict__["verified_at"] = when
        return record

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PublishedStatus:
    """The engine's part of `koordnode status`, as of the end of its last locked section."""

    engine: Mapping[str, Any]
    pod_records: Mapping[str, Record]
    container_records: Mapping[str, Record]


class _PlanKey(NamedTuple):
    """Everything a pod's plan is made from, as the objects themselves (records and kubelet
    resources are replaced, never changed, so comparing two keys is mostly identity checks)."""

    pod: PodRecord
    pod_in: PodInput | None
    settings: Any
    features: KernelFeatures
    allocator: Any
    allocator_version: Any
    be_cpus: frozenset[int] | None
    pod_resources: Any
    containers: tuple[Any, ...]
    facts: PodFacts | None  # from the API server: a pod is planned again when they arrive or change


@dataclasses.dataclass
class _PodPlan:
    """One pod's plan as the last apply made it, with what it was made from (`key`; None: not
    to be reused): a pass whose inputs are the same objects reuses it instead of planning again."""

    key: _PlanKey | None
    decision: ClassDecision
    pod_cgroup: str
    notes: tuple[str, ...]
    writes: tuple[CgroupWrite, ...]  # without the BE group's cpu.idle (added per apply)
    group_write: CgroupWrite | None
    container_plans: dict[str, ContainerPlan]
    container_cgroups: dict[str, str]
    memory_writes: tuple[CgroupWrite, ...]  # what memory_plan() gives for this pod
    core_sched: bool = False  # its tasks share one core-scheduling cookie
    # (status, detail) of each result the records were last built from, then the containers'
    # oom_score_adj lines and the pod's core-scheduling state; None: build them again.
    signature: tuple[Any, ...] | None = None

    def made_for(self, pod: PodRecord, settings: Any) -> bool:
        """Whether this plan's decision and pod cgroup are those of `pod` under `settings`."""
        return self.key is not None and self.key.pod is pod and self.key.settings is settings


@dataclasses.dataclass
class _PassState:
    """What one reconcile pass shares between its pods."""

    containers: dict[str, list[Any]]  # sandbox id -> its containers, indexed once per pass
    be_cpus: frozenset[int] | None  # the QoS manager's BE cpuset, asked once per pass
    results: list[WriteResult] = dataclasses.field(default_factory=list)  # counted once at the end
    process_results: list[ProcessResult] = dataclasses.field(default_factory=list)  # likewise
    covered: set[str] = dataclasses.field(default_factory=set)  # containers whose cpuset a plan wrote
    be_groups: set[str] = dataclasses.field(default_factory=set)  # BE groups whose cpu.idle was checked
    now: float = dataclasses.field(default_factory=time.time)


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


class QoSEngine:
    """Takes the sections it reads as one EngineSettings (EngineSettings.of(config)), at start and
    on reload; `[cgroup] root`, `[procfs] root` and `[sysfs] root` are used at start only (the
    executors and the CPU topology stay until the restart)."""

    def __init__(self, settings: EngineSettings, state: NodeState, *, executor: CgroupExecutor | None = None,
                 topology: CpuTopology | None = None, resized: ResizedResources | None = None,
                 be_cpuset: Callable[[], frozenset[int] | None] | None = None,
                 pool_updates: PoolUpdates | None = None, core_sched: CoreScheduling | None = None) -> None:
        """`be_cpuset()`: the CPUs the QoS manager confines BE to (its cpuset policy), None: the BE pool.
        `pool_updates` (NRI mode): where pool moves of running containers go instead of their cgroups.
        `core_sched`: how cookies are given (tests give a fake kernel)."""
        self.state = state
        self.resized = resized if resized is not None else ResizedResources(None)
        self.lock = threading.RLock()
        self.executor = executor or CgroupExecutor(Path(settings.cgroup.root))
        # The containers' processes' oom_score_adj, which no cgroup file holds.
        self.processes = ProcessExecutor(settings.procfs.root, floor=oom_score_adj_floor())
        # Core-scheduling cookies of the pods of classes with core_sched.
        self.core_sched = core_sched if core_sched is not None else CoreScheduling()
        self.features = KernelFeatures(
            cgroup_version=self.executor.version.value, group_identity=self._has_group_identity()
        )
        self._group_identity_absent = False  # an existing pod cgroup had no cpu.bvt_warp_ns
        self.notes: list[str] = []
        if topology is None:
            try:
                topology = read_cpu_topology(settings.sysfs.root)
            except TopologyError as exc:
                raise RuntimeError(f"cannot read the CPU topology under {settings.sysfs.root}: {exc}") from exc
        self.topology = topology
        self._apply_settings(settings)
        # container id -> kubelet's resources, CPU owner id
        self.kubelet_resources: dict[str, ContainerResources] = {}
        self.cpu_owner: dict[str, str] = {}
        self.container_pod: dict[str, str] = {}  # container id -> sandbox id
        # sandbox id -> kubelet's pod-level resources from UpdatePodSandboxResources.
        self.pod_resources: dict[str, ContainerResources] = {}
        self._metric_names: dict[str, tuple[str, str]] = {}  # sandbox id -> (namespace, name)
        self.pod_records: dict[str, Record] = {}
        # While the QoS manager suppresses BE by cpuset, BE containers must start inside its set.
        self.be_cpuset_override: Callable[[], frozenset[int] | None] | None = be_cpuset
        # NRI mode: pool changes of running containers go to the runtime as container updates
        # (container id -> cpuset) instead of being written to their cgroups here.
        self.pool_updates = pool_updates
        # [kubernetes] pod_facts: a pod's facts from the API server by UID (None: CRI alone).
        self.pod_facts: Callable[[str], PodFacts | None] | None = None
        self.container_records: dict[str, Record] = {}
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
        self._kubelet_cpu_view: dict[str, Any] = {}
        self._published = PublishedStatus({}, {}, {})
        with self.lock:
            self._publish_status()
        self._be_groups: set[str] = set()  # cgroupfs BE groups seen, swept by the reconcile pass
        # sandbox id -> its last plan, reused while what it was made from stays the same.
        self._plans: dict[str, _PodPlan] = {}
        # systemd driver: the group slices, made idle through systemd off the CRI path.
        self.be_slices = SystemdBeGroup(self._be_group_gives_way)

    def _apply_settings(self, settings: EngineSettings, old: CpusetAllocator | None = None) -> None:
        """The sections in use; the allocations of `old` (the allocator before a reload) move over."""
        self.settings = settings
        self.mapping = settings.qos_mapping.as_mapping()
        allocator, notes = allocator_from_config(self.topology, settings.node)
        if old is not None:
            for owner, allocation in old.allocations().items():
                result = allocator.restore(owner, allocation.qos_class, allocation.cpus)
                if not result.accepted:
                    notes.append(f"allocation of {owner} dropped on reload: {result.reason}")
        self.allocator: CpusetAllocator = allocator
        self.notes = notes

    def reconfigure(self, settings: EngineSettings) -> None:
        """A reloaded configuration, applied to the next call and the next reconcile pass."""
        with self.lock:
            self._apply_settings(settings, old=self.allocator)
            self._plans.clear()
            self.executor.forget_unsupported()
            self._publish_status()

    def _probe_group_identity(self, cgroup: str) -> bool:
        # The file comes with the kernel (Anolis), not with the pod: once an existing pod
        # cgroup with the cpu controller lacks it, the reconcile passes stop probing every pod.
        if self._group_identity_absent:
            return False
        try:
            if self.executor.read(cgroup, "cpu.bvt_warp_ns") is not None:
                return True
            # Conclusive only where the cpu controller's own files are there (v2: enabled).
            self._group_identity_absent = self.executor.read(cgroup, "cpu.shares") is not None
        except Exception:
            pass
        return False

    def _has_group_identity(self) -> bool:
        # On cgroup v2 the root cgroup has no cpu.* files: look at the kubepods tiers too.
        for cgroup in ("/", "/kubepods", "/kubepods.slice"):
            try:
                if self.executor.read(cgroup, "cpu.bvt_warp_ns") is not None:
                    return True
            except Exception:
                continue
        return False

    # ---- inputs from CRI ------------------------------------------------------------------

    def classify(self, labels: Mapping[str, str], cgroup_parent: str) -> ClassDecision:
        return resolve_qos_class(labels, cgroup_parent, self.mapping)

    def _memory_requests(self, uid: str) -> Mapping[str, int] | None:
        """The API's memory requests of a pod's containers ([kubernetes] pod_facts); None: not known."""
        facts = self.pod_facts(uid) if self.pod_facts is not None and uid else None
        return facts.memory_requests if facts is not None else None

    def pod_input(self, cfg: pb.PodSandboxConfig) -> PodInput:
        return PodInput(uid=cfg.metadata.uid, name=cfg.metadata.name, namespace=cfg.metadata.namespace,
                        labels=dict(cfg.labels), annotations=dict(cfg.annotations),
                        cgroup_parent=cfg.linux.cgroup_parent,
                        memory_requests=self._memory_requests(cfg.metadata.uid))

    def pod_input_from_record(self, pod: PodRecord) -> PodInput:
        return PodInput(uid=pod.uid, name=pod.name, namespace=pod.namespace, labels=pod.labels,
                        annotations=pod.annotations, cgroup_parent=pod.cgroup_parent,
                        memory_requests=self._memory_requests(pod.uid))

    def _driver(self) -> str:
        return self.settings.cgroup.driver

    def _pod_cgroup(self, cgroup_parent: str) -> str:
        return pod_cgroup_path(cgroup_parent, self._driver())

    def _container_cgroup(self, cgroup_parent: str, container_id: str) -> str:
        return container_cgroup_path(cgroup_parent, container_id, self._driver())

    # ---- hook entry points ----------------------------------------------------------------

    def pod_sandbox_pre(self, cfg: pb.PodSandboxConfig) -> ClassDecision:
        # Parse (and cache) the pod's annotations here, in a hook thread: the event loop's
        # readers (the QoS manager's inventory) then find them parsed.
        parse_pod_annotations(dict(cfg.annotations))
        decision = self.classify(cfg.labels, cfg.linux.cgroup_parent)
        if decision.label_problem:
            log.warning("invalid_qos_class_label_ignored", pod=f"{cfg.metadata.namespace}/{cfg.metadata.name}",
                        problem=decision.label_problem, qos_class=decision.qos_class.value)
        return decision

    # ---- koordnode's BE group (model/be_group.py) ---------------------------------------------

    def place_be_pod(self, cfg: pb.PodSandboxConfig, decision: ClassDecision) -> str | None:
        """RunPodSandbox: move a BestEffort pod of class BE into the idle BE group by rewriting
        its cgroup parent. Returns the new parent, or None when the pod stays where kubelet
        put it (option off, not BestEffort, or the group could not be made idle: fail-open)."""
        if not self.settings.cgroup.be_idle_group or decision.qos_class is not QoSClass.BE:
            return None
        new_parent = be_group_parent(cfg.linux.cgroup_parent)
        if new_parent is None:
            return None
        if systemd_group_slice(new_parent) is not None and not self.settings.cgroup.be_idle_group_systemd:
            return None
        problem = self._ensure_be_group(new_parent)
        if problem is not None:
            log.warning("be_pod_not_moved_to_be_group",
                        detail="BE pod stays in kubelet's besteffort tier: the BE group is not idle",
                        pod=f"{cfg.metadata.namespace}/{cfg.metadata.name}", problem=problem)
            self.notes = list(dict.fromkeys([*self.notes, f"BE group unavailable: {problem}"]))
            return None
        cfg.linux.cgroup_parent = new_parent
        return new_parent

    def follow_sandbox_parent(self, req: pb.CreateContainerRequest) -> None:
        """CreateContainer: containerd takes the container's cgroup parent from the request's
        sandbox config, which kubelet fills with its own parent: point it where the sandbox is."""
        kubelet_parent = req.sandbox_config.linux.cgroup_parent
        pod = self.state.pods.get(req.pod_sandbox_id)
        if pod is not None:
            if in_be_group(pod.cgroup_parent) and pod.cgroup_parent != kubelet_parent:
                req.sandbox_config.linux.cgroup_parent = pod.cgroup_parent
            return
        # Not recorded (e.g. the state is being rebuilt): the pod cgroup on disk tells.
        moved = be_group_parent(kubelet_parent)
        if moved is None:
            return
        try:
            if self.executor.cgroup_exists(self._pod_cgroup(moved)):
                req.sandbox_config.linux.cgroup_parent = moved
        except UnsafePathError:
            return

    def _be_group_gives_way(self, group: str) -> bool:
        """The group yields to LS: idle, or the lowest weight (v1 cpu.shares 2, v2 cpu.weight 1),
        the state the QoS manager's cpu_suppress keeps it in while LS is quiet."""
        if self.executor.read(group, "cpu.idle") == "1":
            return True
        v2 = self.executor.version is CgroupVersion.V2
        return is_lowest_cpu_weight(self.executor.read(group, "cpu.shares"), v2) is True

    def _group_gives_way_safely(self, group: str) -> bool:
        try:
            return self._be_group_gives_way(group)
        except (OSError, UnsafePathError):
            return False

    def _ensure_be_group(self, pod_parent: str) -> str | None:
        """Make the BE group of a pod parent exist and give way (a new group is made idle; the
        QoS manager decides from there); the problem, or None."""
        try:
            group = be_group_of(self._pod_cgroup(pod_parent))
        except UnsafePathError as exc:
            return str(exc)
        if self.executor.dry_run:  # the request diff shows the move; nothing is created
            log.info("dry_run_would_make_be_group_idle", group=group)
            return None
        slice_name = systemd_group_slice(pod_parent)
        if slice_name is not None:
            # systemd owns the slice (and starts it with the pod's): it must know it is idle.
            # Half the hook's time bound at most: the call goes on without the move after that.
            wait_s = self.settings.proxy.hook_timeout_ms / 2000
            return self.be_slices.ready(slice_name, group, wait_s)
        try:
            self.executor.make_cgroup(group, "cpu")
        except (OSError, UnsafePathError) as exc:
            return f"cannot create {group}: {exc}"
        self._be_groups.add(group)
        if self._group_gives_way_safely(group):
            return None
        result = self.executor.apply([CgroupWrite(group, "cpu.idle", 1, "koordnode BE group")])[0]
        METRICS.record_writes([result])
        return None if result.ok else f"cpu.idle on {group}: {result.status.value}: {result.detail}"

    def remove_be_pod_cgroup(self, cgroup_parent: str, *, removed: bool = True) -> None:
        """After StopPodSandbox / RemovePodSandbox: kubelet removes its own pod cgroup, the one
        in the BE group is koordnode's to remove (runc never removes a parent).

        A systemd pod slice is stopped at RemovePodSandbox only (``removed``): after
        StopPodSandbox kubelet may start the pod's next sandbox at once, in the same slice (its
        name is the pod's uid), and stopping the slice then kills that sandbox too -- with the
        real kubelet in the VM lane a BE pod was recreated again and again that way. A slice
        left by a stop without a removal goes with the reconcile pass's sweep (empty, a minute old,
        no pod recorded in it)."""
        if not in_be_group(cgroup_parent):
            return
        if systemd_group_slice(cgroup_parent) is not None:
            if removed:
                self._stop_be_pod_slice(cgroup_parent)
            return
        try:
            pod_cgroup = self._pod_cgroup(cgroup_parent)
            problems = self.executor.remove_cgroup(pod_cgroup)
        except UnsafePathError as exc:
            problems = [str(exc)]
        if problems:
            log.info("be_pod_cgroup_not_removed_yet", cgroup_parent=cgroup_parent, problems=problems)

    def _stop_be_pod_slice(self, cgroup_parent: str) -> bool:
        """systemd keeps a pod slice it started for a scope after the scope is gone: stop it
        once empty (no scope left below it). True when a stop was requested."""
        if self.executor.dry_run:
            return False
        try:
            pod_cgroup = self._pod_cgroup(cgroup_parent)
            if not self.executor.cgroup_exists(pod_cgroup) or self.executor.child_cgroups(pod_cgroup) \
                    or self.executor.read_pids(pod_cgroup):
                return False
        except UnsafePathError:
            return False
        slice_name = cgroup_parent.strip("/").rsplit("/", 1)[-1]

        def still_unused() -> bool:
            """Checked again in the worker right before the stop: a sandbox started in the slice
            since (the pod's next one) keeps it."""
            if any(pod.state == POD_READY and pod.cgroup_parent.strip("/").rsplit("/", 1)[-1] == slice_name
                   for pod in self.state.view().pods.values()):
                return False
            try:
                return not (self.executor.child_cgroups(pod_cgroup) or self.executor.read_pids(pod_cgroup))
            except (OSError, UnsafePathError):
                return False

        self.be_slices.stop_pod_slice(slice_name, still_unused)
        return True

    def _systemd_be_groups(self, view: NodeView) -> dict[str, str]:
        """Group slice -> its cgroup, for the systemd driver: the one beside kubelet's tiers
        (from [qos_manager] kubepods_cgroup or the driver, once kubelet has made that slice)
        and those of recorded pods."""
        cg = self.settings.cgroup
        if not (cg.be_idle_group and cg.be_idle_group_systemd) or self.executor.dry_run:
            return {}
        groups: dict[str, str] = {}
        kubepods = self.settings.qos_manager.kubepods_cgroup
        if not kubepods and cg.driver != "cgroupfs" and (
                cg.driver == "systemd" or self.executor.cgroup_exists("/kubepods.slice")):
            kubepods = "/kubepods.slice"
        default = systemd_group_of_kubepods(kubepods) if cg.driver != "cgroupfs" else None
        # Only beside a kubepods slice kubelet made: starting the group would start its parents.
        if default is not None and self.executor.cgroup_exists(kubepods):
            groups[default[0]] = default[1]
        for pod in view.pods.values():
            slice_name = systemd_group_slice(pod.cgroup_parent)
            if slice_name is None:
                continue
            try:
                groups[slice_name] = be_group_of(self._pod_cgroup(pod.cgroup_parent))
            except UnsafePathError:
                continue
        return groups

    def pod_sandbox_started(self, sandbox_id: str, cfg: pb.PodSandboxConfig) -> None:
        view = self.state.view()
        with self.lock:
            self._apply_pod(view, sandbox_id, self.pod_input(cfg), force=False)
            self._publish_status()

    def container_create_pre(self, req: pb.CreateContainerRequest) -> ContainerPlan:
        """plan_create with the CPUs it reserved committed at once: for callers that forward
        the request as rewritten."""
        plan, reservation = self.plan_create(req)
        if reservation is not None:
            reservation.commit()
        return plan

    def plan_create(self, req: pb.CreateContainerRequest) -> tuple[ContainerPlan, CpuReservation | None]:
        """Rewrite the CreateContainer request in place; returns the plan for the record and the
        CPUs reserved for it (None if none). The caller commits the reservation where the
        rewritten request is kept and cancels it where it is dropped: the hook chain does
        (hooks/chain.py PreEffect), also for a hook that finishes after its timeout."""
        pod = self.pod_input(req.sandbox_config)
        decision = self.classify(pod.labels, pod.cgroup_parent)
        kubelet = resources_from_pb(req.config.linux.resources)
        container = ContainerInput(name=req.config.metadata.name, resources=kubelet)
        # Only koordnode writes its allocation record: a value kubelet passed on is dropped.
        req.config.annotations.pop(CPU_ALLOCATION_ANNOTATION, None)
        owner = self._owner_id(pod, container.name)
        reservation: CpuReservation | None = None
        with self.lock:
            if kubelet.cpuset_cpus:
                self._kubelet_owns_cpus(f"CreateContainer of {pod.namespace}/{pod.name}/{container.name}"
                                        f" carried kubelet's cpuset {kubelet.cpuset_cpus}")
            elif self.kubelet_cpus is not None:
                self._note_no_kubelet_cpuset(f"{pod.namespace}/{pod.name}/{container.name}")
            if self.kubelet_cpus is not None:
                # kubelet's cpuset stays in the request: no allocation, no pool.
                plan = plan_container(pod, container, decision=decision,
                                      config=self.settings.qos.for_class(decision.qos_class),
                                      features=self.features, cpuset=None, node=self.settings.node)
                plan = dataclasses.replace(plan, notes=(*plan.notes, self._kubelet_cpuset_note(
                    decision, kubelet)))
                self._publish_status()
                self._rewrite_create(req, plan, kubelet, owner, None, None, pod, container)
                return plan, None
            cpuset = self._be_override(decision.qos_class) or allocate_cpuset(
                self.allocator, pod, container, decision.qos_class)
            if cpuset.allocation is not None:
                problem = self.allocator.reserve(cpuset.allocation)
                if problem is None:
                    reservation = CpuReservation(self.allocator, cpuset.allocation, self._republish_cpus)
                else:  # cannot happen: decisions count reservations as held
                    cpuset = dataclasses.replace(self.allocator.pool_for(QoSClass.LS), fallback=True,
                                                 reason=f"{decision.qos_class.value}: {problem}")
            plan = plan_container(pod, container, decision=decision, config=self.settings.qos.for_class(decision.qos_class),
                                  features=self.features, cpuset=cpuset, node=self.settings.node)
            allocation = None
            if cpuset.exclusive:
                allocation = (cpuset.allocation or self.allocator.allocation_of(owner)
                              or self.allocator.reservation_of(owner))
            self._publish_status()
        try:
            self._rewrite_create(req, plan, kubelet, owner, allocation, cpuset, pod, container)
        except BaseException:
            if reservation is not None:
                reservation.release()  # the hook fails: nothing of it may stay
            raise
        return plan, reservation

    def _rewrite_create(self, req: pb.CreateContainerRequest, plan: ContainerPlan, kubelet: ContainerResources,
                        owner: str, allocation: Any, cpuset: Any, pod: PodInput, container: ContainerInput) -> None:
        apply_overrides(req.config.linux.resources, plan)
        req.config.annotations[KUBELET_RESOURCES_ANNOTATION] = resources_to_annotation(kubelet)
        if allocation is not None:
            req.config.annotations[CPU_ALLOCATION_ANNOTATION] = allocation_to_annotation(
                owner, allocation.qos_class, allocation.cpus)
        elif cpuset is not None and cpuset.fallback:
            req.config.annotations[CPU_ALLOCATION_ANNOTATION] = fallback_to_annotation(cpuset.reason)
        if cpuset is not None and cpuset.fallback:
            log.warning("not_enough_free_cpus", detail="container runs on the shared pool",
                        pod=f"{pod.namespace}/{pod.name}", container=container.name, reason=cpuset.reason)

    @staticmethod
    def _owner_id(pod: PodInput | PodRecord, container_name: str) -> str:
        return cpuset_owner_id(pod.uid, container_name,
                               parse_pod_annotations(pod.annotations).has_scheduler_cpuset)

    def container_created(self, req: pb.CreateContainerRequest, container_id: str | None) -> None:
        """After CreateContainer: remember the container, or undo the allocation if the call
        failed or went on without it (a Pre hook that failed or timed out has its request
        changes dropped: then the runtime never saw the CPUs, and they go back)."""
        pod = self.pod_input(req.sandbox_config)
        owner = self._owner_id(pod, req.config.metadata.name)
        record = allocation_from_annotation(req.config.annotations.get(CPU_ALLOCATION_ANNOTATION))
        forwarded = record is not None and record[0] == owner
        view = self.state.view()
        with self.lock:
            if container_id:
                self.container_pod[container_id] = req.pod_sandbox_id
                self.kubelet_resources[container_id] = resources_from_annotation(
                    req.config.annotations.get(KUBELET_RESOURCES_ANNOTATION)) or resources_from_pb(
                    req.config.linux.resources)
                if forwarded and self.allocator.allocation_of(owner) is not None:
                    self.cpu_owner[container_id] = owner
                fallback = fallback_from_annotation(req.config.annotations.get(CPU_ALLOCATION_ANNOTATION))
                if fallback is not None:
                    self.fallback_reason[container_id] = fallback
            if (not container_id or not forwarded) and owner not in self.cpu_owner.values():
                self.allocator.release(owner)
            self._refresh_pools(view)
            self._publish_status()

    def container_started(self, container_id: str) -> None:
        view = self.state.view()
        with self.lock:
            pod = view.pod_of_container(container_id)
            if pod is None:
                return
            self._apply_pod(view, pod.sandbox_id, None, force=False)
            self._publish_status()

    def container_updated(self, container_id: str) -> None:
        """After UpdateContainerResources (NRI: PostUpdateContainer): the runtime has written
        kubelet's values of the fields it reports back (REPORTED_BY_RUNTIME) to the container's
        cgroup; the class values go back there, and that rewrite is not counted as an overwrite."""
        self.containers_updated((container_id,))

    def containers_updated(self, container_ids: Iterable[str]) -> None:
        """container_updated for several containers (NRI: the runtime applied container updates,
        e.g. pool moves, which rewrite every resource of the container's spec to its cgroup)."""
        view = self.state.view()
        by_pod: dict[str, set[str]] = {}
        for cid in container_ids:
            pod = view.pod_of_container(cid)
            if pod is not None:
                by_pod.setdefault(pod.sandbox_id, set()).add(cid)
        if not by_pod:
            return
        with self.lock:
            for sandbox_id, cids in by_pod.items():
                self._apply_pod(view, sandbox_id, None, force=False, runtime_rewrote=frozenset(cids))
            self._publish_status()

    def update_resources_pre(self, req: pb.UpdateContainerResourcesRequest) -> None:
        view = self.state.view()
        container = view.containers.get(req.container_id)
        pod = view.pod_of_container(req.container_id)
        if container is None or pod is None or not req.HasField("linux"):
            return
        with self.lock:
            kubelet = resources_from_pb(req.linux)
            if kubelet_cpuset_only(kubelet):
                # kubelet's CPU manager moves the container: only its cpuset changes; the rest of
                # kubelet's values are what it asked before (planning from the zeros of this
                # partial request would give LSE the minimum cpu.shares).
                self._kubelet_owns_cpus(f"UpdateContainerResources of {pod.namespace}/{pod.name}/"
                                        f"{container.name} carried only kubelet's cpuset {kubelet.cpuset_cpus}")
                before = self._kubelet_resources(view, req.container_id)
                kubelet = dataclasses.replace(before, cpuset_cpus=kubelet.cpuset_cpus,
                                              cpuset_mems=kubelet.cpuset_mems or before.cpuset_mems)
            self.kubelet_resources[req.container_id] = kubelet
            # Survives a koordnode restart, unlike the annotation set at CreateContainer.
            self.resized.put(req.container_id, kubelet)
            plan = self._plan(pod, container.name, req.container_id, kubelet, with_cgroup=False)
            self._publish_status()
        apply_overrides(req.linux, plan)

    def pod_resources_pre(self, req: pb.UpdatePodSandboxResourcesRequest) -> None:
        """In-place pod-level resize: the class's values replace kubelet's in the request."""
        pod = self.state.pods.get(req.pod_sandbox_id)
        if pod is None or not req.HasField("resources"):
            return
        kubelet = resources_from_pb(req.resources)
        with self.lock:
            self.pod_resources[req.pod_sandbox_id] = kubelet
            plan = self._pod_resources_plan(pod, kubelet)
        if plan is None:
            return
        if plan.cri.cpu_shares is not None:
            req.resources.cpu_shares = plan.cri.cpu_shares
        for key, value in plan.cri.unified.items():
            req.resources.unified[key] = value

    def pod_resources_updated(self, sandbox_id: str) -> None:
        """After UpdatePodSandboxResources: apply the pod's recomputed values to its cgroup."""
        view = self.state.view()
        with self.lock:
            pod = view.pods.get(sandbox_id)
            if pod is not None:
                self._apply_pod(view, sandbox_id, None, force=False)
                self._publish_status()

    def _pod_resources_plan(self, pod: PodRecord, kubelet: ContainerResources) -> PodResourcesPlan | None:
        try:
            pod_cgroup = self._pod_cgroup(pod.cgroup_parent)
        except UnsafePathError:
            return None
        decision = self._decision(pod)
        return plan_pod_resources(self.pod_input_from_record(pod), kubelet, decision=decision,
                                  config=self.settings.qos.for_class(decision.qos_class), features=self.features,
                                  pod_cgroup=pod_cgroup)

    def container_gone(self, container_id: str) -> None:
        view = self.state.view()
        with self.lock:
            self._drop_container(container_id)
            self._refresh_pools(view)
            self._publish_status()

    def pod_gone(self, sandbox_id: str, removed: bool) -> None:
        view = self.state.view()
        with self.lock:
            for cid in [c for c, s in self.container_pod.items() if s == sandbox_id]:
                self._drop_container(cid)
            self._plans.pop(sandbox_id, None)
            if removed:
                self.pod_records.pop(sandbox_id, None)
                self.pod_resources.pop(sandbox_id, None)
                names = self._metric_names.pop(sandbox_id, None)
                if names is not None:
                    METRICS.drop_pod(*names)
            self._refresh_pools(view)
            self._publish_status()

    def _drop_container(self, container_id: str) -> None:
        owner = self.cpu_owner.pop(container_id, None)
        self.container_pod.pop(container_id, None)
        self.kubelet_resources.pop(container_id, None)
        self.container_records.pop(container_id, None)
        self.reallocate.discard(container_id)
        self.fallback_reason.pop(container_id, None)
        self.resized.drop(container_id)
        if owner is not None and owner not in self.cpu_owner.values():
            self.allocator.release(owner)

    # ---- planning and applying ------------------------------------------------------------

    def _decision(self, pod: PodRecord) -> ClassDecision:
        return self.classify(pod.labels, pod.cgroup_parent)

    def _cpuset_for(self, pod: PodRecord, decision: ClassDecision, container_id: str, name: str,
                    kubelet: ContainerResources) -> CpusetDecision | None:
        """None: kubelet's cpuset stays (kubelet's static CPU manager owns the cpusets)."""
        if self.kubelet_cpus is not None:
            return None
        owner = self.cpu_owner.get(container_id)
        if owner is not None:
            allocation = self.allocator.allocation_of(owner)
            if allocation is not None:
                return self.allocator.allocate(owner, allocation.qos_class, len(allocation.cpus))
        if decision.qos_class in CPU_OWNING_CLASSES and container_id in self.reallocate:
            # Its recorded allocation was refused at restore (e.g. CPUs gone offline): ask again.
            cpuset = allocate_cpuset(self.allocator, self.pod_input_from_record(pod),
                                     ContainerInput(name=name, resources=kubelet), decision.qos_class)
            if cpuset.allocation is not None and self.allocator.record(cpuset.allocation) is not None:
                cpuset = self.allocator.pool_for(QoSClass.LS)  # taken meanwhile: ask again next pass
            owner = self._owner_id(pod, name)
            if cpuset.exclusive and self.allocator.allocation_of(owner) is not None:
                self.cpu_owner[container_id] = owner
                self.container_pod[container_id] = pod.sandbox_id
                self.reallocate.discard(container_id)
            return cpuset
        if decision.qos_class in CPU_OWNING_CLASSES:
            # No allocation: it fell back at creation and stays a share-pool container (CPUs
            # are handed out at CreateContainer, never to a running container later).
            pool = self.allocator.pool_for(decision.qos_class)
            why = self.fallback_reason.get(container_id) or (
                f"{decision.qos_class.value}: no CPUs allocated at creation")
            return dataclasses.replace(pool, reason=f"{why}; now on: {pool.reason}")
        return self._be_override(decision.qos_class) or self.allocator.pool_for(decision.qos_class)

    def _plan(self, pod: PodRecord, name: str, container_id: str, kubelet: ContainerResources,
              with_cgroup: bool = True) -> ContainerPlan:
        decision = self._decision(pod)
        cpuset = self._cpuset_for(pod, decision, container_id, name, kubelet)
        cgroup = self._container_cgroup(pod.cgroup_parent, container_id) if with_cgroup else None
        plan = plan_container(self.pod_input_from_record(pod), ContainerInput(name=name, resources=kubelet, id=container_id),
                              decision=decision, config=self.settings.qos.for_class(decision.qos_class),
                              features=self.features, cpuset=cpuset, node=self.settings.node,
                              container_cgroup=cgroup)
        if cpuset is None:
            plan = dataclasses.replace(plan, notes=(*plan.notes, self._kubelet_cpuset_note(decision, kubelet)))
        return plan

    def _kubelet_resources(self, view: NodeView, container_id: str) -> ContainerResources:
        known = self.kubelet_resources.get(container_id)
        if known is not None:
            return known
        c = view.containers.get(container_id)
        if c is None:
            return ContainerResources()
        # Recovered after a restart: kubelet's values of its latest resize, else those of
        # CreateContainer, which travel in our annotation.
        restored = self.resized.get(container_id) or resources_from_annotation(
            c.annotations.get(KUBELET_RESOURCES_ANNOTATION))
        if restored is None:
            restored = resources_from_pb(c.resources)
        self.kubelet_resources[container_id] = restored
        return restored

    def _plan_key(self, pod: PodRecord, pod_in: PodInput | None, running: list[Any],
                  be_cpus: frozenset[int] | None) -> _PlanKey | None:
        """What a pod's plan is made from; None: plan every time (a container still asking for
        CPUs changes the allocator)."""
        containers = self._containers_key(running)
        if containers is None:
            return None
        allocator = self.allocator
        return _PlanKey(pod, pod_in, self.settings, self.features, allocator, allocator.version, be_cpus,
                        self.pod_resources.get(pod.sandbox_id), containers, self._facts_of(pod.uid))

    def _facts_of(self, uid: str) -> PodFacts | None:
        return self.pod_facts(uid) if self.pod_facts is not None and uid else None

    def _containers_key(self, running: list[Any]) -> tuple[Any, ...] | None:
        parts = []
        for c in running:
            cid = c.container_id
            if cid in self.reallocate:
                return None
            parts.append((c, self.kubelet_resources.get(cid), self.cpu_owner.get(cid),
                          self.fallback_reason.get(cid)))
        return tuple(parts)

    def _memory_writes_current(self, entry: _PodPlan | None, pod: PodRecord, running: list[Any]) -> bool:
        """Whether a pod's last plan still holds for its memory values (the parts of its key
        they depend on; the CPU pools do not change them)."""
        if entry is None:
            return False
        key = entry.key
        return (key is not None and key.pod is pod and key.pod_in is None and key.settings is self.settings
                and key.features == self.features and key.pod_resources is self.pod_resources.get(pod.sandbox_id)
                and key.containers == self._containers_key(running) and key.facts is self._facts_of(pod.uid))

    def _be_cpus(self) -> frozenset[int] | None:
        cpus = self.be_cpuset_override() if self.be_cpuset_override is not None else None
        return frozenset(cpus) if cpus else None

    def _apply_pod(self, view: NodeView, sandbox_id: str, pod_in: PodInput | None, *,
                   force: bool, pass_state: _PassState | None = None,
                   runtime_rewrote: Set[str] = frozenset()) -> ClassDecision | None:
        """Pod-level and container-level writes of one pod (its running containers); returns
        the class decision for the loop to record (None when the pod is unknown or skipped).
        `pod_in`: the pod as a CRI call describes it; None: as recorded. `pass_state`: the
        reconcile pass this is part of (None: a single call from a hook). `runtime_rewrote`:
        containers whose REPORTED_BY_RUNTIME files the runtime has just rewritten."""
        pod = view.pods.get(sandbox_id)
        if pod is None or skip_requested(pod.labels):
            self._plans.pop(sandbox_id, None)
            return None  # skipped pods are left alone, also by the reconcile pass after a restart
        cached = self._plans.get(sandbox_id)
        if cached is not None and cached.made_for(pod, self.settings):
            decision, pod_cgroup = cached.decision, cached.pod_cgroup
        else:
            decision = self._decision(pod)
            try:
                pod_cgroup = self._pod_cgroup(pod.cgroup_parent)
            except UnsafePathError as exc:
                self._plans.pop(sandbox_id, None)
                self.pod_records[sandbox_id] = dataclasses.replace(
                    self.pod_records.get(sandbox_id, Record()), qos_class=decision.qos_class.value,
                    why=decision.why, skipped=(f"cgroup parent {pod.cgroup_parent!r} refused: {exc}",))
                log.warning("unsafe_cgroup_parent_refused", sandbox_id=sandbox_id, error=str(exc))
                return decision
        if not self.features.group_identity and self._probe_group_identity(pod_cgroup):
            self.features = KernelFeatures(cgroup_version=self.features.cgroup_version, group_identity=True)
            log.info("group_identity_kernel_detected", detail="BE pods get cpu.bvt_warp_ns instead of cpu.idle")
        if pass_state is not None:
            containers = pass_state.containers.get(sandbox_id, [])
            be_cpus = pass_state.be_cpus
        else:
            containers = view.containers_of(sandbox_id)
            be_cpus = self._be_cpus()
        running = [c for c in containers if c.state == CONTAINER_RUNNING]
        for c in running:
            self._kubelet_resources(view, c.container_id)  # known before the key is taken
        key = self._plan_key(pod, pod_in, running, be_cpus)
        reused = False
        if cached is not None and key is not None and cached.key == key:
            entry, reused = cached, True
        else:
            entry = self._make_plan(view, pod, pod_in, running, decision, pod_cgroup, key)
            if key is not None:
                self._plans[sandbox_id] = entry
            else:
                self._plans.pop(sandbox_id, None)
        writes = entry.writes
        group_write = entry.group_write
        if group_write is not None and pass_state is not None:
            if group_write.cgroup in pass_state.be_groups:
                group_write = None  # checked already in this pass (the group is shared by all BE pods)
            else:
                pass_state.be_groups.add(group_write.cgroup)
        if group_write is not None and self._group_gives_way_safely(group_write.cgroup):
            group_write = None  # idle, or the lowest weight cpu_suppress keeps while LS is quiet
        if group_write is not None:
            writes = (group_write, *writes)
        if runtime_rewrote:
            self.executor.disown(w for cid in runtime_rewrote if cid in entry.container_plans
                                 for w in entry.container_plans[cid].writes if w.resource in REPORTED_BY_RUNTIME)
        results = self.executor.apply(writes, force=force)
        oom_results = self._keep_oom_score_adj(entry)
        core_line = self._keep_core_sched(entry)
        if pass_state is not None:
            pass_state.results.extend(results)
            pass_state.process_results.extend(result for _, result in oom_results)
            pass_state.covered.update(entry.container_plans)
        else:
            METRICS.record_writes(results)
            METRICS.record_writes(result for _, result in oom_results)
        own = results[1:] if group_write is not None else results
        oom_lines = _oom_lines(oom_results)
        signature = (*((r.status, r.detail) for r in own), *sorted(oom_lines.items()), core_line)
        failed = [r for r in results if r.status in (WriteStatus.FAILED, WriteStatus.REFUSED)]
        if (reused and not failed and signature == entry.signature and sandbox_id in self.pod_records
                and all(cid in self.container_records for cid in entry.container_plans)):
            # Nothing changed since the records were built: they only get the time of this check.
            now = pass_state.now if pass_state is not None else time.time()
            self.pod_records[sandbox_id] = self.pod_records[sandbox_id].checked_at(now)
            for cid in entry.container_plans:
                self.container_records[cid] = self.container_records[cid].checked_at(now)
            return decision
        entry.signature = signature
        self._publish_metrics(pod, containers, decision.qos_class.value, pod_cgroup, results, entry)
        by_cgroup: dict[str, list[WriteResult]] = {}
        for r in results:
            by_cgroup.setdefault(r.cgroup_write.cgroup, []).append(r)
        pod_results = by_cgroup.get(pod_cgroup, [])
        shares = next((r.cgroup_write.value for r in pod_results
                       if r.cgroup_write.resource == "cpu.shares" and r.ok), None)
        record = dataclasses.replace(self.pod_records.get(sandbox_id, Record()),
                                     qos_class=decision.qos_class.value, why=decision.why,
                                     pod_cpu_shares=shares if isinstance(shares, int) else None,
                                     core_sched=core_line)
        self.pod_records[sandbox_id] = record.with_results(pod_results, entry.notes)
        for cid, plan in entry.container_plans.items():
            crec = dataclasses.replace(self.container_records.get(cid, Record()), qos_class=plan.qos_class.value)
            crec = crec.with_results(by_cgroup.get(entry.container_cgroups[cid], []), plan.notes)
            self.container_records[cid] = dataclasses.replace(crec, processes=oom_lines.get(cid, ()))
        if failed:
            log.warning("cgroup_writes_failed", sandbox_id=sandbox_id,
                        failures=[f"{r.cgroup_write.resource} {r.cgroup_write.cgroup}: {r.detail}" for r in failed])
        return decision

    def _keep_oom_score_adj(self, entry: _PodPlan) -> list[tuple[str, ProcessResult]]:
        """Every process of the pod's running containers at its class's oom_score_adj (a
        container created while the hook timed out runs with kubelet's). (container id, result)
        per process."""
        self.processes.dry_run = self.executor.dry_run
        results: list[tuple[str, ProcessResult]] = []
        for cid, plan in entry.container_plans.items():
            value = plan.cri.oom_score_adj
            if value is None:
                continue
            try:
                pids = self.executor.read_pids(entry.container_cgroups[cid])
            except (OSError, UnsafePathError):
                continue
            reason = f"{plan.qos_class.value}: class oom_score_adj {value}"
            results.extend((cid, r) for r in self.processes.keep_oom_score_adj(pids or [], value, reason))
        return results

    def _keep_core_sched(self, entry: _PodPlan) -> str:
        """The pod's processes at its class's core-scheduling cookie (koordnode/hooks/core_sched.py);
        the pod's state for status, "" when its class asks for none."""
        def pids() -> list[int]:
            found: list[int] = []
            for cgroup in entry.container_cgroups.values():
                try:
                    found += self.executor.read_pids(cgroup) or []
                except (OSError, UnsafePathError):
                    continue
            return found

        self.core_sched.dry_run = self.executor.dry_run
        return keep_pod_cookie(self.core_sched, self.settings.qos, entry.decision.qos_class, pids, entry.pod_cgroup)

    def _make_plan(self, view: NodeView, pod: PodRecord, pod_in: PodInput | None, running: list[Any],
                   decision: ClassDecision, pod_cgroup: str, key: _PlanKey | None) -> _PodPlan:
        """Plan one pod: its pod cgroup, its running containers and its memory protection."""
        pod_input = pod_in if pod_in is not None else self.pod_input_from_record(pod)
        pod_plan = plan_pod_sandbox(pod_input, decision=decision,
                                    config=self.settings.qos.for_class(decision.qos_class),
                                    features=self.features, pod_cgroup=pod_cgroup, node=self.settings.node)
        writes: list[CgroupWrite] = list(pod_plan.writes)
        group_write = None
        if in_be_group(pod.cgroup_parent):
            # Re-asserted by every reconcile unless the group gives way (idle, or the lowest
            # weight the QoS manager keeps while LS is quiet): that is what protects LS.
            group_write = CgroupWrite(be_group_of(pod_cgroup), "cpu.idle", 1, "koordnode BE group")
            if systemd_group_slice(pod.cgroup_parent) is not None:
                # systemd rewrites a pod slice's cpu.idle from its CPUWeight whenever it realizes
                # the slice (each container start): the group's idleness is what protects LS.
                writes = [w for w in writes if not (w.cgroup == pod_cgroup and w.resource == "cpu.idle")]
        container_plans: dict[str, ContainerPlan] = {}
        container_cgroups: dict[str, str] = {}
        memories = []
        memory_writes: list[CgroupWrite] = []
        for c in running:
            try:
                plan = self._plan(pod, c.name, c.container_id, self._kubelet_resources(view, c.container_id))
                cgroup = self._container_cgroup(pod.cgroup_parent, c.container_id)
            except UnsafePathError:
                continue
            writes.extend(plan.cri_mirror)
            writes.extend(plan.writes)
            memory_writes.extend(plan.cri_mirror)
            memory_writes.extend(plan.writes)
            container_plans[c.container_id] = plan
            container_cgroups[c.container_id] = cgroup
            memories.append(plan.memory)
        pod_level = self.pod_resources.get(pod.sandbox_id)
        resized = self._pod_resources_plan(pod, pod_level) if pod_level is not None else None
        # Pod-level resources (in-place pod resize) decide the pod cgroup's values, its weight too.
        pod_memory = resized.writes if resized is not None else plan_pod_memory(pod_cgroup, decision.qos_class, memories)
        if resized is None and self.settings.cgroup.pod_class_weight:
            writes.extend(plan_pod_cpu_weight(pod_cgroup, decision.qos_class,
                                              [p.cpu_shares for p in container_plans.values()
                                               if p.cpu_shares is not None]))
        writes.extend(pod_memory)
        memory_writes.extend(pod_memory)
        return _PodPlan(key, decision, pod_cgroup, tuple(pod_plan.notes),
                        tuple(writes), group_write, container_plans, container_cgroups,
                        tuple(w for w in memory_writes if w.resource in MEMORY_QOS_RESOURCES),
                        core_sched=pod_plan.core_sched)

    def _publish_metrics(self, pod: PodRecord, containers: list[Any], cls: str, pod_cgroup: str,
                         results: list[WriteResult], entry: _PodPlan) -> None:
        self._metric_names[pod.sandbox_id] = (pod.namespace, pod.name)
        names = {c.container_id: c.name for c in containers}
        applied: dict[str, dict[str, Any]] = {}
        for r in results:
            if r.ok:
                applied.setdefault(r.cgroup_write.cgroup, {})[r.cgroup_write.resource] = r.write.value
        METRICS.set_applied(pod.namespace, pod.name, "", cls, applied.get(pod_cgroup, {}))
        for cid, plan in entry.container_plans.items():
            values = dict(applied.get(entry.container_cgroups[cid], {}))
            if plan.cri.oom_score_adj is not None:
                values["oom_score_adj"] = plan.cri.oom_score_adj
            METRICS.set_applied(pod.namespace, pod.name, names.get(cid, cid[:12]), cls, values)

    def _be_override(self, qos_class: QoSClass) -> CpusetDecision | None:
        if qos_class is not QoSClass.BE or self.be_cpuset_override is None:
            return None
        cpus = self.be_cpuset_override()
        if not cpus:
            return None
        return CpusetDecision(cpus=frozenset(cpus), exclusive=False, fallback=False,
                              reason="BE cpuset set by the cpu_suppress strategy (policy cpuset)")

    def _refresh_pools(self, view: NodeView, skip: Set[str] = frozenset(),
                       results: list[WriteResult] | None = None) -> None:
        """After an allocation changed: move running shared-pool containers to the new pools.
        `skip`: containers whose cpuset was just written from their plan. `results`: where the
        results go to be counted (default: counted here)."""
        if self.kubelet_cpus is not None:
            return  # kubelet's static CPU manager places every container: no pool here
        writes = []
        moves: dict[str, str] = {}
        for c in view.containers.values():
            if c.state != CONTAINER_RUNNING or c.container_id in self.cpu_owner or c.container_id in skip:
                continue
            pod = view.pods.get(c.sandbox_id)
            if pod is None or skip_requested(pod.labels):
                continue
            decision = self._decision(pod)
            # LSE/LSR containers without an allocation (the fail-open fallback) share the pool
            # too, so they must leave cores handed out since; pool_for gives them the share pool.
            if self._be_override(decision.qos_class) is not None:
                continue  # the QoS manager owns BE cpusets while its cpuset policy runs
            pool = self.allocator.pool_for(decision.qos_class)
            if self.pool_updates is not None:
                moves[c.container_id] = pool.cpuset_cpus
                continue
            try:
                cgroup = self._container_cgroup(pod.cgroup_parent, c.container_id)
            except UnsafePathError:
                continue
            writes.append(CgroupWrite(cgroup, "cpuset.cpus", pool.cpuset_cpus, f"{decision.qos_class.value} pool: {pool.reason}"))
        if moves and self.pool_updates is not None:  # moves are only made for NRI mode
            self.pool_updates.publish(moves)
        if writes:
            applied = self.executor.apply(writes)
            if results is not None:
                results.extend(applied)
            else:
                METRICS.record_writes(applied)
            for r in applied:
                self._note_pool_result(r)

    def _note_pool_result(self, result: WriteResult) -> None:
        """Keep the container's status line for its cpuset current after a pool change."""
        if result.status is not WriteStatus.UNCHANGED:
            for entry in self._plans.values():
                entry.signature = None  # records changed here: the next apply builds them again
        self._note_pool_line(result)

    def _note_pool_line(self, result: WriteResult) -> None:
        cid = result.cgroup_write.cgroup.rsplit("/", 1)[-1].removeprefix("cri-containerd-").removesuffix(".scope")
        record = self.container_records.get(cid)
        if record is None:
            return
        applied, skipped = _summarise([result])
        self.container_records[cid] = dataclasses.replace(
            record,
            applied=tuple(a for a in record.applied if not a.startswith("cpuset.cpus=")) + tuple(applied),
            skipped=tuple(s for s in record.skipped if not s.startswith("cpuset.cpus=")) + tuple(skipped),
            verified_at=time.time())

    # ---- whole-node passes ----------------------------------------------------------------

    def adopt(self, view: NodeView | None = None) -> dict[str, tuple[str, str]]:
        """After the state was rebuilt: restore CPU allocations from the allocator's own records
        (the annotation written at CreateContainer), never from cpusets found on containers.
        Returns the pods' classes, as reconcile does."""
        view = view if view is not None else self.state.view()
        # Before the first BE pod arrives: its group slice made idle through systemd (worker).
        for slice_name, group in self._systemd_be_groups(view).items():
            self.be_slices.prepare(slice_name, group)
        with self.lock:
            self.resized.keep_only(set(view.containers))
            self._kubelet_cpus_from_records(view)
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
                decision = self._decision(pod)
                if decision.qos_class not in CPU_OWNING_CLASSES:
                    continue  # its class changed (config): a pool container now
                result = self.allocator.restore(owner, qos_class, cpus)
                held = self.allocator.allocation_of(owner)
                if result.accepted or (held is not None and held.cpus == cpus):
                    self.cpu_owner[c.container_id] = owner
                    self.container_pod[c.container_id] = c.sandbox_id
                else:
                    self.reallocate.add(c.container_id)
                    log.warning("cpu_allocation_not_restored", detail="will allocate again",
                                container_id=c.container_id, reason=result.reason)
            self._publish_status()
        return self.reconcile(force=False, view=view)

    def remember_kubelet_resources(self, container_id: str, res: pb.LinuxContainerResources) -> None:
        """kubelet's own values of a container learnt elsewhere (NRI mode: from CRI or the
        runtime before koordnode changed anything); our annotation, when present, wins."""
        with self.lock:
            c = self.state.containers.get(container_id)
            if c is not None and resources_from_annotation(c.annotations.get(KUBELET_RESOURCES_ANNOTATION)):
                return
            self.kubelet_resources[container_id] = resources_from_pb(res)

    def forget_containers_except(self, live: set[str]) -> None:
        """Drop what is kept for containers the runtime no longer has (NRI resynchronisation)."""
        view = self.state.view()
        with self.lock:
            for cid in [c for c in set(self.container_pod) | set(self.kubelet_resources) if c not in live]:
                self._drop_container(cid)
            self._refresh_pools(view)

    def planned_resources(self, container_id: str) -> pb.LinuxContainerResources | None:
        """The CRI-carried values a container should run with now; None when left alone."""
        view = self.state.view()
        with self.lock:
            c = view.containers.get(container_id)
            pod = view.pod_of_container(container_id)
            if c is None or pod is None or skip_requested(pod.labels):
                return None
            kubelet = self._kubelet_resources(view, container_id)
            plan = self._plan(pod, c.name, container_id, kubelet, with_cgroup=False)
        target = pb.LinuxContainerResources(
            **{f: getattr(kubelet, f) for f in _RESOURCE_FIELDS}, unified=dict(kubelet.unified))
        apply_overrides(target, plan)
        return target

    def memory_plan(self, view: NodeView | None = None) -> list[CgroupWrite]:
        """The memory protection writes (memory.min/low/high, memory.wmark_*) the hooks decide
        now for every ready pod and its running containers, for the QoS manager's memory_qos
        strategy to keep applied. Allocates nothing: the CPUs do not change memory values."""
        view = view if view is not None else self.state.view()
        writes: list[CgroupWrite] = []
        by_pod: dict[str, list[Any]] = {}
        for c in view.containers.values():
            by_pod.setdefault(c.sandbox_id, []).append(c)
        with self.lock:
            for pod in view.pods.values():
                if pod.state != POD_READY or skip_requested(pod.labels):
                    continue
                running = [c for c in by_pod.get(pod.sandbox_id, ()) if c.state == CONTAINER_RUNNING]
                for c in running:
                    self._kubelet_resources(view, c.container_id)
                entry = self._plans.get(pod.sandbox_id)
                if entry is not None and self._memory_writes_current(entry, pod, running):
                    writes.extend(entry.memory_writes)  # the reconcile pass's plan still holds
                    continue
                decision = self._decision(pod)
                try:
                    pod_cgroup = self._pod_cgroup(pod.cgroup_parent)
                except UnsafePathError:
                    continue
                config = self.settings.qos.for_class(decision.qos_class)
                memories = []
                for c in running:
                    try:
                        plan = plan_container(
                            self.pod_input_from_record(pod),
                            ContainerInput(name=c.name, resources=self._kubelet_resources(view, c.container_id),
                                           id=c.container_id),
                            decision=decision, config=config, features=self.features,
                            cpuset=self.allocator.pool_for(decision.qos_class), node=self.settings.node,
                            container_cgroup=self._container_cgroup(pod.cgroup_parent, c.container_id))
                    except UnsafePathError:
                        continue
                    writes.extend(plan.cri_mirror)  # what went through CRI (unified), as cgroup writes
                    writes.extend(plan.writes)
                    memories.append(plan.memory)
                pod_level = self.pod_resources.get(pod.sandbox_id)
                resized = self._pod_resources_plan(pod, pod_level) if pod_level is not None else None
                writes.extend(resized.writes if resized is not None
                              else plan_pod_memory(pod_cgroup, decision.qos_class, memories))
        return [w for w in writes if w.resource in MEMORY_QOS_RESOURCES]

    def reconcile(self, force: bool = True, view: NodeView | None = None) -> dict[str, tuple[str, str]]:
        """Re-apply every ready pod's values (kubelet and operators overwrite cgroup files).

        `view`: the snapshot to work from (the loop's, taken before handing the pass to a
        thread). Returns sandbox id -> (class, why) for the loop to record in NodeState."""
        view = view if view is not None else self.state.view()
        classes: dict[str, tuple[str, str]] = {}
        with self.lock:
            # First, before this pass re-asserts cpu.idle itself: whether systemd still has it.
            self._sweep_systemd_be_groups(view)
            containers: dict[str, list[Any]] = {}
            for c in view.containers.values():
                containers.setdefault(c.sandbox_id, []).append(c)
            pass_state = _PassState(containers, self._be_cpus())
            allocator, version = self.allocator, self.allocator.version
            for pod in view.pods.values():
                if pod.state != POD_READY:
                    continue
                try:
                    decision = self._apply_pod(view, pod.sandbox_id, None, force=force, pass_state=pass_state)
                except Exception:  # one pod's trouble must not stop the others' reconcile
                    log.exception("pod_reconcile_failed", sandbox_id=pod.sandbox_id)
                    continue
                if decision is not None:
                    classes[pod.sandbox_id] = (decision.qos_class.value, decision.why)
            # The plans above wrote the cpuset of the containers they cover, unless an allocation
            # changed during the pass (which moves the pools under containers already done).
            unchanged = self.allocator is allocator and allocator.version == version and self.pool_updates is None
            self._refresh_pools(view, skip=pass_state.covered if unchanged else frozenset(),
                                results=pass_state.results)
            METRICS.record_writes(pass_state.results)
            METRICS.record_writes(pass_state.process_results)
            for sid in [sid for sid in self.pod_records if sid not in view.pods]:
                del self.pod_records[sid]
            for sid in [sid for sid in self._plans if sid not in view.pods]:
                del self._plans[sid]
            self._sweep_be_group(view)
            self._publish_status()
        return classes

    def _sweep_be_group(self, view: NodeView) -> None:
        """Remove pod cgroups left in the BE group by pods that are gone (koordnode stopped
        between a pod's removal and its clean-up). Only empty ones go (rmdir), and only after a
        minute: a pod being created has its cgroup before koordnode records it."""
        live: set[str] = set()
        for pod in view.pods.values():
            if in_be_group(pod.cgroup_parent) and systemd_group_slice(pod.cgroup_parent) is None:
                planned = self._plans.get(pod.sandbox_id)
                if planned is not None and planned.made_for(pod, self.settings):
                    cgroup = planned.pod_cgroup  # as the pass's plan found it
                else:
                    try:
                        cgroup = self._pod_cgroup(pod.cgroup_parent)
                    except UnsafePathError:
                        continue
                live.add(cgroup)
                self._be_groups.add(be_group_of(cgroup))
        for group in list(self._be_groups):
            for child, age_s in self.executor.child_cgroups(group, skip=live).items():
                name = child.rsplit("/", 1)[-1]
                if not name.startswith("pod") or age_s < BE_GROUP_SWEEP_AGE_S:
                    continue
                problems = self.executor.remove_cgroup(child)
                if not problems:
                    log.info("leftover_be_pod_cgroup_removed", cgroup=child)

    def _sweep_systemd_be_groups(self, view: NodeView) -> None:
        """systemd driver: a group slice that lost its idleness is made idle through systemd
        again; pod slices of pods that are gone (koordnode stopped in between), empty and a
        minute old, are stopped."""
        live = {pod.cgroup_parent.strip("/").rsplit("/", 1)[-1] for pod in view.pods.values()}
        stops = 0
        for slice_name, group in self._systemd_be_groups(view).items():
            self.be_slices.check(slice_name, group)
            for child, age_s in self.executor.child_cgroups(group).items():
                name = child.rsplit("/", 1)[-1]
                if name in live or systemd_group_slice(name) is None or age_s < BE_GROUP_SWEEP_AGE_S:
                    continue
                if stops < MAX_STOPS_PER_PASS and self._stop_be_pod_slice(name):
                    stops += 1

    # ---- who owns the cpusets --------------------------------------------------------------

    def _kubelet_owns_cpus(self, why: str) -> None:
        """kubelet's static CPU manager gave a container its cpuset: from now on kubelet owns
        them. Allocations koordnode held are dropped (their containers keep running where they
        are until kubelet moves them) and the plans are made again without cpusets."""
        if self.kubelet_cpus is not None:
            return
        self.kubelet_cpus = why
        log.warning("kubelet_owns_cpusets", detail="kubelet's static CPU manager sets cpusets: koordnode keeps"
                    " them and allocates no CPUs", evidence=why)
        for owner in list(self.allocator.allocations()):
            self.allocator.release(owner)
        self.cpu_owner.clear()
        self.reallocate.clear()
        self._plans.clear()

    def _note_no_kubelet_cpuset(self, container: str) -> None:
        note = (f"container {container} was created without a cpuset from kubelet (a client other than"
                " kubelet, or kubelet's CPU manager policy changed): cpusets stay kubelet's until koordnode"
                " restarts")
        if note not in self._kubelet_cpus_notes:
            self._kubelet_cpus_notes = [*self._kubelet_cpus_notes[-4:], note]

    def _kubelet_cpus_from_records(self, view: NodeView) -> None:
        """At start: kubelet owns the cpusets when a live container's recorded kubelet values
        (our annotation from its CreateContainer, or kubelet's latest resize) hold a cpuset. The
        runtime's own view is not evidence: in proxy mode it holds koordnode's pool cpusets."""
        for c in view.containers.values():
            if c.state not in (CONTAINER_RUNNING, CONTAINER_CREATED):
                continue
            recorded = self.resized.get(c.container_id) or resources_from_annotation(
                c.annotations.get(KUBELET_RESOURCES_ANNOTATION))
            if recorded is not None and recorded.cpuset_cpus:
                pod = view.pods.get(c.sandbox_id)
                where = f"{pod.namespace}/{pod.name}/{c.name}" if pod is not None else c.container_id[:12]
                self._kubelet_owns_cpus(f"container {where} was created with kubelet's cpuset {recorded.cpuset_cpus}")
                return

    def _kubelet_cpuset_note(self, decision: ClassDecision, kubelet: ContainerResources) -> str:
        cpus = kubelet.cpuset_cpus or "(none: the runtime's default)"
        if decision.qos_class not in CPU_OWNING_CLASSES:
            return f"cpuset {cpus}: kubelet's (static CPU manager)"
        if decision.kube_qos is KubeQoS.GUARANTEED and _whole_cpus(kubelet):
            return f"cpuset {cpus}: kubelet's exclusive CPUs (static CPU manager); koordnode allocates none"
        return (f"cpuset {cpus}: kubelet's shared pool, not exclusive: {decision.qos_class.value} gets exclusive"
                " CPUs from kubelet's static CPU manager only as a Guaranteed container with whole CPUs")

    def _kubelet_cpu_status(self, view: NodeView) -> dict[str, Any]:
        """The cpusets kubelet gave (from what it asked, as recorded): LSE/LSR containers by name,
        `exclusive` when no other container has any of their CPUs, and the CPUs of everyone else
        (kubelet's shared pool)."""
        exclusive: dict[str, Any] = {}
        shared: set[int] = set()
        by_container: dict[str, frozenset[int]] = {}
        for cid, res in list(self.kubelet_resources.items()):
            c = view.containers.get(cid)
            pod = view.pods.get(c.sandbox_id) if c is not None else None
            if c is None or pod is None or c.state != CONTAINER_RUNNING or not res.cpuset_cpus:
                continue
            try:
                cpus = parse_cpu_list(res.cpuset_cpus)
            except ValueError:
                continue
            by_container[cid] = cpus
            decision = self._decision(pod)
            if decision.qos_class in CPU_OWNING_CLASSES:
                exclusive[cid] = (f"{pod.namespace}/{pod.name}/{c.name}", decision.qos_class.value, cpus)
            else:
                shared |= cpus
        lse_lsr = {}
        for cid, (name, cls, cpus) in exclusive.items():
            others = frozenset().union(*(v for k, v in by_container.items() if k != cid))
            lse_lsr[name] = {"class": cls, "cpus": sorted(cpus), "exclusive": not cpus & others}
        return {"lse_lsr_containers": lse_lsr, "others_run_on": sorted(shared)}

    # ---- views ----------------------------------------------------------------------------

    def _cpu_status(self) -> dict[str, Any]:
        """CPU pools and allocations as containers really get them (reads only the allocator)."""
        if self.kubelet_cpus is not None:
            return {"owner": CPUS_OWNER_KUBELET, "evidence": self.kubelet_cpus,
                    "kubelet": dict(self._kubelet_cpu_view),
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

    def _be_slice_notes(self) -> list[str]:
        be_slices = getattr(self, "be_slices", None)  # None while __init__ runs
        problems = dict(be_slices.problems) if be_slices is not None else {}
        return [f"BE group slice {name} not idle (BE pods stay in kubelet's slice): {problem}"
                for name, problem in sorted(problems.items())]

    def _republish_cpus(self) -> None:
        """After a reservation was committed or cancelled (on the loop, without the lock): the CPU
        part of the status again. A worker's publish racing with it can only show a reservation
        a moment longer; the next publish corrects it."""
        published = self._published
        self._published = dataclasses.replace(published, engine={**published.engine, "cpus": self._cpu_status()})

    def _publish_status(self) -> None:
        """Called at the end of each locked section: the status readers' snapshot."""
        if self.kubelet_cpus is not None:
            self._kubelet_cpu_view = self._kubelet_cpu_status(self.state.view())
        self._published = PublishedStatus(
            engine={
                "cgroup_version": self.features.cgroup_version,
                "group_identity": self.features.group_identity,
                "core_sched": node_status(self.core_sched, self.settings.qos),
                "cpus": self._cpu_status(),
                # Values another writer changed and koordnode restored, by resource.
                "overwrites": {"counts": {**self.executor.overwrites, **self.processes.overwrites},
                               "last": {**self.executor.last_overwrites, **self.processes.last_overwrites}},
                "notes": list(self.notes) + self._be_slice_notes(),
            },
            pod_records=dict(self.pod_records),
            container_records=dict(self.container_records),
        )

    def status(self) -> dict[str, Any]:
        """Never takes the lock: the event loop calls it while workers may hold it."""
        published = self._published
        return {**published.engine, "unsupported": dict(self.executor.unsupported)}

    def _weight_status(self, shares: int | None) -> dict[str, int] | None:
        """The pod's CPU weight as status shows it (v2: also the cpu.weight written)."""
        if shares is None:
            return None
        if self.features.cgroup_version == "v2":
            return {"cpu.shares": shares, "cpu.weight": shares_to_weight(shares)}
        return {"cpu.shares": shares}

    def decorate(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        """Add what was applied to the pods of a NodeState snapshot (lock-free, like status)."""
        published = self._published
        for pod in snapshot.get("pods", []):
            # Where the pod is: the cgroup this engine writes (`koordnode top` reads it there).
            try:
                pod["cgroup"] = self._pod_cgroup(pod.get("cgroup_parent") or "")
            except UnsafePathError:
                pod["cgroup"] = None
            rec = published.pod_records.get(pod["sandbox_id"])
            if rec is not None:
                pod.update(qos_class=rec.qos_class, qos_reason=rec.why, applied=list(rec.applied),
                           skipped=list(rec.skipped), notes=list(rec.notes), verified_at=rec.verified_at,
                           cpu_weight=self._weight_status(rec.pod_cpu_shares))
                if rec.core_sched:
                    pod["core_sched"] = rec.core_sched
            for c in pod.get("containers", []):
                crec = published.container_records.get(c["container_id"])
                if crec is not None:
                    c.update(applied=list(crec.applied), skipped=list(crec.skipped), notes=list(crec.notes),
                             processes=list(crec.processes), verified_at=crec.verified_at)
        return snapshot
