"""The strategy interface and what a strategy sees of the node (one immutable snapshot per tick).

A strategy is one module in this package with an object implementing `Strategy`, listed once
in `registry.py`. It decides from the snapshot, its `[strategy.<name>]` config section and the
state it returned last time; it returns writes, sysctls, evictions and an explanation as data
(`StrategyResult`) and never writes anything: the QoS manager (koordnode/qos/) hands the writes
to the executor, stops the containers and records the explanation for `koordnode status`.

Strategy-specific cgroup values are read through `snapshot.probe` (read-only, answered by the
manager's collector), so a strategy reads only what it needs, and only when it needs it.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from koordnode.policy.plan import CgroupWrite
from koordnode.model.qos_class import QoSClass
from koordnode.policy.strategies.common import StrategyResult

# Classes whose usage counts against the BE budget (everything but BE).
NON_BE_CLASSES = frozenset({QoSClass.SYSTEM, QoSClass.LSE, QoSClass.LSR, QoSClass.LS})


@dataclass(frozen=True)
class ContainerView:
    container_id: str
    name: str
    cgroup: str
    cpu_quota_us: int  # 0 = no limit
    cpu_period_us: int
    cpuset: frozenset[int] | None  # as requested through CRI; None = not set
    batch_cpu_milli: int | None  # BE: kubernetes.io/batch-cpu request
    memory_limit_bytes: int = 0  # as requested through CRI; 0 = no limit


@dataclass(frozen=True)
class PodView:
    sandbox_id: str
    name: str  # namespace/name
    qos_class: QoSClass
    cgroup: str
    priority: int
    containers: tuple[ContainerView, ...]
    # The cgroup's parent (kubelet's QoS tier or koordnode's BE group); read for every pod on
    # every tick, so worked out once.
    tier: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tier", posixpath.dirname(self.cgroup.rstrip("/")) or "/")


@dataclass(frozen=True)
class Inventory:
    """The node's running pods and containers, with class and cgroup paths."""

    pods: tuple[PodView, ...]
    skipped: tuple[str, ...] = ()  # pods left out, with the reason

    def of_class(self, *classes: QoSClass) -> list[PodView]:
        return [p for p in self.pods if p.qos_class in classes]


class Probe(Protocol):
    """Read-only questions a strategy may ask during its decision (None: cannot be told)."""

    def cfs_quota(self, cgroup: str) -> tuple[int, int] | None:
        """(quota_us, period_us); quota -1 = unlimited."""

    def cpuset_cpus(self, cgroup: str) -> frozenset[int] | None: ...

    def cpu_idle(self, cgroup: str) -> bool | None:
        """Whether the cgroup is idle (cpu.idle = 1: SCHED_IDLE against its siblings)."""

    def cpu_lowest_weight(self, cgroup: str) -> bool | None:
        """Whether the cgroup has the lowest CPU weight (v1 cpu.shares 2, v2 cpu.weight 1)."""

    def nr_throttled(self, cgroup: str) -> int | None: ...

    def working_set_bytes(self, cgroup: str) -> int | None: ...

    def memory_plan(self) -> tuple[CgroupWrite, ...] | None:
        """The hooks' memory writes for the running pods and containers; None: no planner."""

    def memory_plan_note(self) -> str:
        """Why memory_plan() gave None (shown as memory_qos's planner); "" = no planner."""


@dataclass(frozen=True)
class TickSnapshot:
    """What the manager measured for one tick; every strategy decides from the same one."""

    now: float  # monotonic seconds
    woken_early: bool  # a tick woken between ticks (pressure or LS usage)
    inventory: Inventory
    be_tier: str  # the cgroup holding the BE pods (kubelet's besteffort tier or koordnode's BE group)
    online_cpus: frozenset[int]
    reserved_cpus: frozenset[int]  # [node] reserved_cpus, resolved the allocator's way
    excluded_cpus: frozenset[int]  # reserved plus LSE/LSR-owned CPUs
    ls_used_cpus: float  # non-BE pods, over the last interval
    be_used_cpus: float
    lse_lsr_used_cpus: float
    node_used_cpus: float | None  # None until measured over a full window
    system_used_cpus: float | None  # node use outside the pods
    ls_pressure_percent: float | None  # LS CPU "some" pressure; None = not measurable
    rates_ready: bool  # usage rates have two samples (the warm-up is over)
    elapsed_s: float | None  # since the previous tick's decisions; None = first tick
    tick_s: float  # [qos_manager] tick_ms
    reconcile_interval_s: float  # [qos_manager] reconcile_interval_s
    memory_total_bytes: int | None  # None = /proc/meminfo not readable
    memory_used_bytes: int | None
    probe: Probe
    # kubelet's top cgroup of every pod, and both BE tiers (its besteffort tier, koordnode's BE group)
    kubepods: str = ""
    be_tiers: tuple[str, ...] = ()
    be_starting: int = 0  # BE sandboxes and containers the runtime is starting (model/be_starts.py)
    be_start_age_s: float = 0.0  # how long the oldest of them has been starting

    def due(self, last: float | None) -> bool:
        """Whether a periodic (reconcile) pass last run at `last` is due again."""
        return last is None or self.now - last >= self.reconcile_interval_s


class Strategy(Protocol):
    """One QoS strategy. `name` is also its config section, `[strategy.<name>]`, whose object
    has at least `enable: bool`. Every method is pure: data in, data out."""

    name: str
    early: bool  # also decides on ticks woken early (pressure, LS usage); else regular ticks only
    precheck: bool  # its writes are mostly in place already: compare before handing them over
    evicts: bool  # may return evictions (status shows an evictions block)

    def initial_state(self) -> Any: ...

    def decide(self, snapshot: TickSnapshot, cfg: Any, state: Any,
               earlier: Mapping[str, StrategyResult]) -> StrategyResult:
        """The decision of an enabled strategy; `earlier`: this tick's results of the
        strategies listed before it in the registry."""

    def restore_config(self, old: Any | None, new: Any) -> Any | None:
        """After a config change (`old` None: at start-up), the config whose effects must be
        undone, or None when nothing must be."""

    def restore(self, snapshot: TickSnapshot, cfg: Any, state: Any) -> StrategyResult:
        """Undo what the strategy left behind under `cfg` (given by restore_config)."""

    def status(self, cfg: Any, state: Any) -> dict[str, Any]:
        """Extra fields for `koordnode status` (beside enabled/decision/last_write/writes)."""

    def confines_be_cpuset(self, cfg: Any) -> bool:
        """Whether, under `cfg`, it writes the BE tier's cpuset (then the hooks create BE
        containers inside it: on cgroup v1 a child's cpuset must fit its parent's)."""
