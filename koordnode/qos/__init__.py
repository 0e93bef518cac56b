"""The QoS manager: collectors, bounded history, PSI triggers, strategies and the loop.

Entry points: `QoSManager` (manager.py), the config sections (config.py), the pure
strategy functions (strategies/).
"""

from koordnode.qos.config import (
    BeEvictConfig,
    CpuBurstConfig,
    CpuSuppressConfig,
    MemoryQoSConfig,
    QoSManagerConfig,
    QoSSettings,
    StrategyConfig,
)
from koordnode.qos.manager import QoSManager, TickReport

__all__ = [
    "BeEvictConfig",
    "CpuBurstConfig",
    "CpuSuppressConfig",
    "MemoryQoSConfig",
    "QoSManager",
    "QoSManagerConfig",
    "QoSSettings",
    "StrategyConfig",
    "TickReport",
]
