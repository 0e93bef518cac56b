"""Between NRI's pod and container model and the CRI messages the hooks and policy work on.

The hooks were written for CRI calls. NRI hands over the same facts — the pod's metadata,
labels, annotations and cgroup parent; the container's name, labels, annotations and
resources — so each NRI event is presented to the hooks as the CRI request kubelet made, and
what the hooks changed in it is turned back into an NRI adjustment or update.
"""

from __future__ import annotations

from koordnode.cri import api_pb2 as cri
from koordnode.model.be_group import be_group_parent, cgroups_path_in, moved_cgroups_path
from koordnode.nri import api_pb2 as nri
from koordnode.model.state import (
    CONTAINER_CREATED,
    CONTAINER_EXITED,
    CONTAINER_RUNNING,
    CONTAINER_UNKNOWN,
    ContainerRecord,
    PodRecord,
    RecordedResources,
)

_STATES = {
    nri.CONTAINER_CREATED: CONTAINER_CREATED,
    nri.CONTAINER_RUNNING: CONTAINER_RUNNING,
    nri.CONTAINER_PAUSED: CONTAINER_RUNNING,
    nri.CONTAINER_STOPPED: CONTAINER_EXITED,
}


def cri_message(res: RecordedResources) -> cri.LinuxContainerResources:
    """A new CRI message holding a recorded container's resources (the state keeps them as
    the protocol the model defines, so that model/ does not import the wire format)."""
    out = cri.LinuxContainerResources()
    if isinstance(res, cri.LinuxContainerResources):
        out.CopyFrom(res)
        return out
    for field in ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes", "oom_score_adj",
                  "cpuset_cpus", "cpuset_mems", "memory_swap_limit_in_bytes"):
        setattr(out, field, getattr(res, field))
    out.unified.update(res.unified)
    return out


def sandbox_config(pod: nri.PodSandbox) -> cri.PodSandboxConfig:
    cfg = cri.PodSandboxConfig()
    cfg.metadata.name = pod.name
    cfg.metadata.uid = pod.uid
    cfg.metadata.namespace = pod.namespace
    cfg.labels.update(pod.labels)
    cfg.annotations.update(pod.annotations)
    cfg.linux.cgroup_parent = pod.linux.cgroup_parent
    return cfg


def cri_resources(res: nri.LinuxResources, oom_score_adj: nri.OptionalInt | None = None) -> cri.LinuxContainerResources:
    out = cri.LinuxContainerResources()
    if res.cpu.HasField("shares"):
        out.cpu_shares = res.cpu.shares.value
    if res.cpu.HasField("quota"):
        out.cpu_quota = res.cpu.quota.value
    if res.cpu.HasField("period"):
        out.cpu_period = res.cpu.period.value
    out.cpuset_cpus = res.cpu.cpus
    out.cpuset_mems = res.cpu.mems
    if res.memory.HasField("limit"):
        out.memory_limit_in_bytes = res.memory.limit.value
    if res.memory.HasField("swap"):
        out.memory_swap_limit_in_bytes = res.memory.swap.value
    out.unified.update(res.unified)
    if oom_score_adj is not None:
        out.oom_score_adj = oom_score_adj.value
    return out


def container_config(container: nri.Container) -> cri.ContainerConfig:
    cfg = cri.ContainerConfig()
    cfg.metadata.name = container.name
    cfg.labels.update(container.labels)
    cfg.annotations.update(container.annotations)
    linux = container.linux
    cfg.linux.resources.CopyFrom(
        cri_resources(linux.resources, linux.oom_score_adj if linux.HasField("oom_score_adj") else None))
    return cfg


def create_request(pod: nri.PodSandbox, container: nri.Container) -> cri.CreateContainerRequest:
    return cri.CreateContainerRequest(pod_sandbox_id=pod.id, config=container_config(container),
                                      sandbox_config=sandbox_config(pod))


def pod_record(pod: nri.PodSandbox, source: str) -> PodRecord:
    return PodRecord(sandbox_id=pod.id, name=pod.name, namespace=pod.namespace, uid=pod.uid,
                     labels=dict(pod.labels), annotations=dict(pod.annotations),
                     cgroup_parent=pod.linux.cgroup_parent, runtime_handler=pod.runtime_handler,
                     source=source, ips=tuple(pod.ips))


def placed_parent(pod: nri.PodSandbox, containers: list[nri.Container]) -> str:
    """The cgroup parent of the pod's containers: koordnode's BE group where an earlier run
    placed them there (CreateContainer's cgroups path), else the runtime's (kubelet's)."""
    moved = be_group_parent(pod.linux.cgroup_parent)
    if moved is not None and any(c.pod_sandbox_id == pod.id and cgroups_path_in(c.linux.cgroups_path, moved)
                                 for c in containers):
        return moved
    return pod.linux.cgroup_parent


