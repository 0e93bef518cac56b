"""Applies the QoS policy to real pods: the glue between CRI calls, policy, allocator and executor.

Policy (hooks/policy.py) is pure; this module owns the state that policy needs across calls
(CPU allocations, kubelet's original resources, what was applied and verified) and hands the
plans to the executor. Hook threads and the reconcile pass call it concurrently, so every entry
point takes one lock: plans and writes for a node are cheap, and serialising them keeps the
allocator and cgroup cpusets consistent.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import structlog

from koordnode.cri import api_pb2 as pb
from koordnode.executor.executor import CgroupExecutor, WriteResult, WriteStatus
from koordnode.executor.paths import UnsafePathError, container_cgroup_path, pod_cgroup_path
from koordnode.executor.plan import CgroupWrite
from koordnode.hooks.cpu_topology import CpuTopology, TopologyError, read_cpu_topology
from koordnode.hooks.cpuset_allocator import (
    CpusetAllocator,
    CpusetDecision,
    allocator_from_config,
    cpuset_owner_id,
)
from koordnode.hooks.annotations import parse_pod_annotations
from koordnode.hooks.chain import skip_requested
from koordnode.hooks.cpulist import parse_cpu_list
from koordnode.hooks.policy import (
    ContainerInput,
    ContainerPlan,
    ContainerResources,
    KernelFeatures,
    PodInput,
    allocate_cpuset,
    plan_container,
    plan_pod_memory,
    plan_pod_resources,
    plan_pod_sandbox,
)
from koordnode.hooks.resized import ResizedResources
from koordnode.metrics import METRICS
from koordnode.hooks.qos_class import CPU_OWNING_CLASSES, ClassDecision, QoSClass, resolve_qos_class
from koordnode.state import CONTAINER_RUNNING, POD_READY, NodeState, PodRecord

log = structlog.get_logger("koordnode.qos")

# Container annotation carrying kubelet's own resources, so that after a koordnode restart the
# policy starts again from what kubelet asked, not from what koordnode made of it.
KUBELET_RESOURCES_ANNOTATION = "koordnode.io/kubelet-resources"

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
    if not text:
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
    except (ValueError, TypeError, AttributeError):
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


def _summarise(results: Iterable[WriteResult]) -> tuple[list[str], list[str]]:
    applied, skipped = [], []
    for r in results:
        w = r.write
        where = f"{w.resource}={w.value} on {w.cgroup}"
        if r.ok:
            applied.append(f"{where} ({r.status.value}{', ' + r.detail if r.detail else ''})")
        else:
            skipped.append(f"{where}: {r.status.value}: {r.detail}")
    return applied, skipped


@dataclasses.dataclass
class Record:
    """What koordnode decided and applied for one pod or container, for `koordnode status`."""

    qos_class: str = ""
    why: str = ""
    applied: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    verified_at: float | None = None

    def set_results(self, results: list[WriteResult], notes: Iterable[str] = ()) -> None:
        self.applied, self.skipped = _summarise(results)
        self.notes = list(dict.fromkeys(notes))
        self.verified_at = time.time()

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class QoSEngine:
    def __init__(self, config: Any, state: NodeState, *, executor: CgroupExecutor | None = None,
                 topology: CpuTopology | None = None, resized: ResizedResources | None = None) -> None:
        self.state = state
        self.resized = resized if resized is not None else ResizedResources(None)
        self.lock = threading.RLock()
        self.executor = executor or CgroupExecutor(Path(config.cgroup.root))
        self.features = KernelFeatures(
            cgroup_version=self.executor.version.value, group_identity=self._has_group_identity()
        )
        self.notes: list[str] = []
        if topology is None:
            try:
                topology = read_cpu_topology(config.sysfs.root)
            except TopologyError as exc:
                raise RuntimeError(f"cannot read the CPU topology under {config.sysfs.root}: {exc}") from exc
        self.topology = topology
        self._apply_config(config)
        # container id -> kubelet's resources, CPU owner id
        self.kubelet_resources: dict[str, ContainerResources] = {}
        self.cpu_owner: dict[str, str] = {}
        self.container_pod: dict[str, str] = {}  # container id -> sandbox id
        # sandbox id -> kubelet's pod-level resources from UpdatePodSandboxResources.
        self.pod_resources: dict[str, ContainerResources] = {}
        self._metric_names: dict[str, tuple[str, str]] = {}  # sandbox id -> (namespace, name)
        self.pod_records: dict[str, Record] = {}
        # While the QoS manager suppresses BE by cpuset, BE containers must start inside its set.
        self.be_cpuset_override = None  # Callable[[], frozenset[int] | None] | None
        self.container_records: dict[str, Record] = {}

    def _apply_config(self, config: Any) -> None:
        old = getattr(self, "allocator", None)
        self.config = config
        self.mapping = config.qos_mapping.as_mapping()
        allocator, notes = allocator_from_config(self.topology, config.node)
        if old is not None:
            for owner, allocation in old.allocations().items():
                result = allocator.restore(owner, allocation.qos_class, allocation.cpus)
                if not result.accepted:
                    notes.append(f"allocation of {owner} dropped on reload: {result.reason}")
        self.allocator: CpusetAllocator = allocator
        self.notes = notes

    def reconfigure(self, config: Any) -> None:
        with self.lock:
            self._apply_config(config)
            self.executor.forget_unsupported()

    def _probe_group_identity(self, cgroup: str) -> bool:
        try:
            return self.executor.read(cgroup, "cpu.bvt_warp_ns") is not None
        except Exception:
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

    @staticmethod
    def pod_input(cfg: pb.PodSandboxConfig) -> PodInput:
        return PodInput(uid=cfg.metadata.uid, name=cfg.metadata.name, namespace=cfg.metadata.namespace,
                        labels=dict(cfg.labels), annotations=dict(cfg.annotations),
                        cgroup_parent=cfg.linux.cgroup_parent)

    @staticmethod
    def pod_input_from_record(pod: PodRecord) -> PodInput:
        return PodInput(uid=pod.uid, name=pod.name, namespace=pod.namespace, labels=pod.labels,
                        annotations=pod.annotations, cgroup_parent=pod.cgroup_parent)

    def _driver(self) -> str:
        return self.config.cgroup.driver

    def _pod_cgroup(self, cgroup_parent: str) -> str:
        return pod_cgroup_path(cgroup_parent, self._driver())

    def _container_cgroup(self, cgroup_parent: str, container_id: str) -> str:
        return container_cgroup_path(cgroup_parent, container_id, self._driver())

    # ---- hook entry points ----------------------------------------------------------------

    def pod_sandbox_pre(self, cfg: pb.PodSandboxConfig) -> ClassDecision:
        decision = self.classify(cfg.labels, cfg.linux.cgroup_parent)
        if decision.label_problem:
            log.warning("invalid QoS class label ignored", pod=f"{cfg.metadata.namespace}/{cfg.metadata.name}",
                        problem=decision.label_problem, qos_class=decision.qos_class.value)
        return decision

    def pod_sandbox_started(self, sandbox_id: str, cfg: pb.PodSandboxConfig) -> None:
        with self.lock:
            self._apply_pod(sandbox_id, self.pod_input(cfg), force=False)

    def container_create_pre(self, req: pb.CreateContainerRequest) -> ContainerPlan:
        """Rewrite the CreateContainer request in place; returns the plan for the record."""
        pod = self.pod_input(req.sandbox_config)
        decision = self.classify(pod.labels, pod.cgroup_parent)
        kubelet = resources_from_pb(req.config.linux.resources)
        container = ContainerInput(name=req.config.metadata.name, resources=kubelet)
        with self.lock:
            cpuset = self._be_override(decision.qos_class) or allocate_cpuset(
                self.allocator, pod, container, decision.qos_class)
            plan = plan_container(pod, container, decision=decision, config=self.config.qos.for_class(decision.qos_class),
                                  features=self.features, cpuset=cpuset, node=self.config.node)
        apply_overrides(req.config.linux.resources, plan)
        req.config.annotations[KUBELET_RESOURCES_ANNOTATION] = resources_to_annotation(kubelet)
        if cpuset.fallback:
            log.warning("not enough free CPUs; container runs on the shared pool",
                        pod=f"{pod.namespace}/{pod.name}", container=container.name, reason=cpuset.reason)
        return plan

    def container_created(self, req: pb.CreateContainerRequest, container_id: str | None) -> None:
        """After CreateContainer: remember the container, or undo the allocation if it failed."""
        pod = self.pod_input(req.sandbox_config)
        preferred = parse_pod_annotations(pod.annotations).scheduler_cpuset
        owner = cpuset_owner_id(pod.uid, req.config.metadata.name, preferred is not None)
        with self.lock:
            if container_id:
                self.container_pod[container_id] = req.pod_sandbox_id
                self.kubelet_resources[container_id] = resources_from_annotation(
                    req.config.annotations.get(KUBELET_RESOURCES_ANNOTATION)) or resources_from_pb(
                    req.config.linux.resources)
                if self.allocator.allocation_of(owner) is not None:
                    self.cpu_owner[container_id] = owner
            elif owner not in self.cpu_owner.values():
                self.allocator.release(owner)
            self._refresh_pools()

    def container_started(self, container_id: str) -> None:
        with self.lock:
            pod = self.state.pod_of_container(container_id)
            if pod is None:
                return
            self._apply_pod(pod.sandbox_id, self.pod_input_from_record(pod), force=False)

    def update_resources_pre(self, req: pb.UpdateContainerResourcesRequest) -> None:
        container = self.state.containers.get(req.container_id)
        pod = self.state.pod_of_container(req.container_id)
        if container is None or pod is None or not req.HasField("linux"):
            return
        with self.lock:
            kubelet = resources_from_pb(req.linux)
            self.kubelet_resources[req.container_id] = kubelet
            # Survives a koordnode restart, unlike the annotation set at CreateContainer.
            self.resized.put(req.container_id, kubelet)
            plan = self._plan(pod, container.name, req.container_id, kubelet, with_cgroup=False)
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
        with self.lock:
            pod = self.state.pods.get(sandbox_id)
            if pod is not None:
                self._apply_pod(sandbox_id, self.pod_input_from_record(pod), force=False)

    def _pod_resources_plan(self, pod: PodRecord, kubelet: ContainerResources):
        try:
            pod_cgroup = self._pod_cgroup(pod.cgroup_parent)
        except UnsafePathError:
            return None
        decision = self._decision(pod)
        return plan_pod_resources(self.pod_input_from_record(pod), kubelet, decision=decision,
                                  config=self.config.qos.for_class(decision.qos_class), features=self.features,
                                  pod_cgroup=pod_cgroup)

    def container_gone(self, container_id: str) -> None:
        with self.lock:
            self._drop_container(container_id)
            self._refresh_pools()

    def pod_gone(self, sandbox_id: str, removed: bool) -> None:
        with self.lock:
            for cid in [c for c, s in self.container_pod.items() if s == sandbox_id]:
                self._drop_container(cid)
            if removed:
                self.pod_records.pop(sandbox_id, None)
                self.pod_resources.pop(sandbox_id, None)
                names = self._metric_names.pop(sandbox_id, None)
                if names is not None:
                    METRICS.drop_pod(*names)
            self._refresh_pools()

    def _drop_container(self, container_id: str) -> None:
        owner = self.cpu_owner.pop(container_id, None)
        self.container_pod.pop(container_id, None)
        self.kubelet_resources.pop(container_id, None)
        self.container_records.pop(container_id, None)
        self.resized.drop(container_id)
        if owner is not None and owner not in self.cpu_owner.values():
            self.allocator.release(owner)

    # ---- planning and applying ------------------------------------------------------------

    def _decision(self, pod: PodRecord) -> ClassDecision:
        return self.classify(pod.labels, pod.cgroup_parent)

    def _cpuset_for(self, pod: PodRecord, decision: ClassDecision, container_id: str, name: str,
                    kubelet: ContainerResources):
        owner = self.cpu_owner.get(container_id)
        if owner is not None:
            allocation = self.allocator.allocation_of(owner)
            if allocation is not None:
                return self.allocator.allocate(owner, allocation.qos_class, len(allocation.cpus))
        if decision.qos_class in CPU_OWNING_CLASSES:
            # An owning class that has no allocation (e.g. refused at restore): ask again.
            cpuset = allocate_cpuset(self.allocator, self.pod_input_from_record(pod),
                                     ContainerInput(name=name, resources=kubelet), decision.qos_class)
            preferred = parse_pod_annotations(pod.annotations).scheduler_cpuset
            owner = cpuset_owner_id(pod.uid, name, preferred is not None)
            if self.allocator.allocation_of(owner) is not None:
                self.cpu_owner[container_id] = owner
                self.container_pod[container_id] = pod.sandbox_id
            return cpuset
        return self._be_override(decision.qos_class) or self.allocator.pool_for(decision.qos_class)

    def _plan(self, pod: PodRecord, name: str, container_id: str, kubelet: ContainerResources,
              with_cgroup: bool = True) -> ContainerPlan:
        decision = self._decision(pod)
        cpuset = self._cpuset_for(pod, decision, container_id, name, kubelet)
        cgroup = self._container_cgroup(pod.cgroup_parent, container_id) if with_cgroup else None
        return plan_container(self.pod_input_from_record(pod), ContainerInput(name=name, resources=kubelet, id=container_id),
                              decision=decision, config=self.config.qos.for_class(decision.qos_class),
                              features=self.features, cpuset=cpuset, node=self.config.node,
                              container_cgroup=cgroup)

    def _kubelet_resources(self, container_id: str) -> ContainerResources:
        known = self.kubelet_resources.get(container_id)
        if known is not None:
            return known
        c = self.state.containers.get(container_id)
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

    def _apply_pod(self, sandbox_id: str, pod_in: PodInput, *, force: bool) -> None:
        """Pod-level and container-level writes of one pod (its running containers)."""
        pod = self.state.pods.get(sandbox_id)
        if pod is None or skip_requested(pod.labels):
            return  # skipped pods are left alone, also by the reconcile pass after a restart
        decision = self._decision(pod)
        try:
            pod_cgroup = self._pod_cgroup(pod.cgroup_parent)
        except UnsafePathError as exc:
            record = self.pod_records.setdefault(sandbox_id, Record())
            record.qos_class, record.why = decision.qos_class.value, decision.why
            record.skipped = [f"cgroup parent {pod.cgroup_parent!r} refused: {exc}"]
            log.warning("refusing unsafe cgroup parent", sandbox_id=sandbox_id, error=str(exc))
            return
        if not self.features.group_identity and self._probe_group_identity(pod_cgroup):
            self.features = KernelFeatures(cgroup_version=self.features.cgroup_version, group_identity=True)
            log.info("group identity kernel detected: BE pods get cpu.bvt_warp_ns instead of cpu.idle")
        pod_plan = plan_pod_sandbox(pod_in, decision=decision, config=self.config.qos.for_class(decision.qos_class),
                                    features=self.features, pod_cgroup=pod_cgroup, node=self.config.node)
        writes: list[CgroupWrite] = list(pod_plan.writes)
        container_plans: dict[str, tuple[ContainerPlan, int]] = {}
        memories = []
        for c in self.state.containers_of(sandbox_id):
            if c.state != CONTAINER_RUNNING:
                continue
            try:
                plan = self._plan(pod, c.name, c.container_id, self._kubelet_resources(c.container_id))
            except UnsafePathError:
                continue
            start = len(writes)
            writes.extend(plan.cri_mirror)
            writes.extend(plan.writes)
            container_plans[c.container_id] = (plan, start)
            memories.append(plan.memory)
        pod_level = self.pod_resources.get(sandbox_id)
        resized = self._pod_resources_plan(pod, pod_level) if pod_level is not None else None
        if resized is not None:
            # Pod-level resources (in-place pod resize) decide the pod cgroup's values.
            writes.extend(resized.writes)
        else:
            writes.extend(plan_pod_memory(pod_cgroup, decision.qos_class, memories))
        results = self.executor.apply(writes, force=force)
        METRICS.record_writes(results)
        self._publish_metrics(pod, decision.qos_class.value, pod_cgroup, results, container_plans)
        by_cgroup: dict[str, list[WriteResult]] = {}
        for r in results:
            by_cgroup.setdefault(r.write.cgroup, []).append(r)
        record = self.pod_records.setdefault(sandbox_id, Record())
        record.qos_class, record.why = decision.qos_class.value, decision.why
        record.set_results(by_cgroup.get(pod_cgroup, []), pod_plan.notes)
        pod.qos_class, pod.qos_reason = decision.qos_class.value, decision.why
        for cid, (plan, _) in container_plans.items():
            crec = self.container_records.setdefault(cid, Record())
            crec.qos_class = plan.qos_class.value
            crec.set_results(by_cgroup.get(self._container_cgroup(pod.cgroup_parent, cid), []), plan.notes)
        failed = [r for r in results if r.status in (WriteStatus.FAILED, WriteStatus.REFUSED)]
        if failed:
            log.warning("some cgroup writes failed", sandbox_id=sandbox_id,
                        failures=[f"{r.write.resource} {r.write.cgroup}: {r.detail}" for r in failed])

    def _publish_metrics(self, pod: PodRecord, cls: str, pod_cgroup: str, results: list[WriteResult],
                         container_plans: dict[str, tuple[ContainerPlan, int]]) -> None:
        self._metric_names[pod.sandbox_id] = (pod.namespace, pod.name)
        names = {c.container_id: c.name for c in self.state.containers_of(pod.sandbox_id)}
        applied: dict[str, dict[str, Any]] = {}
        for r in results:
            if r.ok:
                applied.setdefault(r.write.cgroup, {})[r.write.resource] = r.write.value
        METRICS.set_applied(pod.namespace, pod.name, "", cls, applied.get(pod_cgroup, {}))
        for cid, (plan, _) in container_plans.items():
            values = dict(applied.get(self._container_cgroup(pod.cgroup_parent, cid), {}))
            if plan.cri.oom_score_adj is not None:
                values["oom_score_adj"] = plan.cri.oom_score_adj
            METRICS.set_applied(pod.namespace, pod.name, names.get(cid, cid[:12]), cls, values)

    def _be_override(self, qos_class: QoSClass):
        if qos_class is not QoSClass.BE or self.be_cpuset_override is None:
            return None
        cpus = self.be_cpuset_override()
        if not cpus:
            return None
        return CpusetDecision(cpus=frozenset(cpus), exclusive=False, fallback=False,
                              reason="BE cpuset set by the cpu_suppress strategy (policy cpuset)")

    def _refresh_pools(self) -> None:
        """After an allocation changed: move running shared-pool containers to the new pools."""
        writes = []
        for c in list(self.state.containers.values()):
            if c.state != CONTAINER_RUNNING or c.container_id in self.cpu_owner:
                continue
            pod = self.state.pods.get(c.sandbox_id)
            if pod is None or skip_requested(pod.labels):
                continue
            decision = self._decision(pod)
            # LSE/LSR containers without an allocation (the fail-open fallback) share the pool
            # too, so they must leave cores handed out since; pool_for gives them the share pool.
            if self._be_override(decision.qos_class) is not None:
                continue  # the QoS manager owns BE cpusets while its cpuset policy runs
            pool = self.allocator.pool_for(decision.qos_class)
            try:
                cgroup = self._container_cgroup(pod.cgroup_parent, c.container_id)
            except UnsafePathError:
                continue
            writes.append(CgroupWrite(cgroup, "cpuset.cpus", pool.cpuset_cpus, f"{decision.qos_class.value} pool: {pool.reason}"))
        if writes:
            results = self.executor.apply(writes)
            METRICS.record_writes(results)
            for r in results:
                self._note_pool_result(r)

    def _note_pool_result(self, result: WriteResult) -> None:
        """Keep the container's status line for its cpuset current after a pool change."""
        cid = result.write.cgroup.rsplit("/", 1)[-1].removeprefix("cri-containerd-").removesuffix(".scope")
        record = self.container_records.get(cid)
        if record is None:
            return
        applied, skipped = _summarise([result])
        record.applied = [a for a in record.applied if not a.startswith("cpuset.cpus=")] + applied
        record.skipped = [s for s in record.skipped if not s.startswith("cpuset.cpus=")] + skipped
        record.verified_at = time.time()

    # ---- whole-node passes ----------------------------------------------------------------

    def adopt(self) -> None:
        """After the state was rebuilt: restore CPU allocations from running containers."""
        with self.lock:
            self.resized.keep_only(set(self.state.containers))
            for c in list(self.state.containers.values()):
                if c.state != CONTAINER_RUNNING or c.container_id in self.cpu_owner:
                    continue
                pod = self.state.pods.get(c.sandbox_id)
                if pod is None:
                    continue
                decision = self._decision(pod)
                cpus_text = c.resources.cpuset_cpus
                if decision.qos_class not in CPU_OWNING_CLASSES or not cpus_text:
                    continue
                preferred = parse_pod_annotations(pod.annotations).scheduler_cpuset
                owner = cpuset_owner_id(pod.uid, c.name, preferred is not None)
                try:
                    cpus = parse_cpu_list(cpus_text)
                except ValueError:
                    continue
                result = self.allocator.restore(owner, decision.qos_class, cpus)
                if result.accepted or self.allocator.allocation_of(owner) is not None:
                    self.cpu_owner[c.container_id] = owner
                    self.container_pod[c.container_id] = c.sandbox_id
                else:
                    log.warning("cannot restore CPU allocation; will allocate again",
                                container_id=c.container_id, reason=result.reason)
        self.reconcile(force=False)

    def reconcile(self, force: bool = True) -> None:
        """Re-apply every ready pod's values (kubelet and operators overwrite cgroup files)."""
        with self.lock:
            for pod in list(self.state.pods.values()):
                if pod.state != POD_READY:
                    continue
                try:
                    self._apply_pod(pod.sandbox_id, self.pod_input_from_record(pod), force=force)
                except Exception:  # one pod's trouble must not stop the others' reconcile
                    log.exception("reconcile of a pod failed", sandbox_id=pod.sandbox_id)
            self._refresh_pools()
            live = set(self.state.pods)
            for sid in list(self.pod_records):
                if sid not in live:
                    del self.pod_records[sid]

    # ---- views ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        with self.lock:
            return {
                "cgroup_version": self.features.cgroup_version,
                "group_identity": self.features.group_identity,
                "cpus": {
                    "share_pool": sorted(self.allocator.share_pool()),
                    "be_pool": sorted(self.allocator.be_pool()),
                    "reserved": sorted(self.allocator.reserved),
                    "allocations": {o: {"class": a.qos_class.value, "cpus": sorted(a.cpus)}
                                    for o, a in self.allocator.allocations().items()},
                },
                "unsupported": dict(self.executor.unsupported),
                # Values another writer changed and koordnode restored, by resource.
                "overwrites": {"counts": self.executor.overwrites, "last": self.executor.last_overwrites},
                "notes": list(self.notes),
            }

    def decorate(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        """Add what was applied to the pods of a NodeState snapshot."""
        with self.lock:
            for pod in snapshot.get("pods", []):
                rec = self.pod_records.get(pod["sandbox_id"])
                if rec is not None:
                    pod.update(qos_class=rec.qos_class, qos_reason=rec.why, applied=rec.applied,
                               skipped=rec.skipped, notes=rec.notes, verified_at=rec.verified_at)
                for c in pod.get("containers", []):
                    crec = self.container_records.get(c["container_id"])
                    if crec is not None:
                        c.update(applied=crec.applied, skipped=crec.skipped, notes=crec.notes,
                                 verified_at=crec.verified_at)
        return snapshot
