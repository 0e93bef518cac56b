"""NodeMetric's prodReclaimableMetric by koordlet v1.8.0's rules: decaying-histogram peak models
(qos/prediction.py) and the smaller of the per-pod and per-priority estimates
(kube/reclaimable.py)."""

from __future__ import annotations

import pytest

from koordnode.kube.pods import pod_facts_of
from koordnode.kube.reclaimable import Prediction, ProdPod, prod_reclaimable, reclaimable_metric
from koordnode.qos.prediction import CPU_FIRST_BUCKET, CPU_HALF_LIFE_S, CPU_MAX, DecayingHistogram, PeakModels

DAY = 86400.0


def test_a_percentile_is_the_upper_bound_of_its_bucket_and_newer_samples_weigh_more() -> None:
    histogram = DecayingHistogram(CPU_FIRST_BUCKET, CPU_MAX, CPU_HALF_LIFE_S)
    assert histogram.percentile(0.95) == 0.0  # empty
    for minute in range(100):
        histogram.add(0.5, minute * 60.0)
    p95 = histogram.percentile(0.95)
    index = histogram.bucket(0.5)
    assert histogram.start(index) <= 0.5 < histogram.start(index + 1) == p95
    assert p95 / 0.5 < 1.1  # bucket widths grow 5 % a bucket from 0.025 cores
    # 2 cores for 12 h (one half-life) after 12 h at 0.5: the newer weigh twice as much at the
    # middle, so more than half of the weight is at 2 cores
    decayed = DecayingHistogram(CPU_FIRST_BUCKET, CPU_MAX, CPU_HALF_LIFE_S)
    for minute in range(720):
        decayed.add(0.5, minute * 60.0)
    for minute in range(720, 1440):
        decayed.add(2.0, minute * 60.0)
    assert decayed.percentile(0.5) > 1.9
    # weights stay finite over weeks
    for hour in range(24 * 60):
        decayed.add(1.0, 1440 * 60.0 + hour * 3600.0)
    assert 0.9 < decayed.percentile(0.5) < 1.1


def test_models_expire_after_thirty_minutes_without_training() -> None:
    models = PeakModels()
    models.train("pod/a", 1.0, 1 << 30, 0.0)
    models.train("pod/b", 1.0, 1 << 30, 1000.0)
    models.expire(1801.0)
    assert models.predict("pod/a") is None and models.predict("pod/b") is not None


def _predictions(table: dict[str, tuple[float, float]]):  # noqa: ANN202
    return lambda key: Prediction(*table[key]) if key in table else None


GIB = float(1 << 30)


def test_the_smaller_of_the_per_pod_and_per_priority_estimates_wins() -> None:
    """By hand: a prod pod requesting 2 cores / 4 GiB, past its cold start, predicted at 0.5
    cores / 1 GiB; another younger than a day; margin 10 %."""
    pods = [ProdPod("old", "koord-prod", 2.0, 4 * GIB, age_s=2 * DAY),
            ProdPod("young", "", 1.0, 2 * GIB, age_s=3600.0),
            ProdPod("batch", "koord-batch", 4.0, 8 * GIB, age_s=2 * DAY),  # not prod: left out
            ProdPod("leaving", "koord-prod", 8.0, 8 * GIB, age_s=2 * DAY, terminating=True)]
    table = {"pod/old": (0.5, GIB), "pod/young": (0.2, GIB), "pod/leaving": (8.0, 8 * GIB),
             "system": (0.3, GIB), "priority/koord-prod": (0.5, GIB), "priority/": (0.2, GIB)}
    cpu, memory = prod_reclaimable(pods, _predictions(table), allocatable_cpu=8.0, allocatable_memory=32 * GIB)
    # per pod: old only: 2 - 0.55 = 1.45 cores, 4 - 1.1 = 2.9 GiB
    # per priority: requests 3 cores / 6 GiB less (0.3 + 0.5 + 0.2) x 1.1 = 1.1 cores, 3.3 GiB
    #   -> 1.9 cores, 2.7 GiB
    assert cpu == pytest.approx(1.45) and memory == pytest.approx(2.7 * GIB)
    assert reclaimable_metric((cpu, memory)) == {"resource": {"resources": {
        "cpu": "1450m", "memory": str(int(2.7 * GIB))}}}
    # capped by allocatable - what is not reclaimable
    capped = prod_reclaimable(pods, _predictions(table), allocatable_cpu=1.5, allocatable_memory=32 * GIB)
    assert not isinstance(capped, str) and capped[0] == pytest.approx(1.5 - 1.1)  # the per-priority cap


def test_nothing_is_reported_before_the_system_and_the_priority_classes_are_predicted() -> None:
    pods = [ProdPod("old", "koord-prod", 2.0, 4 * GIB, age_s=2 * DAY)]
    found = prod_reclaimable(pods, _predictions({"pod/old": (0.5, GIB)}), allocatable_cpu=8, allocatable_memory=GIB)
    assert isinstance(found, str) and "system" in found
    assert reclaimable_metric(found) == {}
    # every pod in its cold start: nothing reclaimable, though predicted
    table = {"system": (0.3, GIB), "priority/koord-prod": (0.5, GIB), "priority/": (0.0, 0.0)}
    young = [ProdPod("young", "koord-prod", 2.0, 4 * GIB, age_s=60.0)]
    assert prod_reclaimable(young, _predictions(table), allocatable_cpu=8, allocatable_memory=8 * GIB) == (0.0, 0.0)


def test_pod_facts_carry_the_cpu_request_and_the_creation_time() -> None:
    facts, problems = pod_facts_of({
        "metadata": {"uid": "u", "creationTimestamp": "2026-12-02T08:00:00Z"},
        "spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}},
                                {"name": "b", "resources": {"requests": {"cpu": "1"}}}]}})
    assert facts is not None and problems == []
    assert (facts.cpu_request_milli, facts.created_at) == (1250, 1796198400.0)
    facts, problems = pod_facts_of({"metadata": {"uid": "u", "creationTimestamp": "yesterday"},
                                    "spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "lots"}}}]}})
    assert facts is not None and facts.cpu_request_milli is None and facts.created_at is None
    assert problems and "cpu request" in problems[0]
