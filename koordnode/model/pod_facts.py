"""What the API server knows of a pod and CRI does not carry: memory requests, priority, owners.

Filled from the watch of the pods bound to this node ([kubernetes] pod_facts); the QoS engine
reads a pod's facts by its UID when it plans the pod. CRI stays the authority on what runs: a
pod without facts (the API does not know it yet, or [kubernetes] is off) is planned from CRI
alone, and planned again when its facts arrive.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["PodFacts"]


@dataclass(frozen=True)
class PodFacts:
    uid: str
    namespace: str
    name: str
    # container name -> memory request in bytes (containers without one are absent)
    memory_requests: Mapping[str, int] = field(default_factory=dict)
    priority: int | None = None
    priority_class: str = ""
    owners: tuple[str, ...] = ()  # "Kind/name" of the owner references
    kube_qos: str = ""  # status.qosClass: Guaranteed, Burstable, BestEffort
    koord_qos: str = ""  # the koordinator.sh/qosClass label, as given
    terminating: bool = False  # metadata.deletionTimestamp is set
    phase: str = ""
    # the sum of the containers' CPU requests, milli-cores; None: a container's did not parse
    cpu_request_milli: int | None = 0
    created_at: float | None = None  # metadata.creationTimestamp, seconds since the epoch
