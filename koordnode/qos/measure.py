"""Measuring: from the inventory and the kernel's statistics to one TickSnapshot per tick.

Owns what measuring needs between ticks (the previous usage and pressure samples, the
node/system usage window, the bounded history) and the node-reserved CPUs (the allocator's
rule). Where kubelet's top pod cgroup, its QoS tiers and koordnode's BE group are is the
KubeletLayout's (model/kubelet_layout.py), shared with the engine. Reads only; touched by one
tick at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
import structlog

from koordnode.policy.plan import CgroupWrite
from koordnode.model.cpu_topology import CpuInfo, CpuTopology, TopologyError, read_cpu_topology
from koordnode.policy.cpuset import reserved_cpus_from_config
from koordnode.model.kernel import is_lowest_cpu_weight
from koordnode.model.qos_class import CPU_OWNING_CLASSES, QoSClass
from koordnode.policy.strategies.base import NON_BE_CLASSES, Inventory, TickSnapshot
from koordnode.qos.collect import Collector, NodeSample
from koordnode.config.components import ManagerSettings
from koordnode.config.host_apps import HostApplication, host_app_cgroup
from koordnode.qos.history import History
from koordnode.model.kubelet_layout import KubeletLayout, KubeletPaths

log = structlog.get_logger("koordnode.qos")

# The hooks' memory writes; None while another pass keeps the pods' values (memory_qos then
# keeps only the node watermarks), with the reason in the planner's `note` attribute.
MemoryPlanFn = Callable[[], Iterable[CgroupWrite] | None]
ReservedCpus = frozenset[int] | Callable[[], frozenset[int]] | None

# Rates over shorter intervals than this are too noisy; the previous rate is kept instead.
MIN_RATE_INTERVAL_S = 0.005
# System usage (node minus pods) is measured over at least this long: /proc/stat counts in
# 10 ms ticks, too coarse for the short intervals of pressure-woken ticks.
SYSTEM_WINDOW_S = 1.0
# The node's usage over NodeMetric's aggregation windows (koord-manager asks for 5, 10 and 30
# minutes): one sample a second at most, 31 minutes of them (~90 KiB for the three series).
USAGE_WINDOW_SAMPLES = 31 * 60
USAGE_WINDOW_SPACING_S = 1.0


def woken_early(woken_by: str | None) -> bool:
    """A tick woken between ticks (pressure or LS usage) serves the early strategies alone."""
    return woken_by is not None and woken_by.startswith(("pressure:", "usage:"))


def _own_cores(online: frozenset[int]) -> CpuTopology:
    """A topology where every CPU is its own core (when sysfs cannot be read)."""
    return CpuTopology(tuple(CpuInfo(cpu=cpu, socket=0, core=cpu, numa_node=0) for cpu in sorted(online)))


def reserved_from_config(value: str | int, online: frozenset[int], topology: CpuTopology | None) -> frozenset[int]:
    """[node] reserved_cpus resolved as the CPU allocator does (a count takes whole cores
    first, cpuset_allocator.reserved_cpus_from_config), limited to the online CPUs."""
    if value in ("", 0) or not online:
        return frozenset()
    if topology is None or not topology.online & online:
        topology = _own_cores(online)
    reserved, _ = reserved_cpus_from_config(value, topology)
    return reserved & online


class CollectorProbe:
    """The strategies' read-only questions (policy/strategies/base.Probe), answered from the
    manager's collector and the hooks' memory planner."""

    def __init__(self, collector: Collector, memory_plan: MemoryPlanFn | None) -> None:
        self._collector = collector
        self._memory_plan = memory_plan

    def cfs_quota(self, cgroup: str) -> tuple[int, int] | None:
        return self._collector.cfs_quota(cgroup)

    def cpuset_cpus(self, cgroup: str) -> frozenset[int] | None:
        return self._collector.cpuset_cpus(cgroup)

    def cpu_idle(self, cgroup: str) -> bool | None:
        text = self._collector.cgroup_file_text("cpu", cgroup, "cpu.idle")
        return None if text is None else text.strip() == "1"

    def cpu_lowest_weight(self, cgroup: str) -> bool | None:
        v2 = self._collector.is_v2
        return is_lowest_cpu_weight(self._collector.cgroup_file_text("cpu", cgroup, "cpu.weight" if v2 else "cpu.shares"), v2)

    def nr_throttled(self, cgroup: str) -> int | None:
        stat = self._collector.cpu_stat(cgroup)
        return stat.nr_throttled if stat is not None else None

    def working_set_bytes(self, cgroup: str) -> int | None:
        usage = self._collector.memory_usage(cgroup)
        if usage is None:
            return None
        stat = self._collector.memory_stat(cgroup)
        return stat.working_set(usage) if stat is not None else usage

    def memory_plan(self) -> tuple[CgroupWrite, ...] | None:
        if self._memory_plan is None:
            return None
        try:
            planned = self._memory_plan()
            return None if planned is None else tuple(planned)
        except Exception as err:  # noqa: BLE001 - the planner is foreign code
            log.warning("memory_plan_failed", error=str(err))
            return ()

    def memory_plan_note(self) -> str:
        return str(getattr(self._memory_plan, "note", "") or "")


@dataclass
class Measurement:
    """One tick's snapshot plus what the loop needs from measuring."""

    node: NodeSample
    snapshot: TickSnapshot
    watch_targets: list[str] = field(default_factory=list)  # LS cgroups whose pressure is LS pressure


