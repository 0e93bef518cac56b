"""Peak predictions of CPU and memory use, as koordlet v1.8.0's prediction server makes them:
one model per pod, per priority class and for the system, trained once a minute from the last
use; each model a pair of decaying histograms with exponential buckets (CPU from 0.025 cores
growing 5 % a bucket up to 1024 cores, half-life 12 h; memory from 5 MiB growing 5 % up to
2 TiB, half-life 24 h). A percentile is the upper bound of the bucket where the weight reaches
that share. A model not trained for 30 minutes is dropped. No I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from koordnode.kube.reclaimable import Prediction

__all__ = ["DecayingHistogram", "PeakModels"]

GROWTH = 0.05
CPU_FIRST_BUCKET, CPU_MAX = 0.025, 1024.0  # cores
MEMORY_FIRST_BUCKET, MEMORY_MAX = float(5 << 20), float(1 << 41)  # bytes
CPU_HALF_LIFE_S, MEMORY_HALF_LIFE_S = 12 * 3600.0, 24 * 3600.0
MODEL_EXPIRY_S = 30 * 60.0
# Weights are kept relative to a reference time; moved forward before 2**x grows too large.
_MAX_EXPONENT = 100.0


class DecayingHistogram:
    """Samples weighted 2**((t - reference) / half_life): a newer sample outweighs an older one."""

    def __init__(self, first_bucket: float, max_value: float, half_life_s: float) -> None:
        self.first_bucket = first_bucket
        self.half_life_s = half_life_s
        # bucket i covers [start(i), start(i+1)); start(i) = first x ((1+g)^i - 1) / g
        self.buckets = int(math.ceil(math.log(max_value * GROWTH / first_bucket + 1, 1 + GROWTH))) + 1
        self.weights = [0.0] * self.buckets
        self.total = 0.0
        self.reference: float | None = None

    def start(self, index: int) -> float:
        return self.first_bucket * ((1 + GROWTH) ** index - 1) / GROWTH

    def bucket(self, value: float) -> int:
        if value < self.first_bucket:
            return 0
        index = int(math.log(value * GROWTH / self.first_bucket + 1, 1 + GROWTH))
        return min(max(index, 0), self.buckets - 1)

    def add(self, value: float, at: float, weight: float = 1.0) -> None:
        if self.reference is None:
            self.reference = at
        exponent = (at - self.reference) / self.half_life_s
        if exponent > _MAX_EXPONENT:  # rescale to a newer reference
            factor = 2.0 ** -exponent
            self.weights = [w * factor for w in self.weights]
            self.total *= factor
            self.reference, exponent = at, 0.0
        scaled = weight * 2.0 ** exponent
        self.weights[self.bucket(max(value, 0.0))] += scaled
        self.total += scaled

    def percentile(self, share: float) -> float:
        """0 when empty."""
        if self.total <= 0:
            return 0.0
        wanted, seen = share * self.total, 0.0
        for index, weight in enumerate(self.weights):
            seen += weight
            if seen >= wanted and weight > 0:
                return self.start(index + 1) if index + 1 < self.buckets else self.start(index)
        return self.start(self.buckets - 1)


@dataclass
class _Model:
    cpu: DecayingHistogram = field(default_factory=lambda: DecayingHistogram(CPU_FIRST_BUCKET, CPU_MAX, CPU_HALF_LIFE_S))
    memory: DecayingHistogram = field(
        default_factory=lambda: DecayingHistogram(MEMORY_FIRST_BUCKET, MEMORY_MAX, MEMORY_HALF_LIFE_S))
    trained_at: float = 0.0


class PeakModels:
    """Models by key: "pod/<uid>", "priority/<class>", "system"."""

    def __init__(self, expiry_s: float = MODEL_EXPIRY_S) -> None:
        self.expiry_s = expiry_s
        self._models: dict[str, _Model] = {}

    def __len__(self) -> int:
        return len(self._models)

    def train(self, key: str, cpu_cores: float, memory_bytes: float, at: float) -> None:
        model = self._models.get(key)
        if model is None:
            model = self._models[key] = _Model()
        model.cpu.add(cpu_cores, at)
        model.memory.add(memory_bytes, at)
        model.trained_at = at

    def expire(self, now: float) -> None:
        for key in [k for k, m in self._models.items() if now - m.trained_at > self.expiry_s]:
            del self._models[key]

    def predict(self, key: str) -> Prediction | None:
        model = self._models.get(key)
        if model is None:
            return None
        return Prediction(model.cpu.percentile(0.95), model.memory.percentile(0.98))
