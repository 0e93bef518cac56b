"""The NodeMetric object (slo.koordinator.sh/v1alpha1) in Koordinator's shape. Pure: no I/O."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["AGGREGATIONS", "DEFAULT_COLLECT_POLICY", "HostAppUsage", "MetricRequest", "PodUsage", "aggregated_usages",
           "format_duration", "koord_priority_class", "metric_request", "new_node_metric", "node_metric_status",
           "parse_duration", "report_interval_s"]

# What koord-manager writes into a NodeMetric it creates; koordnode creates one the same way
# when none exists yet (koord-manager's controller then keeps it).
DEFAULT_COLLECT_POLICY: Mapping[str, Any] = {
    "aggregateDurationSeconds": 300, "reportIntervalSeconds": 60,
    "nodeAggregatePolicy": {"durations": ["5m0s", "10m0s", "30m0s"]}, "nodeMemoryCollectPolicy": "usageWithoutPageCache"}


@dataclass(frozen=True)
class PodUsage:
    namespace: str
    name: str
    qos: str  # koordnode's class: LSE, LSR, LS, BE, SYSTEM
    priority: int | None  # spec.priority from the API; None: not known
    cpu_cores: float
    memory_bytes: int


@dataclass(frozen=True)
class HostAppUsage:
    """A host application's use, as NodeMetric's hostApplicationMetric reports it."""

    name: str
    qos: str
    priority: str  # Koordinator's priority class (koord-prod, koord-batch, ...)
    cpu_cores: float
    memory_bytes: int


@dataclass(frozen=True)
class MetricRequest:
    """What the NodeMetric's spec asks of the agent: how often, and over which windows its
    usage percentiles are wanted (spec.metricCollectPolicy.nodeAggregatePolicy.durations)."""

    interval_s: float
    aggregate_durations_s: tuple[float, ...] = ()


# koordlet's aggregation types, in its order; each a function of the sorted samples.
AGGREGATIONS = ("avg", "p50", "p90", "p95", "p99")
# A window is reported only once the samples span at least this share of it (koordlet's
# validateTimeRangeRatio: no percentiles from a cold start).
COVERAGE_RATIO = 0.5
Samples = Sequence[tuple[float, float]]  # (time in seconds, value), oldest first


def _aggregate(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    found = {"avg": sum(ordered) / len(ordered)}
    for name, share in (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99)):
        # koordlet's index: int(n x share) - 1, at least 0 (a lower percentile, no interpolation)
        found[name] = ordered[max(int(len(ordered) * share) - 1, 0)]
    return found


def aggregated_usages(cpu: Samples, memory: Samples | None, end: float,
                      durations_s: Sequence[float]) -> list[dict[str, Any]]:
    """One AggregatedUsage per window ending at `end`: avg and percentiles of the CPU (cores)
    and memory (bytes) samples in it. A window the samples do not cover enough (a cold start)
    gets empty resource maps, as koordlet sends them. `memory` None: CPU only."""
    usages = []
    for duration in durations_s:
        start = end - duration
        cpu_in = [(t, v) for t, v in cpu if start <= t <= end]
        memory_in = [(t, v) for t, v in memory if start <= t <= end] if memory is not None else []
        covered = cpu_in[-1][0] - cpu_in[0][0] if len(cpu_in) > 1 else 0.0
        usage: dict[str, Any] = {name: {} for name in AGGREGATIONS}
        if cpu_in and covered >= duration * COVERAGE_RATIO:
            cpu_at = _aggregate([v for _, v in cpu_in])
            memory_at = _aggregate([v for _, v in memory_in]) if memory_in else None
            for name in AGGREGATIONS:
                resources: dict[str, str] = {"cpu": _cpu(cpu_at[name])}
                if memory_at is not None:
                    resources["memory"] = str(max(int(memory_at[name]), 0))
                usage[name] = {"resources": resources}
        usages.append({"usage": usage, "duration": format_duration(duration)})
    return usages


_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_duration(text: Any) -> float | None:
    """A Go duration ("5m0s", "1h", "90s", "1m30s"), as metav1.Duration writes it, in seconds;
    None when it is not one."""
    if not isinstance(text, str) or not text or len(text) > 64:
        return None
    total, number, i = 0.0, "", 0
    while i < len(text):
        if text[i].isdigit() or text[i] == ".":
            number += text[i]
            i += 1
            continue
        unit = next((u for u in ("ms", "us", "µs", "ns", "h", "m", "s") if text.startswith(u, i)), None)
        if unit is None or not number:
            return None
        try:
            total += float(number) * _UNITS[unit]
        except ValueError:
            return None
        number, i = "", i + len(unit)
    return total if not number else None


def format_duration(seconds: float) -> str:
    """Seconds as Go's time.Duration prints them ("5m0s", "1h0m0s", "30s")."""
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def metric_request(obj: Mapping[str, Any], default_interval: int) -> MetricRequest:
    """The report interval and aggregation windows a NodeMetric's spec asks for (windows of at
    least a minute and at most a day; others are left out)."""
    spec = obj.get("spec")
    policy = spec.get("metricCollectPolicy") if isinstance(spec, Mapping) else None
    aggregate = policy.get("nodeAggregatePolicy") if isinstance(policy, Mapping) else None
    durations = aggregate.get("durations") if isinstance(aggregate, Mapping) else None
    windows = [parse_duration(d) for d in durations[:8]] if isinstance(durations, list) else []
    return MetricRequest(float(report_interval_s(obj, default_interval)),
                         tuple(w for w in windows if w is not None and 60 <= w <= 86400))


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
                       system_memory_bytes: int, pods: Sequence[PodUsage], now: datetime.datetime,
                       aggregated_node: Sequence[Mapping[str, Any]] = (),
                       aggregated_system: Sequence[Mapping[str, Any]] = (),
                       host_apps: Sequence[HostAppUsage] = ()) -> dict[str, Any]:
    """systemUsage is the use outside the pods and the host applications (koordlet's)."""
    node_metric: dict[str, Any] = {
        "nodeUsage": _resources(node_cpu_cores, node_memory_bytes),
        "systemUsage": _resources(system_cpu_cores, system_memory_bytes),
    }
    if aggregated_node:
        node_metric["aggregatedNodeUsages"] = list(aggregated_node)
    if aggregated_system:
        node_metric["aggregatedSystemUsages"] = list(aggregated_system)
    status: dict[str, Any] = {
        "updateTime": now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "nodeMetric": node_metric,
        "podsMetric": [
            {"namespace": p.namespace, "name": p.name, "qos": p.qos, "priority": koord_priority_class(p.priority),
             "podUsage": _resources(p.cpu_cores, p.memory_bytes)}
            for p in pods
        ],
    }
    if host_apps:
        status["hostApplicationMetric"] = [
            {"name": h.name, "usage": _resources(h.cpu_cores, h.memory_bytes), "priority": h.priority, "qos": h.qos}
            for h in sorted(host_apps, key=lambda h: h.name)]
    return status


def new_node_metric(node_name: str) -> dict[str, Any]:
    return {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric",
            "metadata": {"name": node_name}, "spec": {"metricCollectPolicy": copy.deepcopy(dict(DEFAULT_COLLECT_POLICY))}}


def report_interval_s(obj: Mapping[str, Any], default: int) -> int:
    """spec.metricCollectPolicy.reportIntervalSeconds, within [5, 3600]; `default` when absent or odd."""
    spec = obj.get("spec")
    policy = spec.get("metricCollectPolicy") if isinstance(spec, Mapping) else None
    value = policy.get("reportIntervalSeconds") if isinstance(policy, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return default
    return min(max(value, 5), 3600)
