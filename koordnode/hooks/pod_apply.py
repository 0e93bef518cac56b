"""Applies one pod's plan (hooks/pod_plans.py): its cgroup writes, its containers' processes'
oom_score_adj, core-scheduling cookie and scheduler slice, then its status records and applied-value metrics.
Called under the engine's lock (hooks/qos_engine.py), by hook threads and the reconcile pass.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Set
from typing import Any

import structlog

from koordnode.executor.cgroup_executor import CgroupExecutor

from koordnode.executor.write_result import WriteResult, WriteStatus
from koordnode.executor.paths import UnsafePathError
from koordnode.executor.core_sched import CoreScheduling
from koordnode.executor.process import ProcessExecutor, ProcessResult
from koordnode.executor.sched_slice import SchedSlices
from koordnode.hooks.core_sched import keep_pod_cookie
from koordnode.hooks.sched_slice import keep_pod_slice
from koordnode.hooks.be_group import BeGroup
from koordnode.hooks.chain import skip_requested
from koordnode.hooks.engine_status import EngineStatus, Record, oom_lines
from koordnode.hooks.pod_plans import PassState, PodPlan, PodPlanner
from koordnode.metrics.recorder import METRICS
from koordnode.model.qos_class import ClassDecision
from koordnode.model.state import CONTAINER_RUNNING, NodeView, PodRecord
from koordnode.policy.container_policy import REPORTED_BY_RUNTIME

log = structlog.get_logger("koordnode.qos")


class PodApplier:
    def __init__(self, planner: PodPlanner, be_group: BeGroup, status: EngineStatus, executor: CgroupExecutor,
                 processes: ProcessExecutor, core_sched: CoreScheduling, slices: SchedSlices) -> None:
        self.planner = planner
        self.be_group = be_group
        self.status = status
        self.executor = executor
        self.processes = processes
        self.core_sched = core_sched
        self.slices = slices
        self._group_identity_absent = False  # an existing pod cgroup had no cpu.bvt_warp_ns
        self.metric_names: dict[str, tuple[str, str]] = {}  # sandbox id -> (namespace, name)

    def has_group_identity(self) -> bool:
        # On cgroup v2 the root cgroup has no cpu.* files: look at the kubepods tiers too.
        for cgroup in ("/", "/kubepods", "/kubepods.slice"):
            try:
                if self.executor.read(cgroup, "cpu.bvt_warp_ns") is not None:
                    return True
            except Exception:
                continue
        return False

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

    def drop_pod_metrics(self, sandbox_id: str) -> None:
        names = self.metric_names.pop(sandbox_id, None)
        if names is not None:
            METRICS.drop_pod(*names)

    def apply(self, view: NodeView, sandbox_id: str, *,
              force: bool, pass_state: PassState | None = None,
              runtime_rewrote: Set[str] = frozenset()) -> ClassDecision | None:
        """Pod-level and container-level writes of one pod (its running containers); returns
        the class decision for the loop to record (None when the pod is unknown or skipped), the
        pod as recorded. `pass_state`: the reconcile pass this is part of (None: a single call
        from a hook). `runtime_rewrote`: containers whose REPORTED_BY_RUNTIME files the runtime
        has just rewritten."""
        planner, records = self.planner, self.status
        pod = view.pods.get(sandbox_id)
        if pod is None or skip_requested(pod.labels):
            planner.plans.pop(sandbox_id, None)
            return None  # skipped pods are left alone, also by the reconcile pass after a restart
        cached = planner.plans.get(sandbox_id)
        if cached is not None and cached.made_for(pod, planner.settings):
            decision, pod_cgroup = cached.decision, cached.pod_cgroup
        else:
            decision = planner.decide(pod)
            try:
                pod_cgroup = planner.pod_cgroup(pod.cgroup_parent)
            except UnsafePathError as exc:
                planner.plans.pop(sandbox_id, None)
                records.pod_records[sandbox_id] = dataclasses.replace(
                    records.pod_records.get(sandbox_id, Record()), qos_class=decision.qos_class.value,
                    why=decision.why, skipped=(f"cgroup parent {pod.cgroup_parent!r} refused: {exc}",))
                log.warning("unsafe_cgroup_parent_refused", sandbox_id=sandbox_id, error=str(exc))
                return decision
        if not planner.features.group_identity and self._probe_group_identity(pod_cgroup):
            planner.features = dataclasses.replace(planner.features, group_identity=True)
            log.info("group_identity_kernel_detected", detail="BE pods get cpu.bvt_warp_ns instead of cpu.idle")
        if pass_state is not None:
            containers = pass_state.containers.get(sandbox_id, [])
            be_cpus = pass_state.be_cpus
        else:
            containers = view.containers_of(sandbox_id)
            be_cpus = planner.pools.be_cpus()
        running = [c for c in containers if c.state == CONTAINER_RUNNING]
        for c in running:
            planner.kubelet_resources_of(view, c.container_id)  # known before the key is taken
        key = planner.key(pod, running, be_cpus)
        reused = False
        if cached is not None and key is not None and cached.key == key:
            entry, reused = cached, True
        else:
            entry = planner.make(view, pod, running, decision, pod_cgroup, key, be_cpus)
            if key is not None:
                planner.plans[sandbox_id] = entry
            else:
                planner.plans.pop(sandbox_id, None)
        writes = entry.writes
        group_write = entry.group_write
        if group_write is not None and pass_state is not None:
            if group_write.cgroup in pass_state.be_groups:
                group_write = None  # checked already in this pass (the group is shared by all BE pods)
            else:
                pass_state.be_groups.add(group_write.cgroup)
        if group_write is not None and self.be_group.gives_way_safely(group_write.cgroup):
            group_write = None  # idle, or the lowest weight cpu_suppress keeps while LS is quiet
        if group_write is not None:
            writes = (group_write, *writes)
        if runtime_rewrote:
            self.executor.disown(w for cid in runtime_rewrote if cid in entry.container_plans
                                 for w in entry.container_plans[cid].writes if w.resource in REPORTED_BY_RUNTIME)
        results = self.executor.apply(writes, force=force)
        processes = ContainerProcesses(self.executor, entry.container_cgroups)
        oom_results = self._keep_oom_score_adj(entry, processes)
        core_line = self._keep_core_sched(entry, processes)
        slice_line = self._keep_sched_slice(entry, processes)
        if pass_state is not None:
            pass_state.results.extend(results)
            pass_state.process_results.extend(result for _, result in oom_results)
            pass_state.covered.update(entry.container_plans)
        else:
            METRICS.record_writes(results)
            METRICS.record_writes(result for _, result in oom_results)
        own = results[1:] if group_write is not None else results
        lines = oom_lines(oom_results)
        signature = (*((r.status, r.detail) for r in own), *sorted(lines.items()), core_line, slice_line)
        failed = [r for r in results if r.status in (WriteStatus.FAILED, WriteStatus.REFUSED)]
        if (reused and not failed and signature == entry.signature and sandbox_id in records.pod_records
                and all(cid in records.container_records for cid in entry.container_plans)):
            # Nothing changed since the records were built: they only get the time of this check.
            now = pass_state.now if pass_state is not None else time.time()
            records.pod_records[sandbox_id] = records.pod_records[sandbox_id].checked_at(now)
            for cid in entry.container_plans:
                records.container_records[cid] = records.container_records[cid].checked_at(now)
            return decision
        entry.signature = signature
        self._publish_metrics(pod, containers, decision.qos_class.value, pod_cgroup, results, entry)
        by_cgroup: dict[str, list[WriteResult]] = {}
        for r in results:
            by_cgroup.setdefault(r.cgroup_write.cgroup, []).append(r)
        pod_results = by_cgroup.get(pod_cgroup, [])
        shares = next((r.cgroup_write.value for r in pod_results
                       if r.cgroup_write.resource == "cpu.shares" and r.ok), None)
        record = dataclasses.replace(records.pod_records.get(sandbox_id, Record()),
                                     qos_class=decision.qos_class.value, why=decision.why,
                                     pod_cpu_shares=shares if isinstance(shares, int) else None,
                                     core_sched=core_line, sched_slice=slice_line)
        records.pod_records[sandbox_id] = record.with_results(pod_results, entry.notes)
        for cid, plan in entry.container_plans.items():
            crec = dataclasses.replace(records.container_records.get(cid, Record()), qos_class=plan.qos_class.value)
            crec = crec.with_results(by_cgroup.get(entry.container_cgroups[cid], []), plan.notes)
            records.container_records[cid] = dataclasses.replace(crec, processes=lines.get(cid, ()))
        if failed:
            log.warning("cgroup_writes_failed", sandbox_id=sandbox_id,
                        failures=[f"{r.cgroup_write.resource} {r.cgroup_write.cgroup}: {r.detail}" for r in failed])
        return decision

    def _keep_oom_score_adj(self, entry: PodPlan, processes: ContainerProcesses) -> list[tuple[str, ProcessResult]]:
        """Every process of the pod's running containers at its class's oom_score_adj (a
        container created while the hook timed out runs with kubelet's). (container id, result)
        per process."""
        self.processes.dry_run = self.executor.dry_run
        results: list[tuple[str, ProcessResult]] = []
        for cid, plan in entry.container_plans.items():
            value = plan.cri.oom_score_adj
            if value is None:
                continue
            pids = processes.of(cid)
            if pids is None:
                continue
            reason = f"{plan.qos_class.value}: class oom_score_adj {value}"
            results.extend((cid, r) for r in self.processes.keep_oom_score_adj(pids, value, reason))
        return results

    def _keep_core_sched(self, entry: PodPlan, processes: ContainerProcesses) -> str:
        """The pod's processes at its class's core-scheduling cookie (koordnode/hooks/core_sched.py);
        the pod's state for status, "" when its class asks for none."""
        self.core_sched.dry_run = self.executor.dry_run
        return keep_pod_cookie(self.core_sched, self.planner.settings.qos, entry.decision.qos_class,
                               processes.all, entry.pod_cgroup)

    def _keep_sched_slice(self, entry: PodPlan, processes: ContainerProcesses) -> str:
        """The pod's threads at its class's slice (koordnode/hooks/sched_slice.py); the pod's state
        for status, "" when its class asks for none."""
        self.slices.dry_run = self.executor.dry_run
        return keep_pod_slice(self.slices, self.planner.settings.qos, entry.decision.qos_class,
                              processes.all, entry.pod_cgroup)

    def _publish_metrics(self, pod: PodRecord, containers: list[Any], cls: str, pod_cgroup: str,
                         results: list[WriteResult], entry: PodPlan) -> None:
        self.metric_names[pod.sandbox_id] = (pod.namespace, pod.name)
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


class ContainerProcesses:
    """The processes of a pod's running containers (their cgroup.procs), each container's read
    once however many per-process values (oom_score_adj, cookie, slice) one apply keeps."""

    def __init__(self, executor: CgroupExecutor, container_cgroups: Mapping[str, str]) -> None:
        self._executor = executor
        self._cgroups = container_cgroups
        self._read: dict[str, list[int] | None] = {}

    def of(self, container_id: str) -> list[int] | None:
        """The container's processes; None when its cgroup cannot be read."""
        if container_id not in self._read:
            try:
                self._read[container_id] = self._executor.read_pids(self._cgroups[container_id]) or []
            except (OSError, UnsafePathError):
                self._read[container_id] = None
        return self._read[container_id]

    def all(self) -> list[int]:
        return [pid for cid in self._cgroups for pid in self.of(cid) or ()]
