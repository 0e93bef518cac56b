"""Where [strategy.memory_qos] gets the pods' memory values: the hooks' plans, unless the engine's
reconcile pass already keeps them."""

from __future__ import annotations

from typing import Protocol

from koordnode.config.components import ManagerSettings
from koordnode.policy.plan import CgroupWrite


class MemoryPlanSource(Protocol):
    def memory_plan(self) -> list[CgroupWrite]:
        """The memory values (memory.min/low/high, wmark_*) of the running pods and containers."""
        ...


class HookMemoryPlanner:
    """The hooks' memory values for [strategy.memory_qos], except while the engine's reconcile
    pass ([cgroup] reconcile_interval_s) runs at least as often as the manager's memory pass
    ([qos_manager] reconcile_interval_s): that pass already reads every pod's values, memory
    included, and restores what another writer changed, so planning and reading them again in
    the manager would double the work for nothing. memory_qos then keeps the node watermarks.
    Called in the tick's thread; reconfigured by the reload."""

    note = ("none: the pods' memory values are kept by the reconcile pass ([cgroup] reconcile_interval_s), "
            "which runs at least as often; node watermarks only")

    def __init__(self, source: MemoryPlanSource, settings: ManagerSettings) -> None:
        self._source = source
        self.reconfigure(settings)

    def reconfigure(self, settings: ManagerSettings) -> None:
        self._engine_every = settings.cgroup.reconcile_interval_s
        self._manager_every = settings.qos_manager.reconcile_interval_s

    def __call__(self) -> list[CgroupWrite] | None:
        if 0 < self._engine_every <= self._manager_every:
            return None
        return self._source.memory_plan()
