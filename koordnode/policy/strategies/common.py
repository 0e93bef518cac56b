"""What every strategy returns: the writes it wants and why."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from koordnode.policy.plan import SysctlWrite
from koordnode.policy.plan import CgroupWrite


@runtime_checkable
class PodStatusFields(Protocol):
    """A strategy state that adds fields to each pod in `koordnode status` (the manager asks
    every enabled strategy's state that has it, naming none)."""

    def pod_status_fields(self, pod: Mapping[str, Any]) -> dict[str, Any]: ...


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
    # Typed facts for the strategies deciding after this one in the same tick and for the
    # metrics (e.g. a BeBudget); read with `fact(result, Type)`.
    facts: tuple[object, ...] = ()
    # True: a tick woken early could not change this decision (e.g. BE is suppressed as far
    # as it goes), so such wake-ups are skipped; None: no opinion this tick.
    saturated: bool | None = None
    # False: nothing new to show; status keeps the previous explanation (once there is one).
    explain: bool = True


@dataclass(frozen=True)
class BeBudget:
    """cpu_suppress's decision on the BE tier's CPU this tick: for be_evict, and for the
    `koordnode_be_cpu_*` metrics."""

    cpus: float  # the budget after the pressure ratio, >= 0
    pressure_ratio: float  # the factor LS CPU pressure applied to it (1 = none)
    # Quota policy: the tier's quota before this tick (-1 unlimited; None: the tier is missing,
    # or the cpuset policy), its period, and the quota this tick's plan writes (None: kept).
    quota_us: int | None = None
    period_us: int = 0
    quota_write: CgroupWrite | None = None

    def quota_cores(self, *, written: bool) -> float | None:
        """The tier's quota in cores once the tick's writes are done (`written`: the quota
        write succeeded); None when unlimited or not known."""
        quota = self.quota_write.value if written and self.quota_write is not None else self.quota_us
        if isinstance(quota, int) and quota > 0 and self.period_us:
            return quota / self.period_us
        return None


Fact = TypeVar("Fact")


def fact(result: StrategyResult | None, kind: type[Fact]) -> Fact | None:
    """The fact of type `kind` a strategy's result carries (None: no result, or no such fact)."""
    for item in result.facts if result is not None else ():
        if isinstance(item, kind):
            return item
    return None


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