def container_record(container: nri.Container, source: str) -> ContainerRecord:
    cfg = container_config(container)
    return ContainerRecord(container_id=container.id, sandbox_id=container.pod_sandbox_id, name=container.name,
                           labels=dict(container.labels), annotations=dict(container.annotations),
                           resources=cfg.linux.resources, state=_STATES.get(container.state, CONTAINER_UNKNOWN),
                           source=source)


def resources_delta(before: RecordedResources, after: cri.LinuxContainerResources) -> nri.LinuxResources | None:
    """The NRI resources that set what the hooks changed (only that: NRI tracks which plugin
    owns each field, and claiming fields we left alone would clash with other plugins)."""
    out = nri.LinuxResources()
    changed = False
    if after.cpu_shares != before.cpu_shares and after.cpu_shares > 0:
        out.cpu.shares.value, changed = after.cpu_shares, True
    if after.cpu_quota != before.cpu_quota:
        out.cpu.quota.value, changed = after.cpu_quota, True
    if after.cpu_period != before.cpu_period and after.cpu_period > 0:
        out.cpu.period.value, changed = after.cpu_period, True
    if after.cpuset_cpus != before.cpuset_cpus and after.cpuset_cpus:
        out.cpu.cpus, changed = after.cpuset_cpus, True
    if after.cpuset_mems != before.cpuset_mems and after.cpuset_mems:
        out.cpu.mems, changed = after.cpuset_mems, True
    if after.memory_limit_in_bytes != before.memory_limit_in_bytes and after.memory_limit_in_bytes > 0:
        out.memory.limit.value, changed = after.memory_limit_in_bytes, True
    for key, value in after.unified.items():
        if before.unified.get(key) != value:
            out.unified[key], changed = value, True
    return out if changed else None


class CgroupsPathNotMoved(ValueError):
    """The hooks moved the pod's cgroup parent, but the container's cgroups path is not below
    kubelet's parent: the move cannot be expressed as an adjustment."""


def default_cgroups_path(cgroup_parent: str, container_id: str) -> str:
    """The cgroups path containerd's CRI gives a container of that parent (its two forms)."""
    slice_name = cgroup_parent.rstrip("/").rsplit("/", 1)[-1]
    if slice_name.endswith(".slice"):
        return f"{slice_name}:cri-containerd:{container_id}"
    return f"{cgroup_parent.rstrip('/')}/{container_id}"


def adjustment(before: cri.CreateContainerRequest, after: cri.CreateContainerRequest,
               container: nri.Container | None = None) -> nri.ContainerAdjustment:
    """What CreateContainer's hooks changed, as a ContainerAdjustment (empty: no change).

    A new cgroup parent in the sandbox config (a BE pod in koordnode's BE group) becomes the
    container's cgroups path: NRI cannot move the pod, but it can place each container."""
    adjust = nri.ContainerAdjustment()
    old_parent, new_parent = before.sandbox_config.linux.cgroup_parent, after.sandbox_config.linux.cgroup_parent
    if new_parent != old_parent and container is not None:
        current = container.linux.cgroups_path or default_cgroups_path(old_parent, container.id)
        moved = moved_cgroups_path(current, old_parent, new_parent)
        if moved is None:
            raise CgroupsPathNotMoved(f"cgroups path {current!r} is not below the pod's parent {old_parent!r}")
        adjust.linux.cgroups_path = moved
    old, new = before.config, after.config
    for key, value in new.annotations.items():
        if old.annotations.get(key) != value:
            adjust.annotations[key] = value
    delta = resources_delta(old.linux.resources, new.linux.resources)
    if delta is not None:
        adjust.linux.resources.CopyFrom(delta)
    if new.linux.resources.oom_score_adj != old.linux.resources.oom_score_adj:
        adjust.linux.oom_score_adj.value = new.linux.resources.oom_score_adj
    return adjust


def full_update(container_id: str, res: cri.LinuxContainerResources) -> nri.ContainerUpdate:
    """An update setting every CRI-carried value of a running container (Synchronize)."""
    update = nri.ContainerUpdate(container_id=container_id)
    delta = resources_delta(cri.LinuxContainerResources(), res)
    if delta is not None:
        update.linux.resources.CopyFrom(delta)
    return update


def cpuset_update(container_id: str, cpus: str) -> nri.ContainerUpdate:
    update = nri.ContainerUpdate(container_id=container_id, ignore_failure=True)
    update.linux.resources.cpu.cpus = cpus
    return update
