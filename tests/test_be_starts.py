"""BE pod starts in flight (model/be_starts.py), which calls count (hooks/be_start.py), and
cpu_suppress's start allowance: the BE group lifted while a BE pod starts, idle again after."""

from __future__ import annotations

import dataclasses

import pytest

from koordnode.config.loader import ConfigError, parse_config
from koordnode.config.strategies import CpuSuppressConfig
from koordnode.cri import api_pb2 as pb
from koordnode.hooks.be_start import BeStartWatch
from koordnode.hooks.chain import SKIP_LABEL, CallContext, PodClassified
from koordnode.model.be_starts import MAX_STARTS, BeStarts
from koordnode.model.state import ContainerRecord, NodeState, PodRecord
from koordnode.policy.strategies import CpuSuppressInput, decide_cpu_suppress, restore_cpu_suppress
from koordnode.policy.strategies.cpu_suppress import StartLift, group_gives_way

GROUP = "/kubepods/koordnode_be"
START_SHARES = CpuSuppressConfig().pod_start_shares
LIFT_AFTER_S = CpuSuppressConfig().pod_start_lift_after_s
# LS busy on both CPUs of a 2-CPU node: the budget is negative, BE at the quota's floor.
BUSY = dict(node_cpus=2, ls_used_cpus=2.0, be_used_cpus=0.02, system_used_cpus=0.1, reserved_cpus=0.0,
            ls_pressure_percent=0.0, be_tier=GROUP, current_quota_us=2000, period_us=100_000,
            elapsed_s=1.0, tick_s=1.0, be_group=True, be_idle=True)


def busy(**changes) -> CpuSuppressInput:
    return dataclasses.replace(CpuSuppressInput(**BUSY), **changes)


def writes(result) -> dict[str, object]:
    return {w.resource: w.value for w in result.writes}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------------ the registry


def test_starts_count_until_they_end_and_wake_the_listener_each_time():
    woken: list[str] = []
    starts = BeStarts(max_s=lambda: 30)
    starts.subscribe(woken.append)
    starts.begin("a")
    starts.begin("a")  # the same start noted twice counts once
    starts.begin("b")
    assert starts.in_flight() == 2 and starts.total == 2
    starts.end("a")
    starts.end("a")  # and ends once
    starts.end("unknown")
    assert starts.in_flight() == 1
    assert woken == ["be_start", "be_start", "be_start_end"]


def test_a_start_whose_end_never_came_stops_counting_after_max_s():
    clock = Clock()
    starts = BeStarts(max_s=lambda: 30, clock=clock)
    starts.begin("lost answer")
    clock.now += 29
    assert starts.in_flight() == 1
    clock.now += 2
    assert starts.in_flight() == 0


def test_the_oldest_start_in_flight_gives_the_age():
    clock = Clock()
    starts = BeStarts(max_s=lambda: 30, clock=clock)
    assert starts.oldest_age_s() == 0.0
    starts.begin("sandbox")
    clock.now += 4
    starts.begin("container")
    clock.now += 2
    assert starts.oldest_age_s() == 6.0
    starts.end("sandbox")
    assert starts.oldest_age_s() == 2.0


def test_the_table_is_bounded():
    starts = BeStarts()
    for index in range(MAX_STARTS + 10):
        starts.begin(str(index))
    assert starts.in_flight() == MAX_STARTS


# ------------------------------------------------------------------------ which calls count


def node_state() -> NodeState:
    state = NodeState()
    for sid, cls in (("be-pod", "BE"), ("ls-pod", "LS")):
        state.put_pod(PodRecord(sid, sid, "default", f"uid-{sid}", {}, {}, "/kubepods", qos_class=cls))
        state.put_container(ContainerRecord(f"{sid}-c", sid, "app", {}, {}, pb.LinuxContainerResources()))
    return state


def sandbox_call(cls: str, labels: dict[str, str] | None = None) -> CallContext:
    call = CallContext("RunPodSandbox", pb.RunPodSandboxRequest(), pod_labels=labels or {})
    call.facts.pod_class = PodClassified(cls, "label")
    return call