class Measurer:
    def __init__(self, settings: ManagerSettings, collector: Collector, *,
                 memory_plan: MemoryPlanFn | None, reserved_cpus: ReservedCpus,
                 topology: CpuTopology | None, clock: Callable[[], float],
                 sleep: Callable[[float], None], layout: KubeletLayout | None = None) -> None:
        """`layout`: kubelet's, as the composition root resolved it (None: resolved here from
        `settings`, and followed on reload)."""
        self.collector = collector
        self._own_layout = layout is None
        self._layout = layout if layout is not None else KubeletLayout(
            settings.cgroup.driver, settings.qos_manager.kubepods_cgroup, self._cgroup_exists)
        self.history = History(settings.qos_manager.history_length)
        # Longer than `history`: NodeMetric's usage percentiles (kube/nodemetric.py). Series
        # "node/cpu_cores", "node/memory_bytes", "system/cpu_cores".
        self.usage_window = History(USAGE_WINDOW_SAMPLES)
        self._usage_window_at = float("-inf")
        self.probe = CollectorProbe(collector, memory_plan)
        self._reserved_cpus = reserved_cpus
        self._topology = topology
        self._clock = clock
        self.sleep = sleep  # the tick thread's, for the wake sample
        self.be_pods_in_group_only = False  # set by each tick from its inventory
        self.configure(settings)

        self._prev_usage: dict[str, tuple[float, int]] = {}  # cgroup -> (t, ns)
        self._rates: dict[str, float] = {}  # cgroup -> CPUs
        self._prev_pressure: dict[str, tuple[float, int]] = {}  # cgroup -> (t, some total us)
        self._pressure_pct: dict[str, float] = {}
        self._system_base: tuple[float, int, int, int] | None = None  # t, busy, total, kubepods ns
        self.node_used_cpus: float | None = None
        self.system_used_cpus: float | None = None
        self.host_app_used_cpus: dict[str, float] = {}  # name -> CPUs, as of the last tick
        self._last_decision_at: float | None = None
        self._last_sweep: float | None = None
        self._forgot_for: tuple[Inventory, str, tuple[str, ...]] | None = None  # forget_gone's last inputs
        self._targets_for: tuple[Inventory, str, tuple[str, ...]] | None = None  # watch_targets' last answer

    def configure(self, settings: ManagerSettings) -> None:
        """A (reloaded) configuration: where kubepods and the tiers are, the history length."""
        self._sections = settings
        self._settings = settings.qos_manager
        # name -> (application, its cgroup): worked out once per configuration, read every tick
        self._host_apps = {name: (app, host_app_cgroup(name, app)) for name, app in settings.host_applications.items()}
        if self._settings.history_length != self.history.capacity:
            self.history.resize(self._settings.history_length)
        if self._own_layout:
            self._layout.configure(settings.cgroup.driver, settings.qos_manager.kubepods_cgroup)
        self._paths: KubeletPaths = self._layout.paths()

    # ------------------------------------------------------------------ where things are

    def _cgroup_exists(self, cgroup: str) -> bool:
        return self.collector.cgroup_file_text("cpu", cgroup, "cgroup.procs") is not None

    @property
    def driver(self) -> str:
        """[cgroup] driver: how the pods' cgroup paths are made (the engine's rule)."""
        return self._layout.driver

    @property
    def kubepods(self) -> str:
        return self._paths.kubepods

    @property
    def tiers(self) -> dict[str, str]:
        """The besteffort and burstable tiers and koordnode's BE group, as of this tick."""
        return self._paths.tiers

    @property
    def be_tier(self) -> str:
        """The cgroup holding the BE pods: koordnode's idle BE group once it exists (the hooks
        create it with the first BE pod) and holds every BE pod, else kubelet's besteffort tier."""
        if self._sections.cgroup.be_idle_group and self.be_pods_in_group_only:
            group = self.tiers["be_group"]
            if self.collector.cfs_quota(group) is not None:
                return group
        return self.tiers["besteffort"]

    def reserved(self, online: frozenset[int]) -> frozenset[int]:
        value = self._reserved_cpus
        if value is None:
            configured = self._sections.node.reserved_cpus
            if self._topology is None and isinstance(configured, int):
                self._topology = self._read_topology()
            return reserved_from_config(configured, online, self._topology)
        if callable(value):
            try:
                return frozenset(value())
            except Exception:  # noqa: BLE001
                return frozenset()
        return frozenset(value)

    def _read_topology(self) -> CpuTopology | None:
        try:
            return read_cpu_topology(self._sections.sysfs.root)
        except (TopologyError, OSError) as err:
            log.warning("qos_cpu_topology_unreadable", error=str(err))
            return None

    # ------------------------------------------------------------------ the snapshot

    def measure(self, inventory: Inventory, woken_by: str | None) -> Measurement:
        # The BE quota goes where the BE pods are: the idle group only while every BE pod is in
        # it (a pod created while koordnode was away, or where the group could not be used, stays
        # in kubelet's besteffort tier, and a quota on the group would not reach it).
        be_tiers = {pod.tier for pod in inventory.of_class(QoSClass.BE)}
        self.be_pods_in_group_only = be_tiers == {self.tiers["be_group"]}
        early = woken_early(woken_by)
        targets = self.watch_targets(inventory)
        recent_usage: dict[str, float] = {}
        recent_pressure: dict[str, float] = {}
        if early and self._settings.wake_sample_ms > 0:
            recent_usage, recent_pressure = self._recent_rates(inventory, targets)
        now = self._clock()
        node = self.collector.node()
        online = node.cpu.cpus if node.cpu is not None else frozenset()

        # usage: per pod (history, LS/BE sums), kubepods (for the system's share)
        ls_used, be_used, lse_lsr_used, rates_ok = self._pod_usage(inventory, now, recent_usage)
        self._paths = self._layout.paths()  # driver "auto": kubelet may make its top cgroup after we start
        host_ls, host_be, host_outside = self._host_app_usage(now)
        ls_used, be_used = ls_used + host_ls, be_used + host_be
        kubepods_ns = self.collector.cpu_usage_ns(self.kubepods)
        self._update_system_usage(node, kubepods_ns, now, host_outside)

        ls_pressure = self._ls_pressure(targets, now)
        if recent_pressure:
            recent = max(recent_pressure.values())
            ls_pressure = recent if ls_pressure is None else max(ls_pressure, recent)
        self._record_node(node, now, ls_used, be_used, ls_pressure)

        elapsed = None if self._last_decision_at is None else now - self._last_decision_at
        self._last_decision_at = now
        reserved = self.reserved(online)
        rates_ready = not (node.cpu is None or self.system_used_cpus is None or not rates_ok and not self._rates)
        snapshot = TickSnapshot(
            now=now,
            woken_early=early,
            inventory=inventory,
            be_tier=self.be_tier,
            online_cpus=online,
            reserved_cpus=reserved,
            excluded_cpus=reserved | _owned_cpus(inventory),
            ls_used_cpus=ls_used,
            be_used_cpus=be_used,
            lse_lsr_used_cpus=lse_lsr_used,
            node_used_cpus=self.node_used_cpus,
            system_used_cpus=self.system_used_cpus,
            ls_pressure_percent=ls_pressure,
            rates_ready=rates_ready,
            elapsed_s=elapsed,
            tick_s=self._settings.tick_ms / 1000.0,
            reconcile_interval_s=self._settings.reconcile_interval_s,
            memory_total_bytes=node.memory.total_bytes if node.memory is not None else None,
            memory_used_bytes=node.memory.used_bytes if node.memory is not None else None,
            probe=self.probe,
            kubepods=self.kubepods,
            be_tiers=(self.tiers["besteffort"], self.tiers["be_group"]),
        )
        return Measurement(node, snapshot, targets)

    def _pod_usage(self, inventory: Inventory, now: float,
                   recent: Mapping[str, float]) -> tuple[float, float, float, bool]:
        """CPUs used by non-BE pods, BE pods and LSE/LSR pods; False when a rate is missing."""
        ls_used = be_used = lse_lsr_used = 0.0
        complete = True
        for pod in inventory.pods:
            rate = self._rate(pod.cgroup, self.collector.cpu_usage_ns(pod.cgroup), now)
            if rate is None:
                complete = False
                continue
            if pod.qos_class in NON_BE_CLASSES and pod.cgroup in recent:
                # Woken by pressure: LS usage now, if higher than the average since the last tick.
                rate = max(rate, recent[pod.cgroup])
            self.history.append(f"pod/{pod.sandbox_id}/cpu", now, rate)
            if pod.qos_class in NON_BE_CLASSES:
                ls_used += rate
                if pod.qos_class in CPU_OWNING_CLASSES:
                    lse_lsr_used += rate
            else:
                be_used += rate
        return ls_used, be_used, lse_lsr_used, complete

    def host_applications(self) -> dict[str, tuple[HostApplication, str]]:
        """name -> (application, its cgroup)."""
        return dict(self._host_apps)

    def _host_app_usage(self, now: float) -> tuple[float, float, float]:
        """CPUs used by the host applications of the LS classes, of BE, and by those outside
        kubepods (whose use is otherwise the system's). Koordinator counts a host application
        in its class's budget, and not as system use."""
        ls = be = outside = 0.0
        rates: dict[str, float] = {}
        for name, (app, cgroup) in self._host_apps.items():
            rate = self._rate(cgroup, self.collector.cpu_usage_ns(cgroup), now)
            if rate is None:
                continue
            rates[name] = rate
            self.history.append(f"host/{name}/cpu", now, rate)
            if app.qos == "BE":
                be += rate
            else:
                ls += rate
            if not (cgroup + "/").startswith(self.kubepods.rstrip("/") + "/"):
                outside += rate
        self.host_app_used_cpus = rates
        return ls, be, outside

    def _rate(self, cgroup: str, usage_ns: int | None, now: float) -> float | None:
        """CPUs used by a cgroup since the previous tick (None on its first sample)."""
        if usage_ns is None:
            self._prev_usage.pop(cgroup, None)
            return None
        prev = self._prev_usage.get(cgroup)
        if prev is not None and now - prev[0] < MIN_RATE_INTERVAL_S:
            return self._rates.get(cgroup)
        self._prev_usage[cgroup] = (now, usage_ns)
        if prev is None or usage_ns < prev[1]:  # first sample, or a recreated cgroup
            return None
        rate = (usage_ns - prev[1]) / 1e9 / (now - prev[0])
        self._rates[cgroup] = rate
        return rate

    def _recent_rates(self, inventory: Inventory, targets: list[str]) -> tuple[dict[str, float], dict[str, float]]:
        """LS usage and pressure over the next wake_sample_ms: a tick woken by pressure needs
        the load as it is now, not averaged since the previous tick (up to tick_ms ago)."""
        pods = [p.cgroup for p in inventory.pods if p.qos_class in NON_BE_CLASSES]
        started = self._clock()
        usage = {cg: self.collector.cpu_usage_ns(cg) for cg in pods}
        pressure = {t: self.collector.pressure(t, "cpu") for t in targets}
        self.sleep(self._settings.wake_sample_ms / 1000.0)
        span = self._clock() - started
        if span < MIN_RATE_INTERVAL_S:
            return {}, {}
        rates = {}
        for cgroup, before in usage.items():
            after = self.collector.cpu_usage_ns(cgroup)
            if before is not None and after is not None and after >= before:
                rates[cgroup] = (after - before) / 1e9 / span
        pressures = {}
        for target, before_p in pressure.items():
            after_p = self.collector.pressure(target, "cpu")
            if before_p is not None and after_p is not None and after_p.some.total_us >= before_p.some.total_us:
                stalled = after_p.some.total_us - before_p.some.total_us
                pressures[target] = min(100.0, 100.0 * stalled / 1e6 / span)
        return rates, pressures

    def _update_system_usage(self, node: NodeSample, kubepods_ns: int | None, now: float,
                             host_apps_outside: float = 0.0) -> None:
        """Node CPU use and the part outside the pods and the host applications, over >= SYSTEM_WINDOW_S."""
        if node.cpu is None:
            return
        busy, total = node.cpu.busy, node.cpu.total
        base = self._system_base
        sample = (now, busy, total, kubepods_ns if kubepods_ns is not None else -1)
        if base is None:
            self._system_base = sample
            return
        span = now - base[0]
        if span < SYSTEM_WINDOW_S and self.system_used_cpus is not None:
            return
        if total <= base[2] or span <= 0:
            return
        node_used = (busy - base[1]) / (total - base[2]) * len(node.cpu.cpus)
        pods_used = (sample[3] - base[3]) / 1e9 / span if sample[3] >= 0 and base[3] >= 0 else 0.0
        self.node_used_cpus = node_used
        self.system_used_cpus = max(0.0, node_used - pods_used - host_apps_outside)
        if span >= SYSTEM_WINDOW_S:
            self._system_base = sample

    def watch_targets(self, inventory: Inventory) -> list[str]:
        """Cgroups whose CPU pressure is LS pressure: the burstable tier when LS pods live in
        it, and every other non-BE pod cgroup outside it (Guaranteed pods sit in kubepods)."""
        burstable = self.tiers["burstable"]
        last = self._targets_for
        if last is not None and last[0] is inventory and last[1] == burstable:
            return list(last[2])  # the inventory is reused while NodeState is unchanged
        targets: dict[str, None] = {}
        for pod in inventory.pods:
            if pod.qos_class is QoSClass.BE:
                continue
            targets[burstable if pod.tier == burstable else pod.cgroup] = None
        self._targets_for = (inventory, burstable, tuple(targets))
        return list(targets)

    def pressure_watch_needed(self, inventory: Inventory, usage_events_armed: bool) -> bool:
        """Pressure wake-ups catch LS stalled by BE. A BE pod in the idle BE group cannot stall
        LS (the scheduler runs LS first), and LS getting busy is seen by the usage events: only
        BE pods elsewhere (kubelet's tiers) still need the pressure watch, or its polling."""
        if not usage_events_armed:
            return True
        group = self.tiers["be_group"]
        return any(pod.qos_class is QoSClass.BE and pod.tier != group for pod in inventory.pods)

    def _ls_pressure(self, targets: list[str], now: float) -> float | None:
        """Highest CPU 'some' pressure among the LS targets since the previous tick, percent."""
        best: float | None = None
        for cgroup in targets:
            pressure = self.collector.pressure(cgroup, "cpu")
            if pressure is None:
                self._prev_pressure.pop(cgroup, None)
                continue
            total = pressure.some.total_us
            prev = self._prev_pressure.get(cgroup)
            if prev is not None and now - prev[0] < MIN_RATE_INTERVAL_S:
                pct = self._pressure_pct.get(cgroup)
            else:
                self._prev_pressure[cgroup] = (now, total)
                if prev is None or total < prev[1]:
                    pct = None
                else:
                    pct = min(100.0, 100.0 * (total - prev[1]) / 1e6 / (now - prev[0]))
                    self._pressure_pct[cgroup] = pct
            if pct is not None:
                best = pct if best is None else max(best, pct)
        return best

    def _record_node(self, node: NodeSample, now: float, ls_used: float, be_used: float,
                     ls_pressure: float | None) -> None:
        history = self.history
        if self.node_used_cpus is not None:
            history.append("node/cpu_used_cpus", now, self.node_used_cpus)
        if self.system_used_cpus is not None:
            history.append("node/system_used_cpus", now, self.system_used_cpus)
        history.append("node/ls_used_cpus", now, ls_used)
        history.append("node/be_used_cpus", now, be_used)
        if node.memory is not None:
            history.append("node/memory_used_percent", now, node.memory.used_percent)
        for resource, pressure in node.pressure.items():
            if pressure is not None:
                history.append(f"node/{resource}_some_avg10", now, pressure.some.avg10)
        if ls_pressure is not None:
            history.append("node/ls_cpu_pressure_percent", now, ls_pressure)
        if now - self._usage_window_at >= USAGE_WINDOW_SPACING_S and self.node_used_cpus is not None:
            self._usage_window_at = now
            self.usage_window.append("node/cpu_cores", now, self.node_used_cpus)
            if node.memory is not None:
                self.usage_window.append("node/memory_bytes", now, float(node.memory.used_bytes))
            if self.system_used_cpus is not None:
                self.usage_window.append("system/cpu_cores", now, self.system_used_cpus)
            if node.memory is not None:
                # The system's memory as koordlet counts it: the node's use less the pods' working set.
                pods = self.probe.working_set_bytes(self.kubepods)
                if pods is not None:
                    self.usage_window.append("system/memory_bytes", now,
                                             float(max(0, node.memory.used_bytes - pods)))

    def forget_gone(self, inventory: Inventory) -> None:
        """Drop every per-pod series and counter of pods and containers no longer running, and
        of host applications no longer configured. Nothing to do while the inventory (the manager
        reuses it while NodeState is unchanged), the tiers and the host applications' cgroups are
        those of the previous call: every table is keyed on them."""
        kept = (*self.tiers.values(), *(cgroup for _, cgroup in self._host_apps.values()))
        inputs = (inventory, self.kubepods, kept)
        if self._forgot_for is not None and self._forgot_for[0] is inventory and self._forgot_for[1:] == inputs[1:]:
            return
        self._forgot_for = inputs
        live_pods = {p.sandbox_id for p in inventory.pods}
        live_cgroups = {p.cgroup for p in inventory.pods} | {c.cgroup for p in inventory.pods for c in p.containers}
        live_cgroups |= set(kept) | {self.kubepods}  # the tiers and the host applications
        live_cgroups |= set(self.watch_targets(inventory))
        self.history.keep_only("pod/", live_pods)
        self.history.keep_only("host/", set(self._host_apps))
        for table in (self._prev_usage, self._rates, self._prev_pressure, self._pressure_pct):
            for key in [k for k in table if k not in live_cgroups]:
                del table[key]

    def sweep(self, now: float) -> None:
        """Close the collector's descriptors of files gone (every reconcile interval)."""
        if self._last_sweep is None or now - self._last_sweep >= self._settings.reconcile_interval_s:
            self._last_sweep = now
            self.collector.sweep()

    def forgets(self, cgroup: str) -> bool:
        """Whether no usage sample of `cgroup` is kept (tests)."""
        return cgroup not in self._prev_usage


def _owned_cpus(inventory: Inventory) -> frozenset[int]:
    owned: set[int] = set()
    for pod in inventory.pods:
        if pod.qos_class in CPU_OWNING_CLASSES:
            for c in pod.containers:
                if c.cpuset:
                    owned |= c.cpuset
    return frozenset(owned)
