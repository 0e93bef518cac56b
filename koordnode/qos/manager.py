"""The QoS manager: collect -> strategies -> executor, every tick and on pressure.

    manager = QoSManager(config, state, executor, procfs_root="/proc",
                         cgroup_root="/sys/fs/cgroup", evict=stop_container)
    await manager.run(stop_event)

A tick runs every `[qos_manager] tick_ms` and also right away when a PSI trigger on the LS
cgroups fires (see psi.py). A tick reads the statistics the enabled strategies need, runs
the pure strategy functions, hands their writes to the executor (the only writer), asks the
runtime to stop the containers be_evict picked, and records every decision for `status()`.

Threads: NodeState is read only on the event loop thread (the inventory snapshot); the tick
itself (file reads, strategies, executor writes, a few ms) runs in one worker thread so the
proxy sharing the loop is not blocked. `status()` may be called from the loop at any time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from koordnode.executor.executor import CgroupExecutor, ProcfsExecutor, WriteResult, WriteStatus
from koordnode.policy.plan import SysctlWrite
from koordnode.policy.plan import CgroupWrite
from koordnode.executor.resources import RESOURCES, FileFormatError, InvalidValueError, parse_cpu_list
from koordnode.model.qos_class import DEFAULT_KUBE_QOS_MAPPING, KubeQoS, QoSClass
from koordnode.qos.collect import Collector, NodeSample
from koordnode.config.qos_manager import QoSManagerConfig
from koordnode.config.strategies import StrategyConfig
from koordnode.qos.history import History
from koordnode.qos.inventory import CPU_OWNING_CLASSES, NON_BE_CLASSES, Inventory, InventoryBuilder, tier_cgroups
from koordnode.qos.psi import PressureWatch
from koordnode.qos.usage_watch import UsageWatch
from koordnode.qos.strategies import be_evict, cpu_burst, cpu_suppress, memory_qos
from koordnode.qos.strategies.common import Eviction, Explanation, StrategyResult

log = structlog.get_logger("koordnode.qos")

EvictFn = Callable[[str, str], Awaitable[Any]]
MemoryPlanFn = Callable[[], Iterable[CgroupWrite]]

STRATEGIES = ("cpu_suppress", "cpu_burst", "memory_qos", "be_evict")
# Rates over shorter intervals than this are too noisy; the previous rate is kept instead.
_MIN_RATE_INTERVAL_S = 0.005
# System usage (node minus pods) is measured over at least this long: /proc/stat counts in
# 10 ms ticks, too coarse for the short intervals of pressure-woken ticks.
_SYSTEM_WINDOW_S = 1.0


def settings_of(config: Any) -> tuple[StrategyConfig, QoSManagerConfig]:
    """The [strategy.*] and [qos_manager] sections of a Config (defaults when absent)."""
    strategy = getattr(config, "strategy", None)
    manager = getattr(config, "qos_manager", None)
    return (strategy if isinstance(strategy, StrategyConfig) else StrategyConfig(),
            manager if isinstance(manager, QoSManagerConfig) else QoSManagerConfig())


def _kube_qos_mapping(config: Any) -> Mapping[KubeQoS, QoSClass]:
    mapping = getattr(config, "qos_mapping", None)
    as_mapping = getattr(mapping, "as_mapping", None)
    if callable(as_mapping):
        try:
            return as_mapping()
        except Exception:  # noqa: BLE001 - a foreign object: fall back to the defaults
            return DEFAULT_KUBE_QOS_MAPPING
    return DEFAULT_KUBE_QOS_MAPPING


def _reserved_from_config(config: Any, online: frozenset[int]) -> frozenset[int]:
    """[node] reserved_cpus: a CPU list, or a count (the lowest-numbered online CPUs)."""
    value = getattr(getattr(config, "node", None), "reserved_cpus", "")
    if isinstance(value, bool):
        return frozenset()
    if isinstance(value, int):
        return frozenset(sorted(online)[: max(0, value)])
    if isinstance(value, str) and value:
        try:
            return parse_cpu_list(value) & online if online else parse_cpu_list(value)
        except InvalidValueError:
            return frozenset()
    return frozenset()


@dataclass
class TickReport:
    """What one tick did (returned by `tick()`, kept for status)."""

    at: float  # wall clock
    duration_s: float
    woken_by: str | None  # pressure target that woke it; None = regular tick
    results: dict[str, StrategyResult] = field(default_factory=dict)
    writes: list[WriteResult] = field(default_factory=list)
    evictions: tuple[Eviction, ...] = ()
    watch_targets: dict[str, str] = field(default_factory=dict)
    usage_targets: dict[str, str] = field(default_factory=dict)  # name -> cgroup dir for perf events


# Usage wake-ups: LS CPU time must grow at least this fast (CPUs) to wake the manager, and
# woken ticks are at least this far apart.
_USAGE_WAKE_MIN_RATE = 0.5
_MIN_USAGE_WAKE_INTERVAL_S = 0.1


def _woken_early(woken_by: str | None) -> bool:
    """A tick woken between ticks (pressure or LS usage) serves the suppression alone."""
    return woken_by is not None and woken_by.startswith(("pressure:", "usage:"))


class QoSManager:
    def __init__(
        self,
        config: Any,
        state: Any,
        executor: CgroupExecutor,
        *,
        procfs_root: str | Path = "/proc",
        cgroup_root: str | Path | None = None,
        evict: EvictFn | None = None,
        memory_plan: MemoryPlanFn | None = None,
        procfs_executor: ProcfsExecutor | None = None,
        reserved_cpus: frozenset[int] | Callable[[], frozenset[int]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """
        config: the daemon's Config (uses .strategy, .qos_manager and, when present, .node
            reserved_cpus and .qos_mapping) or a koordnode.config.QoSSettings.
        state: the NodeState kept by the proxy.
        executor: the CgroupExecutor every cgroup write goes through.
        procfs_root / cgroup_root: where statistics are read (cgroup_root defaults to the
            executor's root); sysctl writes go through a ProcfsExecutor on procfs_root.
        evict: async (container_id, reason) stopping a container through the CRI backend.
        memory_plan: returns the hooks' memory writes (memory.min/low/high, wmark_*) for the
            running pods and containers; memory_qos re-applies them.
        reserved_cpus: node-reserved CPU ids (or a callable giving them); default: resolved
            from config.node.reserved_cpus.
        """
        self._config = config
        self._strategy, self._settings = settings_of(config)
        self._inventory = InventoryBuilder(_kube_qos_mapping(config))
        self._be_pods_in_group_only = False  # set by each tick from its inventory
        self.state = state
        self.executor = executor
        self.collector = Collector(procfs_root, cgroup_root if cgroup_root is not None else executor.root)
        self._procfs_root = procfs_root
        self._procfs_executor = procfs_executor
        self._evict = evict
        self._memory_plan = memory_plan
        self._reserved_cpus = reserved_cpus
        self._clock = clock
        self._wall = wall_clock
        self._sleep = sleep  # the tick thread's, for the wake sample
        self.history = History(self._settings.history_length)
        self._kubepods = self._resolve_kubepods()
        self._tiers = tier_cgroups(self._kubepods, "auto")

        # Tick state: touched only by the tick (one at a time).
        self._prev_usage: dict[str, tuple[float, int]] = {}  # cgroup -> (t, ns)
        self._rates: dict[str, float] = {}  # cgroup -> CPUs
        self._prev_pressure: dict[str, tuple[float, int]] = {}  # cgroup -> (t, some total us)
        self._pressure_pct: dict[str, float] = {}
        self._prev_throttled: dict[str, int] = {}  # container cgroup -> nr_throttled
        self._system_base: tuple[float, int, int, int] | None = None  # t, busy, total, kubepods ns
        self._node_used_cpus: float | None = None
        self._system_used_cpus: float | None = None
        self._last_decision_at: float | None = None
        self._burst_state = cpu_burst.CpuBurstState()
        self._evict_state = be_evict.BeEvictState()
        self._last_reconcile: float | None = None
        self._last_burst_reconcile: float | None = None
        self._last_sweep: float | None = None
        self._restores: list[tuple[str, Any]] = []  # (strategy, old config) to undo next tick
        if not self._strategy.cpu_suppress.enable:
            # Started with the strategy off: a quota an earlier run left on the BE tier or
            # group (koordnode's own, it outlives restarts) must not hold BE down for good.
            self._restores.append(("cpu_suppress", self._strategy.cpu_suppress))
        self._tick_lock = threading.Lock()
        self.last_node: Any = None  # the NodeSample of the last tick
        # Called in the tick's thread after every tick (the daemon feeds its metrics from it).
        self.on_tick: Callable[[TickReport], None] | None = None

        # Status.
        self._status_lock = threading.Lock()
        self._explanations: dict[str, dict[str, Any]] = {}
        self._last_writes: dict[str, dict[str, Any]] = {}
        self._write_counts: dict[str, Counter[str]] = {name: Counter() for name in STRATEGIES}
        self._evictions: deque[dict[str, Any]] = deque(maxlen=20)
        self._eviction_counts: Counter[str] = Counter()
        self._eviction_failures = 0
        self._ticks = 0
        self._woken_ticks = 0
        self._skipped_wakes = 0
        self._suppress_at_minimum = False
        self._tick_errors = 0
        self._last_error: str | None = None
        self._last_tick: dict[str, Any] | None = None
        self._tick_seconds_total = 0.0

        # Loop side.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._woken_by: str | None = None
        self._watch: PressureWatch | None = None
        self._usage: UsageWatch | None = None
        self._pressure_watch_note: str | None = None
        self._usage_ticks = 0
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._evict_tasks: set[asyncio.Task[Any]] = set()
        # Dry run: decide and report, but write nothing (executors), register no PSI trigger
        # (a kernel write: the watch polls instead) and evict nothing.
        self._dry_run = False

    # ================================================================== public API

    @property
    def kubepods(self) -> str:
        return self._kubepods

    @property
    def be_tier(self) -> str:
        """The cgroup holding the BE pods: koordnode's idle BE group once it exists (the hooks
        create it with the first BE pod), else kubelet's besteffort tier."""
        cgroup = getattr(self._config, "cgroup", None)
        if getattr(cgroup, "be_idle_group", False) and self._be_pods_in_group_only:
            group = self._tiers["be_group"]
            if self.collector.cfs_quota(group) is not None:
                return group
        return self._tiers["besteffort"]

    @property
    def dry_run(self) -> bool:
        return self._dry_run

    def set_dry_run(self, dry_run: bool) -> None:
        """Switch dry-run on or off (start-up, config reload); the pressure watch is restarted
        when that changes whether it may register PSI triggers."""
        changed = dry_run != self._dry_run
        self._dry_run = dry_run
        if self._procfs_executor is not None:
            self._procfs_executor.dry_run = dry_run
        if changed and self._watch is not None:
            self._restart_watch()

    @property
    def trigger_mode(self) -> str:
        return self._watch.mode if self._watch is not None else "not running"

    def be_cpuset(self) -> frozenset[int] | None:
        """The BE CPUs while the cpuset policy is active (for hooks creating BE containers:
        on cgroup v1 a new container's cpuset must fit inside its suppressed pod); else None."""
        if not (self._strategy.cpu_suppress.enable and self._strategy.cpu_suppress.policy == "cpuset"):
            return None
        return self.collector.cpuset_cpus(self.be_tier)

    def reconfigure(self, config: Any) -> None:
        """Apply a reloaded configuration; what a strategy leaves behind is undone next tick."""
        old_strategy, old_settings = self._strategy, self._settings
        new_strategy, new_settings = settings_of(config)
        old_suppress, new_suppress = old_strategy.cpu_suppress, new_strategy.cpu_suppress
        restores: list[tuple[str, Any]] = []
        if old_suppress.enable and (not new_suppress.enable or new_suppress.policy != old_suppress.policy):
            restores.append(("cpu_suppress", old_suppress))
        if old_strategy.cpu_burst.enable and not new_strategy.cpu_burst.enable:
            restores.append(("cpu_burst", old_strategy.cpu_burst))
        with self._tick_lock:
            self._config = config
            self._strategy, self._settings = new_strategy, new_settings
            self._inventory.set_mapping(_kube_qos_mapping(config))
            self._kubepods = self._resolve_kubepods()
            self._tiers = tier_cgroups(self._kubepods, "auto")
            self._restores += restores
            if new_settings.history_length != old_settings.history_length:
                self.history.resize(new_settings.history_length)
            if (old_settings.psi_stall_us, old_settings.psi_window_us, old_settings.psi_poll_ms,
                    old_settings.psi_triggers) != (new_settings.psi_stall_us, new_settings.psi_window_us,
                                                   new_settings.psi_poll_ms, new_settings.psi_triggers):
                self._restart_watch()
            if new_settings.usage_wake_cpu_ms != old_settings.usage_wake_cpu_ms:
                self._restart_usage_watch()
        log.info("qos_reconfigured", restores=[name for name, _ in restores])
        self._request_tick("reconfigure")

    def tick(self, woken_by: str | None = None) -> TickReport:
        """One tick now, in the calling thread (tests, benchmarks). Evictions are returned,
        not executed."""
        inventory = self._inventory.build(self.state)
        return self._tick(inventory, woken_by)

    async def run(self, stop_event: asyncio.Event) -> None:
        """Tick every tick_ms and on pressure, until stop_event is set."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="koordnode-qos")
        stopper = self._loop.create_task(self._forward_stop(stop_event))
        self._start_watch()
        self._start_usage_watch()
        log.info("qos_manager_started", tick_ms=self._settings.tick_ms, be_tier=self.be_tier,
                 cgroup_version=self.collector.version.value, trigger_mode=self.trigger_mode)
        next_tick = self._clock()
        last_pressure_tick = last_usage_tick = float("-inf")
        try:
            while not stop_event.is_set():
                now = self._clock()
                woken_by, self._woken_by = self._woken_by, None
                self._wake.clear()
                if woken_by is not None and woken_by.startswith("pressure:") and now < next_tick:
                    # At most one pressure tick per PSI window (the kernel's own rate), and
                    # none while BE is already suppressed as far as it goes.
                    if self._suppress_at_minimum or now - last_pressure_tick < self._settings.psi_window_us / 1e6:
                        with self._status_lock:
                            self._skipped_wakes += 1
                        woken_by = None
                    else:
                        last_pressure_tick = now
                elif woken_by is not None and woken_by.startswith("usage:") and now < next_tick:
                    if self._suppress_at_minimum or now - last_usage_tick < _MIN_USAGE_WAKE_INTERVAL_S:
                        with self._status_lock:
                            self._skipped_wakes += 1
                        woken_by = None
                    else:
                        last_usage_tick = now
                if now >= next_tick or woken_by is not None:
                    inventory = self._inventory.build(self.state)
                    try:
                        report = await self._loop.run_in_executor(self._pool, self._tick, inventory, woken_by)
                    except Exception as err:  # noqa: BLE001 - one bad tick must not end the manager
                        self._note_error(err)
                    else:
                        if self._watch is not None:
                            self._watch.set_targets(report.watch_targets)
                        if self._usage is not None:
                            self._usage.set_targets(report.usage_targets)
                            self._usage.rearm()
                        for eviction in report.evictions:
                            self._spawn_eviction(eviction)
                    if now >= next_tick:
                        next_tick = max(next_tick + self._settings.tick_ms / 1000.0, self._clock())
                delay = max(0.0, next_tick - self._clock())
                try:
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                except TimeoutError:
                    pass
        finally:
            stopper.cancel()
            self._stop_watch()
            if self._usage is not None:
                self._usage.stop()
                self._usage = None
            if self._evict_tasks:
                await asyncio.gather(*list(self._evict_tasks), return_exceptions=True)
            self._pool.shutdown(wait=True)
            self._pool = None
            self.collector.close()
            self._loop = None
            log.info("qos_manager_stopped")

    def status(self) -> dict[str, Any]:
        settings = self._settings
        with self._status_lock:
            strategies = {}
            for name in STRATEGIES:
                cfg = getattr(self._strategy, name)
                strategies[name] = {
                    "enabled": cfg.enable,
                    **({"policy": cfg.policy} if name == "cpu_suppress" else {}),
                    "decision": self._explanations.get(name),
                    "last_write": self._last_writes.get(name),
                    "writes": dict(self._write_counts[name]),
                }
            strategies["be_evict"]["evictions"] = {
                "total": sum(self._eviction_counts.values()),
                "by_cause": dict(self._eviction_counts),
                "failed": self._eviction_failures,
                "recent": list(self._evictions),
            }
            ticks = {
                "period_ms": settings.tick_ms,
                "count": self._ticks,
                "woken_by_pressure": self._woken_ticks,
                "woken_by_usage": self._usage_ticks,
                "pressure_wakes_skipped": self._skipped_wakes,
                "errors": self._tick_errors,
                "last_error": self._last_error,
                "last": self._last_tick,
                "avg_duration_ms": round(1000 * self._tick_seconds_total / self._ticks, 3) if self._ticks else None,
            }
        watch = self._watch.status() if self._watch is not None else {"mode": "not running"}
        if self._pressure_watch_note:
            watch["note"] = self._pressure_watch_note
        node_series = [n for n in self.history.names() if n.startswith("node/") or n.startswith("tier/")]
        return {
            "trigger_mode": watch["mode"],
            "pressure_watch": watch,
            "usage_watch": self._usage.status() if self._usage is not None else {"mode": "not running"},
            "be_tier": self.be_tier,
            "cgroup_version": self.collector.version.value,
            "ticks": ticks,
            "strategies": strategies,
            "node": self.history.summaries(node_series),
            "collector": {
                "errors": self.collector.errors,
                "last_error": self.collector.last_error,
                "open_files": self.collector.reader.open_count,
            },
            "history": {"series": len(self.history), "capacity": self.history.capacity},
        }

    # ================================================================== the loop side

    async def _forward_stop(self, stop_event: asyncio.Event) -> None:
        await stop_event.wait()
        if self._wake is not None:
            self._wake.set()

    def _request_tick(self, why: str) -> None:
        loop = self._loop
        if loop is None:
            return

        def wake() -> None:
            self._woken_by = self._woken_by or why
            if self._wake is not None:
                self._wake.set()

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            wake()
        else:
            loop.call_soon_threadsafe(wake)

    def _on_pressure(self, target: str) -> None:
        self._woken_by = self._woken_by or f"pressure:{target}"
        if self._wake is not None:
            self._wake.set()

    def _on_usage(self, target: str) -> None:
        self._woken_by = self._woken_by or f"usage:{target}"
        if self._wake is not None:
            self._wake.set()

    def _start_usage_watch(self) -> None:
        period_ns = int(self._settings.usage_wake_cpu_ms * 1e6)
        self._usage = UsageWatch(period_ns=period_ns, min_rate=_USAGE_WAKE_MIN_RATE, on_wake=self._on_usage,
                                 clock=self._clock)
        if self._loop is not None:
            self._usage.start(self._loop)

    def _restart_usage_watch(self) -> None:
        loop = self._loop
        if loop is None:
            return

        def restart() -> None:
            targets = self._usage.status()["targets"] if self._usage is not None else {}
            if self._usage is not None:
                self._usage.stop()
            self._start_usage_watch()
            if self._usage is not None:
                self._usage.set_targets(targets)

        loop.call_soon_threadsafe(restart)

    def _start_watch(self) -> None:
        settings = self._settings
        self._watch = PressureWatch(
            stall_us=settings.psi_stall_us,
            window_us=settings.psi_window_us,
            poll_interval_s=settings.psi_poll_ms / 1000.0,
            on_wake=self._on_pressure,
            use_triggers=settings.psi_triggers and not self._dry_run,
            triggers_off_reason="dry run: registering a PSI trigger writes to the kernel"
            if settings.psi_triggers and self._dry_run else None,
            clock=self._clock,
        )
        if self._loop is not None:
            self._watch.start(self._loop)

    def _stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.stop()

    def _restart_watch(self) -> None:
        loop = self._loop
        if loop is None:
            return

        def restart() -> None:
            targets = self._watch.status()["targets"] if self._watch is not None else {}
            self._stop_watch()
            self._start_watch()
            if self._watch is not None:
                self._watch.set_targets(targets)

        loop.call_soon_threadsafe(restart)

    def _spawn_eviction(self, eviction: Eviction) -> None:
        assert self._loop is not None
        task = self._loop.create_task(self._run_eviction(eviction))
        self._evict_tasks.add(task)
        task.add_done_callback(self._evict_tasks.discard)

    async def _run_eviction(self, eviction: Eviction) -> None:
        log.warning("be_evict", container_id=eviction.container_id, pod=eviction.pod, reason=eviction.reason)
        record = {"container_id": eviction.container_id, "pod": eviction.pod, "cause": eviction.cause,
                  "reason": eviction.reason, "at": self._wall(), "ok": None}
        if self._dry_run:
            record["ok"] = None
            record["dry_run"] = f"would stop container {eviction.container_id} through the runtime"
            log.warning("be_evict_dry_run", container_id=eviction.container_id, would=record["dry_run"])
        elif self._evict is None:
            record["ok"] = False
            record["error"] = "no evict function configured"
        else:
            try:
                await self._evict(eviction.container_id, eviction.reason)
                record["ok"] = True
            except Exception as err:  # noqa: BLE001 - report, keep going
                record["ok"] = False
                record["error"] = str(err)
                log.error("be_evict_failed", container_id=eviction.container_id, error=str(err))
        with self._status_lock:
            self._eviction_counts[eviction.cause] += 1
            if record["ok"] is False:
                self._eviction_failures += 1
            self._evictions.append(record)

    def _note_error(self, err: Exception) -> None:
        log.exception("qos_tick_failed", error=str(err))
        with self._status_lock:
            self._tick_errors += 1
            self._last_error = f"{type(err).__name__}: {err}"

    # ================================================================== the tick

    def _tick(self, inventory: Inventory, woken_by: str | None) -> TickReport:
        with self._tick_lock:
            started = time.perf_counter()
            report = self._tick_locked(inventory, woken_by)
            report.duration_s = time.perf_counter() - started
            if self.on_tick is not None:
                try:
                    self.on_tick(report)
                except Exception as err:  # an observer must not break the loop
                    self._note_error(err)
            with self._status_lock:
                self._ticks += 1
                self._woken_ticks += woken_by is not None and woken_by.startswith("pressure:")
                self._usage_ticks += woken_by is not None and woken_by.startswith("usage:")
                self._tick_seconds_total += report.duration_s
                self._last_tick = {
                    "at": report.at,
                    "duration_ms": round(report.duration_s * 1000, 3),
                    "woken_by": woken_by,
                    "pods": len(inventory.pods),
                    "writes": sum(1 for w in report.writes if w.status is WriteStatus.WRITTEN),
                    "skipped_pods": list(inventory.skipped[:5]),
                }
            return report

    def _tick_locked(self, inventory: Inventory, woken_by: str | None) -> TickReport:
        # The BE quota goes where the BE pods are: the idle group only while every BE pod is in
        # it (a pod created while koordnode was away, or where the group could not be used, stays
        # in kubelet's besteffort tier, and a quota on the group would not reach it).
        be_tiers = {pod.tier for pod in inventory.of_class(QoSClass.BE)}
        self._be_pods_in_group_only = be_tiers == {self._tiers["be_group"]}
        strategy = self._strategy
        report = TickReport(at=self._wall(), duration_s=0.0, woken_by=woken_by)
        targets = self._watch_targets(inventory)
        recent_usage: dict[str, float] = {}
        recent_pressure: dict[str, float] = {}
        if _woken_early(woken_by) and self._settings.wake_sample_ms > 0:
            recent_usage, recent_pressure = self._recent_rates(inventory, targets)
        now = self._clock()
        node = self.collector.node()
        self.last_node = node
        online = node.cpu.cpus if node.cpu is not None else frozenset()
        node_cpus = len(online)

        # ---- usage: per pod (history, LS/BE sums), kubepods (for the system's share)
        ls_used, be_used, lse_lsr_used, rates_ok = self._pod_usage(inventory, now, recent_usage)
        if not self._settings.kubepods_cgroup and self._driver() == "auto":
            self._follow_kubepods()
        kubepods_ns = self.collector.cpu_usage_ns(self._kubepods)
        self._update_system_usage(node, kubepods_ns, now)

        # ---- LS CPU pressure (and the targets the pressure watch should arm)
        if strategy.cpu_suppress.enable:  # pressure wake-ups only serve the suppression
            report.usage_targets = {name: path for name, path in
                                    ((t, self.collector.perf_cgroup_dir(t)) for t in targets) if path}
            if not self._pressure_watch_needed(inventory):
                self._pressure_watch_note = ("idle: LS usage events are armed and every BE pod is in the "
                                             "idle BE group, so BE cannot stall LS")
            else:
                self._pressure_watch_note = None
                report.watch_targets = {name: path for name, path in
                                        ((t, self.collector.pressure_path(t, "cpu")) for t in targets) if path}
        ls_pressure = self._ls_pressure(targets, now)
        if recent_pressure:
            recent = max(recent_pressure.values())
            ls_pressure = recent if ls_pressure is None else max(ls_pressure, recent)
        self._record_node(node, now, ls_used, be_used, ls_pressure)

        elapsed = None if self._last_decision_at is None else now - self._last_decision_at
        self._last_decision_at = now
        reserved = self._reserved(online)
        excluded = reserved | self._owned_cpus(inventory)
        cgroup_writes: list[tuple[str, CgroupWrite]] = []
        sysctl_writes: list[tuple[str, SysctlWrite]] = []

        # ---- undo what a strategy disabled by reconfigure left behind
        restores, self._restores = self._restores, []
        for name, old_cfg in restores:
            if name == "cpu_suppress":
                inp = self._suppress_input(inventory, node_cpus, online, excluded, ls_used, be_used,
                                           reserved, ls_pressure, elapsed, old_cfg.policy)
                result = cpu_suppress.restore_cpu_suppress(inp, old_cfg.policy)
            else:
                result = cpu_burst.restore_cpu_burst(self._burst_pods(inventory, now), self._burst_state)
                self._burst_state = result.state
            report.results[f"{name}.restore"] = result
            cgroup_writes += [(name, w) for w in result.writes]
            self._explain(name, result.explanation, report.at)

        # ---- cpu_suppress
        budget_cpus: float | None = None
        if strategy.cpu_suppress.enable:
            cfg = strategy.cpu_suppress
            inp = self._suppress_input(inventory, node_cpus, online, excluded, ls_used, be_used,
                                       reserved, ls_pressure, elapsed, cfg.policy)
            if node.cpu is None or self._system_used_cpus is None or not rates_ok and not self._rates:
                result = StrategyResult(Explanation("cpu_suppress", {}, "no change",
                                                    "warming up: usage rates need two samples"))
            else:
                result = cpu_suppress.decide_cpu_suppress(inp, cfg)
                budget_cpus = cpu_suppress.be_budget(inp, cfg).cpus
                self._suppress_at_minimum = self._at_minimum(inp, cfg, result)
            report.results["cpu_suppress"] = result
            cgroup_writes += [("cpu_suppress", w) for w in result.writes]
            self._explain("cpu_suppress", result.explanation, report.at)

        # A tick woken by pressure is for the suppression alone; the rest waits for the tick.
        regular = not _woken_early(woken_by)

        # ---- cpu_burst
        if strategy.cpu_burst.enable and regular:
            pods = self._burst_pods(inventory, now)
            pool_cpus = len(online - excluded)
            pool_pct = None
            if self._node_used_cpus is not None and pool_cpus:
                pool_pct = 100.0 * max(0.0, self._node_used_cpus - lse_lsr_used) / pool_cpus
            reconcile = self._due(self._last_burst_reconcile, now)
            if reconcile:
                self._last_burst_reconcile = now
            result = cpu_burst.decide_cpu_burst(
                cpu_burst.CpuBurstInput(pods, pool_pct, reconcile), strategy.cpu_burst, self._burst_state)
            self._burst_state = result.state
            report.results["cpu_burst"] = result
            cgroup_writes += [("cpu_burst", w) for w in result.writes]
            self._explain("cpu_burst", result.explanation, report.at)

        # ---- memory_qos
        if strategy.memory_qos.enable and regular:
            due = self._due(self._last_reconcile, now)
            planned: tuple[CgroupWrite, ...] = ()
            if due and self._memory_plan is not None:
                try:
                    planned = tuple(self._memory_plan())
                except Exception as err:  # noqa: BLE001 - the planner is foreign code
                    log.warning("memory_plan_failed", error=str(err))
            result = memory_qos.decide_memory_qos(
                memory_qos.MemoryQoSInput(now, self._last_reconcile, planned,
                                          self._settings.reconcile_interval_s, self._memory_plan is not None),
                strategy.memory_qos)
            self._last_reconcile = result.state
            report.results["memory_qos"] = result
            cgroup_writes += [("memory_qos", w) for w in result.writes]
            sysctl_writes += [("memory_qos", w) for w in result.sysctls]
            if result.writes or result.sysctls or "memory_qos" not in self._explanations:
                self._explain("memory_qos", result.explanation, report.at)

        # ---- be_evict
        if strategy.be_evict.enable and regular:
            result = be_evict.decide_be_evict(
                self._evict_input(inventory, node, now, budget_cpus, be_used, strategy.be_evict),
                strategy.be_evict, self._evict_state)
            self._evict_state = result.state
            report.evictions = result.evictions
            report.results["be_evict"] = result
            self._explain("be_evict", result.explanation, report.at)

        # ---- apply
        if cgroup_writes:
            # Bulk passes (reconcile) mostly find the values in place: check them through the
            # cached descriptors first, so the executor only sees the writes that matter.
            # Resources the executor found unsupported here are dropped without a look.
            unsupported = {name for name in self.executor.unsupported if " " not in name}
            cgroup_writes = [(name, w) for name, w in cgroup_writes
                             if name == "cpu_suppress" or (w.resource not in unsupported and self._differs(w))]
        if cgroup_writes:
            results = self.executor.apply([w for _, w in cgroup_writes])
            self._record_writes([name for name, _ in cgroup_writes], results, report.at)
            report.writes += results
        if sysctl_writes:
            results = self._procfs().apply([w for _, w in sysctl_writes])
            self._record_writes([name for name, _ in sysctl_writes], results, report.at)
            report.writes += results

        self._forget_gone(inventory)
        if self._due(self._last_sweep, now):
            # After any reconcile pass of this tick, so their descriptors stay cached.
            self._last_sweep = now
            self.collector.sweep()
        return report

    # ------------------------------------------------------------------ measurements

    def _driver(self) -> str:
        return getattr(getattr(self._config, "cgroup", None), "driver", "auto")

    def _resolve_kubepods(self) -> str:
        """[qos_manager] kubepods_cgroup, else by [cgroup] driver, else whichever exists."""
        configured = self._settings.kubepods_cgroup
        if configured:
            return configured
        driver = self._driver()
        if driver == "systemd":
            return "/kubepods.slice"
        if driver == "cgroupfs":
            return "/kubepods"
        systemd = self.collector.cgroup_file_text("cpu", "/kubepods.slice", "cgroup.procs") is not None
        return "/kubepods.slice" if systemd else "/kubepods"

    def _follow_kubepods(self) -> None:
        # Driver "auto": kubelet may create its top cgroup after we start.
        found = self._resolve_kubepods()
        if found != self._kubepods:
            log.info("qos_kubepods_cgroup", cgroup=found)
            self._kubepods = found
            self._tiers = tier_cgroups(found, "auto")

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

    def _rate(self, cgroup: str, usage_ns: int | None, now: float) -> float | None:
        """CPUs used by a cgroup since the previous tick (None on its first sample)."""
        if usage_ns is None:
            self._prev_usage.pop(cgroup, None)
            return None
        prev = self._prev_usage.get(cgroup)
        if prev is not None and now - prev[0] < _MIN_RATE_INTERVAL_S:
            return self._rates.get(cgroup)
        self._prev_usage[cgroup] = (now, usage_ns)
        if prev is None or usage_ns < prev[1]:  # first sample, or a recreated cgroup
            return None
        rate = (usage_ns - prev[1]) / 1e9 / (now - prev[0])
        self._rates[cgroup] = rate
        return rate

    @staticmethod
    def _at_minimum(inp: cpu_suppress.CpuSuppressInput, cfg: Any, result: StrategyResult) -> bool:
        """Whether BE is now suppressed as far as the policy goes (quota floor, fewest CPUs)."""
        if cfg.policy == "cpuset":
            cpus = result.writes[0].value if result.writes else inp.current_be_cpus
            if isinstance(cpus, str):
                cpus = parse_cpu_list(cpus)
            return cpus is not None and len(cpus) <= cfg.min_cpus
        quota = result.writes[0].value if result.writes else inp.current_quota_us
        return isinstance(quota, int) and 0 < quota <= cfg.min_quota_us

    def _recent_rates(self, inventory: Inventory, targets: list[str]) -> tuple[dict[str, float], dict[str, float]]:
        """LS usage and pressure over the next wake_sample_ms: a tick woken by pressure needs
        the load as it is now, not averaged since the previous tick (up to tick_ms ago)."""
        pods = [p.cgroup for p in inventory.pods if p.qos_class in NON_BE_CLASSES]
        started = self._clock()
        usage = {cg: self.collector.cpu_usage_ns(cg) for cg in pods}
        pressure = {t: self.collector.pressure(t, "cpu") for t in targets}
        self._sleep(self._settings.wake_sample_ms / 1000.0)
        span = self._clock() - started
        if span < _MIN_RATE_INTERVAL_S:
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

    def _update_system_usage(self, node: NodeSample, kubepods_ns: int | None, now: float) -> None:
        """Node CPU use and the part outside the pods, over >= _SYSTEM_WINDOW_S."""
        if node.cpu is None:
            return
        busy, total = node.cpu.busy, node.cpu.total
        base = self._system_base
        sample = (now, busy, total, kubepods_ns if kubepods_ns is not None else -1)
        if base is None:
            self._system_base = sample
            return
        span = now - base[0]
        if span < _SYSTEM_WINDOW_S and self._system_used_cpus is not None:
            return
        if total <= base[2] or span <= 0:
            return
        node_used = (busy - base[1]) / (total - base[2]) * len(node.cpu.cpus)
        pods_used = (sample[3] - base[3]) / 1e9 / span if sample[3] >= 0 and base[3] >= 0 else 0.0
        self._node_used_cpus = node_used
        self._system_used_cpus = max(0.0, node_used - pods_used)
        if span >= _SYSTEM_WINDOW_S:
            self._system_base = sample

    def _pressure_watch_needed(self, inventory: Inventory) -> bool:
        """Pressure wake-ups catch LS stalled by BE. A BE pod in the idle BE group cannot stall
        LS (the scheduler runs LS first), and LS getting busy is seen by the usage events: only
        BE pods elsewhere (kubelet's tiers) still need the pressure watch, or its polling."""
        if self._usage is None or not self._usage.active:
            return True
        group = self._tiers["be_group"]
        return any(pod.qos_class is QoSClass.BE and pod.tier != group for pod in inventory.pods)

    def _watch_targets(self, inventory: Inventory) -> list[str]:
        """Cgroups whose CPU pressure is LS pressure: the burstable tier when LS pods live in
        it, and every other non-BE pod cgroup outside it (Guaranteed pods sit in kubepods)."""
        burstable = self._tiers["burstable"]
        targets: dict[str, None] = {}
        for pod in inventory.pods:
            if pod.qos_class is QoSClass.BE:
                continue
            targets[burstable if pod.tier == burstable else pod.cgroup] = None
        return list(targets)

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
            if prev is not None and now - prev[0] < _MIN_RATE_INTERVAL_S:
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
        if self._node_used_cpus is not None:
            history.append("node/cpu_used_cpus", now, self._node_used_cpus)
        if self._system_used_cpus is not None:
            history.append("node/system_used_cpus", now, self._system_used_cpus)
        history.append("node/ls_used_cpus", now, ls_used)
        history.append("node/be_used_cpus", now, be_used)
        if node.memory is not None:
            history.append("node/memory_used_percent", now, node.memory.used_percent)
        for resource, pressure in node.pressure.items():
            if pressure is not None:
                history.append(f"node/{resource}_some_avg10", now, pressure.some.avg10)
        if ls_pressure is not None:
            history.append("node/ls_cpu_pressure_percent", now, ls_pressure)

    def _reserved(self, online: frozenset[int]) -> frozenset[int]:
        value = self._reserved_cpus
        if value is None:
            return _reserved_from_config(self._config, online)
        if callable(value):
            try:
                return frozenset(value())
            except Exception:  # noqa: BLE001
                return frozenset()
        return frozenset(value)

    @staticmethod
    def _owned_cpus(inventory: Inventory) -> frozenset[int]:
        owned: set[int] = set()
        for pod in inventory.pods:
            if pod.qos_class in CPU_OWNING_CLASSES:
                for c in pod.containers:
                    if c.cpuset:
                        owned |= c.cpuset
        return frozenset(owned)

    def _due(self, last: float | None, now: float) -> bool:
        return last is None or now - last >= self._settings.reconcile_interval_s

    # ------------------------------------------------------------------ strategy inputs

    def _suppress_input(self, inventory: Inventory, node_cpus: int, online: frozenset[int],
                        excluded: frozenset[int], ls_used: float, be_used: float, reserved: frozenset[int],
                        ls_pressure: float | None, elapsed: float | None, policy: str) -> cpu_suppress.CpuSuppressInput:
        tier = self.be_tier
        quota = period = None
        current_cpus = None
        cpuset_cgroups: tuple[str, ...] = ()
        if policy == "cpuset":
            current_cpus = self.collector.cpuset_cpus(tier)
            cgroups = [tier]
            for pod in inventory.of_class(QoSClass.BE):
                if pod.tier == tier:
                    cgroups.append(pod.cgroup)
                    cgroups += [c.cgroup for c in pod.containers]
            cpuset_cgroups = tuple(cgroups)
        else:
            found = self.collector.cfs_quota(tier)
            if found is not None:
                quota, period = found
        return cpu_suppress.CpuSuppressInput(
            node_cpus=node_cpus,
            ls_used_cpus=ls_used,
            be_used_cpus=be_used,
            system_used_cpus=self._system_used_cpus or 0.0,
            reserved_cpus=float(len(reserved)),
            ls_pressure_percent=ls_pressure,
            be_tier=tier,
            current_quota_us=quota,
            period_us=period or 100_000,
            elapsed_s=elapsed,
            tick_s=self._settings.tick_ms / 1000.0,
            online_cpus=online,
            excluded_cpus=excluded,
            current_be_cpus=current_cpus,
            be_cpuset_cgroups=cpuset_cgroups,
        )

    def _burst_pods(self, inventory: Inventory, now: float) -> tuple[cpu_burst.BurstPod, ...]:
        pods = []
        for pod in inventory.of_class(QoSClass.LS):
            containers = []
            for c in pod.containers:
                throttled = 0
                if c.cpu_quota_us > 0:
                    stat = self.collector.cpu_stat(c.cgroup)
                    if stat is not None:
                        prev = self._prev_throttled.get(c.cgroup)
                        self._prev_throttled[c.cgroup] = stat.nr_throttled
                        throttled = max(0, stat.nr_throttled - prev) if prev is not None else 0
                containers.append(cpu_burst.BurstContainer(c.container_id, c.cgroup, c.cpu_quota_us,
                                                           c.cpu_period_us, throttled))
            pods.append(cpu_burst.BurstPod(pod.sandbox_id, pod.name, pod.cgroup, tuple(containers)))
        return tuple(pods)

    def _evict_input(self, inventory: Inventory, node: NodeSample, now: float, budget: float | None,
                     be_used: float, cfg: Any) -> be_evict.BeEvictInput:
        memory = node.memory
        # Per-container memory is only needed to pick victims when memory is short.
        need_memory = memory is not None and memory.used_percent >= cfg.memory_threshold_percent
        candidates = []
        request = 0.0
        for pod in inventory.of_class(QoSClass.BE):
            for c in pod.containers:
                working_set = 0
                if need_memory:
                    usage = self.collector.memory_usage(c.cgroup)
                    stat = self.collector.memory_stat(c.cgroup) if usage is not None else None
                    working_set = stat.working_set(usage) if stat is not None and usage is not None else (usage or 0)
                cpus = (c.batch_cpu_milli or 0) / 1000.0
                request += cpus
                candidates.append(be_evict.EvictCandidate(c.container_id, pod.sandbox_id, pod.name,
                                                          pod.priority, working_set, cpus))
        return be_evict.BeEvictInput(
            now=now,
            memory_total_bytes=memory.total_bytes if memory is not None else 0,
            memory_used_bytes=memory.used_bytes if memory is not None else 0,
            candidates=tuple(candidates),
            be_cpu_budget_cpus=budget,
            be_cpu_used_cpus=be_used,
            be_cpu_request_cpus=request,
        )

    def _differs(self, write: CgroupWrite) -> bool:
        """False when the kernel file already holds the value (compared the executor's way);
        True when it differs or cannot be told (the executor then decides and reports)."""
        spec = RESOURCES.get(write.resource) if isinstance(write.resource, str) else None
        if spec is None:
            return True
        try:
            value = spec.validate(write.value)
        except InvalidValueError:
            return True
        for fmt in spec.files(self.collector.is_v2):
            text = self.collector.cgroup_file_text(spec.v1_controller, write.cgroup, fmt.filename)
            if text is None:
                continue
            try:
                return fmt.extract(text, value) != fmt.expected(value)
            except (FileFormatError, ValueError):
                return True
        return True

    # ------------------------------------------------------------------ bookkeeping

    def _procfs(self) -> ProcfsExecutor:
        if self._procfs_executor is None:
            self._procfs_executor = ProcfsExecutor(self._procfs_root, dry_run=self._dry_run)
        return self._procfs_executor

    def _explain(self, name: str, explanation: Explanation, at: float) -> None:
        with self._status_lock:
            self._explanations[name] = {"at": at, **explanation.as_dict()}

    def _record_writes(self, owners: list[str], results: list[WriteResult], at: float) -> None:
        with self._status_lock:
            for owner, result in zip(owners, results):
                self._write_counts[owner][result.status.value] += 1
                if result.status in (WriteStatus.WRITTEN, WriteStatus.FAILED, WriteStatus.WOULD_WRITE):
                    write = result.write
                    target = {"cgroup": write.cgroup, "resource": write.resource} if isinstance(write, CgroupWrite) \
                        else {"sysctl": write.name}
                    self._last_writes[owner] = {
                        **target, "value": write.value, "old": result.old, "status": result.status.value,
                        "detail": result.detail or None, "at": at, "reason": write.reason,
                    }

    def _forget_gone(self, inventory: Inventory) -> None:
        """Drop every per-pod series and counter of pods and containers no longer running."""
        live_pods = {p.sandbox_id for p in inventory.pods}
        live_cgroups = {p.cgroup for p in inventory.pods} | {c.cgroup for p in inventory.pods for c in p.containers}
        live_cgroups |= set(self._tiers.values()) | {self._kubepods}
        live_cgroups |= set(self._watch_targets(inventory))
        self.history.keep_only("pod/", live_pods)
        for table in (self._prev_usage, self._rates, self._prev_pressure, self._pressure_pct, self._prev_throttled):
            for key in [k for k in table if k not in live_cgroups]:
                del table[key]
