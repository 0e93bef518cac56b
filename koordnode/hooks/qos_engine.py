"""Applies the QoS policy to real pods: the façade the hooks, NRI and the daemon call.

Policy (policy/container_policy.py, pod_policy.py) is pure; the state it needs across calls is kept beside this
module, one job each: the CPU pools and their claims (cpu_pools.py), koordnode's BE group
(be_group.py), pod plans and kubelet's resources (pod_plans.py), applying a pod's plan
(pod_apply.py) and the status records (engine_status.py). Hook threads and the reconcile pass
call the engine concurrently, so every entry point here takes one lock: plans and writes for a
node are cheap, and serialising them keeps the allocator and cgroup cpusets consistent.

Threads: the engine never changes NodeState. Each entry point reads one immutable NodeView
(taken by the event loop for the reconcile pass), and what the loop must record (the class of
each pod) is returned. What `koordnode status` shows is published as an immutable snapshot at
the end of each locked section, so the event loop reads it without ever waiting for the lock.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import structlog

from koordnode.config.components import EngineSettings
from koordnode.cri import api_pb2 as pb
from koordnode.cri.koordnode_annotations import (
    CPU_ALLOCATION_ANNOTATION,
    KUBELET_RESOURCES_ANNOTATION,
    allocation_to_annotation,
    apply_overrides,
    fallback_to_annotation,
    resources_from_annotation,
    resources_from_pb,
    resources_to_annotation,
    resources_to_pb,
)
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.executor.write_result import WriteResult, WriteStatus
from koordnode.executor.core_sched import CoreScheduling
from koordnode.executor.sched_slice import SchedSlices
from koordnode.executor.process import ProcessExecutor, oom_score_adj_floor
from koordnode.hooks.core_sched import node_status
from koordnode.hooks.be_group import BeGroup
from koordnode.hooks.chain import skip_requested
from koordnode.hooks.cpu_pools import CpuPools, CpuReservation, kubelet_cpuset_only, owner_id
from koordnode.hooks.engine_status import EngineStatus
from koordnode.hooks.node_memory import node_memory_bytes
from koordnode.hooks.pod_apply import PodApplier
from koordnode.hooks.pod_plans import PassState, PodPlanner
from koordnode.hooks.pool_updates import PoolUpdates
from koordnode.hooks.resized import ResizedResources
from koordnode.hooks.tier_memory import TierMemory
from koordnode.metrics.recorder import METRICS
from koordnode.model.annotations import parse_pod_annotations
from koordnode.model.cpu_topology import CpuTopology, TopologyError, read_cpu_topology
from koordnode.model.cpulist import format_cpu_list
from koordnode.model.kubelet_layout import KubeletLayout
from koordnode.model.pod_facts import PodFacts
from koordnode.model.qos_class import ClassDecision
from koordnode.model.state import POD_READY, NodeState, NodeView
from koordnode.policy.class_inputs import ContainerInput, KernelFeatures
from koordnode.policy.container_policy import ContainerPlan, plan_container
from koordnode.policy.plan import CgroupWrite

log = structlog.get_logger("koordnode.qos")


class QoSEngine:
    """Takes the sections it reads as one EngineSettings (EngineSettings.of(config)), at start and
    on reload; `[cgroup] root`, `[procfs] root` and `[sysfs] root` are used at start only (the
    executors and the CPU topology stay until the restart)."""

    def __init__(self, settings: EngineSettings, state: NodeState, *, executor: CgroupExecutor | None = None,
                 topology: CpuTopology | None = None, resized: ResizedResources | None = None,
                 be_cpuset: Callable[[], frozenset[int] | None] | None = None,
                 pool_updates: PoolUpdates | None = None, core_sched: CoreScheduling | None = None,
                 layout: KubeletLayout | None = None, slices: SchedSlices | None = None,
                 be_starting: Callable[[], bool] | None = None) -> None:
        """`be_cpuset()`: the CPUs the QoS manager confines BE to (its cpuset policy), None: the BE pool.
        `pool_updates` (NRI mode): where pool moves of running containers go instead of their cgroups.
        `core_sched`, `slices`: how cookies and slices are given (tests give a fake kernel). `layout`: kubelet's, as the
        composition root resolved it (None: resolved here from `settings`, and followed on reload).
        `be_starting()`: a BE pod is starting (model/be_starts.py), so the QoS manager may have
        lifted the BE group for it: the group then counts as giving way."""
        self.state = state
        self.resized = resized if resized is not None else ResizedResources(None)
        self.lock = threading.RLock()
        self.executor = executor or CgroupExecutor(Path(settings.cgroup.root))
        self._own_layout = layout is None
        self.layout = layout if layout is not None else KubeletLayout(
            settings.cgroup.driver, settings.qos_manager.kubepods_cgroup, self.executor.cgroup_exists)
        # The containers' processes' oom_score_adj, which no cgroup file holds.
        self.processes = ProcessExecutor(settings.procfs.root, floor=oom_score_adj_floor())
        if topology is None:
            try:
                topology = read_cpu_topology(settings.sysfs.root)
            except TopologyError as exc:
                raise RuntimeError(f"cannot read the CPU topology under {settings.sysfs.root}: {exc}") from exc
        self.topology = topology
        self.settings = settings
        self.pools = CpuPools(settings, topology, be_cpuset=be_cpuset, pool_updates=pool_updates)
        self.be_group = BeGroup(settings, self.executor, state, self.layout,
                                memory_nodes=format_cpu_list(topology.numa_nodes.keys()) or "0",
                                starting=be_starting)
        self.records = EngineStatus()
        features = KernelFeatures(cgroup_version=self.executor.version.value, group_identity=False,
                                  node_memory_bytes=self._node_memory())
        self.planner = PodPlanner(settings, features, self.pools, self.layout, self.resized)
        # Core-scheduling cookies of the pods of classes with core_sched.
        self.applier = PodApplier(self.planner, self.be_group, self.records, self.executor, self.processes,
                                  core_sched if core_sched is not None else CoreScheduling(),
                                  slices if slices is not None else SchedSlices(procfs_root=settings.procfs.root))
        if self.applier.has_group_identity():
            self.planner.features = dataclasses.replace(features, group_identity=True)
        self.container_pod: dict[str, str] = {}  # container id -> sandbox id
        # kubelet's cgroups above the pods (kubepods, its burstable tier): at least the sum of
        # the pods' memory protection, which the kernel caps by theirs (hooks/tier_memory.py).
        self.tiers = TierMemory(self.executor, self.layout)
        self._tier_lock = threading.Lock()  # one tier job at a time, outside the engine's lock
        self._tier_jobs = self._tier_job_done = 0
        # What [strategy.memory_qos] is handed: the pods' memory values only while this engine's
        # reconcile pass does not keep them itself.
        self.memory_fallback = MemoryFallback(self)
        with self.lock:
            self._publish_status()

    def _node_memory(self) -> int:
        return node_memory_bytes(self.executor, self.layout.paths().kubepods, self.settings.procfs.root)

    def reconfigure(self, settings: EngineSettings) -> None:
        """A reloaded configuration, applied to the next call and the next reconcile pass."""
        with self.lock:
            self.settings = settings
            if self._own_layout:
                self.layout.configure(settings.cgroup.driver, settings.qos_manager.kubepods_cgroup)
            self.pools.configure(settings)
            self.be_group.reconfigure(settings)
            self.planner.reconfigure(settings)
            self.executor.forget_unsupported()
            self._publish_status()

    # ---- what NRI and the daemon read -----------------------------------------------------

    @property
    def core_sched(self) -> CoreScheduling:
        return self.applier.core_sched

    @core_sched.setter
    def core_sched(self, core_sched: CoreScheduling) -> None:
        self.applier.core_sched = core_sched

    @property
    def features(self) -> KernelFeatures:
        return self.planner.features

    @property
    def notes(self) -> list[str]:
        """Why configured CPUs or the BE group are not used as asked."""
        return list(dict.fromkeys([*self.pools.notes, *self.be_group.notes]))

    def set_pod_facts(self, pod_facts: Callable[[str], PodFacts | None] | None) -> None:
        """[kubernetes] pod_facts: a pod's facts from the API server by UID (None: CRI alone)."""
        self.planner.pod_facts = pod_facts

    def reserved_cpus(self) -> frozenset[int]:
        """The CPUs kept from every pod ([node] reserved_cpus), for the QoS manager."""
        return self.pools.reserved

    def classify(self, labels: Mapping[str, str], cgroup_parent: str) -> ClassDecision:
        return self.planner.classify(labels, cgroup_parent)

    def container_cgroup(self, cgroup_parent: str, container_id: str) -> str:
        """The container's cgroup as the engine writes it (raises UnsafePathError)."""
        return self.planner.container_cgroup(cgroup_parent, container_id)

    def has_kubelet_resources(self, container_id: str) -> bool:
        """Whether kubelet's own values of a container are known (lock-free)."""
        return container_id in self.planner.kubelet_resources

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

    def place_be_pod(self, cfg: pb.PodSandboxConfig, decision: ClassDecision) -> str | None:
        """RunPodSandbox: a BE pod into koordnode's BE group (be_group.py); its new parent or None."""
        return self.be_group.place(cfg, decision)

    def follow_sandbox_parent(self, req: pb.CreateContainerRequest) -> None:
        self.be_group.follow_sandbox_parent(req)

    def prepare_be_group_once_kubelet_is_up(self) -> bool:
        """The BE group slice prepared as soon as kubelet has made its top cgroup (be_group.py:
        BeGroup.prepare_once_kubelet_is_up); True once there is nothing left to wait for. Without
        the engine's lock: it reads a directory and hands the systemd call to its worker."""
        return self.be_group.prepare_once_kubelet_is_up()

    def remove_be_pod_cgroup(self, cgroup_parent: str, *, removed: bool = True) -> None:
        self.be_group.remove_pod_cgroup(cgroup_parent, removed=removed)

    def has_kubelet_slice(self, sandbox_id: str) -> bool:
        """Whether kubelet_slice_after_scope_start has work for this pod (lock-free, on the loop)."""
        pod = self.state.view().pods.get(sandbox_id)
        return pod is not None and self.be_group.has_kubelet_slice(pod.cgroup_parent)

    def kubelet_slice_after_scope_start(self, sandbox_id: str | None = None, container_id: str | None = None) -> None:
        """After RunPodSandbox and StartContainer: kubelet's pod slice of a pod in the systemd
        BE group checked now (be_group.py: BeGroup.check_kubelet_slice)."""
        view = self.state.view()
        pod = view.pods.get(sandbox_id) if sandbox_id else view.pod_of_container(container_id or "")
        if pod is not None:
            self.be_group.check_kubelet_slice(pod.cgroup_parent)

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
        pod = self.planner.pod_input(req.sandbox_config)
        decision = self.classify(pod.labels, pod.cgroup_parent)
        kubelet = resources_from_pb(req.config.linux.resources)
        container = ContainerInput(name=req.config.metadata.name, resources=kubelet)
        # Only koordnode writes its allocation record: a value kubelet passed on is dropped.
        req.config.annotations.pop(CPU_ALLOCATION_ANNOTATION, None)
        owner = owner_id(pod, container.name)
        with self.lock:
            pools, config = self.pools, self.settings.qos.for_class(decision.qos_class)
            if kubelet.cpuset_cpus:
                self._kubelet_owns_cpus(f"CreateContainer of {pod.namespace}/{pod.name}/{container.name}"
                                        f" carried kubelet's cpuset {kubelet.cpuset_cpus}")
            elif pools.kubelet_cpus is not None:
                pools.note_no_kubelet_cpuset(f"{pod.namespace}/{pod.name}/{container.name}")
            if pools.kubelet_cpus is not None:
                # kubelet's cpuset stays in the request: no allocation, no pool.
                plan = plan_container(pod, container, decision=decision, config=config,
                                      features=self.features, cpuset=None, node=self.settings.node)
                plan = dataclasses.replace(plan, notes=(*plan.notes, pools.kubelet_cpuset_note(decision, kubelet)))
                self._publish_status()
                apply_overrides(req.config.linux.resources, plan)
                req.config.annotations[KUBELET_RESOURCES_ANNOTATION] = resources_to_annotation(kubelet)
                return plan, None
            create = pools.for_create(pod, container, decision, owner, self._republish_cpus)
            plan = plan_container(pod, container, decision=decision, config=config,
                                  features=self.features, cpuset=create.cpuset, node=self.settings.node)
            self._publish_status()
        try:
            apply_overrides(req.config.linux.resources, plan)
            req.config.annotations[KUBELET_RESOURCES_ANNOTATION] = resources_to_annotation(kubelet)
            if create.allocation is not None:
                req.config.annotations[CPU_ALLOCATION_ANNOTATION] = allocation_to_annotation(
                    owner, create.allocation.qos_class, create.allocation.cpus)
            elif create.cpuset.fallback:
                req.config.annotations[CPU_ALLOCATION_ANNOTATION] = fallback_to_annotation(create.cpuset.reason)
            if create.cpuset.fallback:
                log.warning("not_enough_free_cpus", detail="container runs on the shared pool",
                            pod=f"{pod.namespace}/{pod.name}", container=container.name, reason=create.cpuset.reason)
        except BaseException:
            if create.reservation is not None:
                create.reservation.release()  # the hook fails: nothing of it may stay
            raise
        return plan, create.reservation

    def container_created(self, req: pb.CreateContainerRequest, container_id: str | None) -> None:
        """After CreateContainer: remember the container, or undo the allocation if the call
        failed or went on without it (a Pre hook that failed or timed out has its request
        changes dropped: then the runtime never saw the CPUs, and they go back)."""
        pod = self.planner.pod_input(req.sandbox_config)
        owner = owner_id(pod, req.config.metadata.name)
        view = self.state.view()
        with self.lock:
            if container_id:
                self.container_pod[container_id] = req.pod_sandbox_id
                self.planner.kubelet_resources[container_id] = resources_from_annotation(
                    req.config.annotations.get(KUBELET_RESOURCES_ANNOTATION)) or resources_from_pb(
                    req.config.linux.resources)
            self.pools.created(container_id, req.pod_sandbox_id, owner, req.config.annotations)
            self._refresh_pools(view)
            self._publish_status()

    def container_started(self, container_id: str) -> None:
        view = self.state.view()
        with self.lock:
            pod = view.pod_of_container(container_id)
            if pod is None:
                return
            self.applier.apply(view, pod.sandbox_id, force=False)
            tiers = self._tier_job(view)
        self._run_tier_job(tiers)

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
                self.applier.apply(view, sandbox_id, force=False, runtime_rewrote=frozenset(cids))
            tiers = self._tier_job(view)
        self._run_tier_job(tiers)

    def update_resources_pre(self, req: pb.UpdateContainerResourcesRequest) -> None:
        self._kubelet_resized(req, rewrite=True)

    def kubelet_resized_unrewritten(self, req: pb.UpdateContainerResourcesRequest) -> None:
        """After an UpdateContainerResources whose Pre result was dropped (the hook overran its
        bound or failed): the runtime got kubelet's request as it was, and koordnode must still
        learn kubelet's new values, or every later pass would put the old ones back (seen under
        TCG: a resize undone for good). A late Pre that ends after this records the same."""
        self._kubelet_resized(req, rewrite=False)

    def _kubelet_resized(self, req: pb.UpdateContainerResourcesRequest, *, rewrite: bool) -> None:
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
                before = self.planner.kubelet_resources_of(view, req.container_id)
                kubelet = dataclasses.replace(before, cpuset_cpus=kubelet.cpuset_cpus,
                                              cpuset_mems=kubelet.cpuset_mems or before.cpuset_mems)
            self.planner.kubelet_resources[req.container_id] = kubelet
            # Survives a koordnode restart, unlike the annotation set at CreateContainer.
            self.resized.put(req.container_id, kubelet)
            if not rewrite:
                return
            plan = self.planner.plan(pod, container.name, req.container_id, kubelet, with_cgroup=False)
            self._publish_status()
        apply_overrides(req.linux, plan)

    def pod_resources_pre(self, req: pb.UpdatePodSandboxResourcesRequest) -> None:
        """In-place pod-level resize: the class's values replace kubelet's in the request."""
        self._kubelet_pod_resized(req, rewrite=True)

    def pod_resized_unrewritten(self, req: pb.UpdatePodSandboxResourcesRequest) -> None:
        """kubelet_resized_unrewritten for a pod-level resize: kubelet's pod values learnt."""
        self._kubelet_pod_resized(req, rewrite=False)

    def _kubelet_pod_resized(self, req: pb.UpdatePodSandboxResourcesRequest, *, rewrite: bool) -> None:
        pod = self.state.pods.get(req.pod_sandbox_id)
        if pod is None or not req.HasField("resources"):
            return
        kubelet = resources_from_pb(req.resources)
        with self.lock:
            self.planner.pod_resources[req.pod_sandbox_id] = kubelet
            if not rewrite:
                return
            plan = self.planner.pod_resources_plan(pod, kubelet)
        if plan is None:
            return
        if plan.cri.cpu_shares is not None:
            req.resources.cpu_shares = plan.cri.cpu_shares
        for key, value in plan.cri.unified.items():
            req.resources.unified[key] = value

    def pod_resources_updated(self, sandbox_id: str) -> None:
        """After UpdatePodSandboxResources: apply the pod's recomputed values to its cgroup."""
        view = self.state.view()
        tiers = None
        with self.lock:
            pod = view.pods.get(sandbox_id)
            if pod is not None:
                self.applier.apply(view, sandbox_id, force=False)
                tiers = self._tier_job(view)
        self._run_tier_job(tiers)

    def container_gone(self, container_id: str) -> None:
        view = self.state.view()
        with self.lock:
            self._drop_container(container_id)
            self._refresh_pools(view)
            self._publish_status()

    def pod_gone(self, sandbox_id: str, removed: bool) -> None:
        view = self.state.view()
        with self.lock:
            owned = self.pools.containers_of(sandbox_id)
            for cid in dict.fromkeys([*(c for c, s in self.container_pod.items() if s == sandbox_id), *owned]):
                self._drop_container(cid)
            plan = self.planner.plans.pop(sandbox_id, None)
            if plan is not None:
                self.applier.slices.forget(plan.pod_cgroup)
            if removed:
                self.records.pod_records.pop(sandbox_id, None)
                self.planner.pod_resources.pop(sandbox_id, None)
                self.applier.drop_pod_metrics(sandbox_id)
            self._refresh_pools(view)
            tiers = self._tier_job(view, gone=sandbox_id)
        self._run_tier_job(tiers)

    def _drop_container(self, container_id: str) -> None:
        self.container_pod.pop(container_id, None)
        self.planner.kubelet_resources.pop(container_id, None)
        self.records.forget_container(container_id)
        self.resized.drop(container_id)
        self.pools.drop(container_id)

    # ---- CPU pools ------------------------------------------------------------------------

    def _kubelet_owns_cpus(self, why: str) -> None:
        if self.pools.kubelet_owns_cpus(why):
            self.planner.plans.clear()  # made again without cpusets

    def _refresh_pools(self, view: NodeView, skip: frozenset[str] | set[str] = frozenset(),
                       results: list[WriteResult] | None = None, *, if_moved: bool = True) -> None:
        """Running shared-pool containers to the pools as they are now; `if_moved`: only if the
        pools moved since the last refresh (CpuPools.refresh). `results`: where the results go
        to be counted (default: counted here)."""
        applied = self.pools.refresh(view, self.executor, self.planner.decide, self.layout.driver, skip,
                                     if_moved=if_moved)
        if not applied:
            return
        if results is not None:
            results.extend(applied)
        else:
            METRICS.record_writes(applied)
        for r in applied:
            if r.status is not WriteStatus.UNCHANGED:
                self.planner.invalidate_records()  # records changed here: the next apply builds them again
            self.records.note_pool_line(r)

    # ---- whole-node passes ----------------------------------------------------------------

    def adopt(self, view: NodeView | None = None) -> dict[str, tuple[str, str]]:
        """After the state was rebuilt: restore CPU allocations from the allocator's own records
        (the annotation written at CreateContainer), never from cpusets found on containers.
        Returns the pods' classes, as reconcile does."""
        view = view if view is not None else self.state.view()
        self.be_group.prepare(view)
        with self.lock:
            self.resized.keep_only(set(view.containers))
            self.pools.adopt(view, self.resized, self.planner.decide)
            if self.pools.kubelet_cpus is not None:
                self.planner.plans.clear()
            self._publish_status()
        return self.reconcile(force=False, view=view)

    def remember_kubelet_resources(self, container_id: str, res: pb.LinuxContainerResources) -> None:
        """kubelet's own values of a container learnt elsewhere (NRI mode: from CRI or the
        runtime before koordnode changed anything); our annotation, when present, wins."""
        with self.lock:
            c = self.state.containers.get(container_id)
            if c is not None and resources_from_annotation(c.annotations.get(KUBELET_RESOURCES_ANNOTATION)):
                return
            self.planner.kubelet_resources[container_id] = resources_from_pb(res)

    def forget_containers_except(self, live: set[str]) -> None:
        """Drop what is kept for containers the runtime no longer has (NRI resynchronisation)."""
        view = self.state.view()
        with self.lock:
            known = set(self.container_pod) | set(self.planner.kubelet_resources) | set(self.pools.cpu_owner)
            for cid in [c for c in known if c not in live]:
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
            kubelet = self.planner.kubelet_resources_of(view, container_id)
            plan = self.planner.plan(pod, c.name, container_id, kubelet, with_cgroup=False)
        target = resources_to_pb(kubelet)
        apply_overrides(target, plan)
        return target

    def memory_plan(self, view: NodeView | None = None) -> list[CgroupWrite]:
        """The memory protection writes (memory.min/low/high, memory.wmark_*) the engine decides
        now for every ready pod and its running containers, then those of kubelet's tiers above
        them (see MemoryFallback)."""
        view = view if view is not None else self.state.view()
        with self.lock:
            writes = self.planner.memory_plan(view)
            self._publish_status()
        with self._tier_lock:
            tiers = self.tiers.plan(writes)
        return [*writes, *tiers]

    def _pod_memory_writes(self, view: NodeView, gone: str | None = None) -> list[CgroupWrite]:
        """The memory protection the ready pods' current plans give them (`gone`: a pod whose
        plan was just dropped). Under the engine's lock."""
        writes: list[CgroupWrite] = []
        for sandbox_id, entry in self.planner.plans.items():
            pod = view.pods.get(sandbox_id)
            if sandbox_id != gone and pod is not None and pod.state == POD_READY and not skip_requested(pod.labels):
                writes.extend(entry.memory_writes)
        return writes

    def _tier_job(self, view: NodeView, gone: str | None = None) -> tuple[int, list[CgroupWrite]]:
        """What the tiers must carry now, numbered, for `_run_tier_job` after the engine's lock is
        released: the tiers' reads and writes (a listing of every pod cgroup, slow on a busy node)
        must not hold up the next call's hooks, which wait for that lock."""
        self._tier_jobs += 1
        return self._tier_jobs, self._pod_memory_writes(view, gone)

    def _run_tier_job(self, job: tuple[int, list[CgroupWrite]] | None) -> None:
        """Keep the tiers as `job` says, then publish the engine's status (the pods' and the tiers')."""
        if job is None:
            return
        number, writes = job
        with self._tier_lock:
            if number >= self._tier_job_done:  # else a later job, from newer plans, has run already
                self._tier_job_done = number
                self._apply_tiers(writes)
        with self.lock:  # never while holding the tier lock: the reconcile pass takes them the other way
            self._publish_status()

    def _keep_tiers(self, view: NodeView, *, force: bool = False, record: bool = True) -> list[WriteResult]:
        """kubelet's tiers above the pods at the sum of the pods' memory protection, from the
        pods' current plans (a pod without one, or not koordnode's: its files), at once (the
        reconcile pass, under the engine's lock). `record`: count the results here (else the caller does)."""
        job = self._tier_job(view)
        with self._tier_lock:
            self._tier_job_done = job[0]
            return self._apply_tiers(job[1], force=force, record=record)

    def _apply_tiers(self, writes: list[CgroupWrite], *, force: bool = False, record: bool = True) -> list[WriteResult]:
        try:
            results = self.tiers.keep(writes, force=force)
        except Exception:  # the tiers' trouble must not fail the hook or the pass
            log.exception("memory_tiers_failed")
            return []
        if record:
            METRICS.record_writes(results)
        for r in results:
            if not r.ok:
                log.warning("memory_tier_write_failed", cgroup=r.cgroup_write.cgroup,
                            resource=r.cgroup_write.resource, detail=r.detail)
        return results

    def reconcile(self, force: bool = True, view: NodeView | None = None) -> dict[str, tuple[str, str]]:
        """Re-apply every ready pod's values (kubelet and operators overwrite cgroup files).

        `view`: the snapshot to work from (the loop's, taken before handing the pass to a
        thread). Returns sandbox id -> (class, why) for the loop to record in NodeState."""
        view = view if view is not None else self.state.view()
        classes: dict[str, tuple[str, str]] = {}
        with self.lock:
            # First, before this pass re-asserts cpu.idle itself: whether systemd still has it.
            self.be_group.sweep_systemd(view)
            self.planner.set_node_memory(self._node_memory())
            containers: dict[str, list[Any]] = {}
            for c in view.containers.values():
                containers.setdefault(c.sandbox_id, []).append(c)
            pass_state = PassState(containers, self.pools.be_cpus())
            allocator, version = self.pools.allocator, self.pools.allocator.version
            for pod in view.pods.values():
                if pod.state != POD_READY:
                    continue
                try:
                    decision = self.applier.apply(view, pod.sandbox_id, force=force, pass_state=pass_state)
                except Exception:  # one pod's trouble must not stop the others' reconcile
                    log.exception("pod_reconcile_failed", sandbox_id=pod.sandbox_id)
                    continue
                if decision is not None:
                    classes[pod.sandbox_id] = (decision.qos_class.value, decision.why)
            # The plans above wrote the cpuset of the containers they cover, unless an allocation
            # changed during the pass (which moves the pools under containers already done).
            unchanged = (self.pools.allocator is allocator and allocator.version == version
                         and self.pools.pool_updates is None)
            self._refresh_pools(view, skip=pass_state.covered if unchanged else frozenset(),
                                results=pass_state.results, if_moved=False)
            # Last: the pods' plans of this pass are what the tiers above them must carry.
            pass_state.results.extend(self._keep_tiers(view, force=force, record=False))
            METRICS.record_writes(pass_state.results)
            METRICS.record_writes(pass_state.process_results)
            self.records.keep_pods(view.pods)
            self.planner.keep_pods(view.pods)
            self.be_group.sweep(view, self.planner.planned_pod_cgroup)
            self._publish_status()
        return classes

    # ---- status ---------------------------------------------------------------------------

    def _republish_cpus(self) -> None:
        """After a reservation was committed or cancelled (on the loop, without the lock)."""
        self.records.republish_cpus(self.pools.status())

    def _publish_status(self) -> None:
        """Called at the end of each locked section: the status readers' snapshot."""
        self.pools.update_kubelet_view(self.state.view(), self.planner.kubelet_resources, self.planner.decide)
        self.records.publish({
            "cgroup_version": self.features.cgroup_version,
            "group_identity": self.features.group_identity,
            "core_sched": node_status(self.core_sched, self.settings.qos),
            "cpus": self.pools.status(),
            # Values another writer changed and koordnode restored, by resource.
            "overwrites": {"counts": {**self.executor.overwrites, **self.processes.overwrites},
                           "last": {**self.executor.last_overwrites, **self.processes.last_overwrites}},
            "notes": self.notes,
            # kubelet's cgroups above the pods: the memory protection koordnode keeps there, and why.
            "memory_tiers": self.tiers.status(),
        })

    def status(self) -> dict[str, Any]:
        """Never takes the lock: the event loop calls it while workers may hold it. The BE
        group's notes as they are now: its systemd worker records them, and nothing may publish
        after it (a pod with no container started yet)."""
        engine = self.records.published.engine
        return {**engine, "notes": [*engine.get("notes", ()), *self.be_group.status_notes()],
                "unsupported": dict(self.executor.unsupported)}

    def decorate(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        """Add what was applied to the pods of a NodeState snapshot (lock-free, like status)."""
        return self.records.decorate(snapshot, self.planner.pod_cgroup, self.features.cgroup_version)


class MemoryFallback:
    """The pods' memory values have one owner: the engine, which writes them at creation and keeps
    them with its reconcile pass ([cgroup] reconcile_interval_s). The QoS manager's memory_qos
    strategy keeps the node's watermarks, and the pods' values only as the fallback, when that
    pass is off or runs less often than the manager's memory pass ([qos_manager]
    reconcile_interval_s): then it gets memory_plan(); else None, with `note` saying why (a
    second pass reading and restoring the same values would double the work for nothing)."""

    note = ("none: the pods' memory values are kept by the reconcile pass ([cgroup] reconcile_interval_s), "
            "which runs at least as often; node watermarks only")

    def __init__(self, engine: QoSEngine) -> None:
        self._engine = engine

    def __call__(self) -> list[CgroupWrite] | None:
        settings = self._engine.settings
        engine_every = settings.cgroup.reconcile_interval_s
        if 0 < engine_every <= settings.qos_manager.reconcile_interval_s:
            return None
        return self._engine.memory_plan()
