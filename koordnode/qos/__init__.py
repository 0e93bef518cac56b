"""The QoS manager: collectors, bounded history, PSI triggers, strategies and the loop.

Entry points: `QoSManager` (manager.py), the config sections (re-exported from koordnode.config), the pure
strategies (koordnode/policy/strategies/). The manager is imported lazily, so the policy modules
living next to it (net_policy, resctrl_policy) can be imported by the executor without
pulling the manager (and the executor) in.
"""

from typing import TYPE_CHECKING, Any

from koordnode.config.qos_manager import QoSManagerConfig
from koordnode.config.strategies import (
    BeEvictConfig,
    CpuBurstConfig,
    CpuSuppressConfig,
    MemoryQoSConfig,
    StrategyConfig,
)

if TYPE_CHECKING:
    from koordnode.qos.manager import QoSManager, TickReport

__all__ = [
    "BeEvictConfig",
    "CpuBurstConfig",
    "CpuSuppressConfig",
    "MemoryQoSConfig",
    "QoSManager",
    "QoSManagerConfig",
    "StrategyConfig",
    "TickReport",
]


def __getattr__(name: str) -> Any:
    if name in ("QoSManager", "TickReport"):
        from koordnode.qos import manager

        return getattr(manager, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
