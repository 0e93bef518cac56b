"""Slices through systemd, for cgroups that systemd owns (the systemd cgroup driver).

With that driver a slice's cgroup directory belongs to systemd: it creates it when a unit
inside needs it and rewrites its files from the unit's properties whenever it realizes the
unit again (a scope started below it, `daemon-reload`), so an idle slice must be idle *as
systemd sees it*: `CPUWeight=idle` (systemd >= 252 writes cpu.idle = 1 for it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

_SLICE = re.compile(r"^[A-Za-z0-9_]+(?:-[A-Za-z0-9_]+)*\.slice$")
_ID_LIST = re.compile(r"^\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*$")
SYSTEMD_RUNNING = Path("/run/systemd/system")


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str] | str:
    """Run systemctl: how it ended, or the problem that kept it from running."""
    if not SYSTEMD_RUNNING.is_dir():
        return "systemd is not running (no /run/systemd/system)"
    systemctl = shutil.which("systemctl")
    if systemctl is None:
        return "systemctl not found"
    try:
        return subprocess.run([systemctl, *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"systemctl {' '.join(args)}: {exc}"


def _systemctl(args: list[str], timeout_s: float) -> str | None:
    """Run systemctl; the problem, or None."""
    done = _run(args, timeout_s)
    if isinstance(done, str):
        return done
    if done.returncode != 0:
        return f"systemctl {' '.join(args)}: {done.stderr.strip() or f'exit {done.returncode}'}"
    return None


def set_slice_idle(slice_name: str, *, timeout_s: float = 5.0) -> str | None:
    """`systemctl set-property --runtime SLICE CPUWeight=idle`; the problem, or None.

    Works before the slice exists: the property is a runtime drop-in
    (/run/systemd/system.control), which systemd keeps over `daemon-reload` until reboot."""
    if not _SLICE.match(slice_name):
        return f"not a slice name: {slice_name!r}"
    return _systemctl(["set-property", "--runtime", slice_name, "CPUWeight=idle"], timeout_s)


def start_idle_slice(slice_name: str, *, timeout_s: float = 5.0) -> str | None:
    """Give a slice CPUWeight=idle and start it (systemd creates its cgroup, and its parent
    slices by the dashes of its name); the problem, or None."""
    problem = set_slice_idle(slice_name, timeout_s=timeout_s)
    if problem is not None:
        return problem
    return _systemctl(["start", slice_name], timeout_s)


def slice_cpu_weight(slice_name: str, *, timeout_s: float = 5.0) -> str | None:
    """The slice's CPUWeight as systemd has it ("idle", a number, "[not set]"); None if unknown."""
    if not _SLICE.match(slice_name):
        return None
    done = _run(["show", "-p", "CPUWeight", "--value", slice_name], timeout_s)
    if isinstance(done, str) or done.returncode != 0:
        return None
    return done.stdout.strip()


def set_allowed_memory_nodes(slice_name: str, nodes: str, *, timeout_s: float = 15.0) -> str | None:
    """`systemctl set-property --runtime SLICE AllowedMemoryNodes=NODES`; the problem, or None.

    systemd enables a controller in a slice's parent (cgroup.subtree_control) only while some
    unit below needs it, and drops it again whenever it realizes the parent: a slice with
    AllowedMemoryNodes needs cpuset, so its cgroup keeps listing cpuset in cgroup.controllers
    (systemd >= 244, cgroup v2). The bound is longer than the other calls': in the VM lane a
    busy systemd took over 5 s for it, minutes on end."""
    if not _SLICE.match(slice_name):
        return f"not a slice name: {slice_name!r}"
    if not _ID_LIST.match(nodes):
        return f"not a list of memory nodes: {nodes!r}"
    return _systemctl(["set-property", "--runtime", slice_name, f"AllowedMemoryNodes={nodes}"], timeout_s)


def stop_slice(slice_name: str, *, timeout_s: float = 5.0) -> str | None:
    """`systemctl stop SLICE` (systemd removes its cgroup); the problem, or None.

    Stopping a slice stops every unit inside it: callers stop only empty slices."""
    if not _SLICE.match(slice_name):
        return f"not a slice name: {slice_name!r}"
    return _systemctl(["stop", slice_name], timeout_s)
