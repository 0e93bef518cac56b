"""Node, system and per-pod usage from the QoS manager's measurements: the NodeMetric status
and the batch allocatable (Koordinator v1.2's formula), with or without an API server.

CPU comes from the manager's last tick (its snapshot and per-pod history); memory per pod is
read here (working set: usage minus inactive file pages), in a worker thread, with a collector
of its own (collectors are not shared across threads).
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from koordnode.kube.nodemetric import (
    HostAppUsage,
    MetricRequest,
    PodUsage,
    aggregated_usages,
    koord_priority_class,
    node_metric_status,
)
from koordnode.config.host_apps import PRIORITY_CLASSES
from koordnode.kube.reclaimable import ProdPod, prod_reclaimable, reclaimable_metric
from koordnode.model.pod_facts import PodFacts
from koordnode.model.qos_class import QoSClass
from koordnode.policy.batch_resources import UsageInputs, batch_allocatable
from koordnode.qos.collect import Collector
from koordnode.qos.manager import QoSManager
from koordnode.qos.measure import CollectorProbe
from koordnode.qos.prediction import PeakModels

TRAINING_INTERVAL_S = 60.0  # koordlet's prediction training interval

__all__ = ["NodeUsage", "NodeUsageReporter"]


@dataclass(frozen=True)
class NodeUsage:
    at: datetime.datetime
    node_cpu_cores: float
    system_cpu_cores: float
    node_memory_bytes: int
    system_memory_bytes: int
    pods: tuple[PodUsage, ...]
    host_apps: tuple[HostAppUsage, ...]
    prod_reclaimable: dict[str, Any]  # NodeMetric's prodReclaimableMetric ({}: not predicted yet)
    batch_cpu_cores: float
    batch_memory_bytes: int
    inputs: dict[str, Any]

    def node_metric_status(self, aggregated_node: list[dict[str, Any]] | None = None,
                           aggregated_system: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        status = node_metric_status(node_cpu_cores=self.node_cpu_cores, node_memory_bytes=self.node_memory_bytes,
                                    system_cpu_cores=self.system_cpu_cores,
                                    system_memory_bytes=self.system_memory_bytes, pods=self.pods, now=self.at,
                                    aggregated_node=aggregated_node or (), aggregated_system=aggregated_system or (),
                                    host_apps=self.host_apps)
        status["prodReclaimableMetric"] = self.prod_reclaimable
        return status

    def batch_status(self) -> dict[str, Any]:
        return {"formula": "Node.Alloc - Node.Reserved - System.Used - Pod(LS).Used; "
                           "System.Used = max(Node.Used - Pod.Used, Node.Anno.Reserved)",
                "cpu_cores": round(self.batch_cpu_cores, 3), "memory_bytes": self.batch_memory_bytes,
                "at": self.at.timestamp(), "inputs": self.inputs}


class BatchAllocatableGauge(Protocol):
    """Where the batch allocatable is exported (metrics.Metrics)."""

    def set_batch_allocatable(self, cpu_cores: float | None, memory_bytes: float | None) -> None: ...


class NodeUsageReporter:
    """Each refresh also sets `koordnode_batch_allocatable`."""

    def __init__(self, manager: QoSManager, procfs_root: str, cgroup_root: str, metrics: BatchAllocatableGauge,
                 facts_of: Callable[[str], PodFacts | None] = lambda sandbox_id: None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        """`facts_of(sandbox_id)`: the pod as the API server has it (None: unknown, or no
        [kubernetes]): its priority, requests and age."""
        self._manager = manager
        self._facts_of = facts_of
        self._wall = wall_clock
        self.models = PeakModels()
        self._trained_at = float("-inf")
        self._metrics = metrics
        self._collector = Collector(procfs_root, cgroup_root)
        self._probe = CollectorProbe(self._collector, None)
        self._lock = threading.Lock()
        self.last: NodeUsage | None = None

    def refresh(self, window_s: float = 60.0) -> NodeUsage | None:
        """Measure once (in a worker thread); None until the manager has measured rates. CPU is
        the average of the manager's samples over the last `window_s` (the report interval: one
        busy second must not swing the batch resources), memory is read now."""
        snap = self._manager.last_snapshot
        if snap is None or not snap.rates_ready or snap.node_used_cpus is None or snap.memory_total_bytes is None:
            return None
        with self._lock:
            history = self._manager.history
            since = snap.now - window_s

            def average(series: str, now_value: float) -> float:
                ring = history.get(series)
                values = ring.values_since(since) if ring is not None else []
                return sum(values) / len(values) if values else now_value

            pods: list[PodUsage] = []
            pods_memory = ls_memory = 0
            facts: dict[str, PodFacts | None] = {}
            last_use: dict[str, tuple[float, int]] = {}  # sandbox -> the last CPU sample, memory now
            for pod in snap.inventory.pods:
                ring = history.get(f"pod/{pod.sandbox_id}/cpu")
                last = ring.last() if ring is not None else None
                pod_cpu = average(f"pod/{pod.sandbox_id}/cpu", last[1] if last is not None else 0.0)
                pod_memory = self._probe.working_set_bytes(pod.cgroup) or 0
                pods_memory += pod_memory
                if pod.qos_class is not QoSClass.BE:
                    ls_memory += pod_memory
                namespace, _, name = pod.name.partition("/")
                found = facts[pod.sandbox_id] = self._facts_of(pod.sandbox_id)
                last_use[pod.sandbox_id] = (last[1] if last is not None else 0.0, pod_memory)
                pods.append(PodUsage(namespace, name, pod.qos_class.value, found.priority if found else None,
                                     pod_cpu, pod_memory))
            host_apps: list[HostAppUsage] = []
            host_cpus = self._manager.host_app_used_cpus
            for name, (app, cgroup) in sorted(self._manager.host_applications().items()):
                app_memory = self._probe.working_set_bytes(cgroup) or 0
                pods_memory += app_memory  # like a pod's: not the system's
                if app.qos != "BE":
                    ls_memory += app_memory
                host_apps.append(HostAppUsage(name, app.qos, app.priority_class,
                                              average(f"host/{name}/cpu", host_cpus.get(name, 0.0)), app_memory))
            node_cpu = average("node/cpu_used_cpus", snap.node_used_cpus)
            ls_cpu = average("node/ls_used_cpus", snap.ls_used_cpus)
            pods_cpu = ls_cpu + average("node/be_used_cpus", snap.be_used_cpus)
            node_memory = snap.memory_used_bytes or 0
            if snap.now - self._trained_at >= TRAINING_INTERVAL_S:
                self._trained_at = snap.now
                self._train(snap.now, facts, last_use, snap.node_used_cpus, node_memory)
            reclaimable = self._prod_reclaimable(facts, float(len(snap.online_cpus) - len(snap.reserved_cpus)),
                                                 float(snap.memory_total_bytes))
            cpu = batch_allocatable(UsageInputs(
                node_allocatable=float(len(snap.online_cpus)), node_reserved=float(len(snap.reserved_cpus)),
                node_used=node_cpu, pods_used=pods_cpu, ls_pods_used=ls_cpu))
            memory = batch_allocatable(UsageInputs(
                node_allocatable=float(snap.memory_total_bytes), node_reserved=0.0, node_used=float(node_memory),
                pods_used=float(pods_memory), ls_pods_used=float(ls_memory)))
            usage = NodeUsage(
                at=datetime.datetime.now(datetime.UTC), node_cpu_cores=node_cpu, system_cpu_cores=cpu.system_used,
                node_memory_bytes=node_memory, system_memory_bytes=int(memory.system_used), pods=tuple(pods),
                host_apps=tuple(host_apps), prod_reclaimable=reclaimable,
                batch_cpu_cores=cpu.value, batch_memory_bytes=int(memory.value),
                inputs={"node_cpus": len(snap.online_cpus), "reserved_cpus": len(snap.reserved_cpus),
                        "node_used_cpus": round(node_cpu, 3), "pods_used_cpus": round(pods_cpu, 3),
                        "ls_used_cpus": round(ls_cpu, 3), "cpu_window_s": window_s,
                        "memory_total_bytes": snap.memory_total_bytes,
                        "node_used_memory_bytes": node_memory, "pods_used_memory_bytes": pods_memory,
                        "ls_used_memory_bytes": ls_memory})
            self.last = usage
        self._metrics.set_batch_allocatable(usage.batch_cpu_cores, usage.batch_memory_bytes)
        return usage

    def _train(self, now: float, facts: dict[str, PodFacts | None], last_use: dict[str, tuple[float, int]],
               node_cpu: float, node_memory: int) -> None:
        """One training round of the peak models from the last use: each pod's, each priority
        class's sum (0 for a class without pods), and the system's (the node less the pods)."""
        by_class = dict.fromkeys(PRIORITY_CLASSES, (0.0, 0))
        pods_cpu, pods_memory = 0.0, 0
        for sandbox_id, (cpu, memory) in last_use.items():
            found = facts.get(sandbox_id)
            self.models.train(f"pod/{found.uid if found else sandbox_id}", cpu, memory, now)
            name = koord_priority_class(found.priority) if found else ""
            total = by_class[name]
            by_class[name] = (total[0] + cpu, total[1] + memory)
            pods_cpu, pods_memory = pods_cpu + cpu, pods_memory + memory
        for name, (cpu, memory) in by_class.items():
            self.models.train(f"priority/{name}", cpu, memory, now)
        self.models.train("system", max(node_cpu - pods_cpu, 0.0), max(node_memory - pods_memory, 0), now)
        self.models.expire(now)

    def _prod_reclaimable(self, facts: dict[str, PodFacts | None], cpus: float, memory: float) -> dict[str, Any]:
        """prodReclaimableMetric; {} without the pods' requests and ages from the API server."""
        known = [f for f in facts.values() if f is not None]
        if len(known) < len(facts):
            return {}
        now = self._wall()
        pods = [ProdPod(f.uid, koord_priority_class(f.priority), (f.cpu_request_milli or 0) / 1000.0,
                        float(sum(f.memory_requests.values())),
                        now - f.created_at if f.created_at is not None else None, f.terminating) for f in known]
        return reclaimable_metric(prod_reclaimable(pods, self.models.predict, allocatable_cpu=cpus,
                                                   allocatable_memory=memory))

    def node_metric_status(self, request: MetricRequest) -> dict[str, Any] | None:
        """In a worker thread: this node's NodeMetric status, CPU averaged over the report interval,
        with the usage percentiles over the windows the NodeMetric asks for (node and system CPU
        and memory)."""
        usage = self.refresh(request.interval_s)
        snap = self._manager.last_snapshot
        if usage is None or snap is None:
            return None
        window = self._manager.usage_window

        def samples(name: str) -> list[tuple[float, float]]:
            ring = window.get(name)
            return ring.items() if ring is not None else []

        durations = request.aggregate_durations_s
        node = aggregated_usages(samples("node/cpu_cores"), samples("node/memory_bytes"), snap.now, durations)
        system = aggregated_usages(samples("system/cpu_cores"), samples("system/memory_bytes"), snap.now, durations)
        return usage.node_metric_status(node, system)

    def memory_total_bytes(self) -> int | None:
        snap = self._manager.last_snapshot
        return snap.memory_total_bytes if snap is not None else None
