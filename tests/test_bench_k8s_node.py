"""bench/k8s_node.py's comparison of runs: what it reports from the pods' start times (no node is
started here; the bench itself runs the real ones)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.k8s_node import _builds, _over_runs

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
