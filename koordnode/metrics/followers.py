"""Metrics read from their owners at each scrape instead of being recorded: the hook chain's
failure counts, the CRI proxy's connection counters and the pods' CPU pressure and throttling.
A source that fails mid-change gives no series for that scrape, never a failed scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from koordnode.metrics.types import Family
from koordnode.model.interference import PodInterference

__all__ = ["FollowHookFailures", "FollowInterference", "FollowProxyStats"]


class FollowHookFailures:
    def __init__(self, source: Callable[[], Mapping[tuple[str, str, str], int]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Family]:
        family = Family("koordnode_hook_failures_total", "counter",
                        "Runtime hook failures by hook, phase and kind (error, timeout)")
        try:
            snapshot = dict(self._source())
        except Exception:  # a scrape must not fail because the source is mid-change
            snapshot = {}
        for (hook, phase, kind), count in sorted(snapshot.items()):
            family.add((("hook", hook), ("phase", phase), ("kind", kind)), count)
        yield family


class FollowInterference:
    def __init__(self, source: Callable[[], Iterable[PodInterference]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Family]:
        pressure = Family("koordnode_pod_cpu_pressure_seconds_total", "counter",
                          "Time some task of the pod waited for a CPU (cpu.pressure some total)")
        throttled = Family("koordnode_pod_cpu_throttled_seconds_total", "counter",
                           "Time the pod was throttled by CFS quotas")
        class_pressure = Family("koordnode_class_cpu_pressure_seconds_total", "counter",
                                "Sum of koordnode_pod_cpu_pressure_seconds_total per class")
        class_throttled = Family("koordnode_class_cpu_throttled_seconds_total", "counter",
                                 "Sum of koordnode_pod_cpu_throttled_seconds_total per class")
        try:
            rows = list(self._source())
        except Exception:  # a scrape must not fail because the source is mid-change
            rows = []
        sums: dict[str, list[float]] = {}
        for row in rows:
            sums.setdefault(row.qos_class, [0.0, 0.0])
            labels = (("namespace", row.namespace), ("pod", row.pod), ("class", row.qos_class))
            if row.cpu_pressure_s is not None:
                pressure.add(labels, row.cpu_pressure_s)
                sums[row.qos_class][0] += row.cpu_pressure_s
            if row.cpu_throttled_s is not None:
                throttled.add(labels, row.cpu_throttled_s)
                sums[row.qos_class][1] += row.cpu_throttled_s
        for cls, (p, t) in sorted(sums.items()):
            class_pressure.add((("class", cls),), p)
            class_throttled.add((("class", cls),), t)
        yield from (pressure, throttled, class_pressure, class_throttled)


class FollowProxyStats:
    """A ``ProxyStats``-like object's counters (missing attributes read as 0)."""

    def __init__(self, stats: Any) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Family]:
        for name, kind, help_text, attribute in (
            ("koordnode_proxy_connections_open", "gauge", "kubelet connections open to the CRI proxy",
             "connections_open"),
            ("koordnode_proxy_connections_total", "counter", "kubelet connections accepted by the CRI proxy",
             "connections_total"),
            ("koordnode_proxy_intercepted_calls_total", "counter", "CRI calls that went through the hooks",
             "intercepted_calls"),
            ("koordnode_dry_run_unchanged_requests_total", "counter",
             "Dry run: CRI requests the hooks would have changed, forwarded unchanged", "dry_run_changed_requests"),
        ):
            family = Family(name, kind, help_text)
            family.add((), getattr(self._stats, attribute, 0))
            yield family
