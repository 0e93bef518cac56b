"""CPU burst for LS pods with a CPU limit.

- `cpu.cfs_burst_us` (`cpu.max.burst` on v2) = quota x burst_percent, capped at the quota:
  the kernel refuses a burst larger than the quota (EINVAL), so 100 % is the real ceiling.
- CFS quota burst: a pod whose containers were throttled since the last tick gets its quota
  x `scale_up` while the share pool is below its threshold; while the share pool is at or
  above it (the node is overloaded) every raised quota goes x `scale_down`; the quota stays
  within [limit, limit x max_quota_percent]. Pod and containers are scaled together (on v1 a
  child's quota may not exceed its parent's): when growing the pod is written first, when
  shrinking the containers are.
- Disabled: bursts back to 0 and quotas back to the limits.

Pure: inputs, config and the previous state in; writes, explanation and new state out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from koordnode.policy.plan import CgroupWrite
from koordnode.model.kernel import CFS_QUOTA_MIN_US, CFS_RUNTIME_MAX_US, DEFAULT_CFS_PERIOD_US
from koordnode.model.qos_class import QoSClass
from koordnode.policy.strategies.base import TickSnapshot
from koordnode.policy.strategies.common import Explanation, StrategyResult, rounded
from koordnode.config.strategies import CpuBurstConfig

NAME = "cpu_burst"


@dataclass(frozen=True)
class BurstContainer:
    container_id: str
    cgroup: str
    quota_us: int  # the limit kubelet set, per period; <= 0 = no CPU limit
    period_us: int = DEFAULT_CFS_PERIOD_US
    throttled: int = 0  # nr_throttled increase since the previous tick


@dataclass(frozen=True)
class BurstPod:
    sandbox_id: str
    name: str
    cgroup: str
    containers: tuple[BurstContainer, ...]

    @property
    def limited(self) -> tuple[BurstContainer, ...]:
        return tuple(c for c in self.containers if c.quota_us > 0)

    def pod_limit_us(self, period_us: int) -> int | None:
        """The pod cgroup's quota (sum of its containers' limits at `period_us`); None when a
        container has no limit (the pod then has none either)."""
        if not self.containers or any(c.quota_us <= 0 for c in self.containers):
            return None
        return sum(round(c.quota_us * period_us / c.period_us) for c in self.containers)


@dataclass(frozen=True)
class CpuBurstInput:
    pods: tuple[BurstPod, ...]  # LS pods
    share_pool_used_percent: float | None  # None: not measurable this tick
    reconcile: bool = False  # re-emit every burst value, not only the changed ones


@dataclass(frozen=True)
class CpuBurstState:
    # sandbox id -> quota scale (absent = 1.0, at the limit)
    scales: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    # cgroup -> cfs_burst_us last written
    bursts: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    # container cgroup -> nr_throttled at the previous decision (kept by the plug-in)
    throttled: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    # when every burst value was last re-emitted; None = never
    last_reconcile: float | None = None


def burst_us(quota_us: int, cfg: CpuBurstConfig) -> int:
    wanted = round(quota_us * cfg.burst_percent / 100.0)
    return max(0, min(wanted, quota_us, CFS_RUNTIME_MAX_US - quota_us))


def _scaled(quota_us: int, scale: float) -> int:
    return max(CFS_QUOTA_MIN_US, round(quota_us * scale))


def _quota_writes(pod: BurstPod, scale: float, growing: bool, reason: str) -> list[CgroupWrite]:
    containers = [CgroupWrite(c.cgroup, "cpu.cfs_quota_us", _scaled(c.quota_us, scale), reason) for c in pod.limited]
    period = pod.limited[0].period_us if pod.limited else DEFAULT_CFS_PERIOD_US
    pod_limit = pod.pod_limit_us(period)
    pod_write = [CgroupWrite(pod.cgroup, "cpu.cfs_quota_us", _scaled(pod_limit, scale), reason)] if pod_limit else []
    return pod_write + containers if growing else containers + pod_write


def decide_cpu_burst(inp: CpuBurstInput, cfg: CpuBurstConfig, state: CpuBurstState) -> StrategyResult:
    writes: list[CgroupWrite] = []
    scales: dict[str, float] = {}
    bursts: dict[str, int] = {}
    changes: list[str] = []
    top = cfg.max_quota_percent / 100.0
    pool = inp.share_pool_used_percent
    overloaded = pool is not None and pool >= cfg.share_pool_threshold_percent
    throttled_pods = 0

    for pod in inp.pods:
        limited = pod.limited
        if not limited:
            continue
        # 1. cfs_burst_us on the containers and the pod.
        targets = [(c.cgroup, burst_us(c.quota_us, cfg)) for c in limited]
        pod_limit = pod.pod_limit_us(limited[0].period_us)
        if pod_limit:
            targets.append((pod.cgroup, burst_us(pod_limit, cfg)))
        for cgroup, value in targets:
            bursts[cgroup] = value
            if inp.reconcile or state.bursts.get(cgroup) != value:
                writes.append(CgroupWrite(cgroup, "cpu.cfs_burst_us", value,
                                          f"cpu_burst: {cfg.burst_percent:g}% of the quota, capped at the quota"))

        # 2. CFS quota burst.
        old = state.scales.get(pod.sandbox_id, 1.0)
        new = old
        throttled = any(c.throttled > 0 for c in limited)
        throttled_pods += throttled
        if cfg.cfs_quota_burst and pool is not None:
            if overloaded:
                new = max(1.0, old * cfg.scale_down)
            elif throttled:
                new = min(top, old * cfg.scale_up)
        elif not cfg.cfs_quota_burst:
            new = 1.0
        if new != 1.0:
            scales[pod.sandbox_id] = new
        if new != old:
            why = (f"share pool {pool:.0f}% >= {cfg.share_pool_threshold_percent:g}%: node overloaded"
                   if overloaded else
                   f"throttled, share pool {pool:.0f}% < {cfg.share_pool_threshold_percent:g}%"
                   if pool is not None and throttled else "quota burst off")
            reason = f"cpu_burst: quota x{new:.2f} of the limit ({why})"
            writes += _quota_writes(pod, new, new > old, reason)
            changes.append(f"{pod.name}: x{old:.2f} -> x{new:.2f}")

    inputs = {
        "ls_pods_with_limit": sum(1 for p in inp.pods if p.limited),
        "throttled_pods": throttled_pods,
        "share_pool_used_percent": rounded(pool, 1),
        "share_pool_threshold_percent": cfg.share_pool_threshold_percent,
        "burst_percent": cfg.burst_percent,
        "pods_above_limit": {p.name: round(scales[p.sandbox_id], 3) for p in inp.pods if p.sandbox_id in scales},
    }
    if changes:
        decision = "; ".join(changes[:10]) + (f" (+{len(changes) - 10} more)" if len(changes) > 10 else "")
        reason = "node overloaded: quotas back toward the limits" if overloaded else "throttled pods get more quota"
    else:
        decision = "no quota change"
        reason = "share pool not measurable yet" if pool is None else (
            "node overloaded, no pod above its limit" if overloaded else "no throttled pod")
    new_state = CpuBurstState(MappingProxyType(scales), MappingProxyType(bursts))
    return StrategyResult(Explanation(NAME, inputs, decision, reason), writes=tuple(writes), state=new_state)


def restore_cpu_burst(pods: tuple[BurstPod, ...], state: CpuBurstState) -> StrategyResult:
    """Disabled: every burst written back to 0, every raised quota back to the limit."""
    writes: list[CgroupWrite] = []
    for pod in pods:
        if pod.sandbox_id in state.scales:
            writes += _quota_writes(pod, 1.0, False, "cpu_burst disabled: quota back to the limit")
    writes += [CgroupWrite(cgroup, "cpu.cfs_burst_us", 0, "cpu_burst disabled")
               for cgroup, value in sorted(state.bursts.items()) if value]
    explanation = Explanation(NAME, {"pods_restored": len(state.scales), "bursts_cleared": len(state.bursts)},
                              "restore", "disabled")
    return StrategyResult(explanation, writes=tuple(writes), state=CpuBurstState())


# ---------------------------------------------------------------------- the plug-in


def burst_pods(snap: TickSnapshot, previous: Mapping[str, int]) -> tuple[tuple[BurstPod, ...], dict[str, int]]:
    """The LS pods with their throttling since the previous decision (read through the probe),
    and the nr_throttled counters to remember (only of the containers listed now)."""
    pods = []
    counters: dict[str, int] = {}
    for pod in snap.inventory.of_class(QoSClass.LS):
        containers = []
        for c in pod.containers:
            throttled = 0
            if c.cpu_quota_us > 0:
                now = snap.probe.nr_throttled(c.cgroup)
                if now is None and c.cgroup in previous:
                    counters[c.cgroup] = previous[c.cgroup]  # unreadable this tick: keep the old count
                elif now is not None:
                    counters[c.cgroup] = now
                    prev = previous.get(c.cgroup)
                    throttled = max(0, now - prev) if prev is not None else 0
            containers.append(BurstContainer(c.container_id, c.cgroup, c.cpu_quota_us, c.cpu_period_us, throttled))
        pods.append(BurstPod(pod.sandbox_id, pod.name, pod.cgroup, tuple(containers)))
    return tuple(pods), counters


class CpuBurst:
    name = NAME
    early = False
    precheck = True  # the reconcile pass re-emits values mostly in place
    evicts = False

    def initial_state(self) -> CpuBurstState:
        return CpuBurstState()

    def decide(self, snap: TickSnapshot, cfg: CpuBurstConfig, state: CpuBurstState,
               earlier: Mapping[str, StrategyResult]) -> StrategyResult:
        pods, counters = burst_pods(snap, state.throttled)
        pool_cpus = len(snap.online_cpus - snap.excluded_cpus)
        pool_pct = None
        if snap.node_used_cpus is not None and pool_cpus:
            pool_pct = 100.0 * max(0.0, snap.node_used_cpus - snap.lse_lsr_used_cpus) / pool_cpus
        reconcile = snap.due(state.last_reconcile)
        result = decide_cpu_burst(CpuBurstInput(pods, pool_pct, reconcile), cfg, state)
        new_state = dataclasses.replace(
            result.state, throttled=MappingProxyType(counters),
            last_reconcile=snap.now if reconcile else state.last_reconcile)
        return dataclasses.replace(result, state=new_state)

    def restore_config(self, old: CpuBurstConfig | None, new: CpuBurstConfig) -> CpuBurstConfig | None:
        return old if old is not None and old.enable and not new.enable else None

    def restore(self, snap: TickSnapshot, cfg: CpuBurstConfig, state: CpuBurstState) -> StrategyResult:
        pods, _ = burst_pods(snap, {})
        return restore_cpu_burst(pods, state)

    def status(self, cfg: CpuBurstConfig, state: CpuBurstState) -> dict[str, Any]:
        return {}


    def confines_be_cpuset(self, cfg: CpuBurstConfig) -> bool:
        return False

STRATEGY = CpuBurst()
