"""The :class:`Metrics` koordnode records into: what it did and what it sees, on a private registry.

One :class:`Metrics` object owns every metric (``koordnode_...``); the daemon constructs it and
hands it to whoever records. Recording is thread-safe: the event loop (CRI calls), hook threads
and reconcile passes (applied values, writes), the QoS tick's thread and the metrics server's
scrapes all use it at once; the metrics lock themselves (:mod:`koordnode.metrics.types`), and
the bookkeeping here is under one lock. :func:`koordnode.metrics.server.start` serves it over
HTTP at ``/metrics`` from a thread. Names follow Prometheus conventions: counters end in
``_total``, values are in base units (seconds, bytes, cores, ratios 0..1).

Exported metrics (labels in braces):

- ``koordnode_build_info{version,python_version}`` (always 1), ``koordnode_start_time_seconds``,
  ``koordnode_uptime_seconds``; ``process_*`` and ``python_info`` (:mod:`koordnode.metrics.process`).
- ``koordnode_cri_requests_total{method,code}``, ``koordnode_cri_request_duration_seconds{method}``
  (histogram): intercepted CRI calls by gRPC method and status code name (``OK``, ...); a
  path that names no CRI method counts as ``other``, so clients cannot grow the label set.
- ``koordnode_cri_hook_delay_seconds{method}`` (histogram): the time a call waited for the Pre
  hooks before it was forwarded, i.e. the latency koordnode adds (the duration above also has
  the runtime's own time).
- ``koordnode_hook_failures_total{hook,phase,kind}``: hook errors (``kind="error"``) and
  timeouts (``kind="timeout"``), read from the hook chain's counters at scrape time.
- ``koordnode_proxy_connections_open``, ``koordnode_proxy_connections_total``,
  ``koordnode_proxy_intercepted_calls_total``: read from the proxy's stats at scrape time.
- ``koordnode_applied_cpu_shares``, ``_cpu_quota_cores``, ``_cpuset_cpus`` (number of CPUs),
  ``_memory_min_bytes``, ``_memory_low_bytes``, ``_memory_high_bytes``, ``_oom_score_adj``,
  ``_blkio_weight``, all ``{namespace,pod,container,class}``: the values koordnode applied,
  ``container=""`` for the pod-level cgroup. No series while a value is unlimited/unset.
- ``koordnode_be_cpu_quota_cores`` (the CPU budget of the BE tier; -1 = unlimited) and
  ``koordnode_be_cpu_suppress_ratio`` (the factor LS pressure applies to that budget; 1 = none).
- ``koordnode_psi_avg10_ratio{scope,resource,kind}``: PSI ``some``/``full`` avg10 as 0..1.
- ``koordnode_pod_cpu_pressure_seconds_total{namespace,pod,class}``: time some task of a non-BE
  pod waited for a CPU (the pod cgroup's cpu.pressure ``some total``), and
  ``koordnode_class_cpu_pressure_seconds_total{class}`` its sum per class: interference as the
  pods feel it (``rate()`` = fraction of time stalled). ``koordnode_pod_cpu_throttled_seconds_total``
  and ``koordnode_class_cpu_throttled_seconds_total``: time throttled by CFS quotas. Read from
  the cgroups at each scrape; a pod whose file is missing has no series.
- ``koordnode_executor_writes_total{resource,outcome}``: kernel writes by outcome
  (``written``, ``unchanged``, ``skipped``, ``missing``, ``failed``, ``refused``).
- ``koordnode_cgroup_overwrites_total{resource}``: values koordnode owns that another writer
  (systemd, kubelet, a script) changed; each is restored by the write that counts it.
- ``koordnode_evictions_total{reason}`` (``memory``, ``cpu``, ``other``).
- ``koordnode_config_reloads_total{result}``, ``koordnode_config_last_reload_successful``,
  ``koordnode_config_last_reload_timestamp_seconds``.

Recording never raises on bad input: a value that cannot be read is skipped (and reported by
the return value where there is one), because metrics must not break the daemon.
"""

from __future__ import annotations

