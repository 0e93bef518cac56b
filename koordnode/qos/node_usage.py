"""Node, system and per-pod usage from the QoS manager's measurements: the NodeMetric status
and the batch allocatable (Koordinator v1.2's formula), with or without an API server.

CPU comes from the manager's last tick (its snapshot and per-pod history); memory per pod is
read here (working set: usage minus inactive file pages), in a worker thread, with a collector
of its own (collectors are not shared across threads).
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from koordnode.kube.nodemetric import HostAppUsage, MetricRequest, PodUsage, aggregated_usages, node_metric_status
from koordnode.model.qos_class import QoSClass
from koordnode.policy.batch_resources import UsageInputs, batch_allocatable
from koordnode.qos.collect import Collector
from koordnode.qos.manager import QoSManager
from koordnode.qos.measure import CollectorProbe

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
    batch_cpu_cores: float
    batch_memory_bytes: int
    inputs: dict[str, Any]

    def node_metric_status(self, aggregated_node: list[dict[str, Any]] | None = None,
                           aggregated_system: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return node_metric_status(node_cpu_cores=self.node_cpu_cores, node_memory_bytes=self.node_memory_bytes,
                                  system_cpu_cores=self.system_cpu_cores,
                                  system_memory_bytes=self.system_memory_bytes, pods=self.pods, now=self.at,
                                  aggregated_node=aggregated_node or (), aggregated_system=aggregated_system or (),
                                  host_apps=self.host_apps)

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
                 priority_of: Callable[[str], int | None] = lambda sandbox_id: None) -> None:
        """`priority_of(sandbox_id)`: the pod's spec.priority from the API (None: unknown)."""
        self._manager = manager
        self._metrics = metrics
        self._collector = Collector(procfs_root, cgroup_root)
        self._probe = CollectorProbe(self._collector, None)
        self._priority_of = priority_of
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
            for pod in snap.inventory.pods:
                ring = history.get(f"pod/{pod.sandbox_id}/cpu")
                last = ring.last() if ring is not None else None
                pod_cpu = average(f"pod/{pod.sandbox_id}/cpu", last[1] if last is not None else 0.0)
                pod_memory = self._probe.working_set_bytes(pod.cgroup) or 0
                pods_memory += pod_memory
                if pod.qos_class is not QoSClass.BE:
                    ls_memory += pod_memory
                namespace, _, name = pod.name.partition("/")
                pods.append(PodUsage(namespace, name, pod.qos_class.value, self._priority_of(pod.sandbox_id),
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
            cpu = batch_allocatable(UsageInputs(
                node_allocatable=float(len(snap.online_cpus)), node_reserved=float(len(snap.reserved_cpus)),
                node_used=node_cpu, pods_used=pods_cpu, ls_pods_used=ls_cpu))
            memory = batch_allocatable(UsageInputs(
                node_allocatable=float(snap.memory_total_bytes), node_reserved=0.0, node_used=float(node_memory),
                pods_used=float(pods_memory), ls_pods_used=float(ls_memory)))
            usage = NodeUsage(
                at=datetime.datetime.now(datetime.UTC), node_cpu_cores=node_cpu, system_cpu_cores=cpu.system_used,
                node_memory_bytes=node_memory, system_memory_bytes=int(memory.system_used), pods=tuple(pods),
                host_apps=tuple(host_apps),
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
