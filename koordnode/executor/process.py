"""Per-process values under a procfs root: a container's oom_score_adj where the runtime cannot
set it (containerd 1.7's NRI has no oom_score_adj adjustment)."""

from __future__ import annotations

from pathlib import Path

import structlog

from koordnode.executor.cgroup import ConfinedRoot, read_file, write_file

log = structlog.get_logger("koordnode.executor")


def set_oom_score_adj(procfs_root: Path | str, pid: int, value: int, reason: str) -> str | None:
    """Write /proc/<pid>/oom_score_adj; None when done, else why not (never raises)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        return f"invalid pid {pid!r}"
    if isinstance(value, bool) or not isinstance(value, int) or not -1000 <= value <= 1000:
        return f"invalid oom_score_adj {value!r}"
    try:
        path = ConfinedRoot(procfs_root).file(f"{pid}/oom_score_adj")
        old = read_file(path).strip()
        if old != str(value):
            write_file(path, str(value))
            log.info("process_write", path=str(path), old=old, new=str(value), reason=reason)
        return None
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
