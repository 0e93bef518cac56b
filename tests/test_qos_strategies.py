"""The pure strategy functions on synthetic inputs."""

from __future__ import annotations

import dataclasses

import pytest

from koordnode.policy.plan import CgroupWrite
from koordnode.config.strategies import BeEvictConfig, BeMemoryConfig, CpuBurstConfig, CpuSuppressConfig, MemoryQoSConfig
from koordnode.policy.strategies.be_memory import (
    BeMemoryInput,
    BeMemoryState,
    be_memory_budget,
    decide_be_memory,
    restore_be_memory,
)
from koordnode.policy.strategies.cpu_suppress import at_minimum
from koordnode.policy.strategies import (
    BeEvictInput,
    BeEvictState,
    BurstContainer,
    BurstPod,
    CpuBurstInput,
    CpuBurstState,
    CpuSuppressInput,
    EvictCandidate,
    MemoryQoSInput,
    be_budget,
    decide_be_evict,
    decide_cpu_burst,
    decide_cpu_suppress,
    decide_memory_qos,
    pressure_ratio,
    restore_cpu_burst,
    restore_cpu_suppress,
)

TIER = "/kubepods/besteffort"
CURVE = CpuSuppressConfig().pressure_curve
# The quota's arithmetic, without the quiet state (LS at 2 of 8 CPUs counts as quiet).
SUPPRESSING = CpuSuppressConfig(ls_quiet_percent=0)


def suppress_input(**changes) -> CpuSuppressInput:
    base = CpuSuppressInput(
        node_cpus=8, ls_used_cpus=2.0, be_used_cpus=1.0, system_used_cpus=0.4, reserved_cpus=0.0,
        ls_pressure_percent=0.0, be_tier=TIER, current_quota_us=-1, period_us=100_000,
        elapsed_s=1.0, tick_s=1.0,
    )
    return dataclasses.replace(base, **changes)


def quota_of(result) -> int | None:
    values = [w.value for w in result.writes if w.resource == "cpu.cfs_quota_us"]
    return values[0] if values else None


# ------------------------------------------------------------------------ pressure curve


@pytest.mark.parametrize("pressure, ratio", [
    (None, 1.0), (0, 1.0), (40, 1.0), (60, 0.65), (80, 0.3), (87.5, 0.2), (95, 0.1), (100, 0.1),
])
def test_pressure_curve_defaults(pressure, ratio):
    assert pressure_ratio(pressure, CURVE) == pytest.approx(ratio)


def test_pressure_curve_is_configurable():
    curve = ((10.0, 0.9), (20.0, 0.5))
    assert pressure_ratio(5, curve) == pytest.approx(0.9)
    assert pressure_ratio(15, curve) == pytest.approx(0.7)
    assert pressure_ratio(50, curve) == pytest.approx(0.5)


# ------------------------------------------------------------------------ cpu_suppress


def test_budget_formula():
    cfg = CpuSuppressConfig()
    # 8 x 65% - 2.0 - max(0.4, 0) = 2.8
    assert be_budget(suppress_input(), cfg).cpus == pytest.approx(2.8)
    # the reservation counts when it exceeds system usage
    assert be_budget(suppress_input(reserved_cpus=1.0), cfg).cpus == pytest.approx(2.2)
    # the pressure ratio scales the budget (pressure 80 -> 0.3)
    assert be_budget(suppress_input(ls_pressure_percent=80), cfg).cpus == pytest.approx(2.8 * 0.3)
    # never negative
    assert be_budget(suppress_input(ls_used_cpus=7.0), cfg).cpus == 0.0


def test_quota_from_unlimited_shrinks_at_once():
    result = decide_cpu_suppress(suppress_input(), SUPPRESSING)
    assert result.writes == (CgroupWrite(TIER, "cpu.cfs_quota_us", 280_000, result.writes[0].reason),)
    assert "shrink at once" in result.explanation.reason
    assert result.explanation.inputs["be_budget_cpus"] == pytest.approx(2.8)


def test_quota_floor():
    result = decide_cpu_suppress(suppress_input(ls_used_cpus=8.0, current_quota_us=50_000), CpuSuppressConfig())
    assert quota_of(result) == 2000
    cfg = CpuSuppressConfig(min_quota_us=5000)
    assert quota_of(decide_cpu_suppress(suppress_input(ls_used_cpus=8.0, current_quota_us=50_000), cfg)) == 5000


