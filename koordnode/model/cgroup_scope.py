"""Whether a cgroup outlives the pods: node-level cgroups versus pod and container cgroups (pure).

Values koordnode writes to a pod's or container's cgroup go with the pod. Those it writes to
any other cgroup (kubelet's top cgroup and QoS tiers, koordnode's BE group, the root) stay
after koordnode stops: their originals are kept so that `koordnode restore` can put them back.
"""

from __future__ import annotations

import re

# A pod's cgroup, in either driver's spelling: "pod<uid>" (cgroupfs) or "...-pod<uid>.slice"
# (systemd; kubelet sends it expanded into its path, each level a slice of its own).
_CGROUPFS_POD = re.compile(r"^pod[0-9A-Za-z_-]+$")
_SYSTEMD_POD = re.compile(r"^[A-Za-z0-9_-]*-pod[0-9A-Za-z_]+\.slice$")


def outlives_pods(cgroup: str) -> bool:
    """True for a cgroup that is neither a pod's nor inside one (its values outlive the pods)."""
    return not any(_CGROUPFS_POD.match(part) or _SYSTEMD_POD.match(part)
                   for part in cgroup.split("/") if part)
