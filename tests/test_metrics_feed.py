"""The QoS side's metrics feeders (qos/metrics_feed.py): what a tick hands to the metrics, read
from typed facts (cpu_suppress's BeBudget), never from its explanation's strings."""

from __future__ import annotations

import threading

from koordnode.executor.write_result import WriteResult, WriteStatus
from koordnode.metrics.recorder import Metrics
from koordnode.policy.plan import CgroupWrite, SysctlWrite
from koordnode.policy.strategies.common import BeBudget, Explanation, StrategyResult, fact
from koordnode.qos.metrics_feed import TickMetrics
from koordnode.qos.tick import TickReport
from test_metrics import value

TIER = "/kubepods/besteffort"


def _tick(*facts: object, writes: tuple[WriteResult, ...] = (), decided: bool = True) -> TickReport:
    report = TickReport(at=0.0, duration_s=0.0, woken_by=None, writes=list(writes))
    if decided:
        report.results["cpu_suppress"] = StrategyResult(Explanation("cpu_suppress", {}, "x", "y"), facts=facts)
    return report


def test_the_be_quota_is_the_written_one_when_the_write_succeeded() -> None:
    metrics = Metrics(process_metrics=False)
    feed = TickMetrics(metrics)
    write = CgroupWrite(TIER, "cpu.cfs_quota_us", 150_000, "cpu_suppress: test")
    budget = BeBudget(1.5, 0.75, quota_us=-1, period_us=100_000, quota_write=write)
    sysctl = WriteResult(SysctlWrite("vm.min_free_kbytes", 1, "w"), WriteStatus.WRITTEN)
    feed(_tick(budget, writes=(sysctl, WriteResult(write, WriteStatus.WRITTEN))))
    assert value(metrics, "koordnode_be_cpu_quota_cores") == 1.5
    assert value(metrics, "koordnode_be_cpu_suppress_ratio") == 0.75
    # Failed: the quota the tier had before (-1: unlimited).
    feed(_tick(budget, writes=(WriteResult(write, WriteStatus.FAILED),)))
    assert value(metrics, "koordnode_be_cpu_quota_cores") == -1


def test_warming_up_cpuset_policy_and_no_decision() -> None:
    metrics = Metrics(process_metrics=False)
    feed = TickMetrics(metrics)
    feed(_tick(BeBudget(2.0, 0.5, quota_us=200_000, period_us=100_000)))
    assert value(metrics, "koordnode_be_cpu_quota_cores") == 2.0
    feed(_tick(decided=False))  # off, or an early tick it sat out: the values stay
    assert value(metrics, "koordnode_be_cpu_quota_cores") == 2.0
    feed(_tick())  # warming up: no budget
    assert (value(metrics, "koordnode_be_cpu_quota_cores"), value(metrics, "koordnode_be_cpu_suppress_ratio")) == (-1, 1)
    feed(_tick(BeBudget(2.0, 0.5)))  # cpuset policy: no quota
    assert value(metrics, "koordnode_be_cpu_quota_cores") == -1


def test_facts_are_found_by_type() -> None:
    budget = BeBudget(1.0, 1.0)
    result = StrategyResult(Explanation("s", {}, "x", "y"), facts=("other", budget))
    assert fact(result, BeBudget) is budget
    assert fact(None, BeBudget) is None
    assert fact(StrategyResult(Explanation("s", {}, "x", "y")), BeBudget) is None


def test_gauges_set_from_many_threads_end_at_a_value_one_of_them_set() -> None:
    metrics = Metrics(process_metrics=False)

    def spin(ratio: float) -> None:
        for _ in range(2000):
            metrics.set_be_cpu(None, ratio)
            metrics.set_psi("cpu", some_avg10=ratio * 100)

    threads = [threading.Thread(target=spin, args=(r,)) for r in (0.25, 0.5, 0.75)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    last = metrics._gauge_last[("be_suppress_ratio",)]
    assert value(metrics, "koordnode_be_cpu_suppress_ratio") == last
