"""Synchronize, the runtime's list of every pod and container at each (re)registration: the node
state and CPU ownership rebuilt from it, and every running container brought to its class
values (pods created while koordnode was away too)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from koordnode.cri import api_pb2 as cri
from koordnode.hooks.qos_engine import QoSEngine
from koordnode.model.state import CONTAINER_RUNNING, POD_READY, NodeState, NodeView, RecordedResources
from koordnode.nri import api_pb2 as nri
from koordnode.nri import convert
from koordnode.nri.container_updates import ContainerUpdates
from koordnode.nri.oom import OomScoreAdj
from koordnode.nri.stats import NriStats

log = structlog.get_logger("koordnode.nri")

Planned = list[tuple[str, cri.LinuxContainerResources, nri.ContainerUpdate | None]]


class Synchronizer:
    def __init__(self, state: NodeState, engine: QoSEngine | None, updates: ContainerUpdates, oom: OomScoreAdj,
                 stats: NriStats, spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
                 answered_late: Callable[[], bool],
                 on_synchronized: Callable[[], Coroutine[Any, Any, None]] | None) -> None:
        self.state = state
        self.engine = engine
        self.updates = updates
        self.oom = oom
        self.stats = stats
        self._spawn = spawn
        self._answered_late = answered_late  # the runtime already had an empty answer (deadline passed)
        self.on_synchronized = on_synchronized
        # kubelet's own resources by container id, from the runtime's CRI view (given to the plugin's run()).
        self.kubelet_view: NodeState | None = None

    async def synchronize(self, pods: list[nri.PodSandbox], containers: list[nri.Container]) -> nri.SynchronizeResponse:
        """Rebuild the node state and CPU ownership from the runtime's list, and bring every
        running container to its class values (pods created while koordnode was away too)."""
        kubelet = self._kubelet_values(containers)
        state = self.state
        pod_records = [dataclasses.replace(convert.pod_record(p, "recovered"),
                                           cgroup_parent=convert.placed_parent(p, containers)) for p in pods]
        container_records = [convert.container_record(c, "recovered") for c in containers]
        if self.engine is not None:  # the class at once; the reconcile pass applies the values
            pod_records = [dataclasses.replace(r, qos_class=d.qos_class.value, qos_reason=d.why)
                           for r in pod_records for d in [self.engine.classify(r.labels, r.cgroup_parent)]]
        state.install(pod_records, container_records)
        live = {c.container_id for c in container_records}
        updates: list[nri.ContainerUpdate] = []
        if self.engine is not None:
            engine = self.engine
            with self.updates.collecting():
                view = state.view()

                def rebuild() -> tuple[dict[str, tuple[str, str]], Planned]:
                    engine.forget_containers_except(live)
                    for cid, res in kubelet.items():
                        engine.remember_kubelet_resources(cid, res)
                    classes = engine.adopt(view)  # CPU ownership from the records, then a reconcile pass
                    return classes, self._class_updates(view)

                classes, planned = await asyncio.to_thread(rebuild)
                for sandbox_id, (qos_class, why) in classes.items():
                    state.set_pod_class(sandbox_id, qos_class, why)
                self.updates.take()  # superseded by the full updates
                by_id = {c.id: c for c in containers}
                oom_fixes = []
                for cid, target, update in planned:
                    record = state.containers.get(cid)
                    if record is not None:
                        state.update_container_resources(cid, _with_delta(record.resources, target))
                    if update is not None:
                        updates.append(update)
                    nri_c = by_id.get(cid)
                    if nri_c is not None and nri_c.pid and nri_c.linux.HasField("oom_score_adj"):
                        want = self.oom.wanted(target.oom_score_adj, nri_c.linux.oom_score_adj.value)
                        pod = state.pods.get(record.sandbox_id) if record is not None else None
                        if want is not None and pod is not None:
                            try:
                                cgroup = engine.container_cgroup(pod.cgroup_parent, cid)
                            except Exception:
                                cgroup = ""
                            oom_fixes.append((cid, cgroup, nri_c.pid, want))
                if oom_fixes:
                    self._spawn(asyncio.to_thread(self.oom.fix_after_sync, oom_fixes))
        self.stats.synchronizations += 1
        log.info("nri_synchronized", pods=len(pod_records), containers=len(container_records),
                 updates=len(updates))
        if self.on_synchronized is not None:
            self._spawn(self.on_synchronized())
        if self._answered_late():  # deliver them now
            if updates:
                self._spawn(self.updates.send(updates))
            return nri.SynchronizeResponse()
        return nri.SynchronizeResponse(update=self.updates.answered(updates))

    def _kubelet_values(self, containers: list[nri.Container]) -> dict[str, cri.LinuxContainerResources]:
        """kubelet's own resources per container: what the runtime's CRI view recorded (its
        CreateContainer config; NRI changes only the OCI spec), else — for a container never
        seen — what it runs with, which is what kubelet asked while koordnode was away."""
        out: dict[str, cri.LinuxContainerResources] = {}
        engine = self.engine
        for c in containers:
            if engine is not None and engine.has_kubelet_resources(c.id):
                continue
            seen = self.kubelet_view.containers.get(c.id) if self.kubelet_view is not None else None
            out[c.id] = convert.cri_message(seen.resources) if seen is not None else convert.cri_resources(
                c.linux.resources, c.linux.oom_score_adj if c.linux.HasField("oom_score_adj") else None)
        return out

    def _class_updates(self, view: NodeView) -> Planned:
        """Updates that bring each running container to its class values (engine thread)."""
        updates: Planned = []
        if self.engine is None:
            return updates
        for c in view.containers.values():
            pod = view.pods.get(c.sandbox_id)
            if c.state != CONTAINER_RUNNING or pod is None or pod.state != POD_READY:
                continue
            target = self.engine.planned_resources(c.container_id)
            if target is None:
                continue
            delta = convert.resources_delta(c.resources, target)
            update = None
            if delta is not None:
                update = nri.ContainerUpdate(container_id=c.container_id, ignore_failure=True)
                update.linux.resources.CopyFrom(delta)
            updates.append((c.container_id, target, update))
        return updates


def _with_delta(current: RecordedResources, target: cri.LinuxContainerResources) -> cri.LinuxContainerResources:
    """What an update makes the container run with (a new message: state records never change)."""
    out = convert.cri_message(current)
    for field in ("cpu_shares", "cpu_quota", "cpu_period", "cpuset_cpus", "cpuset_mems", "memory_limit_in_bytes"):
        value = getattr(target, field)
        if value:
            setattr(out, field, value)
    out.unified.update(target.unified)
    return out
