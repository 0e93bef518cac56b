"""The QoS tier cgroups kubelet keeps (cgroupfs driver), for beds that run without a kubelet.

kubelet creates <kubepods>/burstable and <kubepods>/besteffort and gives the BestEffort tier
the minimum cpu.shares (2), so BE pods lose to everything at the tier level. Without it, runc
creates the tiers with the default 1024 shares and the BE tier competes as an equal.
"""

from __future__ import annotations

import os
from pathlib import Path

CG = Path("/sys/fs/cgroup")


def prepare_qos_tiers(kubepods: str) -> None:
    ncpu = os.cpu_count() or 1
    for controller in ("cpu", "cpuacct", "memory", "blkio", "pids"):
        for tier in ("burstable", "besteffort"):
            (CG / controller / kubepods.lstrip("/") / tier).mkdir(parents=True, exist_ok=True)
    cpu = CG / "cpu" / kubepods.lstrip("/")
    (cpu / "besteffort" / "cpu.shares").write_text("2")
    (cpu / "burstable" / "cpu.shares").write_text(str(1024 * ncpu))


# kubelet's cgroupfs writes, as its cgroup manager makes them on cgroup v1 (no kubelet binary
# exists here). Each raises OSError exactly as kubelet's write would fail.
KUBELET_V1_CONTROLLERS = ("cpu", "cpuacct", "memory", "blkio", "pids")


def _write(controller: str, cgroup: str, name: str, value: str) -> None:
    (CG / controller / cgroup.lstrip("/") / name).write_text(value)


def kubelet_update_qos_cgroups(kubepods: str, burstable_shares: int = 2048) -> None:
    """kubelet's periodic QoS update (every minute and on pod changes): node allocatable on the
    top cgroup, then each tier's cpu.shares (besteffort: the minimum, 2)."""
    _write("cpu", kubepods, "cpu.shares", str(1024 * (os.cpu_count() or 1)))
    _write("cpu", f"{kubepods}/burstable", "cpu.shares", str(burstable_shares))
    _write("cpu", f"{kubepods}/besteffort", "cpu.shares", "2")


def kubelet_ensure_pod_cgroup(kubepods: str, tier: str, uid: str, pids_max: int = 1024, *,
                              cpu_shares: int = 2, cpu_quota: int = -1) -> str:
    """kubelet's pod cgroup before RunPodSandbox: created in every controller, cpu.shares (the
    sum of requests; 2 for BestEffort), the CFS quota of the limits and the pod pids limit.
    `tier` "" is a Guaranteed pod. Returns the cgroup parent kubelet passes in the call."""
    pod = f"{kubepods}/{tier}/pod{uid}" if tier else f"{kubepods}/pod{uid}"
    for controller in KUBELET_V1_CONTROLLERS:
        (CG / controller / pod.lstrip("/")).mkdir(parents=True, exist_ok=True)
    kubelet_set_pod_config(pod, cpu_shares=cpu_shares, cpu_quota=cpu_quota, pids_max=pids_max)
    return pod


def kubelet_set_pod_config(pod: str, *, cpu_shares: int, cpu_quota: int = -1, pids_max: int = 1024) -> None:
    """kubelet's pod-level resource writes (creation and in-place resize)."""
    _write("cpu", pod, "cpu.shares", str(cpu_shares))
    _write("cpu", pod, "cpu.cfs_quota_us", str(cpu_quota))
    _write("pids", pod, "pids.max", str(pids_max))


def kubelet_destroy_pod_cgroup(pod: str) -> None:
    """kubelet removing a terminated pod's cgroup (rmdir in every controller)."""
    for controller in KUBELET_V1_CONTROLLERS:
        directory = CG / controller / pod.lstrip("/")
        if directory.is_dir():
            directory.rmdir()
