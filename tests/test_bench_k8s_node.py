"""bench/k8s_node.py's comparison of runs: what it reports from the pods' start times (no node is
started here; the bench itself runs the real ones)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

import bench.k8s_node as k8s_bench
from bench.k8s_node import (_builds, _over_runs, interleaved_start_latencies, kubelet_added_ms, kubelet_timings,
                             timings_between, turn_orders)

REPO = Path(__file__).resolve().parent.parent


def _run(direct: list[float], proxy: list[float]) -> dict:
    return {"direct": {"p50_s": sorted(direct)[len(direct) // 2], "all_s": direct},
            "proxy": {"p50_s": sorted(proxy)[len(proxy) // 2], "all_s": proxy,
                      "p50_vs_direct": round(sorted(proxy)[len(proxy) // 2] / sorted(direct)[len(direct) // 2], 3)}}


def test_runs_are_summed_up_by_their_median_ratio_and_by_every_pod_together():
    runs = [_run([0.2, 0.2, 0.2], [0.21, 0.21, 0.21]),   # 1.05x
            _run([0.3, 0.3, 0.3], [0.3, 0.3, 0.3]),      # 1.00x, a slower machine that run
            _run([0.2, 0.2, 0.2], [0.22, 0.22, 0.22])]   # 1.10x
    summary = _over_runs(runs, ["direct", "proxy"])
    assert summary["proxy"]["p50_vs_direct_by_run"] == [1.05, 1.0, 1.1]
    assert summary["proxy"]["p50_vs_direct_median"] == 1.05
    # Every pod of every run together: the slow run's pods weigh in as they were.
    assert summary["proxy"]["p50_s"] == 0.22 and summary["direct"]["p50_s"] == 0.2
    assert summary["proxy"]["p50_vs_direct_pooled"] == 1.1


def test_a_build_to_compare_must_name_a_checkout_of_koordnode(tmp_path):
    assert _builds([f"now={REPO}"]) == {"now": REPO}
    for spec in (f"={REPO}", "now=", f"now={tmp_path}", "now"):
        with pytest.raises(SystemExit, match="NAME=DIR"):
            _builds([spec])


KUBELET_METRICS = """\
# HELP kubelet_runtime_operations_duration_seconds [ALPHA] Duration in seconds of runtime operations.
# TYPE kubelet_runtime_operations_duration_seconds histogram
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="0.005"} 0
kubelet_runtime_operations_duration_seconds_sum{operation_type="run_podsandbox"} 1.25
kubelet_runtime_operations_duration_seconds_count{operation_type="run_podsandbox"} 10
kubelet_runtime_operations_duration_seconds_sum{operation_type="version"} 0.002
kubelet_runtime_operations_duration_seconds_count{operation_type="version"} 2
kubelet_pod_worker_duration_seconds_sum{operation_type="create"} 2.0
kubelet_pod_worker_duration_seconds_count{operation_type="create"} 10
kubelet_runtime_operations_total{operation_type="version"} 2
"""


def test_kubelet_timings_are_read_by_operation_and_averaged_over_what_happened_in_between():
    before = kubelet_timings(KUBELET_METRICS)
    assert before == {"runtime:run_podsandbox": [10.0, 1.25], "runtime:version": [2.0, 0.002],
                      "worker:create": [10.0, 2.0]}
    after = kubelet_timings(KUBELET_METRICS.replace("run_podsandbox\"} 1.25", "run_podsandbox\"} 2.45")
                            .replace("run_podsandbox\"} 10", "run_podsandbox\"} 20"))
    # Only what kubelet did in between, with its mean: 10 sandboxes in 1.2 s.
    assert timings_between(before, after) == {"runtime:run_podsandbox": {"calls": 10, "mean_ms": 120.0}}


def test_what_a_mode_adds_to_each_operation_is_listed_largest_first():
    direct = {"runtime:start_container": 70.0, "runtime:version": 1.0}
    proxy = {"runtime:start_container": 74.0, "runtime:version": 0.5, "runtime:only_here": 3.0}
    assert list(kubelet_added_ms(proxy, direct).items()) == [("runtime:start_container", 4.0),
                                                             ("runtime:version", -0.5)]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_mode_starts_at_every_place_and_after_every_other_mode_equally_often(n):
    orders = turn_orders(n)
    assert all(sorted(order) == list(range(n)) for order in orders)
    places = [[order[place] for order in orders].count(mode) for place in range(n) for mode in range(n)]
    follows = [sum(1 for order in orders for a, b in itertools.pairwise(order) if (a, b) == (x, y))
               for x in range(n) for y in range(n) if x != y]
    assert len(set(places)) == 1 and len(set(follows)) <= 1


def test_interleaved_starts_take_the_turns_in_those_orders(monkeypatch):
    started: list[str] = []
    monkeypatch.setattr(k8s_bench, "pod_start_latency", lambda node, name: started.append(node) or 0.1)
    latencies = interleaved_start_latencies({"direct": "direct", "proxy": "proxy", "nri": "nri"}, 7)
    names = ["direct", "proxy", "nri"]
    assert started == [names[k] for i in range(7) for k in turn_orders(3)[i % 6]]
    assert {mode: len(v) for mode, v in latencies.items()} == {"direct": 7, "proxy": 7, "nri": 7}
