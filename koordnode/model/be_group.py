"""Where BE pods run: koordnode's idle cgroup beside kubelet's QoS tiers (pure).

SCHED_IDLE group semantics (cpu.idle = 1) act between sibling scheduling entities. BE pods
compete with LS pods one level above the pods, as kubelet's `besteffort` tier against its
`burstable` tier and the Guaranteed pods, so cpu.idle on a BE pod changes nothing for LS,
and cpu.idle on kubelet's `besteffort` tier breaks kubelet (it writes that tier's cpu.shares /
cpu.weight, which the kernel refuses on an idle group, and refuses to start on an idle tier).

So koordnode keeps a cgroup of its own, a sibling of the tiers inside kubelet's top cgroup:

    cgroupfs: <kubepods>/besteffort/pod<uid>           ->  <kubepods>/koordnode_be/pod<uid>
    systemd:  kubepods-besteffort-pod<uid>.slice       ->  kubepods-koordnode_be-pod<uid>.slice
              (kubelet sends it expanded, "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-
              pod<uid>.slice", and gets it back the same way: ".../kubepods-koordnode_be.slice/...")

marks it idle, and moves BestEffort pods of class BE there by rewriting the cgroup parent of
RunPodSandbox and CreateContainer (proxy mode), or places their containers there through the
cgroups path of NRI's CreateContainer adjustment (NRI mode: the sandbox stays in kubelet's pod
cgroup, which NRI cannot change). kubelet's own cgroups are untouched: its pod cgroup under
`besteffort` stays (empty) and writable, its tier stays non-idle. The group is still inside
kubepods, so node allocatable (kubepods' limits) keeps bounding BE. Only BestEffort pods move:
their kubelet pod cgroup carries no limits that would be lost by leaving it.
"""

from __future__ import annotations

import re

# The group's name: no "-" (systemd nests slices by dashes), no "pod" prefix (kubelet's
# orphan cleanup looks at "pod*" directories).
BE_GROUP = "koordnode_be"

# What kubelet (1.37, cgroup v2) wants in a pod cgroup's cgroup.controllers, of those the root
# has: a running pod whose cgroup lacks one is killed at its next sync (SyncPod, pcm.Exists).
KUBELET_POD_CONTROLLERS = ("cpu", "cpuset", "memory", "hugetlb", "pids")

_CGROUPFS_POD = re.compile(r"^pod[0-9A-Za-z_-]+$")
_SYSTEMD_BE_POD = re.compile(r"^(?P<stem>[A-Za-z0-9_]+(?:-[A-Za-z0-9_]+)*)-besteffort-(?P<pod>pod[0-9A-Za-z_]+)\.slice$")
_SYSTEMD_GROUP_POD = re.compile(
    r"^(?P<stem>[A-Za-z0-9_]+(?:-[A-Za-z0-9_]+)*)-" + BE_GROUP + r"-(?P<pod>pod[0-9A-Za-z_]+)\.slice$")


def be_group_parent(kubelet_parent: str) -> str | None:
    """The cgroup parent in koordnode's BE group for kubelet's BestEffort pod parent.

    None when the parent is not a pod cgroup directly under a `besteffort` tier (Burstable
    and Guaranteed pods, foreign layouts): such pods stay where kubelet put them.
    """
    if not isinstance(kubelet_parent, str) or not kubelet_parent:
        return None
    if "/" in kubelet_parent.strip("/") or kubelet_parent.startswith("/"):
        parts = kubelet_parent.rstrip("/").split("/")
        if len(parts) >= 3 and parts[-2] == "besteffort" and _CGROUPFS_POD.match(parts[-1]):
            return "/".join(parts[:-2] + [BE_GROUP, parts[-1]])
        # The systemd driver as kubelet really sends it: the pod slice expanded into its path
        # ("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice", the
        # slice's cgroup: kubelet's CgroupName.ToSystemd). The group's pod slice, expanded alike.
        match = _SYSTEMD_BE_POD.match(parts[-1])
        if match and len(parts) >= 3 and parts[-2] == f"{match['stem']}-besteffort.slice":
            group_slice = f"{match['stem']}-{BE_GROUP}.slice"
            return "/".join(parts[:-2] + [group_slice, f"{match['stem']}-{BE_GROUP}-{match['pod']}.slice"])
        return None
    match = _SYSTEMD_BE_POD.match(kubelet_parent)
    if match:
        return f"{match['stem']}-{BE_GROUP}-{match['pod']}.slice"
    return None


