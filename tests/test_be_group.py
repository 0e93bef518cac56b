"""Where BE pods go (model/be_group.py) and how their class is read back from there."""

from __future__ import annotations

import pytest

from koordnode.model.be_group import (
    be_group_of, be_group_parent, cgroups_path_in, in_be_group, kubelet_parent_of, moved_cgroups_path,
    systemd_group_slice,
)
from koordnode.model.qos_class import KubeQoS, kube_qos_from_cgroup_parent, pod_uid_from_cgroup_parent
from koordnode.executor.paths import pod_cgroup_path

UID = "0f1e2d3c-aaaa-bbbb-cccc-123456789abc"
SUID = UID.replace("-", "_")


@pytest.mark.parametrize("kubelet, moved", [
    (f"/kubepods/besteffort/pod{UID}", f"/kubepods/koordnode_be/pod{UID}"),
    (f"/koordnode-test-ab12/kubepods/besteffort/pod{UID}", f"/koordnode-test-ab12/kubepods/koordnode_be/pod{UID}"),
    (f"kubepods-besteffort-pod{SUID}.slice", f"kubepods-koordnode_be-pod{SUID}.slice"),
    # What the real kubelet sends with the systemd driver (found by tests/vm_guest/test_real_kubelet_v2.py:
    # the BE pod stayed in kubelet's slice): the slice expanded into its path; a static pod's uid has no dashes.
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SUID}.slice",
     f"/kubepods.slice/kubepods-koordnode_be.slice/kubepods-koordnode_be-pod{SUID}.slice"),
])
def test_besteffort_pods_move_to_the_group_beside_the_tiers(kubelet, moved):
    assert be_group_parent(kubelet) == moved
    assert in_be_group(moved) and not in_be_group(kubelet)
    assert kube_qos_from_cgroup_parent(moved)[0] is KubeQoS.BEST_EFFORT
    assert pod_uid_from_cgroup_parent(moved) == UID
    group = be_group_of(pod_cgroup_path(moved))
    # A sibling of kubelet's tiers, inside kubelet's top cgroup (node allocatable still bounds it).
    assert group.rsplit("/", 1)[0] == pod_cgroup_path(kubelet).rsplit("/", 2)[0]


@pytest.mark.parametrize("parent", [
    f"/kubepods/burstable/pod{UID}", f"/kubepods/pod{UID}", f"kubepods-burstable-pod{SUID}.slice",
    f"kubepods-pod{SUID}.slice", "/kubepods/besteffort", "/besteffort/pod1/extra", "", "/",
    f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SUID}.slice",
    f"/kubepods.slice/kubepods-pod{SUID}.slice",
    f"/kubepods.slice/kubepods-besteffort-pod{SUID}.slice",  # not nested the way systemd nests it
    "/kubepods/besteffort/../pod1", "kubepods-besteffort-pod..slice",
])
def test_other_parents_stay(parent):
    assert be_group_parent(parent) is None


def test_systemd_group_slice_name():
    assert systemd_group_slice(f"kubepods-koordnode_be-pod{SUID}.slice") == "kubepods-koordnode_be.slice"
    assert systemd_group_slice(f"/kubepods/koordnode_be/pod{UID}") is None
    expanded = f"/kubepods.slice/kubepods-koordnode_be.slice/kubepods-koordnode_be-pod{SUID}.slice"
    assert systemd_group_slice(expanded) == "kubepods-koordnode_be.slice"


@pytest.mark.parametrize("kubelet", [
    f"kubepods-besteffort-pod{SUID}.slice",
    f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SUID}.slice",
])
def test_kubelets_own_pod_slice_of_a_moved_pod(kubelet):
    """The inverse of the move, in the same form: koordnode keeps kubelet's (empty) slice usable."""
    assert kubelet_parent_of(be_group_parent(kubelet)) == kubelet


@pytest.mark.parametrize("parent", [
    f"/kubepods/koordnode_be/pod{UID}",  # cgroupfs: kubelet's directory is its own business there
    f"kubepods-besteffort-pod{SUID}.slice", f"/kubepods.slice/kubepods-pod{SUID}.slice",
    f"/kubepods.slice/kubepods-koordnode_be-pod{SUID}.slice",  # not nested the way systemd nests it
    f"/kubepods.slice/other.slice/kubepods-koordnode_be-pod{SUID}.slice", "", "/",
])
def test_no_kubelet_slice_outside_the_systemd_group(parent):
    assert kubelet_parent_of(parent) is None


CGROUPFS_KUBELET = "/kubepods/besteffort/pod1234"
SYSTEMD_KUBELET = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234.slice"


@pytest.mark.parametrize("path, kubelet, moved", [
    # containerd's two forms of a container's cgroups path (NRI mode places BE containers)
    ("/kubepods/besteffort/pod1234/abc", CGROUPFS_KUBELET, "/kubepods/koordnode_be/pod1234/abc"),
    ("kubepods-besteffort-pod1234.slice:cri-containerd:abc", SYSTEMD_KUBELET,
     "kubepods-koordnode_be-pod1234.slice:cri-containerd:abc"),
    # not below kubelet's parent: the container stays where the runtime put it
    ("/elsewhere/pod1234/abc", CGROUPFS_KUBELET, None),
    ("/kubepods/besteffort/pod1234/nested/abc", CGROUPFS_KUBELET, None),
    ("system.slice:cri-containerd:abc", SYSTEMD_KUBELET, None),
    ("kubepods-besteffort-pod1234.slice:cri-containerd:", SYSTEMD_KUBELET, None),
    ("", CGROUPFS_KUBELET, None),
])
def test_container_cgroups_paths_move_into_the_group(path, kubelet, moved):
    assert moved_cgroups_path(path, kubelet, be_group_parent(kubelet)) == moved
    if moved is not None:
        assert cgroups_path_in(moved, be_group_parent(kubelet))
        assert not cgroups_path_in(path, be_group_parent(kubelet))
        assert cgroups_path_in(path, kubelet)