def test_quota_growth_is_limited_to_ten_percent_of_the_node_per_tick():
    cfg = SUPPRESSING
    # LS went idle: target 8 x 65% - 0 - 0.4 = 4.8 CPUs; from 0.5 CPU grow by 0.8 CPU per tick
    quota = 50_000
    seen = []
    for _ in range(10):
        result = decide_cpu_suppress(suppress_input(ls_used_cpus=0.0, current_quota_us=quota), cfg)
        if result.writes:
            quota = quota_of(result)
        seen.append(quota)
    assert seen[:5] == [130_000, 210_000, 290_000, 370_000, 450_000]
    assert seen[5:] == [480_000] * 5  # reached the target, then unchanged


def test_growth_scales_with_elapsed_time_so_extra_ticks_do_not_speed_it_up():
    cfg = CpuSuppressConfig()
    result = decide_cpu_suppress(suppress_input(ls_used_cpus=0.0, current_quota_us=50_000, elapsed_s=0.1), cfg)
    assert quota_of(result) == 58_000  # 10% of a tick's growth


def test_recovery_after_ls_load_drops():
    cfg = CpuSuppressConfig()
    busy = decide_cpu_suppress(suppress_input(ls_used_cpus=5.0, current_quota_us=-1), cfg)
    low = quota_of(busy)
    assert low == 2000  # 5.2 - 5.0 - 0.4 < 0 -> floor
    idle = decide_cpu_suppress(suppress_input(ls_used_cpus=0.5, current_quota_us=low), cfg)
    assert quota_of(idle) == 82_000  # grows by 0.8 CPU


def test_small_changes_are_skipped():
    cfg = SUPPRESSING
    result = decide_cpu_suppress(suppress_input(current_quota_us=281_000), cfg)  # target 280_000: 0.36%
    assert result.writes == ()
    assert "less than 1.0%" in result.explanation.reason
    result = decide_cpu_suppress(suppress_input(current_quota_us=300_000), cfg)  # 6.7%
    assert quota_of(result) == 280_000


def test_missing_tier_writes_nothing():
    result = decide_cpu_suppress(suppress_input(current_quota_us=None), CpuSuppressConfig())
    assert result.writes == ()
    assert "does not exist" in result.explanation.reason


def test_pressure_shrinks_quota():
    cfg = SUPPRESSING
    calm = quota_of(decide_cpu_suppress(suppress_input(), cfg))
    pressed = quota_of(decide_cpu_suppress(suppress_input(ls_pressure_percent=95), cfg))
    assert pressed == round(calm * 0.1)


# ---- BE in koordnode's idle BE group: idle_group_threshold_percent instead of threshold_percent

GROUP = "/kubepods/koordnode_be"


def test_idle_be_group_uses_the_idle_group_threshold():
    cfg = SUPPRESSING
    assert CpuSuppressConfig().idle_group_threshold_percent == 95.0
    # 8 x 95% - 2.0 - 0.4 = 5.2 CPUs, against 2.8 at 65% for the same node in kubelet's tier
    idle = suppress_input(be_tier=GROUP, be_group=True, be_idle=True)
    assert be_budget(idle, cfg).cpus == pytest.approx(5.2)
    result = decide_cpu_suppress(idle, cfg)
    assert quota_of(result) == 520_000
    assert result.writes[0].cgroup == GROUP
    assert result.explanation.inputs["threshold_percent"] == 95.0
    assert result.explanation.inputs["be_idle"] is True
    assert "95.0% (BE group)" in result.explanation.reason
    assert len(result.writes) == 1  # already idle: only the quota


def test_threshold_percent_keeps_its_meaning_in_kubelets_tier_and_a_group_that_cannot_be_idle():
    cfg = CpuSuppressConfig(threshold_percent=50.0, idle_group_threshold_percent=100.0)
    # kubelet's tier (be_idle_group off, or BE pods left there): threshold_percent
    assert be_budget(suppress_input(), cfg).cpus == pytest.approx(8 * 0.5 - 2.0 - 0.4)
    # the group without cpu.idle (a kernel before 5.15): BE does not yield in the kernel
    assert be_budget(suppress_input(be_tier=GROUP, be_group=False), cfg).cpus == pytest.approx(1.6)
    # the group giving way: idle, or at the lowest weight of the quiet state
    assert be_budget(suppress_input(be_tier=GROUP, be_group=True, be_idle=True), cfg).cpus == pytest.approx(5.6)
    lowest = suppress_input(be_tier=GROUP, be_group=True, be_idle=False, be_lowest_weight=True)
    assert be_budget(lowest, cfg).cpus == pytest.approx(5.6)
    # the group at another weight (an operator's CPUWeight=100): BE does not yield
    other = suppress_input(be_tier=GROUP, be_group=True, be_idle=False, be_lowest_weight=False)
    assert be_budget(other, cfg).cpus == pytest.approx(1.6)


