"""NodeMetric's prodReclaimableMetric: how much of what the prod pods request they are predicted
not to use, by koordlet v1.8.0's rules (prediction/peak_predictor.go). Pure: the predictions
come in (qos/prediction.py makes them).

Two estimates, the smaller wins, per resource:
- per pod: each prod pod past its cold start (24 h) counts request - peak as reclaimable and its
  peak as not; peak = p95 CPU / p98 memory x (1 + safety margin 10 %);
- per priority: the requests of every prod pod less the peaks of the system and of the prod
  priority classes (koord-prod and pods without a Koordinator priority), with the same margin.
Each is capped by allocatable - what is not reclaimable, never below 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["COLD_START_S", "PROD_CLASSES", "Prediction", "ProdPod", "SAFETY_MARGIN_PERCENT", "prod_reclaimable",
           "reclaimable_metric"]

COLD_START_S = 24 * 3600.0
SAFETY_MARGIN_PERCENT = 10
PROD_CLASSES = ("koord-prod", "")  # "" : no Koordinator priority, which koordlet counts as prod


@dataclass(frozen=True)
class Prediction:
    cpu_p95: float  # cores
    memory_p98: float  # bytes


@dataclass(frozen=True)
class ProdPod:
    uid: str
    priority_class: str  # Koordinator's: koord-prod, koord-mid, koord-batch, koord-free or ""
    cpu_request_cores: float
    memory_request_bytes: float
    age_s: float | None  # since its creation; None: not known (counts as in its cold start)
    terminating: bool = False


def _capped(allocatable: float, unreclaimable: float, reclaimable: float) -> float:
    return max(min(allocatable - unreclaimable, reclaimable), 0.0)


def prod_reclaimable(pods: Sequence[ProdPod], predict: Callable[[str], Prediction | None], *,
                     allocatable_cpu: float, allocatable_memory: float, cold_start_s: float = COLD_START_S,
                     margin_percent: int = SAFETY_MARGIN_PERCENT) -> tuple[float, float] | str:
    """(cores, bytes) reclaimable from the prod pods, or why it cannot be told (no system or
    priority prediction yet: koordlet then reports none)."""
    ratio = (100 + margin_percent) / 100
    prod = [p for p in pods if p.priority_class in PROD_CLASSES and not p.terminating]

    reclaim_cpu = reclaim_memory = unreclaim_cpu = unreclaim_memory = 0.0
    for pod in prod:
        if pod.age_s is None or pod.age_s <= cold_start_s:
            continue  # a pod in its cold start has nothing reclaimable
        peak = predict(f"pod/{pod.uid}")
        if peak is None:
            continue  # no model yet: left out, as koordlet leaves a pod it cannot predict
        cpu, memory = peak.cpu_p95 * ratio, peak.memory_p98 * ratio
        unreclaim_cpu, unreclaim_memory = unreclaim_cpu + cpu, unreclaim_memory + memory
        reclaim_cpu += max(pod.cpu_request_cores - cpu, 0.0)
        reclaim_memory += max(pod.memory_request_bytes - memory, 0.0)
    by_pod = (_capped(allocatable_cpu, unreclaim_cpu, reclaim_cpu),
              _capped(allocatable_memory, unreclaim_memory, reclaim_memory))

    system = predict("system")
    if system is None:
        return "no prediction of the system's use yet"
    peak_cpu, peak_memory = system.cpu_p95, system.memory_p98
    for name in PROD_CLASSES:
        found = predict(f"priority/{name}")
        if found is None:
            return f"no prediction of priority class {name or '(none)'} yet"
        peak_cpu, peak_memory = peak_cpu + found.cpu_p95, peak_memory + found.memory_p98
    peak_cpu, peak_memory = peak_cpu * ratio, peak_memory * ratio
    requested_cpu = sum(p.cpu_request_cores for p in prod)
    requested_memory = sum(p.memory_request_bytes for p in prod)
    by_priority = (_capped(allocatable_cpu, peak_cpu, max(requested_cpu - peak_cpu, 0.0)),
                   _capped(allocatable_memory, peak_memory, max(requested_memory - peak_memory, 0.0)))
    return min(by_pod[0], by_priority[0]), min(by_pod[1], by_priority[1])


def reclaimable_metric(found: tuple[float, float] | str) -> dict[str, object]:
    """NodeMetric status.prodReclaimableMetric: the resources, or empty when not told."""
    if isinstance(found, str):
        return {}
    cpu, memory = found
    return {"resource": {"resources": {"cpu": f"{int(cpu * 1000)}m", "memory": str(int(memory))}}}
