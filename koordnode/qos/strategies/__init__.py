"""QoS strategies: pure functions from dataclass inputs to writes plus an explanation."""

from koordnode.qos.strategies.be_evict import BeEvictInput, BeEvictState, EvictCandidate, decide_be_evict
from koordnode.qos.strategies.common import Eviction, Explanation, StrategyResult
from koordnode.qos.strategies.cpu_burst import (
    BurstContainer,
    BurstPod,
    CpuBurstInput,
    CpuBurstState,
    decide_cpu_burst,
    restore_cpu_burst,
)
from koordnode.qos.strategies.cpu_suppress import (
    CpuSuppressInput,
    be_budget,
    decide_cpu_suppress,
    pressure_ratio,
    restore_cpu_suppress,
)
from koordnode.qos.strategies.memory_qos import MEMORY_QOS_RESOURCES, MemoryQoSInput, decide_memory_qos

__all__ = [
    "BeEvictInput", "BeEvictState", "BurstContainer", "BurstPod", "CpuBurstInput", "CpuBurstState",
    "CpuSuppressInput", "EvictCandidate", "Eviction", "Explanation", "MEMORY_QOS_RESOURCES",
    "MemoryQoSInput", "StrategyResult", "be_budget", "decide_be_evict", "decide_cpu_burst",
    "decide_cpu_suppress", "decide_memory_qos", "pressure_ratio", "restore_cpu_burst",
    "restore_cpu_suppress",
]