import dataclasses
import platform
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from koordnode import __version__
from koordnode.cri import api_pb2 as _cri
from koordnode.cri.grpc_wire import STATUS_NAMES, status_name
from koordnode.metrics.exposition import render
from koordnode.metrics.followers import FollowHookFailures, FollowInterference, FollowProxyStats
from koordnode.metrics.process import PlatformCollector, ProcessCollector
from koordnode.metrics.types import Collector, Counter, Gauge, Histogram, Registry
from koordnode.model.cpulist import CpuListError, parse_cpu_list
from koordnode.model.interference import PodInterference
from koordnode.model.kernel import DEFAULT_CFS_PERIOD_US

__all__ = ["METRICS", "Metrics", "NO_STATUS", "OTHER_METHOD"]

# ---------------------------------------------------------------------------------------------
# The metrics

# From microseconds of hook work to the seconds a slow runtime can take.
_CRI_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                5.0, 10.0, 30.0, 60.0)

# The call ended without a grpc-status (stream reset, connection lost).
NO_STATUS = "NO_STATUS"
# The `method` label of a call to a method CRI does not define: the client writes the :path,
# so anything else would let it create series without end.
OTHER_METHOD = "other"
_CRI_SERVICES = ("RuntimeService", "ImageService")
_CRI_METHOD_NAMES = frozenset(
    m.name for svc in _CRI_SERVICES for m in _cri.DESCRIPTOR.services_by_name[svc].methods)
_CRI_PATH = re.compile(r"/runtime\.(?:v1|v1alpha2)\.(?:RuntimeService|ImageService)/(\w+)")

_POD_LABELS = ("namespace", "pod", "container", "class")

# Keys accepted by Metrics.set_applied: executor resource names, and the CRI field names of
# LinuxContainerResources for the same values.
_ALIASES = {
    "cpu_shares": "cpu.shares",
    "cpu_quota": "cpu.cfs_quota_us",
    "cpu_period": "cpu.cfs_period_us",
    "cpuset_cpus": "cpuset.cpus",
}
_APPLIED_KEYS = frozenset({"cpu.shares", "cpu.cfs_quota_us", "cpu.cfs_period_us", "cpuset.cpus",
                           "memory.min", "memory.low", "memory.high", "oom_score_adj",
                           "blkio.weight"})


@dataclass
class _AppliedSeries:
    qos_class: str
    values: dict[str, float] = dataclasses.field(default_factory=dict)  # gauge name -> value
    quota_us: int | None = None
    period_us: int = DEFAULT_CFS_PERIOD_US