def test_idle_be_group_still_shrinks_at_once_on_an_ls_step():
    # BE had nearly the whole node; LS steps to 7.5 busy CPUs: the quota falls to its floor at once.
    cfg = CpuSuppressConfig()
    result = decide_cpu_suppress(suppress_input(be_tier=GROUP, be_idle=True, ls_used_cpus=7.5,
                                                current_quota_us=700_000), cfg)
    assert quota_of(result) == cfg.min_quota_us
    assert "shrink at once" in result.explanation.reason
    # a 2-CPU node (the reaction benchmark's): LS 1.7 CPUs, system 0.1 -> budget 0.1 CPU
    small = suppress_input(node_cpus=2, be_tier=GROUP, be_idle=True, ls_used_cpus=1.7,
                           system_used_cpus=0.1, current_quota_us=180_000)
    assert quota_of(decide_cpu_suppress(small, cfg)) == 10_000  # below half a CPU


def test_idle_be_group_system_and_reservation_still_count():
    cfg = CpuSuppressConfig(idle_group_threshold_percent=100.0)
    inp = suppress_input(be_tier=GROUP, be_idle=True, ls_used_cpus=0.5, system_used_cpus=0.3, reserved_cpus=1.0)
    assert be_budget(inp, cfg).cpus == pytest.approx(8 - 0.5 - 1.0)


def test_idle_be_group_threshold_for_the_cpuset_policy():
    cfg = CpuSuppressConfig(policy="cpuset")
    result = decide_cpu_suppress(cpuset_input(be_tier=GROUP, be_idle=True, current_be_cpus=frozenset({5, 6, 7})), cfg)
    # 8 x 95% - 2.0 - 0.4 = 5.2 -> 6 CPUs, growing by at most 1 per tick
    assert {w.value for w in result.writes} == {"4-7"}


def cpuset_input(**changes) -> CpuSuppressInput:
    cgroups = (TIER, TIER + "/podA", TIER + "/podA/c1")
    fields = dict(online_cpus=frozenset(range(8)), excluded_cpus=frozenset({0, 1}),
                  current_be_cpus=frozenset(range(2, 8)), be_cpuset_cgroups=cgroups)
    return suppress_input(**{**fields, **changes})


def test_cpuset_policy_takes_ceil_budget_cpus_outside_lse_lsr_reserved():
    cfg = CpuSuppressConfig(policy="cpuset")
    result = decide_cpu_suppress(cpuset_input(), cfg)  # budget 2.8 -> 3 CPUs, shrink from 6 at once
    values = {w.value for w in result.writes}
    assert values == {"5-7"}
    assert [w.cgroup for w in result.writes] == [TIER, TIER + "/podA", TIER + "/podA/c1"]
    assert all(w.resource == "cpuset.cpus" for w in result.writes)


def test_cpuset_policy_minimum_and_growth():
    cfg = CpuSuppressConfig(policy="cpuset")
    busy = decide_cpu_suppress(cpuset_input(ls_used_cpus=8.0), cfg)
    assert {w.value for w in busy.writes} == {"6-7"}  # min 2 CPUs, the ones BE had kept
    grow = decide_cpu_suppress(cpuset_input(ls_used_cpus=0.0, current_be_cpus=frozenset({6, 7})), cfg)
    # budget 4.8 -> 5 CPUs wanted; 10% of 8 CPUs -> at most 1 more per tick
    assert {w.value for w in grow.writes} == {"5-7"}


def test_cpuset_unchanged_writes_nothing():
    cfg = CpuSuppressConfig(policy="cpuset")
    result = decide_cpu_suppress(cpuset_input(current_be_cpus=frozenset({5, 6, 7})), cfg)
    assert result.writes == ()


def test_restore():
    result = restore_cpu_suppress(suppress_input(), "cfs_quota")
    assert [(w.cgroup, w.resource, w.value) for w in result.writes] == [(TIER, "cpu.cfs_quota_us", -1)]
    result = restore_cpu_suppress(cpuset_input(), "cpuset")
    assert {w.value for w in result.writes} == {"2-7"}
    assert len(result.writes) == 3


