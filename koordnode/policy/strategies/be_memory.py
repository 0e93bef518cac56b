"""BE memory budget: BE pods hold at most what LS and the system leave, so a leaking BE pod
reclaims its own pages (or is throttled) instead of LS's page cache.

    budget = MemTotal x budget_percent - LS working set - max(system use, reserved_mib)

(the reservation terms of Koordinator v1.2's batch memory: Node.Total x ratio - Node.Reserved -
System.Used - Pod(LS).Used), at least `min_budget_mib`. LS = kubelet's top cgroup less the BE
tiers; system = node use (MemTotal - MemAvailable) less kubelet's top cgroup.

Written to
  - the BE tier (koordnode's BE group, or kubelet's besteffort tier while a BE pod runs there):
    memory.high (v2) / memory.soft_limit_in_bytes (v1) = the budget: above it BE is reclaimed
    first (v2: throttled); memory.max / memory.limit_in_bytes = the budget or what the tier
    holds now if more: BE never grows past the budget, and is never forced below what it holds
    (the kernel would OOM-kill it: leaving that to be_evict and the kernel keeps this a bound);
  - each BE pod without a memory limit: memory.high / soft limit = `pod_high_percent` of the
    budget, as a BE pod with a limit gets [qos.BE] memory_high_percent of its limit.
The executor skips the file a kernel lacks (memory.high on v1, the soft limit on v2).

Decided every regular tick from six reads (usage and memory.stat of kubelet's top cgroup and
the two BE tiers); handed to the executor when a value moves by more than 1%, and again each
reconcile interval (another writer's change is restored then). Pure: inputs in, writes out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from koordnode.config.strategies import BeMemoryConfig
from koordnode.model.qos_class import QoSClass
from koordnode.policy.plan import CgroupWrite
from koordnode.policy.strategies.base import TickSnapshot
from koordnode.policy.strategies.common import Explanation, StrategyResult

NAME = "be_memory"
MIB = 1 << 20
UNLIMITED = -1
# Smaller moves of a value are not written (the working sets change every tick).
MIN_CHANGE_FRACTION = 0.01
# What a BE tier or pod bound is made of (logical v1 names; the executor maps them for v2).
SOFT_RESOURCES = ("memory.high", "memory.soft_limit_in_bytes")
CAP_RESOURCE = "memory.limit_in_bytes"


@dataclass(frozen=True)
class BeMemoryInput:
    now: float
    memory_total_bytes: int
    memory_used_bytes: int  # MemTotal - MemAvailable
    kubepods_bytes: int  # working set of kubelet's top cgroup (every pod)
    be_bytes: int  # working set of the BE tiers (kubelet's besteffort tier and koordnode's group)
    be_tier: str  # where the BE pods are: the group's cap goes there
    be_tier_bytes: int | None  # its working set; None: it does not exist (yet: no BE pod)
    unlimited_be_pods: Mapping[str, str] = field(default_factory=dict)  # sandbox id -> pod cgroup
    due: bool = True  # a reconcile interval since the last hand-over: write even unchanged values


@dataclass(frozen=True)
class BeMemoryState:
    last_pass: float | None = None
    budget_bytes: int | None = None
    # cgroup -> resource -> the value last handed over
    written: Mapping[str, Mapping[str, int]] = field(default_factory=lambda: MappingProxyType({}))
    pod_bounds: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))  # sandbox id -> bytes

    def pod_status_fields(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """A BE pod's `be_memory_bound` in status: its memory.high and the budget, or None."""
        if pod.get("qos_class") != "BE":
            return {}
        bound = self.pod_bounds.get(pod.get("sandbox_id", ""))
        return {"be_memory_bound": {"memory.high": bound, "budget_bytes": self.budget_bytes}
                if bound is not None else None}