class Metrics:
    """Every koordnode metric, on its own registry (nothing global is touched)."""

    def __init__(self, *, registry: Registry | None = None,
                 process_metrics: bool = True, clock: Callable[[], float] = time.time) -> None:
        self.registry = registry if registry is not None else Registry()
        r = self.registry
        self._clock = clock
        self._lock = threading.Lock()  # guards the bookkeeping below (any thread); gauges lock themselves
        self._applied: dict[tuple[str, str, str], _AppliedSeries] = {}
        self._followers: dict[str, Collector] = {}
        # Gauges the QoS tick sets every tick, with the value last set: unchanged values are not
        # set again (a labelled set is a lookup and a lock; PSI averages move every 2 s).
        self._gauge_last: dict[tuple[Any, ...], float] = {}

        if process_metrics:
            r.register(ProcessCollector())
            r.register(PlatformCollector())

        self.build_info = Gauge("koordnode_build_info",
                                "koordnode build, always 1; the labels carry the information",
                                ["version", "python_version"], registry=r)
        self.build_info.labels(__version__, platform.python_version()).set(1)
        self.started_at = clock()
        Gauge("koordnode_start_time_seconds", "Unix time koordnode started",
              registry=r).set(self.started_at)
        Gauge("koordnode_uptime_seconds", "Seconds since koordnode started",
              registry=r).set_function(lambda: max(0.0, self._clock() - self.started_at))

        self.cri_requests = Counter(
            "koordnode_cri_requests_total",
            "CRI calls koordnode relayed, by gRPC method and status code",
            ["method", "code"], registry=r)
        self.cri_duration = Histogram(
            "koordnode_cri_request_duration_seconds",
            "Time from a CRI request reaching koordnode to its response leaving, hooks included",
            ["method"], buckets=_CRI_BUCKETS, registry=r)

        self.hook_delay = Histogram(
            "koordnode_cri_hook_delay_seconds",
            "Time a CRI request waited for koordnode's Pre hooks before it was forwarded: the "
            "latency koordnode adds to the call",
            ["method"], buckets=_CRI_BUCKETS, registry=r)

        self.executor_writes = Counter(
            "koordnode_executor_writes_total",
            "Kernel writes (cgroup files, sysctls) by resource and outcome",
            ["resource", "outcome"], registry=r)
        self.dry_run = Gauge("koordnode_dry_run",
                             "1 while koordnode runs in dry-run mode (decides and reports, writes "
                             "nothing to the kernel, forwards CRI requests unchanged)", registry=r)
        self.cgroup_overwrites = Counter(
            "koordnode_cgroup_overwrites_total",
            "Values koordnode owns that another writer changed (then restored), by resource",
            ["resource"], registry=r)
        self.evictions = Counter("koordnode_evictions_total",
                                 "BE containers koordnode evicted, by reason", ["reason"],
                                 registry=r)

        self._applied_gauges = {
            name: Gauge(name, doc, _POD_LABELS, registry=r)
            for name, doc in (
                ("koordnode_applied_cpu_shares", "cpu.shares applied"),
                ("koordnode_applied_cpu_quota_cores",
                 "CFS quota applied, in cores (quota / period); no series when unlimited"),
                ("koordnode_applied_cpuset_cpus", "Number of CPUs in the cpuset applied"),
                ("koordnode_applied_memory_min_bytes", "memory.min applied"),
                ("koordnode_applied_memory_low_bytes", "memory.low applied"),
                ("koordnode_applied_memory_high_bytes", "memory.high applied; no series when max"),
                ("koordnode_applied_oom_score_adj", "oom_score_adj applied"),
                ("koordnode_applied_blkio_weight", "blkio weight applied"),
            )
        }

        self.be_cpu_quota = Gauge(
            "koordnode_be_cpu_quota_cores",
            "CPU the best-effort tier may use now, in cores; -1 when unlimited", registry=r)
        self.be_cpu_quota.set(-1)
        self.be_suppress_ratio = Gauge(
            "koordnode_be_cpu_suppress_ratio",
            "Factor LS CPU pressure applies to the best-effort CPU budget (1 = no reduction)",
            registry=r)
        self.be_suppress_ratio.set(1)
        self.psi = Gauge(
            "koordnode_psi_avg10_ratio",
            "Pressure stall information, 10 s average, as a ratio 0..1 (kernel percent / 100)",
            ["scope", "resource", "kind"], registry=r)

        self.config_reloads = Counter("koordnode_config_reloads_total",
                                      "Configuration reloads by result (success, failure)",
                                      ["result"], registry=r)
        self.config_last_reload_ok = Gauge("koordnode_config_last_reload_successful",
                                           "1 if the last configuration reload was applied",
                                           registry=r)
        self.config_last_reload_ok.set(1)
        self.config_last_reload_time = Gauge(
            "koordnode_config_last_reload_timestamp_seconds",
            "Unix time of the last configuration reload attempt (0: none yet)", registry=r)

        # [kubernetes]: the API server link, NodeSLO, evictions through the API; batch resources.
        self.kube_api_up = Gauge("koordnode_kube_api_up",
                                 "1 while the API server answers koordnode's watches ([kubernetes] enable)",
                                 registry=r)
        self.nodeslo_updates = Counter("koordnode_nodeslo_updates_total",
                                       "NodeSLO versions seen, by result (applied, refused)", ["result"],
                                       registry=r)
        self.nodeslo_refused = Gauge("koordnode_nodeslo_refused",
                                     "1 while the newest NodeSLO is refused (the last good one stays applied)",
                                     registry=r)
        self.api_evictions = Counter("koordnode_api_evictions_total",
                                     "Evictions asked of the Eviction API, by result (evicted, refused, "
                                     "already_terminating, gone, rate_limited, failed)", ["result"], registry=r)
        for result in ("applied", "refused"):  # the series exist at 0 from the start
            self.nodeslo_updates.labels(result)
        for result in ("evicted", "refused", "already_terminating", "gone", "rate_limited", "failed"):
            self.api_evictions.labels(result)
        self.batch_allocatable = Gauge(
            "koordnode_batch_allocatable",
            "Batch resources BE pods may use by Koordinator v1.2's formula (Node.Alloc - Node.Reserved - "
            "System.Used - Pod(LS).Used), by resource (cpu: cores, memory: bytes)", ["resource"], registry=r)

    # --- exposition ---------------------------------------------------------------------

    def render(self) -> bytes:
        """The current metrics in the Prometheus text format."""
        return render(self.registry.collect())

    # --- CRI, hooks, proxy --------------------------------------------------------------

    def observe_cri_call(self, method: str, code: int | str | None, seconds: float) -> None:
        """One intercepted CRI call: ``method`` as the gRPC path or its last part, ``code``
        the grpc-status number or name (None: the call ended without a status). A method CRI
        does not define is counted as ``other``."""
        name = _method_label(method)
        self.cri_requests.labels(name, _code_name(code)).inc()
        if seconds >= 0:
            self.cri_duration.labels(name).observe(seconds)

    def cri_calls_by_method(self) -> dict[str, int]:
        """CRI calls relayed so far by method (all status codes together)."""
        calls: dict[str, int] = {}
        for (method, _code), count in self.cri_requests.values().items():
            calls[method] = calls.get(method, 0) + int(count)
        return calls

    def observe_hook_delay(self, method: str, seconds: float) -> None:
        """How long an intercepted call's Pre hooks held it before it went to the runtime."""
        if seconds >= 0:
            self.hook_delay.labels(_method_label(method)).observe(seconds)

    def follow_hook_failures(
        self, source: Callable[[], Mapping[tuple[str, str, str], int]]
    ) -> None:
        """Export ``source()`` -- {(hook, phase, kind): count}, e.g. ``HookChain.failures`` --
        as ``koordnode_hook_failures_total``, read at each scrape. A later call replaces it."""
        self._follow("hook_failures", FollowHookFailures(source))

    def follow_proxy_stats(self, stats: Any) -> None:
        """Export a ``ProxyStats``-like object's connection and call counts at each scrape.
        A later call replaces it."""
        self._follow("proxy_stats", FollowProxyStats(stats))

    def follow_interference(self, source: Callable[[], Iterable[PodInterference]]) -> None:
        """Export per-pod and per-class CPU pressure and throttling from ``source()``, read at
        each scrape. A later call replaces it."""
        self._follow("interference", FollowInterference(source))

    def _follow(self, name: str, collector: Collector) -> None:
        with self._lock:
            previous = self._followers.pop(name, None)
            if previous is not None:
                self.registry.unregister(previous)
            self.registry.register(collector)
            self._followers[name] = collector

    # --- executor, evictions, config ----------------------------------------------------

    def record_write(self, resource: str, outcome: str) -> None:
        self.executor_writes.labels(resource, outcome).inc()

    def record_writes(self, results: Iterable[Any]) -> None:
        """Count executor results (``WriteResult``: ``.write.resource`` or ``.write.name``
        for sysctls, and ``.status``)."""
        counts: dict[tuple[str, str], int] = {}  # one counter update per label set (a reconcile pass has hundreds)
        for result in results:
            write = getattr(result, "write", None)
            resource = getattr(write, "resource", None) or getattr(write, "name", None) or "unknown"
            status = getattr(result, "status", "unknown")
            key = (str(resource), str(getattr(status, "value", status)))
            counts[key] = counts.get(key, 0) + 1
            if getattr(result, "overwritten", False) is True:
                self.cgroup_overwrites.labels(str(resource)).inc()
        for (resource, outcome), count in counts.items():
            self.executor_writes.labels(resource, outcome).inc(count)

    def record_eviction(self, reason: str, count: int = 1) -> None:
        """Count evictions by a short reason (``memory``, ``cpu``). A free-text reason, such as
        ``Eviction.reason``, is reduced to one of ``memory``, ``cpu`` or ``other`` so that the
        label cannot grow a series per pod."""
        if count > 0:
            self.evictions.labels(_reason_label(reason)).inc(count)

    def record_nodeslo(self, applied: bool) -> None:
        self.nodeslo_updates.labels("applied" if applied else "refused").inc()
        self.nodeslo_refused.set(0 if applied else 1)

    def record_api_eviction(self, result: str) -> None:
        self.api_evictions.labels(result).inc()

    def observe_cluster(self, kind: str, result: str) -> None:
        """The cluster link's outcomes (its `observe`): a NodeSLO applied or refused, an eviction
        asked of the API."""
        if kind == "nodeslo":
            self.record_nodeslo(result == "applied")
        elif kind == "eviction":
            self.record_api_eviction(result)

    def set_batch_allocatable(self, cpu_cores: float | None, memory_bytes: float | None) -> None:
        for resource, value in (("cpu", cpu_cores), ("memory", memory_bytes)):
            if value is not None:
                self.batch_allocatable.labels(resource).set(value)

    def record_config_reload(self, success: bool) -> None:
        self.config_reloads.labels("success" if success else "failure").inc()
        self.config_last_reload_ok.set(1 if success else 0)
        self.config_last_reload_time.set(self._clock())

    # --- QoS manager --------------------------------------------------------------------

    def set_be_cpu(self, quota_cores: float | None, suppress_ratio: float = 1.0) -> None:
        """BE tier CPU after a cpu_suppress decision: the budget in cores (None = unlimited;
        ``Budget.cpus``) and the pressure factor applied to it (``Budget.ratio``)."""
        self._set_if_changed(("be_cpu_quota",), self.be_cpu_quota,
                             -1 if quota_cores is None else max(0.0, float(quota_cores)))
        self._set_if_changed(("be_suppress_ratio",), self.be_suppress_ratio, max(0.0, float(suppress_ratio)))

    def set_psi(self, resource: str, *, some_avg10: float | None,
                full_avg10: float | None = None, scope: str = "node") -> None:
        """PSI avg10 values as the kernel prints them (percent, 0..100) for ``resource``
        (cpu, memory, io) of ``scope`` (``node``, or e.g. a tier such as ``be``)."""
        for kind, percent in (("some", some_avg10), ("full", full_avg10)):
            if percent is not None:
                value = float(percent) / 100.0
                with self._lock:
                    if self._changed(("psi", scope, resource, kind), value):  # the labelled lookup only then
                        self.psi.labels(scope, resource, kind).set(value)

    def _set_if_changed(self, key: tuple[Any, ...], gauge: Gauge, value: float) -> None:
        with self._lock:  # the check and the set together: another thread's newer value is not undone
            if self._changed(key, value):
                gauge.set(value)

    def _changed(self, key: tuple[Any, ...], value: float) -> bool:
        """Whether `value` differs from the last one set under `key` (and remember it); the
        caller holds the lock."""
        if self._gauge_last.get(key) == value:
            return False
        self._gauge_last[key] = value
        return True

    def set_pressures(self, pressures: Mapping[str, Any], *, scope: str = "node") -> None:
        """Every resource of a {resource: Pressure or None} map (``NodeSample.pressure``):
        objects with ``.some.avg10`` and ``.full`` (None or ``.avg10``)."""
        for resource, pressure in pressures.items():
            some = getattr(pressure, "some", None)
            if some is None:
                continue
            full = getattr(pressure, "full", None)
            self.set_psi(resource, some_avg10=some.avg10,
                         full_avg10=None if full is None else full.avg10, scope=scope)

    # --- per-pod applied values ---------------------------------------------------------

    def set_applied(self, namespace: str, pod: str, container: str, qos_class: str,
                    values: Mapping[str, Any]) -> list[str]:
        """Record values applied to a pod (``container=""``) or container.

        ``values`` maps executor resource names (``cpu.shares``, ``cpu.cfs_quota_us``,
        ``cpu.cfs_period_us``, ``cpuset.cpus``, ``memory.min``, ``memory.low``,
        ``memory.high``, ``blkio.weight``) or CRI field names (``cpu_shares``, ``cpu_quota``,
        ``cpu_period``, ``cpuset_cpus``) and ``oom_score_adj`` to what was written. Keys not
        given keep their last value; None, ``"max"`` or a quota <= 0 drop the series. A new
        ``qos_class`` relabels the series. Returns the keys that were ignored (unknown key
        or unreadable value).
        """
        key = (namespace, pod, container)
        ignored: list[str] = []
        with self._lock:
            series = self._applied.get(key)
            published: dict[str, float] | None = None  # what the gauges hold now, if known
            if series is None:
                series = self._applied[key] = _AppliedSeries(qos_class)
            elif series.qos_class != qos_class:
                self._remove_series(key, series)
                series.qos_class = qos_class
            else:
                published = dict(series.values)
            for raw_key, raw_value in values.items():
                name = _ALIASES.get(raw_key, raw_key)
                if name not in _APPLIED_KEYS:
                    ignored.append(raw_key)
                    continue
                try:
                    self._update(series, name, raw_value)
                except (TypeError, ValueError):
                    ignored.append(raw_key)
            if series.values != published:  # every reconcile pass reports the same values again
                self._publish(key, series)
        return ignored

    def drop_container(self, namespace: str, pod: str, container: str) -> None:
        with self._lock:
            series = self._applied.pop((namespace, pod, container), None)
            if series is not None:
                self._remove_series((namespace, pod, container), series)

    def drop_pod(self, namespace: str, pod: str) -> None:
        """Remove every applied-value series of a pod (pod level and all its containers)."""
        with self._lock:
            for key in [k for k in self._applied if k[:2] == (namespace, pod)]:
                self._remove_series(key, self._applied.pop(key))

    def _update(self, series: _AppliedSeries, name: str, value: Any) -> None:
        if name == "cpu.cfs_period_us":
            period = _as_int(value)
            if period is not None and period > 0:
                series.period_us = period
        elif name == "cpu.cfs_quota_us":
            quota = _as_int(value)
            series.quota_us = quota if quota is not None and quota > 0 else None
        elif name == "cpuset.cpus":
            _set(series.values, "koordnode_applied_cpuset_cpus",
                 None if value is None else _count_cpus(value))
        elif name.startswith("memory."):
            gauge = "koordnode_applied_memory_" + name.split(".", 1)[1] + "_bytes"
            _set(series.values, gauge, None if value in (None, "max") else _as_int(value))
        else:
            gauge = {"cpu.shares": "koordnode_applied_cpu_shares",
                     "oom_score_adj": "koordnode_applied_oom_score_adj",
                     "blkio.weight": "koordnode_applied_blkio_weight"}[name]
            _set(series.values, gauge, _as_int(value))
        if name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"):
            cores = None if series.quota_us is None else series.quota_us / series.period_us
            _set(series.values, "koordnode_applied_cpu_quota_cores", cores)

    def _publish(self, key: tuple[str, str, str], series: _AppliedSeries) -> None:
        labels = (*key, series.qos_class)
        for name, gauge in self._applied_gauges.items():
            if name in series.values:
                gauge.labels(*labels).set(series.values[name])
            else:
                gauge.remove(*labels)

    def _remove_series(self, key: tuple[str, str, str], series: _AppliedSeries) -> None:
        for gauge in self._applied_gauges.values():
            gauge.remove(*key, series.qos_class)