def in_be_group(cgroup_parent: str) -> bool:
    """True for a cgroup parent inside koordnode's BE group (either driver)."""
    if not isinstance(cgroup_parent, str):
        return False
    segments = [s for s in cgroup_parent.split("/") if s]
    if len(segments) >= 2 and segments[-2] == BE_GROUP and _CGROUPFS_POD.match(segments[-1]):
        return True
    return bool(segments) and bool(_SYSTEMD_GROUP_POD.match(segments[-1]))


def is_be_group(cgroup: str) -> bool:
    """True for the group cgroup itself ("<kubepods>/koordnode_be", ".../kubepods-koordnode_be.slice")."""
    if not isinstance(cgroup, str):
        return False
    name = cgroup.rstrip("/").rsplit("/", 1)[-1]
    return name == BE_GROUP or (name.endswith(f"-{BE_GROUP}.slice") and name != f"-{BE_GROUP}.slice")


def be_group_of(pod_cgroup: str) -> str:
    """The group cgroup holding a pod cgroup path (its parent directory)."""
    return pod_cgroup.rstrip("/").rsplit("/", 1)[0] or "/"


def systemd_group_slice(cgroup_parent: str) -> str | None:
    """The group's slice unit name for a systemd pod parent in it ("kubepods-koordnode_be.slice")."""
    match = _SYSTEMD_GROUP_POD.match(cgroup_parent.strip("/").rsplit("/", 1)[-1])
    return f"{match['stem']}-{BE_GROUP}.slice" if match else None


def kubelet_parent_of(group_parent: str) -> str | None:
    """kubelet's own cgroup parent for a systemd pod parent in the group (the inverse of
    be_group_parent, in the same form): ".../kubepods-koordnode_be.slice/kubepods-koordnode_be-
    pod<uid>.slice" -> ".../kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice", a bare
    slice name -> kubelet's bare slice name. None for cgroupfs parents and parents outside the group."""
    if not isinstance(group_parent, str):
        return None
    segments = [s for s in group_parent.split("/") if s]
    match = _SYSTEMD_GROUP_POD.match(segments[-1]) if segments else None
    if match is None:
        return None
    pod_slice = f"{match['stem']}-besteffort-{match['pod']}.slice"
    if len(segments) == 1 and not group_parent.startswith("/"):
        return pod_slice
    if len(segments) < 2 or segments[-2] != f"{match['stem']}-{BE_GROUP}.slice":
        return None
    return "/" + "/".join(segments[:-2] + [f"{match['stem']}-besteffort.slice", pod_slice])


def moved_cgroups_path(cgroups_path: str, kubelet_parent: str, new_parent: str) -> str | None:
    """NRI mode: a container's OCI cgroups path with kubelet's pod parent swapped for the one in
    the group, in the runtime's own form: "<slice>:<prefix>:<name>" (systemd driver: the slice is
    the parent's last element) or "<parent>/<name>" (cgroupfs). None when the path is not below
    `kubelet_parent` (a foreign layout, or a runtime that placed it elsewhere): it stays then."""
    if not (cgroups_path and kubelet_parent and new_parent):
        return None
    fields = cgroups_path.split(":")
    if len(fields) == 3 and "/" not in fields[0]:
        kubelet_slice = kubelet_parent.rstrip("/").rsplit("/", 1)[-1]
        if fields[0] != kubelet_slice or not fields[2]:
            return None
        return ":".join([new_parent.rstrip("/").rsplit("/", 1)[-1], fields[1], fields[2]])
    prefix = kubelet_parent.rstrip("/") + "/"
    rest = cgroups_path[len(prefix):]
    if not cgroups_path.startswith(prefix) or not rest or "/" in rest:
        return None
    return new_parent.rstrip("/") + "/" + rest


def cgroups_path_in(cgroups_path: str, parent: str) -> bool:
    """True for a container's OCI cgroups path (either form) directly below `parent`."""
    if not (cgroups_path and parent):
        return False
    fields = cgroups_path.split(":")
    if len(fields) == 3 and "/" not in fields[0]:
        return fields[0] == parent.rstrip("/").rsplit("/", 1)[-1]
    return cgroups_path.rsplit("/", 1)[0] == parent.rstrip("/")
