"""Memory protection reconcile: keep what the hooks decided applied.

The hooks compute memory.min / low / high and the memory watermark files when a pod or
container is created; anything (an operator, a restarted runtime, kubelet's own cgroup
manager) may change them afterwards. Every reconcile interval this strategy hands the
hooks' current plan back to the executor, which rewrites only the files that differ. The
node watermarks (vm.min_free_kbytes, vm.watermark_scale_factor) are kept too, when set.

Pure: the plan comes in as data (the manager calls the hooks' planner); nothing is read.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from koordnode.policy.plan import SysctlWrite
from koordnode.policy.plan import CgroupWrite
from koordnode.policy.strategies.base import TickSnapshot
from koordnode.policy.strategies.common import Explanation, StrategyResult
from koordnode.config.strategies import MemoryQoSConfig

NAME = "memory_qos"

MEMORY_QOS_RESOURCES = frozenset({
    "memory.min", "memory.low", "memory.high",
    "memory.wmark_ratio", "memory.wmark_scale_factor", "memory.wmark_min_adj",
})


@dataclass(frozen=True)
class MemoryQoSInput:
    now: float
    last_reconcile: float | None  # when the previous pass ran; None = never
    planned: tuple[CgroupWrite, ...]  # the hooks' writes for the running pods and containers
    interval_s: float = 10.0  # [qos_manager] reconcile_interval_s
    have_planner: bool = True
    planner_note: str = ""  # why there is no plan, when the pods' values are kept elsewhere


def decide_memory_qos(inp: MemoryQoSInput, cfg: MemoryQoSConfig) -> StrategyResult:
    """Writes when a reconcile pass is due; the state is the time of the pass."""
    due_in = None if inp.last_reconcile is None else inp.interval_s - (inp.now - inp.last_reconcile)
    inputs: dict[str, object] = {
        "reconcile_interval_s": inp.interval_s,
        "planner": "hooks" if inp.have_planner else inp.planner_note or "none (node watermarks only)",
        "min_free_kbytes": cfg.min_free_kbytes or None,
        "watermark_scale_factor": cfg.watermark_scale_factor or None,
    }
    if due_in is not None and due_in > 0:
        return StrategyResult(
            Explanation(NAME, inputs, "wait", f"next reconcile in {due_in:.1f} s"), state=inp.last_reconcile
        )
    writes = tuple(
        CgroupWrite(w.cgroup, w.resource, w.value, f"memory_qos reconcile: {w.reason}" if w.reason else "memory_qos reconcile")
        for w in inp.planned if w.resource in MEMORY_QOS_RESOURCES
    )
    sysctls: list[SysctlWrite] = []
    if cfg.min_free_kbytes:
        sysctls.append(SysctlWrite("vm.min_free_kbytes", cfg.min_free_kbytes, "memory_qos: configured node watermark"))
    if cfg.watermark_scale_factor:
        sysctls.append(SysctlWrite("vm.watermark_scale_factor", cfg.watermark_scale_factor,
                                   "memory_qos: configured node watermark"))
    counts = Counter(w.resource for w in writes)
    inputs["planned"] = dict(sorted(counts.items()))
    decision = f"reconcile {len(writes)} cgroup value(s), {len(sysctls)} sysctl(s)"
    return StrategyResult(
        Explanation(NAME, inputs, decision, "periodic pass: the executor rewrites only values that differ"),
        writes=writes, sysctls=tuple(sysctls), state=inp.now,
    )


# ---------------------------------------------------------------------- the plug-in


class MemoryQoS:
    name = NAME
    early = False
    precheck = True  # a reconcile pass finds most values in place
    evicts = False

    def initial_state(self) -> float | None:
        return None  # when the last reconcile pass ran

    def decide(self, snap: TickSnapshot, cfg: MemoryQoSConfig, state: float | None,
               earlier: Mapping[str, StrategyResult]) -> StrategyResult:
        planned: tuple[CgroupWrite, ...] | None = None
        note = ""
        if snap.due(state):
            planned = snap.probe.memory_plan()  # only when a pass is due: it plans every pod
            if planned is None:
                note = snap.probe.memory_plan_note()
        result = decide_memory_qos(
            MemoryQoSInput(snap.now, state, planned or (), snap.reconcile_interval_s,
                           have_planner=planned is not None or not snap.due(state), planner_note=note),
            cfg)
        # A waiting pass has nothing new to show.
        return dataclasses.replace(result, explain=bool(result.writes or result.sysctls))

    def restore_config(self, old: MemoryQoSConfig | None, new: MemoryQoSConfig) -> None:
        return None  # the values it keeps are the hooks' own: nothing to undo

    def restore(self, snap: TickSnapshot, cfg: MemoryQoSConfig, state: float | None) -> StrategyResult:
        return StrategyResult(Explanation(NAME, {}, "no change", "nothing to restore"), state=state)

    def status(self, cfg: MemoryQoSConfig, state: float | None) -> dict[str, Any]:
        return {}


    def confines_be_cpuset(self, cfg: MemoryQoSConfig) -> bool:
        return False

STRATEGY = MemoryQoS()