# ------------------------------------------------------------------------ cpu_burst


def burst_pod(throttled: int = 0, quota: int = 200_000, sid: str = "s1") -> BurstPod:
    return BurstPod(sid, "ns/web", f"/kubepods/burstable/pod{sid}", (
        BurstContainer("c1", f"/kubepods/burstable/pod{sid}/c1", quota, 100_000, throttled),
        BurstContainer("c2", f"/kubepods/burstable/pod{sid}/c2", 100_000, 100_000, 0),
    ))


def writes_by(result, resource):
    return [(w.cgroup.rsplit("/", 1)[-1], w.value) for w in result.writes if w.resource == resource]


def test_burst_us_is_capped_at_the_quota():
    result = decide_cpu_burst(CpuBurstInput((burst_pod(),), 10.0), CpuBurstConfig(enable=True), CpuBurstState())
    assert writes_by(result, "cpu.cfs_burst_us") == [("c1", 200_000), ("c2", 100_000), ("pods1", 300_000)]
    half = decide_cpu_burst(CpuBurstInput((burst_pod(),), 10.0), CpuBurstConfig(enable=True, burst_percent=50),
                            CpuBurstState())
    assert writes_by(half, "cpu.cfs_burst_us") == [("c1", 100_000), ("c2", 50_000), ("pods1", 150_000)]
    # written once, then only when the value changes (or on a reconcile pass)
    again = decide_cpu_burst(CpuBurstInput((burst_pod(),), 10.0), CpuBurstConfig(enable=True), result.state)
    assert writes_by(again, "cpu.cfs_burst_us") == []
    forced = decide_cpu_burst(CpuBurstInput((burst_pod(),), 10.0, reconcile=True), CpuBurstConfig(enable=True),
                              result.state)
    assert len(writes_by(forced, "cpu.cfs_burst_us")) == 3


def test_quota_burst_grows_when_throttled_and_pool_is_free():
    cfg = CpuBurstConfig(enable=True)
    state = CpuBurstState()
    quotas = []
    for _ in range(8):
        result = decide_cpu_burst(CpuBurstInput((burst_pod(throttled=3),), 20.0), cfg, state)
        state = result.state
        if result.writes:
            written = dict(writes_by(result, "cpu.cfs_quota_us"))
            if written:
                quotas.append(written["pods1"])
    # pod limit 300_000 x 1.2, 1.44, ... clamped at 300%
    assert quotas == [360_000, 432_000, 518_400, 622_080, 746_496, 895_795, 900_000]
    # growth: pod written before its containers (v1: a child may not exceed its parent)
    result = decide_cpu_burst(CpuBurstInput((burst_pod(throttled=1),), 20.0), cfg, CpuBurstState())
    order = [w.cgroup.rsplit("/", 1)[-1] for w in result.writes if w.resource == "cpu.cfs_quota_us"]
    assert order == ["pods1", "c1", "c2"]


def test_quota_burst_shrinks_when_overloaded_and_never_below_the_limit():
    cfg = CpuBurstConfig(enable=True)
    state = CpuBurstState(scales={"s1": 2.0})
    result = decide_cpu_burst(CpuBurstInput((burst_pod(throttled=5),), 80.0), cfg, state)
    assert dict(writes_by(result, "cpu.cfs_quota_us"))["pods1"] == 480_000  # 300_000 x 2.0 x 0.8
    order = [w.cgroup.rsplit("/", 1)[-1] for w in result.writes if w.resource == "cpu.cfs_quota_us"]
    assert order == ["c1", "c2", "pods1"]  # shrinking: children first
    state = CpuBurstState(scales={"s1": 1.1})
    result = decide_cpu_burst(CpuBurstInput((burst_pod(),), 80.0), cfg, state)
    assert dict(writes_by(result, "cpu.cfs_quota_us")) == {"c1": 200_000, "c2": 100_000, "pods1": 300_000}
    assert "s1" not in result.state.scales


def test_quota_burst_keeps_the_scale_without_throttling():
    cfg = CpuBurstConfig(enable=True)
    state = CpuBurstState(scales={"s1": 1.44})
    result = decide_cpu_burst(CpuBurstInput((burst_pod(),), 20.0), cfg, state)
    assert writes_by(result, "cpu.cfs_quota_us") == []
    assert result.state.scales == {"s1": 1.44}


