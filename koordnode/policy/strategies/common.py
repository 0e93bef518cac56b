"""What every strategy returns: the writes it wants and why."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from koordnode.policy.plan import SysctlWrite
from koordnode.policy.plan import CgroupWrite


@dataclass(frozen=True)
class Explanation:
    """One decision, for logs and `koordnode status`: what went in, what came out, why."""

    strategy: str
    inputs: Mapping[str, Any]
    decision: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"inputs": dict(self.inputs), "decision": self.decision, "reason": self.reason}


@dataclass(frozen=True)
class Eviction:
    """A BE container to stop, and why."""

    container_id: str
    sandbox_id: str
    pod: str
    reason: str
    cause: str = "memory"  # "memory" or "cpu"


@dataclass(frozen=True)
class StrategyResult:
    explanation: Explanation
    writes: tuple[CgroupWrite, ...] = ()
    sysctls: tuple[SysctlWrite, ...] = ()
    evictions: tuple[Eviction, ...] = ()
    # The strategy's memory for its next call (None for stateless strategies).
    state: Any = None
    # Facts for the strategies deciding after this one in the same tick (e.g. the BE budget).
    facts: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # True: a tick woken early could not change this decision (e.g. BE is suppressed as far
    # as it goes), so such wake-ups are skipped; None: no opinion this tick.
    saturated: bool | None = None
    # False: nothing new to show; status keeps the previous explanation (once there is one).
    explain: bool = True


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
