"""Cgroup version detection and CRI cgroup_parent -> cgroup path for both drivers."""

from __future__ import annotations

from pathlib import Path

import pytest

from faketree import make_cgroup_tree
from koordnode.executor.paths import (
    CgroupRootError,
    CgroupVersion,
    UnsafePathError,
    cgroup_depth,
    container_cgroup_path,
    detect_cgroup_version,
    expand_systemd_slice,
    normalize_cgroup_path,
    parent_cgroup_path,
    pod_cgroup_path,
    v1_controller_dir,
)

UID = "8a0e2b9c_1234_4d6e_9f00_aabbccddeeff"
CID = "0f" * 32


def test_detect_v1_separate_and_combined(tmp_path: Path) -> None:
    separate = make_cgroup_tree(tmp_path / "a", "v1")
    combined = make_cgroup_tree(tmp_path / "b", "v1", combined_cpu_cpuacct=True)
    assert detect_cgroup_version(separate) is CgroupVersion.V1
    assert detect_cgroup_version(combined) is CgroupVersion.V1
    assert v1_controller_dir(separate, "cpu") == separate / "cpu"
    assert v1_controller_dir(combined, "cpuacct") == combined / "cpuacct"  # the symlink


def test_v1_combined_mount_without_symlinks(tmp_path: Path) -> None:
    (tmp_path / "cpu,cpuacct").mkdir()
    assert v1_controller_dir(tmp_path, "cpu") == tmp_path / "cpu,cpuacct"
    assert v1_controller_dir(tmp_path, "cpuacct") == tmp_path / "cpu,cpuacct"
    assert v1_controller_dir(tmp_path, "memory") is None
    assert detect_cgroup_version(tmp_path) is CgroupVersion.V1


def test_detect_v2_and_garbage(tmp_path: Path) -> None:
    assert detect_cgroup_version(make_cgroup_tree(tmp_path / "a", "v2")) is CgroupVersion.V2
    (tmp_path / "empty").mkdir()
    with pytest.raises(CgroupRootError):
        detect_cgroup_version(tmp_path / "empty")


def test_real_machine_root_is_detected() -> None:
    if not Path("/sys/fs/cgroup").is_dir():
        pytest.skip("no /sys/fs/cgroup")
    assert detect_cgroup_version("/sys/fs/cgroup") in (CgroupVersion.V1, CgroupVersion.V2)


@pytest.mark.parametrize(
    ("parent", "expected"),
    [
        ("/kubepods/burstable/pod" + UID, "/kubepods/burstable/pod" + UID),
        ("kubepods/besteffort/pod1/", "/kubepods/besteffort/pod1"),
        ("/kubepods//pod1/./", "/kubepods/pod1"),
        (f"kubepods-besteffort-pod{UID}.slice",
         f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID}.slice"),
        (f"kubepods-pod{UID}.slice", f"/kubepods.slice/kubepods-pod{UID}.slice"),
        ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice",
         "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice"),
    ],
)
def test_pod_cgroup_path(parent: str, expected: str) -> None:
    assert pod_cgroup_path(parent) == expected


def test_container_cgroup_path_both_drivers() -> None:
    assert container_cgroup_path("/kubepods/burstable/pod1", CID) == f"/kubepods/burstable/pod1/{CID}"
    assert container_cgroup_path("kubepods-burstable-pod1.slice", CID) == (
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-{CID}.scope"
    )
    # An explicit driver wins over the suffix heuristic.
    assert container_cgroup_path("/a/b.slice", CID, "cgroupfs") == f"/a/b.slice/{CID}"


@pytest.mark.parametrize(
    "parent",
    [
        "../../etc",
        "/kubepods/../../etc",
        "/kubepods/pod1\n",
        "/kubepods/\x00pod",
        "",
        "/",
        "kubepods-..-pod1.slice",
        "...slice",
        "kubepods--pod.slice",
        "-kubepods.slice",
        "kube/../../pods-x.slice",
        "kubepods-pod$(id).slice",
        "/kubepods.slice/../x.slice",
    ],
)
def test_hostile_cgroup_parents_are_refused(parent: str) -> None:
    with pytest.raises(UnsafePathError):
        pod_cgroup_path(parent)


@pytest.mark.parametrize("cid", ["", "..", "../x", "a/b", "x\n", "-x"])
def test_hostile_container_ids_are_refused(cid: str) -> None:
    with pytest.raises(UnsafePathError):
        container_cgroup_path("/kubepods/pod1", cid)


def test_path_helpers() -> None:
    assert normalize_cgroup_path("/etc") == "/etc"  # relative to the root, never the host's /etc
    assert normalize_cgroup_path("") == "/"
    assert cgroup_depth("/") == 0
    assert cgroup_depth("/kubepods/pod1/c") == 3
    assert parent_cgroup_path("/kubepods/pod1") == "/kubepods"
    assert parent_cgroup_path("/kubepods") == "/"
    assert parent_cgroup_path("/") is None
    assert expand_systemd_slice("-.slice") == "/"
