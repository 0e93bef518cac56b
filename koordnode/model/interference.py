"""What a non-BE pod feels from the others, as the kernel counts it: read by the QoS side,
exported by the metrics."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PodInterference:
    """Cumulative seconds, as the kernel counts them."""

    namespace: str
    pod: str
    qos_class: str
    cpu_pressure_s: float | None  # cpu.pressure some total
    cpu_throttled_s: float | None  # cpu.stat throttled time