def test_pods_without_limits_are_left_alone():
    pod = BurstPod("s2", "ns/free", "/kubepods/burstable/pods2",
                   (BurstContainer("c", "/kubepods/burstable/pods2/c", 0, 100_000, 9),))
    result = decide_cpu_burst(CpuBurstInput((pod,), 10.0), CpuBurstConfig(enable=True), CpuBurstState())
    assert result.writes == ()


def test_restore_cpu_burst():
    cfg = CpuBurstConfig(enable=True)
    result = decide_cpu_burst(CpuBurstInput((burst_pod(throttled=1),), 10.0), cfg, CpuBurstState())
    restored = restore_cpu_burst((burst_pod(),), result.state)
    assert dict(writes_by(restored, "cpu.cfs_quota_us")) == {"c1": 200_000, "c2": 100_000, "pods1": 300_000}
    assert sorted(writes_by(restored, "cpu.cfs_burst_us")) == [("c1", 0), ("c2", 0), ("pods1", 0)]
    assert restored.state == CpuBurstState()


# ------------------------------------------------------------------------ memory_qos


def test_memory_qos_reconciles_the_hooks_plan_when_due():
    planned = (
        CgroupWrite("/kubepods/burstable/pod1", "memory.min", 1 << 20, "LS pod"),
        CgroupWrite("/kubepods/burstable/pod1", "cpu.shares", 1024, "not memory"),
        CgroupWrite("/kubepods/burstable/pod1/c", "memory.high", 1 << 30, "LS container"),
    )
    cfg = MemoryQoSConfig(min_free_kbytes=100_000)
    result = decide_memory_qos(MemoryQoSInput(100.0, None, planned), cfg)
    assert [w.resource for w in result.writes] == ["memory.min", "memory.high"]
    assert [(s.name, s.value) for s in result.sysctls] == [("vm.min_free_kbytes", 100_000)]
    assert result.state == 100.0
    waiting = decide_memory_qos(MemoryQoSInput(105.0, 100.0, planned, interval_s=10.0), cfg)
    assert waiting.writes == () and waiting.sysctls == ()
    assert waiting.explanation.decision == "wait"
    due = decide_memory_qos(MemoryQoSInput(110.0, 100.0, planned, interval_s=10.0), cfg)
    assert len(due.writes) == 2


# ------------------------------------------------------------------------ be_evict

GIB = 1 << 30


def evict_input(used_gib: float, candidates, now: float = 1000.0, **changes) -> BeEvictInput:
    return BeEvictInput(now=now, memory_total_bytes=100 * GIB, memory_used_bytes=int(used_gib * GIB),
                        candidates=tuple(candidates), **changes)


CANDIDATES = (
    EvictCandidate("small", "s1", "ns/a", priority=0, memory_bytes=1 * GIB),
    EvictCandidate("big", "s2", "ns/b", priority=0, memory_bytes=5 * GIB),
    EvictCandidate("vip", "s3", "ns/c", priority=10, memory_bytes=20 * GIB),
    EvictCandidate("mid", "s4", "ns/d", priority=0, memory_bytes=3 * GIB),
)


def test_no_eviction_below_threshold():
    result = decide_be_evict(evict_input(69.9, CANDIDATES), BeEvictConfig(enable=True), BeEvictState())
    assert result.evictions == ()


def test_memory_eviction_order_and_release():
    cfg = BeEvictConfig(enable=True)
    # 75% used, threshold 70% - 2% margin: release 7 GiB -> big (5) then mid (3), lowest priority first
    result = decide_be_evict(evict_input(75, CANDIDATES), cfg, BeEvictState())
    assert [e.container_id for e in result.evictions] == ["big", "mid"]
    assert "node memory 75.0% >= 70%" in result.evictions[0].reason
    assert result.evictions[0].cause == "memory"
    assert result.explanation.inputs["memory_release_bytes"] == 7 * GIB
    # higher priority goes only when the low ones are not enough
    result = decide_be_evict(evict_input(80, CANDIDATES), cfg, BeEvictState())
    assert [e.container_id for e in result.evictions] == ["big", "mid", "small", "vip"]


