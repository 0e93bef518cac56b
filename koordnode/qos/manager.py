"""The QoS manager: measure -> strategies -> executor, every tick and on pressure.

    manager = QoSManager(ManagerSettings.of(config), state, executor, procfs_root="/proc",
                         cgroup_root="/sys/fs/cgroup", evict=stop_container)
    await manager.run(stop_event)

A tick runs every `[qos_manager] tick_ms` and also right away when a PSI trigger on the LS
cgroups fires (see psi.py) or LS usage events do (usage_watch.py). The work is split:

- measure.py: the inventory and the kernel's statistics -> one immutable TickSnapshot;
- policy/strategies/registry.py: the strategies (pure: snapshot, config, state -> plans);
- tick.py: runs the registered strategies and hands their writes to the executor (the
  only writer); evictions come back to this loop, which asks the runtime to stop them;
- status.py: every decision, write and eviction, for `status()`;
- this module: the loop (ticks, wake-ups, the pressure and usage watches), reconfigure.

Threads: the ticks (the inventory from NodeState's immutable view, file reads, strategies,
executor writes, a few ms) run in one thread of their own that keeps the tick schedule, so the
proxy sharing the event loop is neither blocked nor woken by a regular tick. The loop owns the
pressure and usage watches and the evictions: their events wake the tick thread, and a tick
hands back to the loop only what changed for them. `status()` may be called from the loop at
any time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from koordnode.executor.cgroup_executor import CgroupExecutor

from koordnode.executor.procfs_executor import ProcfsExecutor

from koordnode.executor.write_result import WriteStatus
from koordnode.executor.originals import OriginalsJournal
from koordnode.model.be_starts import BeStarts
from koordnode.model.cpu_topology import CpuTopology
from koordnode.model.kubelet_layout import KubeletLayout
from koordnode.policy.strategies.base import Inventory, Strategy, TickSnapshot
from koordnode.policy.strategies.common import Eviction, PodStatusFields
from koordnode.policy.strategies.registry import STRATEGIES as REGISTRY
from koordnode.qos.collect import Collector
from koordnode.config.components import ManagerSettings
from koordnode.config.host_apps import HostApplication
from koordnode.qos.history import History
from koordnode.qos.inventory import InventoryBuilder
from koordnode.model.state import NodeState
from koordnode.qos.measure import MemoryPlanFn, Measurer, ReservedCpus
from koordnode.qos.psi import PressureWatch
from koordnode.qos.status import StatusBook
from koordnode.qos.tick import StrategyRunner, TickReport
from koordnode.qos.usage_watch import UsageWatch

log = structlog.get_logger("koordnode.qos")

EvictFn = Callable[[str, str], Awaitable[Any]]

STRATEGIES = tuple(s.name for s in REGISTRY)
__all__ = ["EvictFn", "QoSManager", "STRATEGIES"]

# Usage wake-ups: LS CPU time must grow at least this fast (CPUs) to wake the manager, and
# woken ticks are at least this far apart.
_USAGE_WAKE_MIN_RATE = 0.5
_MIN_USAGE_WAKE_INTERVAL_S = 0.1
# How long stopping waits for the tick in progress.
_STOP_WAIT_S = 10.0


class QoSManager:
    def __init__(
        self,
        settings: ManagerSettings,
        state: NodeState,
        executor: CgroupExecutor,
        *,
        procfs_root: str | Path = "/proc",
        cgroup_root: str | Path | None = None,
        evict: EvictFn | None = None,
        memory_plan: MemoryPlanFn | None = None,
        procfs_executor: ProcfsExecutor | None = None,
        originals: OriginalsJournal | None = None,
        reserved_cpus: ReservedCpus = None,
        topology: CpuTopology | None = None,
        layout: KubeletLayout | None = None,
        strategies: Sequence[Strategy] = REGISTRY,
        on_tick: Callable[[TickReport], None] | None = None,
        be_starts: BeStarts | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """
        settings: the sections the manager reads (ManagerSettings.of(config) in the daemon).
        state: the NodeState kept by the proxy.
        executor: the CgroupExecutor every cgroup write goes through.
        procfs_root / cgroup_root: where statistics are read (cgroup_root defaults to the
            executor's root); sysctl writes go through a ProcfsExecutor on procfs_root.
        evict: async (container_id, reason) stopping a container through the CRI backend.
        memory_plan: returns the hooks' memory writes (memory.min/low/high, wmark_*) for the
            running pods and containers; memory_qos re-applies them.
        layout: kubelet's cgroup layout, shared with the engine (default: resolved from settings).
        reserved_cpus: node-reserved CPU ids (or a callable giving them); default: resolved
            from [node] reserved_cpus the CPU allocator's way (on `topology`, default read
            under [sysfs] root).
        strategies: the strategies to run (default: policy/strategies/registry.py).
        on_tick: called in the tick's thread after every tick (the daemon hands qos.metrics_feed.TickMetrics).
        be_starts: the BE starts the hooks note; a start beginning or ending wakes a tick.
        """
        self._settings = settings.qos_manager
        self.state = state
        self.executor = executor
        self.collector = Collector(procfs_root, cgroup_root if cgroup_root is not None else executor.root)
        self._procfs_root = procfs_root
        self._procfs_executor = procfs_executor
        self._originals = originals  # where the sysctls' originals are kept before their first write
        self._evict = evict
        self._clock = clock
        self._wall = wall_clock
        self._measure = Measurer(settings, self.collector, memory_plan=memory_plan,
                                 reserved_cpus=reserved_cpus, topology=topology, clock=clock, sleep=sleep,
                                 layout=layout)
        self._inventory = InventoryBuilder(settings.qos_mapping.as_mapping(), self._measure.driver)
        self._book = StatusBook()
        self._runner = StrategyRunner(strategies, settings.strategy, executor, self._procfs, self.collector, self._book)
        self._tick_lock = threading.Lock()
        self.last_node: Any = None  # the NodeSample of the last tick
        self.last_snapshot: TickSnapshot | None = None
        self.on_tick = on_tick
        self.be_starts = be_starts
        if be_starts is not None:
            be_starts.subscribe(self._request_tick)

        # Loop side.
        self._loop: asyncio.AbstractEventLoop | None = None
        # Wake-ups for the tick thread (from the loop's watches, reconfigure, stop).
        self._wake = threading.Event()
        self._wake_lock = threading.Lock()
        self._woken_by: str | None = None
        self._stopping = False
        # The (pressure, usage) targets last handed to the loop's watches.
        self._handed_targets: tuple[dict[str, str], dict[str, str]] | None = None
        self._watch: PressureWatch | None = None
        self._usage: UsageWatch | None = None
        self._pressure_watch_note: str | None = None
        self._evict_tasks: set[asyncio.Task[Any]] = set()
        # Dry run: decide and report, but write nothing (executors), register no PSI trigger
        # (a kernel write: the watch polls instead) and evict nothing.
        self._dry_run = False

    # ================================================================== public API

    @property
    def kubepods(self) -> str:
        return self._measure.kubepods

    @property
    def history(self) -> History:
        return self._measure.history

    def host_applications(self) -> dict[str, tuple[HostApplication, str]]:
        """name -> (host application, its cgroup), as configured."""
        return self._measure.host_applications()

    @property
    def host_app_used_cpus(self) -> dict[str, float]:
        return dict(self._measure.host_app_used_cpus)

    @property
    def usage_window(self) -> History:
        """The node's usage, a sample a second over the last half hour (NodeMetric's percentiles)."""
        return self._measure.usage_window

    @property
    def be_tier(self) -> str:
        """The cgroup holding the BE pods: koordnode's idle BE group once it exists (the hooks
        create it with the first BE pod), else kubelet's besteffort tier."""
        return self._measure.be_tier

    @property
    def dry_run(self) -> bool:
        return self._dry_run

    @dry_run.setter
    def dry_run(self, dry_run: bool) -> None:
        self.set_dry_run(dry_run)

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
        if not self._runner.confines_be_cpuset():
            return None
        return self.collector.cpuset_cpus(self.be_tier)

    def inventory(self) -> Inventory:
        """The pods and containers the next tick works on (from NodeState's current view,
        which no later change alters: any thread; rebuilt only when the view changed)."""
        return self._inventory.build(self.state)

    def forgets(self, cgroup: str) -> bool:
        """Whether nothing measured of `cgroup` is kept any more."""
        return self._measure.forgets(cgroup)

    def decorate(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        """Add the enabled strategies' per-pod fields (e.g. a BE pod's memory bound) to a
        NodeState snapshot, after the engine's decorate, which gives the pods their class."""
        sources = [s for s in self._runner.enabled_states() if isinstance(s, PodStatusFields)]
        for pod in snapshot.get("pods", []) if sources else ():
            for source in sources:
                pod.update(source.pod_status_fields(pod))
        return snapshot

    def reconfigure(self, settings: ManagerSettings) -> None:
        """Apply a reloaded configuration; what a strategy leaves behind is undone next tick."""
        old_settings, new_settings = self._settings, settings.qos_manager
        with self._tick_lock:
            self._settings = new_settings
            self._inventory.set_mapping(settings.qos_mapping.as_mapping())
            self._measure.configure(settings)
            self._inventory.set_driver(self._measure.driver)
            restores = self._runner.reconfigure(settings.strategy)
            if (old_settings.psi_stall_us, old_settings.psi_window_us, old_settings.psi_poll_ms,
                    old_settings.psi_triggers) != (new_settings.psi_stall_us, new_settings.psi_window_us,
                                                   new_settings.psi_poll_ms, new_settings.psi_triggers):
                self._restart_watch()
            if new_settings.usage_wake_cpu_ms != old_settings.usage_wake_cpu_ms:
                self._restart_usage_watch()
        log.info("qos_reconfigured", restores=restores)
        self._request_tick("reconfigure")

    def tick(self, woken_by: str | None = None) -> TickReport:
        """One tick now, in the calling thread (tests, benchmarks). Evictions are returned,
        not executed."""
        return self._tick(woken_by)

    async def run(self, stop_event: asyncio.Event) -> None:
        """Tick every tick_ms and on pressure or LS usage, until stop_event is set.

        The ticks run in a thread of their own that keeps the schedule itself: a regular tick
        does not wake the event loop (which serves CRI calls). The loop owns the watches (their
        file descriptors are in its selector) and the evictions (CRI calls): it wakes the tick
        thread on their events, and hears back only when a tick changed what it owns (the
        watched cgroups, events a wake disabled, evictions)."""
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._start_watch()
        self._start_usage_watch()
        log.info("qos_manager_started", tick_ms=self._settings.tick_ms, be_tier=self.be_tier,
                 cgroup_version=self.collector.version.value, trigger_mode=self.trigger_mode)
        thread = threading.Thread(target=self._tick_loop, name="koordnode-qos", daemon=True)
        thread.start()
        try:
            await stop_event.wait()
        finally:
            self._stopping = True
            self._wake.set()
            thread.join(_STOP_WAIT_S)  # at most the tick in progress (a few ms)
            self._stop_watch()
            if self._usage is not None:
                self._usage.stop()
                self._usage = None
            if self._evict_tasks:
                await asyncio.gather(*list(self._evict_tasks), return_exceptions=True)
            self.collector.close()
            self._loop = None
            log.info("qos_manager_stopped")

    def status(self) -> dict[str, Any]:
        watch = self._watch.status() if self._watch is not None else {"mode": "not running"}
        if self._pressure_watch_note:
            watch["note"] = self._pressure_watch_note
        history = self.history
        names = history.names()
        node_series = [n for n in names if n.startswith("node/") or n.startswith("tier/")]
        pod_series = [n for n in names if n.startswith("pod/") and n.endswith("/cpu")]
        return {
            "trigger_mode": watch["mode"],
            "pressure_watch": watch,
            "usage_watch": self._usage.status() if self._usage is not None else {"mode": "not running"},
            "be_tier": self.be_tier,
            # BE sandboxes and containers being started now, and since the daemon started.
            "be_starts": ({"in_flight": self.be_starts.in_flight(), "total": self.be_starts.total,
                           "oldest_s": round(self.be_starts.oldest_age_s(), 1)}
                          if self.be_starts is not None else None),
            "cgroup_version": self.collector.version.value,
            "ticks": self._book.ticks_status(self._settings.tick_ms),
            "strategies": self._runner.status(),
            "node": history.summaries(node_series),
            # CPUs each pod used over the last tick, by sandbox id (what the strategies saw).
            "pod_cpu": {name.split("/")[1]: summary.get("last")
                        for name, summary in history.summaries(pod_series).items()},
            "collector": {
                "errors": self.collector.errors,
                "last_error": self.collector.last_error,
                "open_files": self.collector.reader.open_count,
            },
            "history": {"series": len(history), "capacity": history.capacity},
        }

    # ================================================================== the loop side

    def _request_tick(self, why: str) -> None:
        """Wake the tick thread (any thread may call this)."""
        if self._loop is None:
            return
        self._wake_for(why)

    def _wake_for(self, why: str) -> None:
        with self._wake_lock:
            self._woken_by = self._woken_by or why
        self._wake.set()

    def _on_pressure(self, target: str) -> None:
        self._wake_for(f"pressure:{target}")

    def _on_usage(self, target: str) -> None:
        self._wake_for(f"usage:{target}")

    # ================================================================== the tick thread

    def _tick_loop(self) -> None:
        """The tick thread: ticks at tick_ms, and when woken between ticks (rate-limited)."""
        next_tick = self._clock()
        last_pressure_tick = last_usage_tick = float("-inf")
        while not self._stopping:
            now = self._clock()
            self._wake.clear()
            with self._wake_lock:
                woken_by, self._woken_by = self._woken_by, None
            if woken_by is not None and woken_by.startswith("pressure:") and now < next_tick:
                # At most one pressure tick per PSI window (the kernel's own rate), and
                # none while the early strategies cannot do more (BE suppressed as far as it goes).
                if self._runner.saturated or now - last_pressure_tick < self._settings.psi_window_us / 1e6:
                    self._book.skipped_wake()
                    woken_by = None
                else:
                    last_pressure_tick = now
            elif woken_by is not None and woken_by.startswith("usage:") and now < next_tick:
                if self._runner.saturated or now - last_usage_tick < _MIN_USAGE_WAKE_INTERVAL_S:
                    self._book.skipped_wake()
                    woken_by = None
                else:
                    last_usage_tick = now
            if now >= next_tick or woken_by is not None:
                try:
                    report = self._tick(woken_by)
                except Exception as err:  # noqa: BLE001 - one bad tick must not end the manager
                    self._note_error(err)
                else:
                    self._hand_back(report)
                if now >= next_tick:
                    next_tick = max(next_tick + self._settings.tick_ms / 1000.0, self._clock())
            self._wake.wait(max(0.0, next_tick - self._clock()))

    def _hand_back(self, report: TickReport) -> None:
        """Give the loop what a tick changed of what it owns; nothing (no wake-up) otherwise."""
        watch, usage = self._watch, self._usage
        targets = (report.watch_targets, report.usage_targets)
        retarget = targets != self._handed_targets or bool(
            watch is not None and watch.needs_retry or usage is not None and usage.needs_retry)
        rearm = usage is not None and usage.needs_rearm
        if not (retarget or rearm or report.evictions):
            return
        self._handed_targets = targets
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._after_tick, report, retarget, rearm)
        except RuntimeError:  # the loop closed under us (shutdown)
            pass

    def _after_tick(self, report: TickReport, retarget: bool, rearm: bool) -> None:
        """On the loop: apply what a tick handed back."""
        if retarget:
            if self._watch is not None:
                self._watch.set_targets(report.watch_targets)
            if self._usage is not None:
                self._usage.set_targets(report.usage_targets)
        if rearm and self._usage is not None:
            self._usage.rearm()
        for owner, eviction in zip(report.eviction_owners, report.evictions, strict=True):
            self._spawn_eviction(owner, eviction)

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

    def _spawn_eviction(self, owner: str, eviction: Eviction) -> None:
        assert self._loop is not None
        task = self._loop.create_task(self._run_eviction(owner, eviction))
        self._evict_tasks.add(task)
        task.add_done_callback(self._evict_tasks.discard)

    async def _run_eviction(self, owner: str, eviction: Eviction) -> None:
        log.warning(owner, container_id=eviction.container_id, pod=eviction.pod, reason=eviction.reason)
        record: dict[str, Any] = {"container_id": eviction.container_id, "pod": eviction.pod, "cause": eviction.cause,
                  "reason": eviction.reason, "at": self._wall(), "ok": None}
        if self._dry_run:
            record["ok"] = None
            record["dry_run"] = f"would stop container {eviction.container_id} through the runtime"
            log.warning(f"{owner}_dry_run", container_id=eviction.container_id, would=record["dry_run"])
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
                log.error(f"{owner}_failed", container_id=eviction.container_id, error=str(err))
        self._book.record_eviction(owner, eviction.cause, record)

    def _note_error(self, err: Exception) -> None:
        log.exception("qos_tick_failed", error=str(err))
        self._book.tick_failed(err)

    # ================================================================== the tick

    def _procfs(self) -> ProcfsExecutor:
        if self._procfs_executor is None:
            self._procfs_executor = ProcfsExecutor(self._procfs_root, dry_run=self._dry_run,
                                                   originals=self._originals)
        return self._procfs_executor

    def _tick(self, woken_by: str | None) -> TickReport:
        with self._tick_lock:  # the inventory too: a reconfigure may change its mapping
            started = time.perf_counter()
            inventory = self.inventory()
            report = self._tick_locked(inventory, woken_by)
            report.duration_s = time.perf_counter() - started
            if self.on_tick is not None:
                try:
                    self.on_tick(report)
                except Exception as err:  # noqa: BLE001 - an observer must not break the loop
                    self._note_error(err)
            self._book.record_tick(woken_by, report.duration_s, {
                "at": report.at,
                "duration_ms": round(report.duration_s * 1000, 3),
                "woken_by": woken_by,
                "pods": len(inventory.pods),
                "writes": sum(1 for w in report.writes if w.status is WriteStatus.WRITTEN),
                "skipped_pods": list(inventory.skipped[:5]),
            })
            return report

    def _tick_locked(self, inventory: Inventory, woken_by: str | None) -> TickReport:
        report = TickReport(at=self._wall(), duration_s=0.0, woken_by=woken_by)
        measured = self._measure.measure(inventory, woken_by)
        if self.be_starts is not None:
            measured.snapshot = dataclasses.replace(measured.snapshot, be_starting=self.be_starts.in_flight(),
                                                    be_start_age_s=self.be_starts.oldest_age_s())
        self.last_node = report.node = measured.node
        self.last_snapshot = measured.snapshot  # the NodeMetric report and the batch allocatable read it
        if self._runner.early_enabled():  # pressure and usage wake-ups only serve early strategies
            collector, targets = self.collector, measured.watch_targets
            report.usage_targets = {name: path for name, path in
                                    ((t, collector.perf_cgroup_dir(t)) for t in targets) if path}
            usage_armed = self._usage is not None and self._usage.active
            if not self._measure.pressure_watch_needed(inventory, usage_armed):
                self._pressure_watch_note = ("idle: LS usage events are armed and every BE pod is in the "
                                             "BE group (idle, or the lowest weight while LS is quiet), "
                                             "so BE cannot stall LS")
            else:
                self._pressure_watch_note = None
                report.watch_targets = {name: path for name, path in
                                        ((t, collector.pressure_path(t, "cpu")) for t in targets) if path}
        self._runner.run(measured.snapshot, report)
        self._measure.forget_gone(inventory)
        # After any reconcile pass of this tick, so their descriptors stay cached.
        self._measure.sweep(measured.snapshot.now)
        return report
