"""Slice properties through systemd, for cgroups that systemd owns (the systemd cgroup driver).

With that driver a slice's cgroup directory belongs to systemd: it creates it when a unit
inside needs it and rewrites its files from the unit's properties, so an idle slice must be
idle *as systemd sees it* (`CPUWeight=idle`, systemd >= 251; it writes cpu.idle = 1).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

_SLICE = re.compile(r"^[A-Za-z0-9_]+(?:-[A-Za-z0-9_]+)*\.slice$")
SYSTEMD_RUNNING = Path("/run/systemd/system")


def set_slice_idle(slice_name: str, *, timeout_s: float = 5.0) -> str | None:
    """`systemctl set-property --runtime SLICE CPUWeight=idle`; the problem, or None.

    Works before the slice exists: systemd keeps the property for when it is started."""
    if not _SLICE.match(slice_name):
        return f"not a slice name: {slice_name!r}"
    if not SYSTEMD_RUNNING.is_dir():
        return "systemd is not running (no /run/systemd/system)"
    systemctl = shutil.which("systemctl")
    if systemctl is None:
        return "systemctl not found"
    try:
        done = subprocess.run([systemctl, "set-property", "--runtime", slice_name, "CPUWeight=idle"],
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"systemctl set-property {slice_name}: {exc}"
    if done.returncode != 0:
        return f"systemctl set-property {slice_name} CPUWeight=idle: {done.stderr.strip() or done.returncode}"
    return None
