"""The contract between policy (class policy, QoS strategies) and the executor: plans are data.

Policy code never touches the kernel: it returns a list of CgroupWrite, and the executor
maps each logical resource name to the right file for the cgroup version and kernel.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CgroupWrite:
    # Path of the cgroup relative to the hierarchy root, e.g. "/kubepods/besteffort/pod<uid>"
    # or "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice".
    cgroup: str
    # Logical resource name from koordnode.executor.resources (v1 spelling, e.g. "cpu.shares").
    resource: str
    # Value in v1 units; the executor converts for cgroup v2 (cpu.shares -> cpu.weight, ...).
    value: str | int
    # Why this write is wanted; logged with the write and shown by `koordnode status`.
    reason: str = ""


@dataclass(frozen=True)
class SysctlWrite:
    # Name from koordnode.executor.resources.SYSCTLS, e.g. "vm.min_free_kbytes".
    name: str
    value: str | int
    reason: str = ""
