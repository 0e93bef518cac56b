"""Keeps the memory protection of kubelet's cgroups above the pods (kubepods and its burstable
tier) at the sum of the pods' below them (policy/tier_memory.py says why and how much), for the
QoS engine: after a pod's values were applied (creation, start, resize, removal) and at the end of
each reconcile pass, and in the memory plan the QoS manager's memory_qos strategy gets when it is
the fallback. Remembers, per tier file, what koordnode last wrote there, which tells kubelet's
own value from koordnode's. Called under the engine's lock (hooks/qos_engine.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.executor.originals import OriginalsError
from koordnode.executor.paths import UnsafePathError
from koordnode.model.kernel import PAGE_SIZE
from koordnode.executor.write_result import WriteResult
from koordnode.model.cgroup_scope import outlives_pods
from koordnode.model.kubelet_layout import KubeletLayout
from koordnode.policy.plan import CgroupWrite
from koordnode.policy.tier_memory import (
    TIER_RESOURCES,
    ChildProtection,
    TierDecision,
    TierFile,
    plan_tier_memory,
)


def _bytes(text: str | None) -> int | None:
    """A memory.min / memory.low file's value; None: absent; "max" (or anything else): 0, as
    koordnode never asks a tier for unlimited protection on a pod's behalf."""
    if text is None:
        return None
    text = text.strip()
    return int(text) if text.isdigit() else 0


def planned_pod_values(writes: Iterable[CgroupWrite]) -> dict[str, dict[str, int]]:
    """cgroup -> {memory.min / memory.low: bytes} of a memory plan's writes (containers' too:
    only the tiers' direct children are looked up in it)."""
    planned: dict[str, dict[str, int]] = {}
    for write in writes:
        if write.resource in TIER_RESOURCES and isinstance(write.value, int):
            planned.setdefault(write.cgroup.rstrip("/") or "/", {})[write.resource] = write.value
    return planned


class TierMemory:
    def __init__(self, executor: CgroupExecutor, layout: KubeletLayout) -> None:
        self.executor = executor
        self.layout = layout
        self.files: dict[tuple[str, str], TierFile] = {}  # what was decided per tier file last
        self.decisions: tuple[TierDecision, ...] = ()

    def _read(self, cgroup: str, resource: str) -> int | None:
        try:
            return _bytes(self.executor.read(cgroup, resource))
        except (OSError, UnsafePathError):
            return None

    def _children(self, tier: str, planned: Mapping[str, Mapping[str, int]]) -> list[ChildProtection]:
        children = []
        for child in sorted(self.executor.child_cgroups(tier, "memory")):
            values = planned.get(child)
            pod = not outlives_pods(child)
            if values is not None and pod and all(r in values for r in TIER_RESOURCES):
                children.append(ChildProtection(child, dict(values)))
                continue
            read = {r: self._read(child, r) for r in TIER_RESOURCES}
            children.append(ChildProtection(child, {r: v for r, v in read.items() if v is not None},
                                            pod=pod, planned=False))
        return children

    def _previous(self, key: tuple[str, str], current: int) -> TierFile | None:
        known = self.files.get(key)
        if known is not None:
            return known
        # First sight in this run: if koordnode wrote the file before (its original is kept for
        # `koordnode restore`), the value there may be koordnode's own from before a restart;
        # kubelet's is taken as the smaller of the two until another writer shows its own.
        try:
            kept, original = self.executor.original_of(*key)
        except (OSError, UnsafePathError, OriginalsError):
            return None
        if not kept:
            return None
        return TierFile(kubelet=min(_bytes(original) or 0, current), ours=current)

    def plan(self, planned_writes: Iterable[CgroupWrite]) -> list[CgroupWrite]:
        """Decide the tier files from the pods' planned memory writes; the writes to make."""
        if self.executor.version.value != "v2":
            self.decisions = ()
            return []
        paths = self.layout.paths()
        tiers = [paths.kubepods, paths.burstable]
        planned = planned_pod_values(planned_writes)
        current: dict[tuple[str, str], int] = {}
        previous: dict[tuple[str, str], TierFile] = {}
        for tier in tiers:
            for resource in TIER_RESOURCES:
                value = self._read(tier, resource)
                if value is None:
                    continue
                current[(tier, resource)] = value
                prev = self._previous((tier, resource), value)
                if prev is not None:
                    previous[(tier, resource)] = prev
        children = {tier: self._children(tier, planned) for tier in tiers}
        decisions = plan_tier_memory("v2", tiers, children, current, previous, page=PAGE_SIZE)
        handed_back = []
        for d in decisions:
            before = self.files.get((d.cgroup, d.resource))
            if d.state.ours is None and d.write is None and before is not None and before.ours is not None:
                handed_back.append(CgroupWrite(d.cgroup, d.resource, d.value, "left to kubelet"))
        if handed_back:
            # kubelet's value stands again: its next change is no overwrite of koordnode's.
            self.executor.disown(handed_back)
        self.files = {(d.cgroup, d.resource): d.state for d in decisions}
        self.decisions = decisions
        return [d.write for d in decisions if d.write is not None]

    def keep(self, planned_writes: Iterable[CgroupWrite], *, force: bool = False) -> list[WriteResult]:
        """Decide and write (through the executor)."""
        writes = self.plan(planned_writes)
        return self.executor.apply(writes, force=force) if writes else []

    def status(self) -> dict[str, Any]:
        """Per tier cgroup and file: what koordnode keeps there and why."""
        out: dict[str, Any] = {}
        for d in self.decisions:
            out.setdefault(d.cgroup, {})[d.resource] = {
                "value": d.value, "needed": d.needed, "pods": d.pods, "from_files": d.unplanned,
                "kubelet": d.kubelet, "kept_by": d.keeper, "why": d.why,
            }
        return out