def test_proxy_calls_of_be_pods_count_from_request_to_answer():
    starts = BeStarts()
    watch = BeStartWatch(node_state(), starts)
    calls = [sandbox_call("BE"),
             CallContext("CreateContainer", pb.CreateContainerRequest(pod_sandbox_id="be-pod")),
             CallContext("StartContainer", pb.StartContainerRequest(container_id="be-pod-c"))]
    for call in calls:
        watch.call_began(call)
    assert starts.in_flight() == 3
    for call in calls:
        watch.call_ended(call)
    assert starts.in_flight() == 0


def test_other_classes_calls_and_skipped_pods_do_not_count():
    starts = BeStarts()
    watch = BeStartWatch(node_state(), starts)
    for call in (sandbox_call("LS"),
                 sandbox_call("BE", {SKIP_LABEL: "true"}),
                 CallContext("StartContainer", pb.StartContainerRequest(container_id="ls-pod-c")),
                 CallContext("CreateContainer", pb.CreateContainerRequest(pod_sandbox_id="unknown")),
                 CallContext("StopContainer", pb.StopContainerRequest(container_id="be-pod-c"))):
        watch.call_began(call)
    assert starts.in_flight() == 0


def test_nri_counts_a_be_container_from_create_to_start():
    starts = BeStarts()
    watch = BeStartWatch(node_state(), starts)
    watch.container_creating("be-pod", "c1")
    watch.container_creating("ls-pod", "c2")
    assert starts.in_flight() == 1
    watch.container_started("c1")
    assert starts.in_flight() == 0


# ------------------------------------------------------------------------ the allowance


def test_a_start_first_gets_the_quota_with_the_group_still_idle():
    """Its first pod_start_lift_after_s: what LS leaves over, up to the allowance; LS runs first."""
    result = decide_cpu_suppress(busy(be_starting=1, be_start_age_s=LIFT_AFTER_S - 0.5), CpuSuppressConfig())
    assert writes(result) == {"cpu.cfs_quota_us": 25_000}
    assert result.state == StartLift(budget_quota_us=2000, group_lifted=False)
    assert "BE start" in result.explanation.reason


def test_a_start_that_lasts_lifts_the_idle_group_too():
    result = decide_cpu_suppress(busy(be_starting=1, be_start_age_s=LIFT_AFTER_S), CpuSuppressConfig())
    assert writes(result) == {"cpu.cfs_quota_us": 25_000, "cpu.idle": 0, "cpu.shares": START_SHARES}
    # Remembered: the next decision knows the weight is its own, and the budget's quota.
    assert result.state == StartLift(budget_quota_us=2000, group_lifted=True)
    assert "BE start" in result.explanation.reason
    # Once the quota is there, the lift comes alone; with 0 s it comes with the quota.
    later = busy(be_starting=1, be_start_age_s=LIFT_AFTER_S + 1, current_quota_us=25_000)
    assert writes(decide_cpu_suppress(later, CpuSuppressConfig())) == {"cpu.idle": 0, "cpu.shares": START_SHARES}
    at_once = decide_cpu_suppress(busy(be_starting=1), CpuSuppressConfig(pod_start_lift_after_s=0))
    assert writes(at_once) == {"cpu.cfs_quota_us": 25_000, "cpu.idle": 0, "cpu.shares": START_SHARES}


def test_after_the_start_the_group_is_idle_at_the_floor_again():
    lifted = busy(current_quota_us=25_000, be_idle=False, be_lowest_weight=False, start_lifted=True,
                  budget_quota_us=2000)
    assert group_gives_way(lifted)
    result = decide_cpu_suppress(lifted, CpuSuppressConfig())
    assert writes(result) == {"cpu.cfs_quota_us": 2000, "cpu.idle": 1}
    assert result.state is None


