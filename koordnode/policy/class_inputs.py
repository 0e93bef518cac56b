"""What the class policy is given: a pod, a container with the resources kubelet sent, and the
kernel's features. Plain records; the plans are made by container_policy.py and pod_policy.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

CGROUP_VERSIONS = ("v1", "v2")


@dataclass(frozen=True)
class ContainerResources:
    """LinuxContainerResources as kubelet sent them (0 / "" = not set)."""

    cpu_period: int = 0
    cpu_quota: int = 0
    cpu_shares: int = 0
    memory_limit_in_bytes: int = 0
    oom_score_adj: int = 0
    cpuset_cpus: str = ""
    cpuset_mems: str = ""
    unified: Mapping[str, str] = field(default_factory=dict)
    memory_swap_limit_in_bytes: int = 0


@dataclass(frozen=True)
class PodInput:
    uid: str = ""
    name: str = ""
    namespace: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    cgroup_parent: str = ""
    # container name -> memory request from the API server's pod spec; None: not known
    memory_requests: Mapping[str, int] | None = None


@dataclass(frozen=True)
class ContainerInput:
    name: str
    resources: ContainerResources = field(default_factory=ContainerResources)
    # Empty at CreateContainer (the runtime assigns it); known afterwards.
    id: str = ""


@dataclass(frozen=True)
class KernelFeatures:
    cgroup_version: str = "v1"  # "v1" or "v2"
    # Alibaba/Anolis group identity (cpu.bvt_warp_ns) instead of upstream cpu.idle.
    group_identity: bool = False
    # Memory the pods may use together (kubelet's kubepods limit, i.e. the node's allocatable,
    # else MemTotal); 0 = not known. Stands in for the limit of a container without one.
    node_memory_bytes: int = 0

    def __post_init__(self) -> None:
        if self.cgroup_version not in CGROUP_VERSIONS:
            raise ValueError(f"cgroup_version must be one of {CGROUP_VERSIONS}, got {self.cgroup_version!r}")