def _method_label(method: str) -> str:
    """A CRI method's name from its gRPC path (v1 or v1alpha2) or name; ``other`` otherwise."""
    label = _method_labels.get(method)
    if label is not None:
        return label
    name = method
    if "/" in method:
        match = _CRI_PATH.fullmatch(method)
        name = match.group(1) if match else ""
    label = name if name in _CRI_METHOD_NAMES else OTHER_METHOD
    if label != OTHER_METHOD:  # only CRI's own paths are kept: a client's others are unbounded
        _method_labels[method] = label
    return label


# Labels by the path or name they came from (every relayed call asks).
_method_labels: dict[str, str] = {}


def _code_name(code: int | str | None) -> str:
    """The status code's name; a value gRPC does not define counts as UNKNOWN (as gRPC clients
    read it), so the label stays one of 18 values."""
    if code is None:
        return NO_STATUS
    if isinstance(code, int) and not isinstance(code, bool):
        return status_name(code)
    name = getattr(code, "name", None)  # grpc.StatusCode
    name = str(name if name is not None else code).upper()
    return name if name in STATUS_NAMES or name == NO_STATUS else "UNKNOWN"


_SHORT_REASON = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def _reason_label(reason: str) -> str:
    if _SHORT_REASON.match(reason):
        return reason
    text = reason.lower()
    if "memory" in text:
        return "memory"
    return "cpu" if "cpu" in text else "other"


def _as_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError("a boolean is not a number")
    if isinstance(value, str):
        return int(value.strip())
    return int(value)


def _count_cpus(value: Any) -> int:
    """Number of CPUs in a cpulist such as "0-3,8" (an int is taken as the count)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return len(parse_cpu_list(str(value)))
    except CpuListError as err:
        raise ValueError(str(err)) from None


def _set(values: dict[str, float], name: str, value: float | None) -> None:
    if value is None:
        values.pop(name, None)
    else:
        values[name] = float(value)


# The process's default instance: the daemon's unless it is handed another. The QoS engine still
# records here directly (until it is handed the daemon's). Tests build their own Metrics().
METRICS = Metrics()
