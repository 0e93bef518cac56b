"""Memory protection of kubelet's cgroups above the pods (cgroup v2): kubepods and its burstable tier.

The kernel caps a cgroup's effective memory.min / memory.low by those of its ancestors (an
ancestor's protection is shared among its children in proportion to theirs), so a pod's
protection only holds up to what every cgroup between it and the root carries. Below the root,
kubelet's top cgroup (`kubepods` / `kubepods.slice`) and its burstable tier are those ancestors;
kubelet writes them only with `memoryReservationPolicy: TieredReservation` (kubepods min = Σ
requests of Guaranteed and Burstable pods, kubepods low and the burstable tier's low = Σ
Burstable requests; never the burstable tier's min), and leaves them at 0 otherwise: then every
pod's protection is void.

Each tier file must hold at least the sum of its direct children's values: the pods' as planned
(a pod koordnode does not plan, e.g. skipped or another runtime's, or whose class has memory QoS
off: what its file says), the lower tier's as decided here, other children's (besteffort tier,
koordnode's BE group) as their files say. koordnode never goes below the value another writer
(kubelet) left there: it writes max(sum, kubelet's), and only when the sum is larger; when the
sum drops back it hands the file back with kubelet's value. Which value was kubelet's is told
from what koordnode last wrote there (TierFile, kept by the caller between passes): a value that
differs from it is another writer's. When kubelet keeps writing a smaller value (TieredReservation
with a sum of koordnode's that is larger, e.g. LSE's memory.low of 1.2 × request, or Guaranteed
pods' memory.low, which kubelet's kubepods low leaves out), the next pass raises it again: an
overwrite, counted like any other. The besteffort tier and the BE group get nothing (BE's
protection is 0). cgroup v1 has no memory.min: nothing.

Pure: the caller reads the files and lists the children; this only decides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from koordnode.policy.plan import CgroupWrite

TIER_RESOURCES = ("memory.min", "memory.low")
PAGE = 4096  # the kernel keeps memory.min / memory.low in whole pages, rounded down


@dataclass(frozen=True)
class ChildProtection:
    """One direct child of a tier: a pod cgroup, or another cgroup (a lower tier, the BE group)."""

    cgroup: str
    values: Mapping[str, int]  # memory.min / memory.low in bytes (a missing key counts 0)
    pod: bool = True  # a pod cgroup (counted as a pod in the reasons)
    planned: bool = True  # koordnode's plan; False: what its file says


@dataclass(frozen=True)
class TierFile:
    """What koordnode remembers of one tier file between passes."""

    kubelet: int  # the value another writer (kubelet, systemd, an operator) last left there
    ours: int | None  # what koordnode last wrote there; None: the file is left to kubelet


@dataclass(frozen=True)
class TierDecision:
    cgroup: str
    resource: str
    value: int  # what the file holds after this pass: max(needed, kubelet)
    needed: int  # the sum of the children's values
    pods: int  # pod cgroups counted (at any depth below the tier)
    unplanned: int  # of them, counted from their file (not planned by koordnode)
    kubelet: int
    write: CgroupWrite | None
    state: TierFile

    @property
    def keeper(self) -> str:
        return "koordnode" if self.value > self.kubelet else "kubelet"

    @property
    def why(self) -> str:
        counted = f"Σ of {self.pods} pods' protection" + (
            f" ({self.unplanned} read from their files)" if self.unplanned else "")
        if self.value > self.kubelet:
            return f"{self.resource} {self.value} = {counted} (kubelet's own: {self.kubelet})"
        return (f"{self.resource} {self.value} = kubelet's own, left to kubelet ({counted}: {self.needed})")


def kubelet_value(current: int, previous: TierFile | None, page: int = PAGE) -> int:
    """The value another writer left in a tier file: the file's, unless it is koordnode's own
    (compared in whole pages: the kernel rounds a written value down)."""
    if previous is None or previous.ours is None or current // page != previous.ours // page:
        return current
    return previous.kubelet


def decide_tier_file(cgroup: str, resource: str, children: Sequence[ChildProtection], current: int,
                     previous: TierFile | None, *, pods: int | None = None,
                     unplanned: int | None = None, page: int = PAGE) -> TierDecision:
    """One tier file: max(Σ children, kubelet's), written only when that is not in the file
    (in whole pages of `page` bytes). `pods` / `unplanned`: the pods counted at any depth
    (default: the pod children)."""
    needed = sum(max(int(child.values.get(resource, 0)), 0) for child in children)
    kubelet = kubelet_value(current, previous, page)
    value = max(needed - needed % page, kubelet)
    ours = value if value > kubelet else None
    pods = pods if pods is not None else sum(1 for child in children if child.pod)
    unplanned = unplanned if unplanned is not None else sum(
        1 for child in children if child.pod and not child.planned)
    write = None
    if value // page != current // page:
        if ours is not None:
            reason = (f"{resource} of kubelet's {cgroup}: Σ of {pods} pods' protection {needed} "
                      f"(kubelet's own {kubelet}): a pod's protection counts only up to its ancestors'")
        else:
            reason = f"{resource} of kubelet's {cgroup}: back to kubelet's own {kubelet} (Σ of {pods} pods' {needed})"
        write = CgroupWrite(cgroup, resource, value, reason)
    return TierDecision(cgroup, resource, value, needed, pods, unplanned, kubelet, write, TierFile(kubelet, ours))


def plan_tier_memory(cgroup_version: str, tiers: Sequence[str], children: Mapping[str, Sequence[ChildProtection]],
                     current: Mapping[tuple[str, str], int], previous: Mapping[tuple[str, str], TierFile],
                     page: int = PAGE) -> tuple[TierDecision, ...]:
    """memory.min / memory.low of kubelet's tiers, `tiers` ordered from the top (kubepods) down
    to the lowest (the burstable tier); `children[tier]`: its direct children (a lower tier among
    them stands for what is decided for it here); `current[(tier, resource)]`: the file's value
    (a tier file not there is left out); `previous`: the TierFile of each file from the last pass.
    Nothing on cgroup v1."""
    if cgroup_version != "v2":
        return ()
    decided: dict[tuple[str, str], TierDecision] = {}
    order: list[TierDecision] = []
    for tier in reversed(tiers):  # the lowest first: its value is its parent's child
        for resource in TIER_RESOURCES:
            if (tier, resource) not in current:
                continue
            own = list(children.get(tier, ()))
            pods = sum(1 for child in own if child.pod)
            unplanned = sum(1 for child in own if child.pod and not child.planned)
            counted: list[ChildProtection] = []
            for child in own:
                lower = decided.get((child.cgroup, resource))
                if lower is not None:
                    pods += lower.pods
                    unplanned += lower.unplanned
                    child = ChildProtection(child.cgroup, {resource: lower.value}, pod=False)
                counted.append(child)
            decision = decide_tier_file(tier, resource, counted, current[(tier, resource)],
                                        previous.get((tier, resource)), pods=pods, unplanned=unplanned,
                                        page=page)
            decided[(tier, resource)] = decision
            order.append(decision)
    order.sort(key=lambda d: (list(tiers).index(d.cgroup), TIER_RESOURCES.index(d.resource)))
    return tuple(order)
