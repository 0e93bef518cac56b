"""The batch resources BE pods may be scheduled on, by Koordinator v1.2's formula. Pure.

    Node(BE).Alloc = Node.Alloc - Node.Reserved - System.Used - Pod(LS).Used
    System.Used    = max(Node.Used - Pod.Used, Node.Anno.Reserved)

koord-manager computes kubernetes.io/batch-cpu and batch-memory this way from the NodeMetric;
koordnode computes the same from its own measurements (status and a metric), API server or not.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchAllocatable", "UsageInputs", "batch_allocatable"]


@dataclass(frozen=True)
class UsageInputs:
    """One resource's numbers (CPUs, or bytes of memory)."""

    node_allocatable: float  # Node.Alloc: the node's capacity
    node_reserved: float  # Node.Reserved: [node] reserved_cpus (CPU), 0 for memory
    node_used: float  # Node.Used
    pods_used: float  # Pod.Used: every pod
    ls_pods_used: float  # Pod(LS).Used: every pod that is not BE
    annotated_reserved: float = 0.0  # Node.Anno.Reserved


@dataclass(frozen=True)
class BatchAllocatable:
    value: float  # never below 0
    system_used: float


def batch_allocatable(inputs: UsageInputs) -> BatchAllocatable:
    system_used = max(inputs.node_used - inputs.pods_used, inputs.annotated_reserved, 0.0)
    value = inputs.node_allocatable - inputs.node_reserved - system_used - inputs.ls_pods_used
    return BatchAllocatable(max(value, 0.0), system_used)
