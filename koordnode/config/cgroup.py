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
        "systemd >= 252), prepared at start; false: BestEffort pods stay in kubelet's besteffort slice",
    )


@dataclass(frozen=True)
class ProcfsConfig:
    root: str = setting("/proc", doc="procfs mount; node memory watermarks are written under it")


@dataclass(frozen=True)
class SysfsConfig:
    root: str = setting("/sys", doc="sysfs mount the CPU topology is read from")