def test_cooldown_and_pending():
    cfg = BeEvictConfig(enable=True, cooldown_s=60)
    first = decide_be_evict(evict_input(75, CANDIDATES, now=1000), cfg, BeEvictState())
    assert first.evictions
    during = decide_be_evict(evict_input(75, CANDIDATES, now=1030), cfg, first.state)
    assert during.evictions == ()
    assert "cooling down" in during.explanation.reason
    after = decide_be_evict(evict_input(75, CANDIDATES, now=1061), cfg, during.state)
    # big and mid were asked to stop and are still listed: not picked again
    assert [e.container_id for e in after.evictions] == ["small", "vip"]
    assert after.state.evicted_total == 4


def test_cpu_satisfaction_eviction_needs_the_duration():
    cfg = BeEvictConfig(enable=True, cpu_satisfaction_floor_percent=50, cpu_satisfaction_duration_s=30)
    candidates = (
        EvictCandidate("a", "s1", "ns/a", cpu_request_cpus=2.0),
        EvictCandidate("b", "s2", "ns/b", cpu_request_cpus=1.0),
        EvictCandidate("c", "s3", "ns/c", priority=5, cpu_request_cpus=4.0),
    )
    kwargs = dict(be_cpu_budget_cpus=1.0, be_cpu_used_cpus=0.95, be_cpu_request_cpus=7.0)
    state = BeEvictState()
    first = decide_be_evict(evict_input(10, candidates, now=0, **kwargs), cfg, state)
    assert first.evictions == () and first.state.low_satisfaction_since == 0
    later = decide_be_evict(evict_input(10, candidates, now=31, **kwargs), cfg, first.state)
    # satisfaction 1/7 = 14%; keep requests <= 1.0 / 0.5 = 2 CPUs: release 5 -> a (2), b (1), then c (4)
    assert [e.container_id for e in later.evictions] == ["a", "b", "c"]
    assert "satisfaction 14% < 50%" in later.evictions[0].reason
    assert {e.cause for e in later.evictions} == {"cpu"}
    # BE not really using its budget: no eviction
    idle = dict(kwargs, be_cpu_used_cpus=0.2)
    assert decide_be_evict(evict_input(10, candidates, now=31, **idle), cfg, first.state).evictions == ()


# ---- the quiet state: no quota, the BE group not idle at the lowest weight, while LS is quiet


def quiet_group(**changes) -> CpuSuppressInput:
    """BE in koordnode's group on an 8-CPU node, LS at 0.5 CPU (quiet at the default 25%)."""
    return suppress_input(**{"be_tier": GROUP, "be_group": True, "ls_used_cpus": 0.5, **changes})


def resources(result) -> list[tuple[str, object]]:
    return [(w.resource, w.value) for w in result.writes]


def test_quiet_ls_leaves_an_unthrottled_tier_alone():
    result = decide_cpu_suppress(suppress_input(ls_used_cpus=0.5), CpuSuppressConfig())
    assert result.writes == ()
    assert result.explanation.inputs["ls_quiet"] is True
    assert "LS quiet" in result.explanation.reason


def test_quiet_ls_takes_the_idle_flag_off_the_group_and_gives_it_the_lowest_weight():
    result = decide_cpu_suppress(quiet_group(be_idle=True), CpuSuppressConfig())
    # cpu.idle 0 resets the weight to the default: the lowest weight is written after it
    assert resources(result) == [("cpu.idle", 0), ("cpu.shares", 2)]
    assert all(w.cgroup == GROUP for w in result.writes)


def test_quiet_group_already_so_writes_nothing_and_one_someone_else_set_is_left_alone():
    cfg = CpuSuppressConfig()
    assert decide_cpu_suppress(quiet_group(be_idle=False, be_lowest_weight=True), cfg).writes == ()
    # Not idle at another weight (an operator's or systemd's): the engine's reconcile pass
    # restores the group (through systemd where it owns it); the strategy writes no flag.
    other = quiet_group(be_idle=False, be_lowest_weight=False)
    assert decide_cpu_suppress(other, cfg).writes == ()
    busy = decide_cpu_suppress(dataclasses.replace(other, ls_used_cpus=7.5), cfg)
    assert resources(busy) == [("cpu.cfs_quota_us", cfg.min_quota_us)]
    assert busy.explanation.inputs["threshold_percent"] == cfg.threshold_percent


