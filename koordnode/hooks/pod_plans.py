"""Pod plans of the QoS engine: what each pod and its running containers should have, made from
the pod, kubelet's resources, the class settings and the CPU pools, and kept while what a plan
was made from stays the same objects (a reconcile pass then reuses it instead of planning again).

Also the memory values of every pod for the QoS manager's memory_qos strategy (memory_plan).
Called under the engine's lock (hooks/qos_engine.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from koordnode.config.components import EngineSettings
from koordnode.cri import api_pb2 as pb
from koordnode.cri.koordnode_annotations import KUBELET_RESOURCES_ANNOTATION, resources_from_annotation, resources_from_pb
from koordnode.executor.write_result import WriteResult
from koordnode.executor.paths import UnsafePathError, container_cgroup_path, pod_cgroup_path
from koordnode.executor.process import ProcessResult
from koordnode.hooks.chain import skip_requested
from koordnode.hooks.cpu_pools import CpuPools
from koordnode.hooks.resized import ResizedResources
from koordnode.model.be_group import be_group_of, in_be_group, systemd_group_slice
from koordnode.model.kubelet_layout import KubeletLayout
from koordnode.model.pod_facts import PodFacts
from koordnode.model.qos_class import ClassDecision, QoSClass, resolve_qos_class
from koordnode.model.state import CONTAINER_RUNNING, POD_READY, NodeView, PodRecord
from koordnode.policy.class_inputs import ContainerInput, ContainerResources, KernelFeatures, PodInput
from koordnode.policy.container_policy import ContainerPlan, plan_container
from koordnode.policy.pod_policy import (
    PodResourcesPlan,
    plan_pod_cpu_weight,
    plan_pod_memory,
    plan_pod_resources,
    plan_pod_sandbox,
)
from koordnode.policy.plan import CgroupWrite
from koordnode.policy.strategies.memory_qos import MEMORY_QOS_RESOURCES

CPUSET_RESOURCES = frozenset({"cpuset.cpus", "cpuset.mems"})


class PlanKey(NamedTuple):
    """Everything a pod's plan is made from, as the objects themselves (records and kubelet
    resources are replaced, never changed, so comparing two keys is mostly identity checks)."""

    pod: PodRecord
    settings: Any
    features: KernelFeatures
    allocator: Any
    allocator_version: Any
    be_cpus: frozenset[int] | None
    pod_resources: Any
    containers: tuple[Any, ...]
    facts: PodFacts | None  # from the API server: a pod is planned again when they arrive or change


@dataclasses.dataclass
class PodPlan:
    """One pod's plan as the last apply made it, with what it was made from (`key`; None: not
    to be reused): a pass whose inputs are the same objects reuses it instead of planning again."""

    key: PlanKey | None
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
class PassState:
    """What one reconcile pass shares between its pods."""

    containers: dict[str, list[Any]]  # sandbox id -> its containers, indexed once per pass
    be_cpus: frozenset[int] | None  # the QoS manager's BE cpuset, asked once per pass
    results: list[WriteResult] = dataclasses.field(default_factory=list)  # counted once at the end
    process_results: list[ProcessResult] = dataclasses.field(default_factory=list)  # likewise
    covered: set[str] = dataclasses.field(default_factory=set)  # containers whose cpuset a plan wrote
    be_groups: set[str] = dataclasses.field(default_factory=set)  # BE groups whose cpu.idle was checked
    now: float = dataclasses.field(default_factory=time.time)


class PodPlanner:
    """Plans pods, and keeps what plans are made from across calls: kubelet's resources of each
    container and pod (CRI calls, or recovered after a restart) and the last plan of each pod."""

    def __init__(self, settings: EngineSettings, features: KernelFeatures, pools: CpuPools,
                 layout: KubeletLayout, resized: ResizedResources) -> None:
        self.features = features
        self.pools = pools
        self.layout = layout
        self.resized = resized
        # [kubernetes] pod_facts: a pod's facts from the API server by UID (None: CRI alone).
        self.pod_facts: Callable[[str], PodFacts | None] | None = None
        self.kubelet_resources: dict[str, ContainerResources] = {}  # container id -> kubelet's
        # sandbox id -> kubelet's pod-level resources from UpdatePodSandboxResources.
        self.pod_resources: dict[str, ContainerResources] = {}
        # sandbox id -> its last plan, reused while what it was made from stays the same.
        self.plans: dict[str, PodPlan] = {}
        self.reconfigure(settings)

    def reconfigure(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.mapping = settings.qos_mapping.as_mapping()
        self.plans.clear()

    # ---- what a pod is --------------------------------------------------------------------

    def classify(self, labels: Mapping[str, str], cgroup_parent: str) -> ClassDecision:
        return resolve_qos_class(labels, cgroup_parent, self.mapping)

    def decide(self, pod: PodRecord) -> ClassDecision:
        return self.classify(pod.labels, pod.cgroup_parent)

    def facts_of(self, uid: str) -> PodFacts | None:
        return self.pod_facts(uid) if self.pod_facts is not None and uid else None

    def _memory_requests(self, uid: str) -> Mapping[str, int] | None:
        """The API's memory requests of a pod's containers ([kubernetes] pod_facts); None: not known."""
        facts = self.facts_of(uid)
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

    def pod_cgroup(self, cgroup_parent: str) -> str:
        return pod_cgroup_path(cgroup_parent, self.layout.driver)

    def container_cgroup(self, cgroup_parent: str, container_id: str) -> str:
        return container_cgroup_path(cgroup_parent, container_id, self.layout.driver)

    def planned_pod_cgroup(self, pod: PodRecord) -> str:
        """A recorded pod's cgroup, as its current plan found it (raises UnsafePathError)."""
        planned = self.plans.get(pod.sandbox_id)
        if planned is not None and planned.made_for(pod, self.settings):
            return planned.pod_cgroup
        return self.pod_cgroup(pod.cgroup_parent)

    def kubelet_resources_of(self, view: NodeView, container_id: str) -> ContainerResources:
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

    def set_node_memory(self, memory_bytes: int) -> None:
        """The pods' memory (hooks/node_memory.py) as the plans' input; a change plans again."""
        if memory_bytes != self.features.node_memory_bytes:
            self.features = dataclasses.replace(self.features, node_memory_bytes=memory_bytes)

    # ---- plans ----------------------------------------------------------------------------

    def plan(self, pod: PodRecord, name: str, container_id: str, kubelet: ContainerResources,
             with_cgroup: bool = True) -> ContainerPlan:
        """A running container's plan, from kubelet's resources."""
        decision = self.decide(pod)
        pod_input = self.pod_input_from_record(pod)
        cpuset = self.pools.cpuset_for(pod, pod_input, decision, container_id, name, kubelet)
        cgroup = self.container_cgroup(pod.cgroup_parent, container_id) if with_cgroup else None
        plan = plan_container(pod_input, ContainerInput(name=name, resources=kubelet, id=container_id),
                              decision=decision, config=self.settings.qos.for_class(decision.qos_class),
                              features=self.features, cpuset=cpuset, node=self.settings.node,
                              container_cgroup=cgroup)
        if cpuset is None:
            plan = dataclasses.replace(plan, notes=(*plan.notes, self.pools.kubelet_cpuset_note(decision, kubelet)))
        return plan

    def pod_resources_plan(self, pod: PodRecord, kubelet: ContainerResources) -> PodResourcesPlan | None:
        try:
            pod_cgroup = self.pod_cgroup(pod.cgroup_parent)
        except UnsafePathError:
            return None
        decision = self.decide(pod)
        return plan_pod_resources(self.pod_input_from_record(pod), kubelet, decision=decision,
                                  config=self.settings.qos.for_class(decision.qos_class), features=self.features,
                                  pod_cgroup=pod_cgroup)

    def key(self, pod: PodRecord, running: list[Any],
            be_cpus: frozenset[int] | None) -> PlanKey | None:
        """What a pod's plan is made from; None: plan every time (a container still asking for
        CPUs changes the allocator)."""
        containers = self._containers_key(running)
        if containers is None:
            return None
        allocator = self.pools.allocator
        return PlanKey(pod, self.settings, self.features, allocator, allocator.version, be_cpus,
                       self.pod_resources.get(pod.sandbox_id), containers, self.facts_of(pod.uid))

    def _containers_key(self, running: list[Any]) -> tuple[Any, ...] | None:
        parts = []
        pools = self.pools
        for c in running:
            cid = c.container_id
            if cid in pools.reallocate:
                return None
            parts.append((c, self.kubelet_resources.get(cid), pools.cpu_owner.get(cid),
                          pools.fallback_reason.get(cid)))
        return tuple(parts)

    def _memory_writes_current(self, entry: PodPlan | None, pod: PodRecord, running: list[Any]) -> bool:
        """Whether a pod's last plan still holds for its memory values (the parts of its key
        they depend on; the CPU pools do not change them)."""
        if entry is None:
            return False
        key = entry.key
        return (key is not None and key.pod is pod and key.settings is self.settings
                and key.features == self.features and key.pod_resources is self.pod_resources.get(pod.sandbox_id)
                and key.containers == self._containers_key(running) and key.facts is self.facts_of(pod.uid))

    def make(self, view: NodeView, pod: PodRecord, running: list[Any],
             decision: ClassDecision, pod_cgroup: str, key: PlanKey | None,
             be_cpus: frozenset[int] | None) -> PodPlan:
        """Plan one pod: its pod cgroup, its running containers and its memory protection.
        `be_cpus`: the set the QoS manager confines BE to (None: not confined)."""
        pod_input = self.pod_input_from_record(pod)
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
        # While the QoS manager's cpu_suppress confines BE by cpuset it is the one writer of BE
        # cpusets (tier, pods and containers in one ordered apply); the set goes into CRI requests only.
        confined = be_cpus is not None and decision.qos_class is QoSClass.BE
        container_plans: dict[str, ContainerPlan] = {}
        container_cgroups: dict[str, str] = {}
        memories = []
        memory_writes: list[CgroupWrite] = []
        for c in running:
            try:
                plan = self.plan(pod, c.name, c.container_id, self.kubelet_resources_of(view, c.container_id))
                cgroup = self.container_cgroup(pod.cgroup_parent, c.container_id)
            except UnsafePathError:
                continue
            writes.extend(w for w in plan.cri_mirror if not (confined and w.resource in CPUSET_RESOURCES))
            writes.extend(plan.writes)
            memory_writes.extend(plan.cri_mirror)
            memory_writes.extend(plan.writes)
            container_plans[c.container_id] = plan
            container_cgroups[c.container_id] = cgroup
            memories.append(plan.memory)
        pod_level = self.pod_resources.get(pod.sandbox_id)
        resized = self.pod_resources_plan(pod, pod_level) if pod_level is not None else None
        # Pod-level resources (in-place pod resize) decide the pod cgroup's values, its weight too.
        pod_memory = resized.writes if resized is not None else plan_pod_memory(pod_cgroup, decision.qos_class, memories)
        if resized is None and self.settings.cgroup.pod_class_weight:
            writes.extend(plan_pod_cpu_weight(pod_cgroup, decision.qos_class,
                                              [p.cpu_shares for p in container_plans.values()
                                               if p.cpu_shares is not None]))
        writes.extend(pod_memory)
        memory_writes.extend(pod_memory)
        return PodPlan(key, decision, pod_cgroup, tuple(pod_plan.notes),
                       tuple(writes), group_write, container_plans, container_cgroups,
                       tuple(w for w in memory_writes if w.resource in MEMORY_QOS_RESOURCES),
                       core_sched=pod_plan.core_sched)

    def invalidate_records(self) -> None:
        """Records changed outside a plan's apply (a pool move): the next apply builds them again."""
        for entry in self.plans.values():
            entry.signature = None

    def keep_pods(self, live: Mapping[str, Any]) -> None:
        for sid in [sid for sid in self.plans if sid not in live]:
            del self.plans[sid]

    # ---- memory values for the QoS manager ------------------------------------------------

    def memory_plan(self, view: NodeView) -> list[CgroupWrite]:
        """The memory protection writes (memory.min/low/high, memory.wmark_*) decided now for
        every ready pod and its running containers. Allocates nothing: the CPUs do not change
        memory values."""
        writes: list[CgroupWrite] = []
        by_pod: dict[str, list[Any]] = {}
        for c in view.containers.values():
            by_pod.setdefault(c.sandbox_id, []).append(c)
        for pod in view.pods.values():
            if pod.state != POD_READY or skip_requested(pod.labels):
                continue
            running = [c for c in by_pod.get(pod.sandbox_id, ()) if c.state == CONTAINER_RUNNING]
            for c in running:
                self.kubelet_resources_of(view, c.container_id)
            entry = self.plans.get(pod.sandbox_id)
            if entry is not None and self._memory_writes_current(entry, pod, running):
                writes.extend(entry.memory_writes)  # the reconcile pass's plan still holds
                continue
            decision = self.decide(pod)
            try:
                pod_cgroup = self.pod_cgroup(pod.cgroup_parent)
            except UnsafePathError:
                continue
            config = self.settings.qos.for_class(decision.qos_class)
            memories = []
            for c in running:
                try:
                    plan = plan_container(
                        self.pod_input_from_record(pod),
                        ContainerInput(name=c.name, resources=self.kubelet_resources_of(view, c.container_id),
                                       id=c.container_id),
                        decision=decision, config=config, features=self.features,
                        cpuset=self.pools.allocator.pool_for(decision.qos_class), node=self.settings.node,
                        container_cgroup=self.container_cgroup(pod.cgroup_parent, c.container_id))
                except UnsafePathError:
                    continue
                writes.extend(plan.cri_mirror)  # what went through CRI (unified), as cgroup writes
                writes.extend(plan.writes)
                memories.append(plan.memory)
            pod_level = self.pod_resources.get(pod.sandbox_id)
            resized = self.pod_resources_plan(pod, pod_level) if pod_level is not None else None
            writes.extend(resized.writes if resized is not None
                          else plan_pod_memory(pod_cgroup, decision.qos_class, memories))
        return [w for w in writes if w.resource in MEMORY_QOS_RESOURCES]
