"""The QoS manager's strategies, in decision order (one line each; see docs/developing.md "Adding a strategy").

Order matters only where a strategy reads an earlier one's facts: be_evict uses the BE budget
cpu_suppress found in the same tick.
"""

from __future__ import annotations

from koordnode.policy.strategies import be_evict, be_memory, cpu_burst, cpu_suppress, memory_qos
from koordnode.policy.strategies.base import Strategy

STRATEGIES: tuple[Strategy, ...] = (
    cpu_suppress.STRATEGY,
    cpu_burst.STRATEGY,
    memory_qos.STRATEGY,
    be_evict.STRATEGY,
    be_memory.STRATEGY,
)