def test_an_ls_step_from_quiet_throttles_and_idles_the_group_at_once():
    cfg = CpuSuppressConfig()
    busy = quiet_group(be_idle=False, be_lowest_weight=True, ls_used_cpus=7.5)
    result = decide_cpu_suppress(busy, cfg)
    assert resources(result) == [("cpu.cfs_quota_us", cfg.min_quota_us), ("cpu.idle", 1)]
    assert result.explanation.inputs["ls_quiet"] is False
    # kubelet's tier gets the quota only: it must never be idle (kubelet would fail on it)
    tier = decide_cpu_suppress(suppress_input(ls_used_cpus=7.5), cfg)
    assert resources(tier) == [("cpu.cfs_quota_us", cfg.min_quota_us)]


def test_ls_pressure_ends_the_quiet_state_even_at_low_use():
    cfg = CpuSuppressConfig()
    result = decide_cpu_suppress(quiet_group(be_idle=False, be_lowest_weight=True, ls_pressure_percent=60), cfg)
    assert ("cpu.idle", 1) in resources(result)
    assert quota_of(result) is not None and quota_of(result) > 0


def test_back_to_quiet_only_once_the_quota_has_grown_to_its_target():
    cfg = CpuSuppressConfig()
    quota, idle, lowest = cfg.min_quota_us, True, None
    seen = []
    for _ in range(12):
        result = decide_cpu_suppress(quiet_group(current_quota_us=quota, be_idle=idle,
                                                 be_lowest_weight=lowest), cfg)
        for write in result.writes:
            if write.resource == "cpu.cfs_quota_us":
                quota = int(write.value)
            elif write.resource == "cpu.idle":
                idle = bool(write.value)
            elif write.resource == "cpu.shares":
                lowest = True
        seen.append((quota, idle))
    # target 8 x 95% - 0.5 - 0.4 = 6.7 CPUs: grows 0.8 CPU per tick while the group stays idle
    assert seen[:4] == [(82_000, True), (162_000, True), (242_000, True), (322_000, True)]
    lifted = seen.index((-1, False))
    assert all(idle for _, idle in seen[:lifted])
    assert seen[lifted - 1][0] >= 590_000  # one growth step below the target at most
    assert seen[lifted:] == [(-1, False)] * (len(seen) - lifted)


def test_the_quiet_state_can_be_turned_off_and_is_for_the_quota_policy_only():
    off = decide_cpu_suppress(quiet_group(be_idle=True), CpuSuppressConfig(ls_quiet_percent=0))
    assert quota_of(off) == 670_000
    cpuset = decide_cpu_suppress(cpuset_input(ls_used_cpus=0.5), CpuSuppressConfig(policy="cpuset"))
    assert cpuset.explanation.inputs.get("ls_quiet") is None
    assert {w.resource for w in cpuset.writes} <= {"cpuset.cpus"}


def test_restore_leaves_the_group_idle_and_unthrottled():
    result = restore_cpu_suppress(quiet_group(be_idle=False, be_lowest_weight=True, current_quota_us=50_000),
                                  "cfs_quota")
    assert resources(result) == [("cpu.cfs_quota_us", -1), ("cpu.idle", 1)]
    assert resources(restore_cpu_suppress(suppress_input(), "cfs_quota")) == [("cpu.cfs_quota_us", -1)]


def test_at_minimum_reads_the_quota_among_the_group_writes():
    cfg = CpuSuppressConfig()
    busy = quiet_group(be_idle=False, be_lowest_weight=True, ls_used_cpus=7.9)
    result = decide_cpu_suppress(busy, cfg)
    assert at_minimum(busy, cfg, result)
    quiet = quiet_group(be_idle=True)
    assert not at_minimum(quiet, cfg, decide_cpu_suppress(quiet, cfg))


# --- be_memory ------------------------------------------------------------------------------

GROUP = "/kubepods/koordnode_be"
MIB = 1 << 20
GIB = 1 << 30


def memory_input(**changes) -> BeMemoryInput:
    # 16 GiB node: pods hold 6 GiB (BE 2 of it), the node uses 7 GiB (the system 1 GiB).
    base = BeMemoryInput(now=100.0, memory_total_bytes=16 * GIB, memory_used_bytes=7 * GIB,
                         kubepods_bytes=6 * GIB, be_bytes=2 * GIB, be_tier=GROUP, be_tier_bytes=2 * GIB,
                         unlimited_be_pods={"sb1": f"{GROUP}/pod1"})
    return dataclasses.replace(base, **changes)


def writes_of(result) -> dict[tuple[str, str], object]:
    return {(w.cgroup, w.resource): w.value for w in result.writes}


