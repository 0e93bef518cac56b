"""The NodeMetric object (slo.koordinator.sh/v1alpha1) in Koordinator's shape. Pure: no I/O."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_COLLECT_POLICY", "PodUsage", "koord_priority_class", "new_node_metric",
           "node_metric_status", "report_interval_s"]

# What koord-manager writes into a NodeMetric it creates; koordnode creates one the same way
# when none exists yet (koord-manager's controller then keeps it).
DEFAULT_COLLECT_POLICY: Mapping[str, Any] = {"aggregateDurationSeconds": 300, "reportIntervalSeconds": 60}


@dataclass(frozen=True)
class PodUsage:
    namespace: str
    name: str
    qos: str  # koordnode's class: LSE, LSR, LS, BE, SYSTEM
    priority: int | None  # spec.priority from the API; None: not known
    cpu_cores: float
    memory_bytes: int


def koord_priority_class(priority: int | None) -> str:
    """Koordinator's priority class of a pod's spec.priority (its ranges), "" outside them."""
    if priority is None:
        return ""
    for low, high, name in ((9000, 9999, "koord-prod"), (7000, 7999, "koord-mid"),
                            (5000, 5999, "koord-batch"), (3000, 3999, "koord-free")):
        if low <= priority <= high:
            return name
    return ""


def _cpu(cores: float) -> str:
    return f"{max(round(cores * 1000), 0)}m"


def _resources(cpu_cores: float, memory_bytes: int) -> dict[str, Any]:
    return {"resources": {"cpu": _cpu(cpu_cores), "memory": str(max(int(memory_bytes), 0))}}


def node_metric_status(*, node_cpu_cores: float, node_memory_bytes: int, system_cpu_cores: float,
                       system_memory_bytes: int, pods: Sequence[PodUsage],
                       now: datetime.datetime) -> dict[str, Any]:
    return {
        "updateTime": now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "nodeMetric": {
            "nodeUsage": _resources(node_cpu_cores, node_memory_bytes),
            "systemUsage": _resources(system_cpu_cores, system_memory_bytes),
        },
        "podsMetric": [
            {"namespace": p.namespace, "name": p.name, "qos": p.qos, "priority": koord_priority_class(p.priority),
             "podUsage": _resources(p.cpu_cores, p.memory_bytes)}
            for p in pods
        ],
    }


def new_node_metric(node_name: str) -> dict[str, Any]:
    return {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric",
            "metadata": {"name": node_name}, "spec": {"metricCollectPolicy": dict(DEFAULT_COLLECT_POLICY)}}


def report_interval_s(obj: Mapping[str, Any], default: int) -> int:
    """spec.metricCollectPolicy.reportIntervalSeconds, within [5, 3600]; `default` when absent or odd."""
    spec = obj.get("spec")
    policy = spec.get("metricCollectPolicy") if isinstance(spec, Mapping) else None
    value = policy.get("reportIntervalSeconds") if isinstance(policy, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return default
    return min(max(value, 5), 3600)