def be_memory_budget(inp: BeMemoryInput, cfg: BeMemoryConfig) -> tuple[int, dict[str, int]]:
    """The budget in bytes and its terms."""
    ls = max(0, inp.kubepods_bytes - inp.be_bytes)
    system = max(0, inp.memory_used_bytes - inp.kubepods_bytes)
    reserved = cfg.reserved_mib * MIB
    share = int(inp.memory_total_bytes * cfg.budget_percent / 100.0)
    raw = share - ls - max(system, reserved)
    terms = {"share_bytes": share, "ls_bytes": ls, "system_bytes": system, "reserved_bytes": reserved,
             "raw_budget_bytes": raw}
    return max(raw, cfg.min_budget_mib * MIB), terms


def _moved(old: int | None, new: int) -> bool:
    if old is None:
        return True
    if UNLIMITED in (old, new):
        return old != new
    return abs(new - old) > MIN_CHANGE_FRACTION * max(old, 1)


def _mib(value: int) -> str:
    return f"{value / MIB:.0f} MiB"


def decide_be_memory(inp: BeMemoryInput, cfg: BeMemoryConfig, state: BeMemoryState) -> StrategyResult:
    budget, terms = be_memory_budget(inp, cfg)
    cap = max(budget, inp.be_tier_bytes or 0)
    pod_bound = budget * cfg.pod_high_percent // 100
    formula = (f"budget {_mib(budget)} = {cfg.budget_percent:g}% of {_mib(inp.memory_total_bytes)} - LS "
               f"{_mib(terms['ls_bytes'])} - max(system {_mib(terms['system_bytes'])}, reserved "
               f"{_mib(terms['reserved_bytes'])})" + (f", floor {cfg.min_budget_mib} MiB"
                                                      if budget > terms["raw_budget_bytes"] else ""))
    wanted: dict[str, dict[str, tuple[int, str]]] = {}
    if inp.be_tier_bytes is not None:
        wanted[inp.be_tier] = {
            **{r: (budget, f"be_memory: BE tier soft bound, {formula}") for r in SOFT_RESOURCES},
            CAP_RESOURCE: (cap, f"be_memory: BE tier cap, the budget or what BE holds now "
                                f"({_mib(inp.be_tier_bytes)}) if more; {formula}"),
        }
    for cgroup in inp.unlimited_be_pods.values():
        why = f"be_memory: BE pod without a memory limit, {cfg.pod_high_percent}% of the {formula}"
        wanted[cgroup] = {r: (pod_bound, why) for r in SOFT_RESOURCES}
    writes = []
    written: dict[str, dict[str, int]] = {}
    for cgroup, values in wanted.items():
        before = state.written.get(cgroup, {})
        for resource, (value, why) in values.items():
            if inp.due or _moved(before.get(resource), value):
                writes.append(CgroupWrite(cgroup, resource, value, why))
                written.setdefault(cgroup, {})[resource] = value
            else:
                written.setdefault(cgroup, {})[resource] = before[resource]
    inputs: dict[str, Any] = {
        "memory_total_bytes": inp.memory_total_bytes, "memory_used_bytes": inp.memory_used_bytes,
        "budget_percent": cfg.budget_percent, **terms, "be_bytes": inp.be_bytes, "be_tier": inp.be_tier,
        "be_tier_bytes": inp.be_tier_bytes, "budget_bytes": budget, "cap_bytes": cap,
        "unlimited_be_pods": len(inp.unlimited_be_pods), "pod_bound_bytes": pod_bound,
    }
    new_state = BeMemoryState(
        last_pass=inp.now if inp.due else state.last_pass, budget_bytes=budget,
        written=MappingProxyType(written),
        pod_bounds=MappingProxyType({sid: pod_bound for sid in inp.unlimited_be_pods}))
    if not writes:
        return StrategyResult(Explanation(NAME, inputs, f"keep budget {_mib(budget)}",
                                          f"moved by less than {MIN_CHANGE_FRACTION:.0%}; {formula}"),
                              state=new_state, explain=False)
    decision = f"budget {_mib(budget)}, BE tier cap {_mib(cap)}" + (
        f", {len(inp.unlimited_be_pods)} BE pod(s) without a limit at {_mib(pod_bound)}" if inp.unlimited_be_pods else "")
    why = "periodic pass" if inp.due else "a value moved"
    return StrategyResult(Explanation(NAME, inputs, decision, f"{why}; {formula}"), writes=tuple(writes),
                          state=new_state)


