"""The tick: snapshot -> each registered strategy's pure decision -> the executor.

Knows strategies only through their interface (policy/strategies/base.Strategy): their
config sections, their states between ticks, the restores a config change calls for, and
which of their writes are worth comparing with the kernel first. Nothing here names a strategy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from koordnode.config.strategies import StrategyConfig
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.executor.procfs_executor import ProcfsExecutor
from koordnode.executor.write_result import WriteResult
from koordnode.policy.plan import SysctlWrite
from koordnode.policy.plan import CgroupWrite
from koordnode.executor.resources import RESOURCES, FileFormatError, InvalidValueError
from koordnode.policy.strategies.base import Strategy, TickSnapshot
from koordnode.policy.strategies.common import Eviction, StrategyResult
from koordnode.qos.collect import Collector
from koordnode.qos.status import StatusBook


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
    # strategy name of each eviction, in the order of `evictions`
    eviction_owners: tuple[str, ...] = ()
    node: Any = None  # the NodeSample measured for it (its pressure goes to the metrics)


def strategy_configs(registry: Sequence[Strategy], strategy_config: StrategyConfig) -> dict[str, Any]:
    """name -> its [strategy.<name>] section (the field named after the strategy: a plug-in
    strategy brings its section in a StrategyConfig subclass)."""
    return {s.name: getattr(strategy_config, s.name) for s in registry}


class StrategyRunner:
    """Runs the registered strategies on a snapshot and applies their plans."""

    def __init__(self, registry: Sequence[Strategy], strategy_config: StrategyConfig, executor: CgroupExecutor,
                 procfs: Callable[[], ProcfsExecutor], collector: Collector, status: StatusBook) -> None:
        self.registry = tuple(registry)
        names = [s.name for s in self.registry]
        if len(set(names)) != len(names):
            raise ValueError(f"strategy names must be unique: {names}")
        self.configs = strategy_configs(self.registry, strategy_config)
        self.states: dict[str, Any] = {s.name: s.initial_state() for s in self.registry}
        self.executor = executor
        self._procfs = procfs
        self._collector = collector
        self._status = status
        # (strategy, config whose effects to undo) for the next tick
        self.restores: list[tuple[Strategy, Any]] = []
        for s in self.registry:
            undo = s.restore_config(None, self.configs[s.name])
            if undo is not None:
                self.restores.append((s, undo))
        self.saturated = False  # the early strategies cannot do more: skip early wake-ups

    def reconfigure(self, strategy_config: StrategyConfig) -> list[str]:
        """New config sections; returns the strategies whose old effects the next tick undoes."""
        new = strategy_configs(self.registry, strategy_config)
        restores = []
        for s in self.registry:
            undo = s.restore_config(self.configs[s.name], new[s.name])
            if undo is not None:
                restores.append((s, undo))
        self.configs = new
        self.restores += restores
        return [s.name for s, _ in restores]

    def early_enabled(self) -> bool:
        """Whether an enabled strategy decides on early ticks (pressure/usage wake-ups serve it)."""
        return any(s.early and self.configs[s.name].enable for s in self.registry)

    def confines_be_cpuset(self) -> bool:
        return any(s.confines_be_cpuset(self.configs[s.name]) for s in self.registry)

    def run(self, snap: TickSnapshot, report: TickReport) -> None:
        cgroup_writes: list[tuple[Strategy, CgroupWrite]] = []
        sysctl_writes: list[tuple[Strategy, SysctlWrite]] = []

        # Undo what a strategy disabled (or changed) by a reconfigure left behind.
        restores, self.restores = self.restores, []
        for strategy, old_cfg in restores:
            result = strategy.restore(snap, old_cfg, self.states[strategy.name])
            self.states[strategy.name] = result.state
            report.results[f"{strategy.name}.restore"] = result
            cgroup_writes += [(strategy, w) for w in result.writes]
            sysctl_writes += [(strategy, w) for w in result.sysctls]
            self._status.explain(strategy.name, result.explanation, report.at)

        decided: dict[str, StrategyResult] = {}
        evictions: list[tuple[str, Eviction]] = []
        opinions: list[bool] = []
        for strategy in self.registry:
            cfg = self.configs[strategy.name]
            # A tick woken early is for the early strategies alone; the rest waits for the tick.
            if not cfg.enable or (snap.woken_early and not strategy.early):
                continue
            result = strategy.decide(snap, cfg, self.states[strategy.name], decided)
            self.states[strategy.name] = result.state
            decided[strategy.name] = result
            report.results[strategy.name] = result
            cgroup_writes += [(strategy, w) for w in result.writes]
            sysctl_writes += [(strategy, w) for w in result.sysctls]
            evictions += [(strategy.name, e) for e in result.evictions]
            if strategy.early and result.saturated is not None:
                opinions.append(result.saturated)
            self._status.explain(strategy.name, result.explanation, report.at, only_if_new=not result.explain)
        if opinions:
            self.saturated = all(opinions)
        report.evictions = tuple(e for _, e in evictions)
        report.eviction_owners = tuple(name for name, _ in evictions)
        self._apply(cgroup_writes, sysctl_writes, report)

    def _apply(self, cgroup_writes: list[tuple[Strategy, CgroupWrite]],
               sysctl_writes: list[tuple[Strategy, SysctlWrite]], report: TickReport) -> None:
        if cgroup_writes:
            # Bulk passes (reconcile) mostly find the values in place: check them through the
            # cached descriptors first, so the executor only sees the writes that matter.
            # Resources the executor found unsupported here are dropped without a look.
            unsupported = {name for name in self.executor.unsupported if " " not in name}
            cgroup_writes = [(s, w) for s, w in cgroup_writes
                             if not s.precheck or (w.resource not in unsupported and self._differs(w))]
        if cgroup_writes:
            results = self.executor.apply([w for _, w in cgroup_writes])
            self._status.record_writes([s.name for s, _ in cgroup_writes], results, report.at)
            report.writes += results
        if sysctl_writes:
            results = self._procfs().apply([w for _, w in sysctl_writes])
            self._status.record_writes([s.name for s, _ in sysctl_writes], results, report.at)
            report.writes += results

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
        for fmt in spec.files(self._collector.is_v2):
            text = self._collector.cgroup_file_text(spec.v1_controller, write.cgroup, fmt.filename)
            if text is None:
                continue
            try:
                return bool(fmt.extract(text, value) != fmt.expected(value))
            except (FileFormatError, ValueError):
                return True
        return True

    def status(self) -> dict[str, dict[str, Any]]:
        return self._status.strategies(self.registry, self.configs, self.states)

    def enabled_states(self) -> list[object]:
        """The states the enabled strategies keep; any thread (states are replaced whole)."""
        return [self.states[s.name] for s in self.registry if self.configs[s.name].enable and s.name in self.states]
