"""What the QoS side hands to the metrics: each tick's outcome, and the pods' CPU interference
read at scrape time. Each feeder owns its reading; the daemon only constructs and wires them
(qos/ does not import the metrics: `TickGauges` is what a tick needs of `metrics.Metrics`).

Both run outside the event loop (the tick's thread, the metrics server's thread): `Metrics`
is thread-safe, and each feeder keeps what it reads to itself (a Collector is not shared
across threads)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from koordnode.config.cgroup import CgroupConfig
from koordnode.executor.paths import UnsafePathError, container_cgroup_path, pod_cgroup_path
from koordnode.model.interference import PodInterference
from koordnode.model.state import POD_READY, NodeState
from koordnode.policy.strategies.common import BeBudget, fact
from koordnode.qos.collect import Collector
from koordnode.qos.tick import TickReport


class TickGauges(Protocol):
    def record_writes(self, results: Iterable[Any]) -> None: ...

    def set_pressures(self, pressures: Mapping[str, Any], *, scope: str = "node") -> None: ...

    def set_be_cpu(self, quota_cores: float | None, suppress_ratio: float = 1.0) -> None: ...


class TickMetrics:
    """After every QoS manager tick (its `on_tick`, in the tick's thread): the kernel writes,
    the node's pressure, and the BE tier's CPU budget as cpu_suppress decided it."""

    def __init__(self, metrics: TickGauges) -> None:
        self._metrics = metrics

    def __call__(self, report: TickReport) -> None:
        self._metrics.record_writes(report.writes)
        if report.node is not None:
            self._metrics.set_pressures(report.node.pressure)
        if "cpu_suppress" not in report.results:
            return  # off, or a tick woken early it did not decide in: the last values stay
        budget = fact(report.results["cpu_suppress"], BeBudget)
        if budget is None:  # warming up: no budget yet
            self._metrics.set_be_cpu(None, 1.0)
            return
        # Sysctl writes (memory_qos watermarks) are in the list too: compared by value, only
        # the plan's quota write matches.
        written = budget.quota_write is not None and any(
            result.ok and result.write == budget.quota_write for result in report.writes)
        self._metrics.set_be_cpu(budget.quota_cores(written=written), budget.pressure_ratio)


class PodInterferenceReader:
    """CPU pressure and throttling of the non-BE pods, read from their cgroups at each scrape
    (in the metrics server's thread, with a collector of its own, made at the first scrape)."""

    def __init__(self, state: NodeState, cgroup: CgroupConfig, procfs_root: str) -> None:
        self._state = state
        self._cgroup_root = cgroup.root  # fixed until the restart, as everywhere
        self._driver = cgroup.driver
        self._procfs_root = procfs_root
        self._collector: Collector | None = None

    def reconfigure(self, cgroup: CgroupConfig) -> None:
        self._driver = cgroup.driver

    def __call__(self) -> list[PodInterference]:
        if self._collector is None:
            self._collector = Collector(self._procfs_root, self._cgroup_root)
        collector, driver = self._collector, self._driver
        rows = []
        for pod in list(self._state.pods.values()):
            if pod.state != POD_READY or not pod.qos_class or pod.qos_class == "BE":
                continue
            try:
                cgroup = pod_cgroup_path(pod.cgroup_parent, driver)
                containers = [container_cgroup_path(pod.cgroup_parent, c.container_id, driver)
                              for c in self._state.containers_of(pod.sandbox_id)]
            except UnsafePathError:
                continue
            pressure = collector.pressure(cgroup, "cpu")
            throttled = None
            for cg in [cgroup, *containers]:  # a quota throttles the cgroup it is set on
                stat = collector.cpu_stat(cg)
                if stat is not None:
                    throttled = (throttled or 0.0) + stat.throttled_ns / 1e9
            rows.append(PodInterference(pod.namespace, pod.name, pod.qos_class,
                                        pressure.some.total_us / 1e6 if pressure is not None else None, throttled))
        return rows
