"""bench/k8s_latency.py's arithmetic: BE's yield from sampled usage, the figures over runs and
their table (no node is started here; the benchmark itself runs the real nodes)."""

from __future__ import annotations

import pytest

from bench.k8s_latency import figures, over_runs, slo_controller_config, table, yield_from_samples

NS = 1_000_000_000


def samples_of(rates: list[tuple[float, float, float]], step_s: float = 0.02) -> list[tuple[float, int, int]]:
    """Cumulative usage samples every step_s from (until_s, LS CPUs, BE CPUs) pieces."""
    out, t, ls, be = [], 0.0, 0.0, 0.0
    for until, ls_cpus, be_cpus in rates:
        while t < until - 1e-9:
            out.append((t, int(ls), int(be)))
            t += step_s
            ls += ls_cpus * step_s * NS
            be += be_cpus * step_s * NS
    return out


def test_yield_is_time_from_ls_step_to_be_near_where_it_settles() -> None:
    # BE at 1.9 CPUs beside quiet LS; LS steps at 1 s; BE holds on for 0.5 s, then 0.2 CPUs.
    got = yield_from_samples(samples_of([(1.0, 0.0, 1.9), (1.5, 1.5, 1.9), (6.0, 1.5, 0.2)]), 1.5)
    assert got["be_cpus_before"] == pytest.approx(1.9, abs=0.05)
    assert got["be_cpus_settled"] == pytest.approx(0.2, abs=0.05)
    # LS is seen stepped once its 100 ms rate passes half the step (~0.06 s in), BE near its end
    # level once the 100 ms window is past its drop (~0.6 s after the step).
    assert 0.4 < got["yield_s"] < 0.65


def test_yield_of_an_at_once_drop_is_a_window_or_less() -> None:
    got = yield_from_samples(samples_of([(1.0, 0.0, 1.9), (5.0, 1.5, 0.5)]), 1.5)
    assert got["yield_s"] is not None and got["yield_s"] <= 0.1


def test_no_yield_without_an_ls_step() -> None:
    got = yield_from_samples(samples_of([(5.0, 0.2, 1.8)]), 1.5)
    assert got["yield_s"] is None


def _turn(p99: float, p999: float, be_share: float, yield_s: float | None) -> dict:
    probe = {"p99_us": p99, "p999_us": p999}
    return {"quiet": {"alone": {"probe": {"p99_us": 100.0, "p999_us": 200.0}},
                      "with_be": {"probe": {**probe, "be_share_of_idle": be_share}},
                      "step": {"yield_s": yield_s, "be_cpus_settled": 0.3}}}


def test_figures_over_runs_give_median_and_spread() -> None:
    runs = [{"proxy": _turn(110, 300, 0.9, 0.2), "koordlet": _turn(900, 4000, 0.5, 2.0)},
            {"proxy": _turn(130, 500, 0.8, 0.3), "koordlet": _turn(700, 3000, 0.4, None)},
            {"proxy": _turn(120, 400, 0.7, 0.1), "koordlet": _turn(800, 5000, 0.6, 3.0)}]
    assert figures(runs[0]["proxy"])["quiet probe p99 ratio"] == 1.1
    summary = over_runs(runs, ["proxy", "koordlet"])
    assert summary["proxy"]["quiet probe p99 with BE us"] == {"runs": [110, 130, 120], "median": 120, "min": 110,
                                                               "max": 130}
    # A run without a yield leaves the median to the others, and says so in its runs.
    assert summary["koordlet"]["yield s"]["runs"] == [2.0, None, 3.0]
    assert summary["koordlet"]["yield s"]["median"] == 2.5
    rendered = table(summary, ["proxy", "koordlet"])
    assert "| quiet probe p99.9 with BE us |" not in rendered  # the key is p999
    assert "| quiet probe p999 with BE us | 400 (300–500) | 4000 (3000–5000) |" in rendered


def test_slo_config_turns_suppression_on_with_the_policy() -> None:
    import json

    data = slo_controller_config("cfsQuota")
    assert json.loads(data["resource-threshold-config"]) == {
        "clusterStrategy": {"enable": True, "cpuSuppressPolicy": "cfsQuota"}}
    assert json.loads(data["colocation-config"]) == {"enable": True}


def test_autogroup_nice_is_read_from_proc(tmp_path) -> None:
    from bench.k8s_latency import autogroup_nice

    (tmp_path / "autogroup").write_text("/autogroup-4 nice 19\n")
    assert autogroup_nice(tmp_path / "autogroup") == 19
    assert autogroup_nice(tmp_path / "missing") is None


def test_pod_start_of_a_run_is_a_figure_with_its_spread() -> None:
    runs = [{"proxy": {**_turn(110, 300, 0.9, 0.2), "pod start": {"p50_s": 0.41, "p50_vs_direct": 1.05}}},
            {"proxy": {**_turn(120, 300, 0.9, 0.2), "pod start": {"p50_s": 0.40, "p50_vs_direct": 1.01}}}]
    summary = over_runs(runs, ["proxy"])
    assert summary["proxy"]["pod start p50 vs direct"] == {"runs": [1.05, 1.01], "median": 1.03, "min": 1.01,
                                                          "max": 1.05}
    assert "quiet probe p99 ratio" in summary["proxy"]  # the states' figures are still there
