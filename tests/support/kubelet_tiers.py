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