def test_after_the_start_growth_goes_on_from_the_budgets_quota_not_the_allowance():
    """LS eased during the start: the budget grows by at most 10 % of the node per tick from
    where it was (2 ms), not from the 25 ms the start had."""
    eased = busy(ls_used_cpus=1.0, current_quota_us=25_000, be_idle=False, be_lowest_weight=False,
                 start_lifted=True, budget_quota_us=2000)
    result = decide_cpu_suppress(eased, CpuSuppressConfig(ls_quiet_percent=0))
    assert writes(result) == {"cpu.cfs_quota_us": 22_000, "cpu.idle": 1}


def test_while_lifted_the_next_decision_keeps_the_lift_without_writes():
    lifted = busy(current_quota_us=25_000, be_idle=False, be_lowest_weight=False, start_lifted=True, be_starting=2,
                  be_start_age_s=LIFT_AFTER_S + 3)
    result = decide_cpu_suppress(lifted, CpuSuppressConfig())
    assert writes(result) == {}
    assert result.state == StartLift(budget_quota_us=2000, group_lifted=True)


def test_a_weight_someone_else_set_is_not_taken_for_the_lift():
    """Not idle, not the lowest weight, and not lifted by koordnode: the group is left to the
    engine's reconcile pass; only the quota follows the start."""
    other = busy(be_idle=False, be_lowest_weight=False, be_starting=1, be_start_age_s=LIFT_AFTER_S)
    assert not group_gives_way(other)
    result = decide_cpu_suppress(other, CpuSuppressConfig())
    assert writes(result) == {"cpu.cfs_quota_us": 25_000}
    assert result.state == StartLift(budget_quota_us=2000, group_lifted=False)


def test_kubelets_tier_gets_the_quota_only():
    result = decide_cpu_suppress(busy(be_tier="/kubepods/besteffort", be_group=False, be_idle=False, be_starting=1),
                                 CpuSuppressConfig())
    assert writes(result) == {"cpu.cfs_quota_us": 25_000}


def test_no_allowance_when_off_or_for_the_cpuset_policy():
    off = decide_cpu_suppress(busy(be_starting=1), CpuSuppressConfig(pod_start_cpu_percent=0))
    assert writes(off) == {}  # at the floor and idle already
    assert decide_cpu_suppress(busy(be_starting=1), CpuSuppressConfig(policy="cpuset")).state is None


def test_a_larger_budget_than_the_allowance_is_kept():
    # 2 x 95% - LS 0.9 - system 0.1 = 0.9 CPUs: the budget, not the 25 % allowance
    roomy = busy(ls_used_cpus=0.9, current_quota_us=80_000, be_starting=1, be_start_age_s=LIFT_AFTER_S)
    result = decide_cpu_suppress(roomy, CpuSuppressConfig(ls_quiet_percent=0))
    assert writes(result) == {"cpu.cfs_quota_us": 90_000, "cpu.idle": 0, "cpu.shares": START_SHARES}


def test_quiet_ls_goes_from_the_lift_to_the_lowest_weight():
    lifted = busy(ls_used_cpus=0.1, current_quota_us=-1, be_idle=False, be_lowest_weight=False, start_lifted=True)
    result = decide_cpu_suppress(lifted, CpuSuppressConfig())
    assert writes(result) == {"cpu.shares": 2}


def test_restore_makes_a_lifted_group_idle():
    lifted = busy(current_quota_us=25_000, be_idle=False, be_lowest_weight=False, start_lifted=True)
    assert writes(restore_cpu_suppress(lifted, "cfs_quota")) == {"cpu.cfs_quota_us": -1, "cpu.idle": 1}


def test_the_start_weight_is_configurable_above_the_lowest():
    result = decide_cpu_suppress(busy(be_starting=1, be_start_age_s=LIFT_AFTER_S), CpuSuppressConfig(pod_start_shares=64))
    assert writes(result) == {"cpu.cfs_quota_us": 25_000, "cpu.idle": 0, "cpu.shares": 64}
    with pytest.raises(ConfigError, match="pod_start_shares"):  # the quiet state's weight
        parse_config("[strategy.cpu_suppress]\npod_start_shares = 2\n")
