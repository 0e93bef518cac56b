"""``[cgroup]``, ``[procfs]``, ``[sysfs]``: where the kernel's filesystems are and how kubelet
lays out its cgroups."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from koordnode.config.fields import setting

__all__ = ["CgroupConfig", "CgroupDriverName", "ProcfsConfig", "SysfsConfig"]

CgroupDriverName = Literal["auto", "cgroupfs", "systemd"]


@dataclass(frozen=True)
class CgroupConfig:
    root: str = setting(
        "/sys/fs/cgroup",
        doc="where the cgroup hierarchies are mounted; every cgroup write stays under it",
    )
    driver: CgroupDriverName = setting(
        "auto",
        doc='kubelet\'s cgroup driver: "auto" (systemd when the parent is a .slice), '
        '"cgroupfs" or "systemd"',
    )
    reconcile_interval_s: float = setting(
        10.0,
        min=0,
        max=3600,
        doc="seconds between passes re-applying every running pod's values (0 = never)",
    )
    be_idle_group: bool = setting(
        True,
        doc="run BestEffort pods of class BE in koordnode's idle cgroup beside kubelet's QoS tiers "
        '("<kubepods>/koordnode_be", systemd "kubepods-koordnode_be.slice", cpu.idle = 1) so they '
        "yield to LS at once; false: they stay in kubelet's besteffort tier",
    )
    be_idle_group_systemd: bool = setting(
        True,
        doc="also with the systemd driver: the group slice made idle through systemd (CPUWeight=idle, "
        "systemd >= 252), prepared once kubelet has made its top slice; false: BestEffort pods stay in "
        "kubelet's besteffort slice",
    )
    # Off by default: kubelet >= 1.36 (InPlacePodLevelResourcesVerticalScaling, beta, on) reads a
    # running pod's cgroup cpu.shares back as its CPU request; with an LSE pod's 262144 it counted
    # 256 CPUs used and refused the node's other pods after a restart (a real kubelet 1.37).
    pod_class_weight: bool = setting(
        False,
        doc="give each pod cgroup its class's CPU weight (its containers' class weights summed) so the "
        "class priority acts between pods, not only between a pod's containers; only with kubelet < 1.36 "
        "or its feature gate InPlacePodLevelResourcesVerticalScaling off: newer kubelets read a pod "
        "cgroup's cpu.shares back as the pod's CPU request (pod status, admission)",
    )


@dataclass(frozen=True)
class ProcfsConfig:
    root: str = setting("/proc", doc="procfs mount; node memory watermarks are written under it")


@dataclass(frozen=True)
class SysfsConfig:
    root: str = setting("/sys", doc="sysfs mount the CPU topology is read from")
