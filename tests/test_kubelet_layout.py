"""KubeletLayout (model/kubelet_layout.py): where kubelet keeps the pods, resolved in one place for
the engine and the QoS manager."""

from __future__ import annotations

from koordnode.model.kubelet_layout import KubeletLayout, paths_of


def test_the_driver_or_the_configuration_decides_without_looking():
    asked: list[str] = []

    def exists(cgroup: str) -> bool:
        asked.append(cgroup)
        return True

    assert KubeletLayout("systemd", "", exists).paths().kubepods == "/kubepods.slice"
    assert KubeletLayout("cgroupfs", "", exists).paths().kubepods == "/kubepods"
    configured = KubeletLayout("auto", "/custom.slice/custom-kubepods.slice", exists)
    assert configured.paths().besteffort == "/custom.slice/custom-kubepods.slice/custom-kubepods-besteffort.slice"
    assert configured.paths().systemd_be_group == (
        "custom-kubepods-koordnode_be.slice", "/custom.slice/custom-kubepods.slice/custom-kubepods-koordnode_be.slice")
    assert asked == []


def test_auto_follows_kubelet_making_its_top_slice_after_the_start():
    made: set[str] = set()
    layout = KubeletLayout("auto", "", made.__contains__)
    first = layout.paths()
    assert first.kubepods == "/kubepods" and first.be_group == "/kubepods/koordnode_be"
    assert layout.paths() is first  # unchanged: the same object
    made.add("/kubepods.slice")
    assert layout.paths().tiers == {"besteffort": "/kubepods.slice/kubepods-besteffort.slice",
                                    "burstable": "/kubepods.slice/kubepods-burstable.slice",
                                    "be_group": "/kubepods.slice/kubepods-koordnode_be.slice"}


def test_a_reload_resolves_again():
    layout = KubeletLayout("cgroupfs", "", lambda cgroup: False)
    assert layout.driver == "cgroupfs" and layout.paths().kubepods == "/kubepods"
    layout.configure("systemd", "")
    assert layout.driver == "systemd" and layout.paths().kubepods == "/kubepods.slice"


def test_a_failing_probe_decides_nothing():
    def broken(cgroup: str) -> bool:
        raise OSError("EIO")

    assert KubeletLayout("auto", "", broken).paths().kubepods == "/kubepods"


def test_the_systemd_group_is_only_beside_a_slice_and_not_for_cgroupfs_pods():
    assert paths_of("cgroupfs", "/kubepods.slice").systemd_be_group is None
    assert paths_of("auto", "/kubepods").systemd_be_group is None
