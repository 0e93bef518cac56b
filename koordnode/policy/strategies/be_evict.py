"""BE eviction: stop BE containers when the node runs short of memory, or BE of CPU.

Memory: when node memory use (MemTotal - MemAvailable) reaches `memory_threshold_percent`,
release = use - (threshold - margin) x MemTotal, taken from BE containers lowest priority
first, largest working set first within a priority.

CPU: BE's satisfaction = its CPU budget (from cpu_suppress) / the CPU its containers
requested. When it stays below `cpu_satisfaction_floor_percent` for
`cpu_satisfaction_duration_s` while BE really uses its budget (>= cpu_busy_percent), BE
containers are stopped (lowest priority, largest request first) until the requests left
fit: request <= budget / floor.

After an eviction round nothing more is evicted for `cooldown_s` (the memory takes time to
be freed and the metrics to show it); a container already asked to stop is not picked again
while it is still listed (for up to 5 minutes, then it is asked again).

Pure: inputs, config and the previous state in; evictions, explanation and new state out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from koordnode.model.qos_class import QoSClass
from koordnode.policy.strategies.base import TickSnapshot
from koordnode.policy.strategies.common import BeBudget, Eviction, Explanation, StrategyResult, fact, rounded
from koordnode.config.strategies import BeEvictConfig

NAME = "be_evict"
_GIB = 1 << 30
# A container asked to stop that is still listed this long after is asked again.
PENDING_RETRY_S = 300.0


@dataclass(frozen=True)
class EvictCandidate:
    container_id: str
    sandbox_id: str
    pod: str  # namespace/name
    priority: int = 0  # lower goes first
    memory_bytes: int = 0  # working set
    cpu_request_cpus: float = 0.0


@dataclass(frozen=True)
class BeEvictInput:
    now: float
    memory_total_bytes: int
    memory_used_bytes: int
    candidates: tuple[EvictCandidate, ...]
    be_cpu_budget_cpus: float | None = None  # None: cpu_suppress off or not measurable
    be_cpu_used_cpus: float = 0.0
    be_cpu_request_cpus: float = 0.0


@dataclass(frozen=True)
class BeEvictState:
    last_round_at: float | None = None
    low_satisfaction_since: float | None = None
    # container id -> when it was asked to stop
    pending: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    evicted_total: int = 0


def _pick(candidates: list[EvictCandidate], amount: float,
          size: Callable[[EvictCandidate], float]) -> list[EvictCandidate]:
    chosen: list[EvictCandidate] = []
    released = 0.0
    for candidate in candidates:
        if released >= amount:
            break
        if size(candidate) <= 0:
            continue
        chosen.append(candidate)
        released += size(candidate)
    return chosen


def decide_be_evict(inp: BeEvictInput, cfg: BeEvictConfig, state: BeEvictState) -> StrategyResult:
    now = inp.now
    listed = {c.container_id for c in inp.candidates}
    # A stop in flight stays pending while the container is listed (up to PENDING_RETRY_S).
    pending = {cid: at for cid, at in state.pending.items()
               if cid in listed and now - at < max(cfg.cooldown_s, PENDING_RETRY_S)}
    free = [c for c in inp.candidates if c.container_id not in pending]

    total = inp.memory_total_bytes
    used_percent = 100.0 * inp.memory_used_bytes / total if total else 0.0
    budget, request = inp.be_cpu_budget_cpus, inp.be_cpu_request_cpus
    satisfaction = 100.0 * budget / request if budget is not None and request > 0 else None
    floor = cfg.cpu_satisfaction_floor_percent
    busy = budget is not None and budget > 0 and inp.be_cpu_used_cpus >= cfg.cpu_busy_percent / 100.0 * budget
    starved = floor > 0 and satisfaction is not None and satisfaction < floor and busy
    since = (state.low_satisfaction_since if state.low_satisfaction_since is not None else now) if starved else None

    inputs = {
        "memory_used_percent": round(used_percent, 1),
        "memory_threshold_percent": cfg.memory_threshold_percent,
        "be_containers": len(inp.candidates),
        "be_cpu_budget_cpus": rounded(budget),
        "be_cpu_used_cpus": rounded(inp.be_cpu_used_cpus),
        "be_cpu_request_cpus": rounded(request),
        "cpu_satisfaction_percent": rounded(satisfaction, 1),
        "cpu_satisfaction_floor_percent": floor or None,
        "low_satisfaction_for_s": round(now - since, 1) if since is not None else None,
        "pending_stops": len(pending),
        "evicted_total": state.evicted_total,
    }

    def result(decision: str, reason: str, evictions: tuple[Eviction, ...] = (), **changes: Any) -> StrategyResult:
        new_state = BeEvictState(
            last_round_at=changes.get("last_round_at", state.last_round_at),
            low_satisfaction_since=changes.get("since", since),
            pending=MappingProxyType(changes.get("pending", pending)),
            evicted_total=state.evicted_total + len(evictions),
        )
        return StrategyResult(Explanation(NAME, inputs, decision, reason), evictions=evictions, state=new_state)

    memory_short = used_percent >= cfg.memory_threshold_percent
    cpu_short = since is not None and now - since >= cfg.cpu_satisfaction_duration_s
    if not memory_short and not cpu_short:
        why = "starved, waiting for the duration" if since is not None else "memory and BE CPU within limits"
        return result("nothing to evict", why)
    if state.last_round_at is not None and now - state.last_round_at < cfg.cooldown_s:
        left = cfg.cooldown_s - (now - state.last_round_at)
        return result("wait", f"cooling down for {left:.0f} s after the last eviction round")

    chosen: list[EvictCandidate] = []
    reasons: dict[str, str] = {}
    causes: dict[str, str] = {}
    if memory_short:
        release = inp.memory_used_bytes - (cfg.memory_threshold_percent - cfg.memory_margin_percent) / 100.0 * total
        order = sorted(free, key=lambda c: (c.priority, -c.memory_bytes, c.container_id))
        for c in _pick(order, release, lambda c: c.memory_bytes):
            chosen.append(c)
            causes[c.container_id] = "memory"
            reasons[c.container_id] = (
                f"node memory {used_percent:.1f}% >= {cfg.memory_threshold_percent:g}%: releasing "
                f"{release / _GIB:.2f} GiB; {c.pod} uses {c.memory_bytes / _GIB:.2f} GiB, priority {c.priority}"
            )
        inputs["memory_release_bytes"] = int(release)
    if cpu_short and budget is not None and since is not None:
        release_cpus = request - budget / (floor / 100.0)
        order = sorted((c for c in free if c.container_id not in reasons),
                       key=lambda c: (c.priority, -c.cpu_request_cpus, c.container_id))
        for c in _pick(order, release_cpus, lambda c: c.cpu_request_cpus):
            chosen.append(c)
            causes[c.container_id] = "cpu"
            reasons[c.container_id] = (
                f"BE CPU satisfaction {satisfaction:.0f}% < {floor:g}% for "
                f"{now - since:.0f} s: releasing {release_cpus:.2f} CPUs of requests; {c.pod} "
                f"requests {c.cpu_request_cpus:.2f}, priority {c.priority}"
            )
        inputs["cpu_release_cpus"] = rounded(release_cpus)
    if not chosen:
        return result("nothing to evict", "short, but no BE container left to stop")
    evictions = tuple(Eviction(c.container_id, c.sandbox_id, c.pod, reasons[c.container_id], causes[c.container_id])
                      for c in chosen)
    new_pending = dict(pending)
    new_pending.update({c.container_id: now for c in chosen})
    decision = f"evict {len(evictions)}: " + ", ".join(f"{c.pod}/{c.container_id[:12]}" for c in chosen[:5])
    reason = "memory" if memory_short and not cpu_short else "cpu" if cpu_short and not memory_short else "memory and cpu"
    # A CPU round restarts the satisfaction clock: the next round needs a new full duration.
    restart = None if cpu_short else since
    return result(decision, f"short of {reason}", evictions, last_round_at=now, pending=new_pending, since=restart)


# ---------------------------------------------------------------------- the plug-in


def evict_input(snap: TickSnapshot, cfg: BeEvictConfig, budget: float | None) -> BeEvictInput:
    """The candidates (BE containers) and the node's numbers; per-container memory is read
    (through the probe) only when memory is short, to pick the victims."""
    total = snap.memory_total_bytes or 0
    used = snap.memory_used_bytes or 0
    need_memory = snap.memory_total_bytes is not None and total > 0 and \
        100.0 * used / total >= cfg.memory_threshold_percent
    candidates = []
    request = 0.0
    for pod in snap.inventory.of_class(QoSClass.BE):
        for c in pod.containers:
            working_set = (snap.probe.working_set_bytes(c.cgroup) or 0) if need_memory else 0
            cpus = (c.batch_cpu_milli or 0) / 1000.0
            request += cpus
            candidates.append(EvictCandidate(c.container_id, pod.sandbox_id, pod.name, pod.priority, working_set, cpus))
    return BeEvictInput(
        now=snap.now,
        memory_total_bytes=total,
        memory_used_bytes=used,
        candidates=tuple(candidates),
        be_cpu_budget_cpus=budget,
        be_cpu_used_cpus=snap.be_used_cpus,
        be_cpu_request_cpus=request,
    )


class BeEvict:
    name = NAME
    early = False
    precheck = False  # writes nothing
    evicts = True

    def initial_state(self) -> BeEvictState:
        return BeEvictState()

    def decide(self, snap: TickSnapshot, cfg: BeEvictConfig, state: BeEvictState,
               earlier: Mapping[str, StrategyResult]) -> StrategyResult:
        # The BE CPU budget cpu_suppress found this tick (None: it is off or warming up).
        budget = fact(earlier.get("cpu_suppress"), BeBudget)
        return decide_be_evict(evict_input(snap, cfg, budget.cpus if budget is not None else None), cfg, state)

    def restore_config(self, old: BeEvictConfig | None, new: BeEvictConfig) -> None:
        return None  # stopped containers are kubelet's to restart

    def restore(self, snap: TickSnapshot, cfg: BeEvictConfig, state: BeEvictState) -> StrategyResult:
        return StrategyResult(Explanation(NAME, {}, "no change", "nothing to restore"), state=state)

    def status(self, cfg: BeEvictConfig, state: BeEvictState) -> dict[str, Any]:
        return {}


    def confines_be_cpuset(self, cfg: BeEvictConfig) -> bool:
        return False

STRATEGY = BeEvict()
