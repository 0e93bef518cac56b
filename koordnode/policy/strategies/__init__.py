"""QoS strategies: pure functions from dataclass inputs to writes plus an explanation.

Each module holds one strategy: its pure decision function(s) and the plug-in object
(`STRATEGY`, implementing base.Strategy) that the registry lists for the QoS manager.
"""

from koordnode.policy.strategies.base import Strategy, TickSnapshot
from koordnode.policy.strategies.be_evict import BeEvictInput, BeEvictState, EvictCandidate, decide_be_evict
from koordnode.policy.strategies.common import Eviction, Explanation, StrategyResult
from koordnode.policy.strategies.cpu_burst import (
    BurstContainer,
    BurstPod,
    CpuBurstInput,
    CpuBurstState,
    decide_cpu_burst,
    restore_cpu_burst,
)
from koordnode.policy.strategies.cpu_suppress import (
    CpuSuppressInput,
    be_budget,
    decide_cpu_suppress,
    pressure_ratio,
    restore_cpu_suppress,
)
from koordnode.policy.strategies.memory_qos import MEMORY_QOS_RESOURCES, MemoryQoSInput, decide_memory_qos

__all__ = [
    "BeEvictInput", "BeEvictState", "BurstContainer", "BurstPod", "CpuBurstInput", "CpuBurstState",
    "CpuSuppressInput", "EvictCandidate", "Eviction", "Explanation", "MEMORY_QOS_RESOURCES",
    "MemoryQoSInput", "Strategy", "StrategyResult", "TickSnapshot", "be_budget", "decide_be_evict",
    "decide_cpu_burst", "decide_cpu_suppress", "decide_memory_qos", "pressure_ratio",
    "restore_cpu_burst", "restore_cpu_suppress",
]