def test_be_memory_budget_is_the_share_less_ls_and_the_larger_of_system_and_reserved():
    cfg = BeMemoryConfig(budget_percent=50)
    budget, terms = be_memory_budget(memory_input(), cfg)
    assert terms["ls_bytes"] == 4 * GIB and terms["system_bytes"] == GIB
    assert budget == 8 * GIB - 4 * GIB - GIB
    # A reservation larger than the system's use counts instead of it.
    assert be_memory_budget(memory_input(), BeMemoryConfig(budget_percent=50, reserved_mib=2048))[0] == 2 * GIB
    # Never below the floor.
    assert be_memory_budget(memory_input(kubepods_bytes=11 * GIB, memory_used_bytes=12 * GIB), cfg)[0] == 256 * MIB


def test_be_memory_bounds_the_tier_and_the_pods_without_a_limit():
    cfg = BeMemoryConfig(budget_percent=50)
    result = decide_be_memory(memory_input(), cfg, BeMemoryState())
    budget = 3 * GIB
    assert writes_of(result) == {
        (GROUP, "memory.high"): budget, (GROUP, "memory.soft_limit_in_bytes"): budget,
        (GROUP, "memory.limit_in_bytes"): budget,
        (f"{GROUP}/pod1", "memory.high"): budget * 70 // 100,
        (f"{GROUP}/pod1", "memory.soft_limit_in_bytes"): budget * 70 // 100,
    }
    assert all(w.reason.startswith("be_memory: ") for w in result.writes)
    assert result.state.pod_bounds == {"sb1": budget * 70 // 100}
    # BE holds more than the budget: the cap stays at what it holds (never an OOM kill).
    over = decide_be_memory(memory_input(be_tier_bytes=5 * GIB), cfg, BeMemoryState())
    assert writes_of(over)[(GROUP, "memory.limit_in_bytes")] == 5 * GIB
    assert writes_of(over)[(GROUP, "memory.soft_limit_in_bytes")] == budget
    # No BE tier yet: only the pods; the tier is written once it exists.
    missing = decide_be_memory(memory_input(be_tier_bytes=None, unlimited_be_pods={}), cfg, BeMemoryState())
    assert writes_of(missing) == {} and missing.state.written == {}


def test_be_memory_writes_again_only_what_moved_or_when_a_pass_is_due():
    cfg = BeMemoryConfig(budget_percent=50)
    first = decide_be_memory(memory_input(), cfg, BeMemoryState())
    steady = decide_be_memory(memory_input(now=101.0, due=False, be_tier_bytes=2 * GIB + MIB), cfg, first.state)
    assert steady.writes == () and not steady.explain
    # LS grows by 1 GiB: the budget shrinks, every bound follows.
    moved = decide_be_memory(memory_input(now=102.0, due=False, kubepods_bytes=7 * GIB, memory_used_bytes=8 * GIB),
                             cfg, steady.state)
    assert writes_of(moved)[(GROUP, "memory.soft_limit_in_bytes")] == 2 * GIB
    assert len(moved.writes) == 5
    due = decide_be_memory(memory_input(now=112.0, kubepods_bytes=7 * GIB, memory_used_bytes=8 * GIB), cfg,
                           moved.state)
    assert len(due.writes) == 5 and due.state.last_pass == 112.0


def test_be_memory_restore_unbounds_the_tier_and_the_pods():
    result = restore_be_memory(GROUP, [f"{GROUP}/pod1"])
    assert set(writes_of(result).values()) == {-1}
    assert len(result.writes) == 5


def test_pod_view_tier_is_the_cgroups_parent_and_follows_a_replaced_cgroup():
    from koordnode.model.qos_class import QoSClass
    from koordnode.policy.strategies.base import PodView

    pod = PodView("sb", "ns/p", QoSClass.BE, "/kubepods/besteffort/podabc/", 0, ())
    assert pod.tier == "/kubepods/besteffort"
    moved = dataclasses.replace(pod, cgroup="/kubepods/koordnode_be/podabc")
    assert moved.tier == "/kubepods/koordnode_be"
    assert PodView("sb", "ns/p", QoSClass.LS, "/pod", 0, ()).tier == "/"
    # Not part of equality: two views of the same pod compare equal as before.
    assert pod == PodView("sb", "ns/p", QoSClass.BE, "/kubepods/besteffort/podabc/", 0, ())
