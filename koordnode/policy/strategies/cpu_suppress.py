"""BE CPU suppression: give BE what the LS side and the system leave over, and no more.

    budget = node CPUs x threshold% - LS usage - max(system usage, node reserved)
    budget x= ratio(LS CPU pressure)          (the configurable pressure curve)

threshold% is `threshold_percent` while BE runs in kubelet's besteffort tier, and
`idle_group_threshold_percent` while every BE pod is in koordnode's BE group, which is idle
(cpu.idle = 1) whenever BE is suppressed. In an idle group the kernel already runs a waking LS
task before BE, so holding CPU back (35% of the node at 65%) buys LS no latency (measured:
bench/ls_latency.py) and only costs BE throughput; the quota is then left to keep BE out of the
CPU that LS, the system and the reservation use, and to follow an LS step within a tick
(bench/qos_reaction.py).

While LS is quiet (its pods use at most `ls_quiet_percent` of the node, no LS CPU pressure on
the curve) the cfs_quota policy suppresses nothing: no quota, and the BE group not idle at the
lowest weight. Both suppression tools cost a quiet LS latency on a kernel with EEVDF: the idle
flag makes wake-up placement send LS's network wake-ups to a CPU running BE, and every quota
refill starts BE on a fresh, protected slice that a waking LS task waits behind
(bench/wake_placement.py); the lowest weight alone keeps BE's CPU time off LS. When LS gets
busy both apply at once; the quiet state returns once the quota has grown back to its target.

While the runtime starts a BE pod's sandbox or container (model/be_starts.py) the cfs_quota
policy lets BE have at least `pod_start_cpu_percent` of one CPU, first with the group still idle
(the start gets what LS leaves over, and LS still runs first), then, once a start has run for
`pod_start_lift_after_s`, with koordnode's BE group out of idle at `pod_start_shares`: an idle
group (or the lowest weight) beside LS pods busy on every CPU gets a few thousandths of a CPU,
and runc's work for the start ran past kubelet's runtime request timeout, while a group out of
idle costs LS its wake-up latency for as long as it lasts. The allowance is bounded (the quota)
and lasts as long as the start (each at most `pod_start_max_s`); then the group is idle again
at once.

Policy "cfs_quota" turns the budget into the BE tier cgroup's CFS quota (floor
`min_quota_us`); policy "cpuset" into a number of CPUs for BE (ceil(budget), at least
`min_cpus`, never LSE/LSR/reserved ones). Either way a smaller budget applies at once (LS
needs the CPU now) while a larger one grows by at most `max_growth_percent` of the node per
tick (BE is let back in gradually, so one quiet sample does not undo the suppression), and
changes below `min_change_percent` are not written at all.

Pure: inputs and config in, writes and an explanation out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from koordnode.policy.plan import CgroupWrite
from koordnode.model.be_group import is_be_group
from koordnode.model.cpulist import format_cpu_list, parse_cpu_list
from koordnode.model.kernel import CPU_SHARES_MIN, DEFAULT_CFS_PERIOD_US
from koordnode.model.qos_class import QoSClass
from koordnode.policy.strategies.base import TickSnapshot
from koordnode.policy.strategies.common import BeBudget, Explanation, StrategyResult, rounded
from koordnode.config.strategies import CpuSuppressConfig, PressureCurve

NAME = "cpu_suppress"
UNLIMITED = -1


@dataclass(frozen=True)
class CpuSuppressInput:
    node_cpus: int  # online CPUs
    ls_used_cpus: float  # SYSTEM + LSE + LSR + LS pods, over the last interval
    be_used_cpus: float
    system_used_cpus: float  # node usage outside the pods
    reserved_cpus: float  # the node reservation, CPUs
    ls_pressure_percent: float | None  # LS CPU "some" pressure; None = not measurable
    be_tier: str  # the BE tier cgroup ("/kubepods/besteffort") or koordnode's BE group
    current_quota_us: int | None = None  # the tier's quota now (-1 unlimited); None = tier missing
    period_us: int = DEFAULT_CFS_PERIOD_US
    elapsed_s: float | None = None  # since the previous decision; None = first one
    tick_s: float = 1.0
    # cpuset policy
    online_cpus: frozenset[int] = frozenset()
    excluded_cpus: frozenset[int] = frozenset()  # LSE / LSR owned and node-reserved
    current_be_cpus: frozenset[int] | None = None  # the tier's cpuset now
    # Where the BE cpuset is written: the tier, then every BE pod and its containers (also those
    # outside the tier, e.g. BE-labelled Burstable pods). cpu_suppress is the one writer of BE
    # cpusets while its cpuset policy runs; the engine only puts the set into CRI requests.
    be_cpuset_cgroups: tuple[str, ...] = ()
    # The BE cgroup is koordnode's BE group (not kubelet's tier, which must never be idle): the
    # suppressed state makes it idle, the quiet state gives it the lowest weight.
    be_group: bool = False
    be_idle: bool = False  # the BE cgroup reads cpu.idle = 1 now
    be_lowest_weight: bool | None = None  # it reads cpu.shares 2 / cpu.weight 1; None = unknown
    be_starting: int = 0  # BE sandboxes and containers the runtime is starting now
    be_start_age_s: float = 0.0  # how long the oldest of them has been starting
    start_lifted: bool = False  # the previous decision left the group at pod_start_shares for a start
    # The quota the budget alone gave when the previous decision raised it to the allowance
    # (None: it did not): growth goes on from there, not from the allowance, after the start.
    budget_quota_us: int | None = None


def pressure_ratio(pressure_percent: float | None, curve: PressureCurve) -> float:
    """Piecewise-linear ratio for a pressure; flat before the first and after the last point."""
    if pressure_percent is None or not curve:
        return 1.0
    first_x, first_y = curve[0]
    if pressure_percent <= first_x:
        return first_y
    for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
        if pressure_percent <= x1:
            return y0 + (y1 - y0) * (pressure_percent - x0) / (x1 - x0)
    return curve[-1][1]


@dataclass(frozen=True)
class StartLift:
    """cpu_suppress's memory while a BE start has the allowance: the quota the budget alone gave,
    and whether the BE group was lifted (its weight is then koordnode's, not someone else's)."""

    budget_quota_us: int
    group_lifted: bool


@dataclass(frozen=True)
class Budget:
    raw_cpus: float  # before the pressure ratio, may be negative
    ratio: float
    cpus: float  # >= 0


def group_gives_way(inp: CpuSuppressInput) -> bool:
    """The BE cgroup is koordnode's group in one of the states it keeps: idle, or (quiet) the
    lowest weight. At any other weight someone else set it (an operator's CPUWeight=, systemd
    re-applying one): the engine's reconcile pass restores it (through systemd, so the
    property is right too), the strategy leaves it alone and BE does not yield meanwhile."""
    return inp.be_idle or (inp.be_group and (inp.be_lowest_weight is True or inp.start_lifted))


def effective_threshold_percent(inp: CpuSuppressInput, cfg: CpuSuppressConfig) -> float:
    """The share of the node LS + system + BE may use: higher while BE is in koordnode's group
    and it gives way (idle whenever suppressed)."""
    return cfg.idle_group_threshold_percent if group_gives_way(inp) else cfg.threshold_percent


def ls_quiet(inp: CpuSuppressInput, cfg: CpuSuppressConfig, budget: Budget) -> bool:
    """LS uses little CPU and is not under CPU pressure: BE needs no suppression (quota policy)."""
    return (cfg.policy == "cfs_quota" and cfg.ls_quiet_percent > 0 and budget.ratio >= 1.0
            and inp.ls_used_cpus <= inp.node_cpus * cfg.ls_quiet_percent / 100.0)


def be_budget(inp: CpuSuppressInput, cfg: CpuSuppressConfig) -> Budget:
    raw = (
        inp.node_cpus * effective_threshold_percent(inp, cfg) / 100.0
        - inp.ls_used_cpus
        - max(inp.system_used_cpus, inp.reserved_cpus)
    )
    ratio = pressure_ratio(inp.ls_pressure_percent, cfg.pressure_curve)
    return Budget(raw, ratio, max(0.0, raw) * ratio)


def _growth_scale(inp: CpuSuppressInput) -> float:
    # Extra ticks woken by PSI events must not speed up the growth: scale it by time.
    if inp.elapsed_s is None or inp.tick_s <= 0:
        return 1.0
    return max(0.0, min(1.0, inp.elapsed_s / inp.tick_s))


def _inputs(inp: CpuSuppressInput, cfg: CpuSuppressConfig, budget: Budget) -> dict[str, object]:
    return {
        "policy": cfg.policy,
        "node_cpus": inp.node_cpus,
        "threshold_percent": effective_threshold_percent(inp, cfg),
        "be_group": inp.be_group,
        "be_idle": inp.be_idle,
        "ls_quiet_percent": cfg.ls_quiet_percent,
        "ls_used_cpus": rounded(inp.ls_used_cpus),
        "be_used_cpus": rounded(inp.be_used_cpus),
        "system_used_cpus": rounded(inp.system_used_cpus),
        "reserved_cpus": rounded(inp.reserved_cpus),
        "ls_pressure_percent": rounded(inp.ls_pressure_percent, 2),
        "pressure_ratio": rounded(budget.ratio),
        "budget_before_ratio_cpus": rounded(budget.raw_cpus),
        "be_budget_cpus": rounded(budget.cpus),
        "be_tier": inp.be_tier,
        "be_starting": inp.be_starting,
        "be_start_age_s": rounded(inp.be_start_age_s),
    }


def decide_cpu_suppress(inp: CpuSuppressInput, cfg: CpuSuppressConfig) -> StrategyResult:
    budget = be_budget(inp, cfg)
    inputs = _inputs(inp, cfg, budget)
    if cfg.policy == "cpuset":
        return _decide_cpuset(inp, cfg, budget, inputs)
    return _decide_quota(inp, cfg, budget, inputs)


def _group_writes(inp: CpuSuppressInput, *, idle: bool, why: str,
                  shares: int = CPU_SHARES_MIN) -> list[CgroupWrite]:
    """The BE group's idle flag (and, when not idle, its weight: the lowest, or pod_start_shares
    for a start) where it differs; nothing for kubelet's tier. The executor writes cpu.idle
    first: clearing it resets the weight to the default, and an idle group refuses a weight."""
    if not (inp.be_group and group_gives_way(inp)):
        return []
    writes: list[CgroupWrite] = []
    if inp.be_idle != idle:
        writes.append(CgroupWrite(inp.be_tier, "cpu.idle", int(idle), f"cpu_suppress: {why}"))
    at_lowest = inp.be_lowest_weight is True
    if not idle and (inp.be_idle or at_lowest != (shares == CPU_SHARES_MIN)):
        writes.append(CgroupWrite(inp.be_tier, "cpu.shares", shares, f"cpu_suppress: {why}"))
    return writes


def starting(inp: CpuSuppressInput, cfg: CpuSuppressConfig) -> bool:
    """A BE start is in flight and the allowance is on (cfs_quota policy)."""
    return inp.be_starting > 0 and cfg.pod_start_cpu_percent > 0 and cfg.policy == "cfs_quota"


def _decide_quota(inp: CpuSuppressInput, cfg: CpuSuppressConfig, budget: Budget,
                  inputs: dict[str, object]) -> StrategyResult:
    inputs.update(current_quota_us=inp.current_quota_us, period_us=inp.period_us)
    if inp.current_quota_us is None:
        return StrategyResult(Explanation(NAME, inputs, "no change", f"BE tier {inp.be_tier} does not exist"))
    capacity = inp.node_cpus * inp.period_us
    current = inp.current_quota_us
    unlimited = current == UNLIMITED or current > capacity
    effective = capacity if unlimited else current
    if inp.budget_quota_us is not None:  # the allowance raised it: go on from the budget's own
        effective = min(effective, inp.budget_quota_us)
    target = max(cfg.min_quota_us, round(budget.cpus * inp.period_us))
    quiet = ls_quiet(inp, cfg, budget)
    start = starting(inp, cfg)
    allowance = round(cfg.pod_start_cpu_percent / 100.0 * inp.period_us) if start else 0
    inputs.update(target_quota_us=target, ls_quiet=quiet)
    if target < effective:
        new, how = target, "shrink at once"
    else:
        step = cfg.max_growth_percent / 100.0 * capacity * _growth_scale(inp)
        new = max(cfg.min_quota_us, min(target, round(effective + step)))
        how = "grow (limited)" if new < target else "grow"
    # Quiet, and BE already unthrottled or its quota grown back to the target: lift it all.
    if quiet and new >= target:
        return _lift(inp, cfg, inputs, current)
    budget_quota = new
    if new < allowance:
        new, how = allowance, f"at least {cfg.pod_start_cpu_percent}% of a CPU while {inp.be_starting} BE start(s) run"
    # The allowance's second step: a start has run `pod_start_lift_after_s` on the quota alone.
    lift_group = start and inp.be_start_age_s >= cfg.pod_start_lift_after_s
    if lift_group:
        writes = _group_writes(inp, idle=False, shares=cfg.pod_start_shares,
                               why=f"a BE pod has been starting {inp.be_start_age_s:.0f} s: BE group not idle "
                                   f"at cpu.shares {cfg.pod_start_shares}")
    else:
        writes = _group_writes(inp, idle=True, why="LS busy: BE group idle while suppressed")
    group_lifted = lift_group and inp.be_group and group_gives_way(inp)
    lift = StartLift(budget_quota, group_lifted) if budget_quota < new or group_lifted else None
    reason = (
        f"BE budget {budget.cpus:.2f} CPUs = {inp.node_cpus} x {effective_threshold_percent(inp, cfg)}%"
        f"{' (BE group)' if inp.be_group else ''} - LS "
        f"{inp.ls_used_cpus:.2f} - max(system {inp.system_used_cpus:.2f}, reserved {inp.reserved_cpus:.2f})"
        f", x {budget.ratio:.2f} for LS pressure; {how}"
    )
    if not unlimited and abs(new - current) < cfg.min_change_percent / 100.0 * current:
        return StrategyResult(Explanation(
            NAME, inputs, f"keep quota {current}",
            f"{how} to {new} differs by less than {cfg.min_change_percent}%",
        ), writes=tuple(writes), state=lift)
    # The quota before the idle flag in the plan (the executor puts cpu.idle first anyway).
    writes.insert(0, CgroupWrite(inp.be_tier, "cpu.cfs_quota_us", new, f"cpu_suppress: {reason}"))
    return StrategyResult(Explanation(NAME, inputs, f"quota {current} -> {new}", reason), writes=tuple(writes),
                          state=lift)


def _lift(inp: CpuSuppressInput, cfg: CpuSuppressConfig, inputs: dict[str, object], current: int) -> StrategyResult:
    """LS is quiet: no quota, and the BE group not idle at the lowest weight."""
    reason = (f"LS quiet: LS uses {inp.ls_used_cpus:.2f} CPUs <= {cfg.ls_quiet_percent}% of "
              f"{inp.node_cpus}, no LS CPU pressure; BE unthrottled"
              f"{', BE group not idle at the lowest weight' if inp.be_group else ''}")
    writes = _group_writes(inp, idle=False, why=reason)
    if current != UNLIMITED:
        writes.append(CgroupWrite(inp.be_tier, "cpu.cfs_quota_us", UNLIMITED, f"cpu_suppress: {reason}"))
    outcome = f"quota {current} -> {UNLIMITED}, LS quiet" if current != UNLIMITED else "LS quiet"
    if not writes:
        return StrategyResult(Explanation(NAME, inputs, "keep: LS quiet", reason))
    return StrategyResult(Explanation(NAME, inputs, outcome, reason), writes=tuple(writes))


def _choose_cpus(pool: list[int], current: frozenset[int], count: int) -> frozenset[int]:
    """`count` CPUs from the pool: the ones BE has now first (no needless migration), then
    the highest-numbered (low CPUs tend to carry system work and interrupts)."""
    ordered = sorted(pool, key=lambda cpu: (cpu not in current, -cpu))
    return frozenset(ordered[:count])


def _decide_cpuset(inp: CpuSuppressInput, cfg: CpuSuppressConfig, budget: Budget,
                   inputs: dict[str, object]) -> StrategyResult:
    pool = sorted(inp.online_cpus - inp.excluded_cpus)
    current = inp.current_be_cpus
    inputs.update(
        pool=format_cpu_list(frozenset(pool)),
        excluded=format_cpu_list(inp.excluded_cpus),
        current_cpus=format_cpu_list(current) if current is not None else None,
    )
    if current is None:
        return StrategyResult(Explanation(NAME, inputs, "no change", f"BE tier {inp.be_tier} does not exist"))
    if not pool:
        return StrategyResult(Explanation(NAME, inputs, "no change", "no CPU left outside LSE/LSR/reserved"))
    wanted = min(len(pool), max(cfg.min_cpus, math.ceil(budget.cpus)))
    have = len(current & set(pool)) or len(pool)
    if wanted < have:
        count, how = wanted, "shrink at once"
    else:
        step = max(1, round(cfg.max_growth_percent / 100.0 * inp.node_cpus * _growth_scale(inp)))
        count = min(wanted, have + step)
        how = "grow (limited)" if count < wanted else "grow"
    chosen = _choose_cpus(pool, current, count)
    inputs["target_cpus"] = wanted
    if chosen == current:
        return StrategyResult(Explanation(NAME, inputs, f"keep {len(current)} CPUs", "already so"))
    text = format_cpu_list(chosen)
    reason = (f"BE budget {budget.cpus:.2f} CPUs at {effective_threshold_percent(inp, cfg)}%"
              f"{' (BE group)' if inp.be_group else ''} (x {budget.ratio:.2f} for LS pressure) -> {count} "
              f"of {len(pool)} pool CPUs; {how}")
    writes = tuple(CgroupWrite(cg, "cpuset.cpus", text, f"cpu_suppress: {reason}") for cg in inp.be_cpuset_cgroups)
    return StrategyResult(
        Explanation(NAME, inputs, f"cpuset {format_cpu_list(current)} -> {text}", reason), writes=writes
    )


def restore_cpu_suppress(inp: CpuSuppressInput, policy: str) -> StrategyResult:
    """Undo the suppression of `policy`: unlimited quota, or the whole BE pool."""
    if policy == "cpuset":
        pool = inp.online_cpus - inp.excluded_cpus
        if not pool:
            return StrategyResult(Explanation(NAME, {"policy": policy}, "no change", "empty pool"))
        text = format_cpu_list(pool)
        writes = tuple(CgroupWrite(cg, "cpuset.cpus", text, "cpu_suppress disabled: full BE pool")
                       for cg in inp.be_cpuset_cgroups)
        return StrategyResult(Explanation(NAME, {"policy": policy}, f"restore cpuset {text}", "disabled"), writes=writes)
    # The group rests idle while nothing suppresses (what [cgroup] be_idle_group promises).
    restored = (CgroupWrite(inp.be_tier, "cpu.cfs_quota_us", UNLIMITED, "cpu_suppress disabled: no BE quota"),
                *_group_writes(inp, idle=True, why="cpu_suppress disabled: BE group idle"))
    return StrategyResult(Explanation(NAME, {"policy": policy}, "restore quota -1", "disabled"), writes=restored)


# ---------------------------------------------------------------------- the plug-in


def suppress_input(snap: TickSnapshot, policy: str, *, lift: StartLift | None = None) -> CpuSuppressInput:
    """The strategy's input from the tick's snapshot (reads the BE tier's quota or cpuset);
    `lift`: what the previous decision's start allowance left."""
    tier = snap.be_tier
    group = is_be_group(tier)
    idle = snap.probe.cpu_idle(tier) if group else None
    quota = period = None
    current_cpus = None
    cpuset_cgroups: tuple[str, ...] = ()
    if policy == "cpuset":
        current_cpus = snap.probe.cpuset_cpus(tier)
        cgroups = [tier]
        for pod in snap.inventory.of_class(QoSClass.BE):
            cgroups.append(pod.cgroup)
            cgroups += [c.cgroup for c in pod.containers]
        cpuset_cgroups = tuple(cgroups)
    else:
        found = snap.probe.cfs_quota(tier)
        if found is not None:
            quota, period = found
    return CpuSuppressInput(
        node_cpus=len(snap.online_cpus),
        ls_used_cpus=snap.ls_used_cpus,
        be_used_cpus=snap.be_used_cpus,
        system_used_cpus=snap.system_used_cpus or 0.0,
        reserved_cpus=float(len(snap.reserved_cpus)),
        ls_pressure_percent=snap.ls_pressure_percent,
        be_tier=tier,
        current_quota_us=quota,
        period_us=period or DEFAULT_CFS_PERIOD_US,
        elapsed_s=snap.elapsed_s,
        tick_s=snap.tick_s,
        online_cpus=snap.online_cpus,
        excluded_cpus=snap.excluded_cpus,
        current_be_cpus=current_cpus,
        be_cpuset_cgroups=cpuset_cgroups,
        # Only koordnode's group: kubelet's tier is never idle (kubelet would fail on it).
        be_group=group and idle is not None,
        be_idle=group and idle is True,
        be_lowest_weight=snap.probe.cpu_lowest_weight(tier) if group and idle is False else None,
        be_starting=snap.be_starting,
        be_start_age_s=snap.be_start_age_s,
        start_lifted=lift is not None and lift.group_lifted and group and idle is False,
        budget_quota_us=lift.budget_quota_us if lift is not None else None,
    )


def at_minimum(inp: CpuSuppressInput, cfg: CpuSuppressConfig, result: StrategyResult) -> bool:
    """Whether BE is now suppressed as far as the policy goes (quota floor, fewest CPUs)."""
    if cfg.policy == "cpuset":
        value = result.writes[0].value if result.writes else inp.current_be_cpus
        cpus = parse_cpu_list(value) if isinstance(value, str) else value
        return isinstance(cpus, frozenset) and len(cpus) <= cfg.min_cpus
    written = [w.value for w in result.writes if w.resource == "cpu.cfs_quota_us"]
    quota = written[0] if written else inp.current_quota_us
    return isinstance(quota, int) and 0 < quota <= cfg.min_quota_us


def budget_fact(inp: CpuSuppressInput, cfg: CpuSuppressConfig, result: StrategyResult) -> BeBudget:
    """The decision as a typed fact for the strategies after this one and the metrics."""
    budget = be_budget(inp, cfg)
    if cfg.policy == "cpuset":
        return BeBudget(budget.cpus, budget.ratio)
    quota_write = next((w for w in result.writes if w.resource == "cpu.cfs_quota_us"), None)
    return BeBudget(budget.cpus, budget.ratio, quota_us=inp.current_quota_us, period_us=inp.period_us,
                    quota_write=quota_write)


class CpuSuppress:
    name = NAME
    early = True  # the reason for pressure and usage wake-ups
    precheck = False  # decided against the values just read
    evicts = False

    def initial_state(self) -> None:
        return None

    def decide(self, snap: TickSnapshot, cfg: CpuSuppressConfig, state: Any,
               earlier: Mapping[str, StrategyResult]) -> StrategyResult:
        inp = suppress_input(snap, cfg.policy, lift=state if isinstance(state, StartLift) else None)
        if not snap.rates_ready:
            return StrategyResult(Explanation(NAME, {}, "no change", "warming up: usage rates need two samples"),
                                  state=state)
        result = decide_cpu_suppress(inp, cfg)
        return StrategyResult(
            result.explanation, writes=result.writes,
            facts=(budget_fact(inp, cfg, result),),
            saturated=at_minimum(inp, cfg, result),
            state=result.state,
        )

    def restore_config(self, old: CpuSuppressConfig | None, new: CpuSuppressConfig) -> CpuSuppressConfig | None:
        if old is None:
            # Started with the strategy off: a quota an earlier run left on the BE tier or
            # group (koordnode's own, it outlives restarts) must not hold BE down for good.
            return new if not new.enable else None
        if old.enable and (not new.enable or new.policy != old.policy):
            return old
        return None

    def restore(self, snap: TickSnapshot, cfg: CpuSuppressConfig, state: Any) -> StrategyResult:
        lift = state if isinstance(state, StartLift) else None
        return restore_cpu_suppress(suppress_input(snap, cfg.policy, lift=lift), cfg.policy)

    def status(self, cfg: CpuSuppressConfig, state: Any) -> dict[str, Any]:
        return {"policy": cfg.policy}


    def confines_be_cpuset(self, cfg: CpuSuppressConfig) -> bool:
        return cfg.enable and cfg.policy == "cpuset"

STRATEGY = CpuSuppress()