def restore_be_memory(be_tier: str, pod_cgroups: list[str]) -> StrategyResult:
    """Undo the bounds: the BE tier and the BE pods without a limit unlimited again."""
    reason = "be_memory disabled: no BE memory bound"
    writes = [CgroupWrite(be_tier, r, UNLIMITED, reason) for r in (*SOFT_RESOURCES, CAP_RESOURCE)]
    writes += [CgroupWrite(cgroup, r, UNLIMITED, reason) for cgroup in pod_cgroups for r in SOFT_RESOURCES]
    return StrategyResult(Explanation(NAME, {"be_tier": be_tier}, "restore: unlimited", "disabled"),
                          writes=tuple(writes), state=BeMemoryState())


# ---------------------------------------------------------------------- the plug-in


def unlimited_be_pods(snap: TickSnapshot) -> dict[str, str]:
    """BE pods that have no memory limit (a container without one leaves the pod unlimited)."""
    return {pod.sandbox_id: pod.cgroup for pod in snap.inventory.of_class(QoSClass.BE)
            if pod.containers and any(c.memory_limit_bytes <= 0 for c in pod.containers)}


def memory_input(snap: TickSnapshot, state: BeMemoryState) -> BeMemoryInput | None:
    """The budget's inputs (six reads), None when the node's memory cannot be read."""
    if not snap.memory_total_bytes or snap.memory_used_bytes is None:
        return None
    kubepods = snap.probe.working_set_bytes(snap.kubepods) if snap.kubepods else None
    if kubepods is None:
        return None
    tiers = {tier: snap.probe.working_set_bytes(tier) for tier in (*snap.be_tiers, snap.be_tier)}
    return BeMemoryInput(
        now=snap.now, memory_total_bytes=snap.memory_total_bytes, memory_used_bytes=snap.memory_used_bytes,
        kubepods_bytes=kubepods, be_bytes=sum(v or 0 for v in tiers.values()), be_tier=snap.be_tier,
        be_tier_bytes=tiers[snap.be_tier],
        unlimited_be_pods=unlimited_be_pods(snap), due=snap.due(state.last_pass))


class BeMemory:
    name = NAME
    early = False  # memory moves slowly; the cap already stops BE growing between ticks
    precheck = False  # handed over only when a value moved or a pass is due
    evicts = False

    def initial_state(self) -> BeMemoryState:
        return BeMemoryState()

    def decide(self, snap: TickSnapshot, cfg: BeMemoryConfig, state: BeMemoryState,
               earlier: Mapping[str, StrategyResult]) -> StrategyResult:
        inp = memory_input(snap, state)
        if inp is None:
            return StrategyResult(Explanation(NAME, {"kubepods": snap.kubepods}, "no change",
                                              "node or kubepods memory not readable"), state=state)
        return decide_be_memory(inp, cfg, state)

    def restore_config(self, old: BeMemoryConfig | None, new: BeMemoryConfig) -> BeMemoryConfig | None:
        if old is None:
            # Started with it off: bounds an earlier run left on the group stay with it otherwise.
            return new if not new.enable else None
        return old if old.enable and not new.enable else None

    def restore(self, snap: TickSnapshot, cfg: BeMemoryConfig, state: BeMemoryState) -> StrategyResult:
        return restore_be_memory(snap.be_tier, list(unlimited_be_pods(snap).values()))

    def status(self, cfg: BeMemoryConfig, state: BeMemoryState) -> dict[str, Any]:
        return {"budget_bytes": state.budget_bytes, "pod_bounds": dict(state.pod_bounds)}

    def confines_be_cpuset(self, cfg: BeMemoryConfig) -> bool:
        return False


STRATEGY = BeMemory()
