"""Per-process values under a procfs root: a container's oom_score_adj, which is a process
attribute (no cgroup file holds it). Set where the runtime cannot (containerd 1.7's NRI has no
oom_score_adj adjustment) and kept by the reconcile pass (a container created while a hook
timed out runs with kubelet's value)."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import structlog

from koordnode.executor.cgroup import ConfinedRoot
from koordnode.executor.write_result import WriteStatus

log = structlog.get_logger("koordnode.executor")

CAP_SYS_RESOURCE = 24
OOM_SCORE_ADJ = "oom_score_adj"


def oom_score_adj_floor(proc_self: str = "/proc/self") -> int | None:
    """The lowest oom_score_adj a container can be given here; None when there is no limit.

    Lowering oom_score_adj needs CAP_SYS_RESOURCE. Without it (some sandboxes, user
    namespaces) runc fails to start a container whose spec asks for less than its parent
    has, and koordnode's own writes below its value fail; containerd clamps CRI values itself
    (restrict_oom_score_adj) but not NRI adjustments, so koordnode clamps its own the same way.
    """
    try:
        status = open(f"{proc_self}/status").read()
        cap_eff = int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), 16)
        if cap_eff & (1 << CAP_SYS_RESOURCE):
            return None
        return int(open(f"{proc_self}/oom_score_adj").read().strip())
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def oom_score_adj_wanted(want: int, have: int, floor: int | None) -> int:
    """The value to give a process that has `have` when its class asks `want`: never below
    `floor` (unless it is lower already, which is kept rather than raised to the floor)."""
    return want if floor is None else max(want, min(floor, have))


def set_oom_score_adj(procfs_root: Path | str, pid: int, value: int, reason: str) -> str | None:
    """Write /proc/<pid>/oom_score_adj; None when done, else why not (never raises)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        return f"invalid pid {pid!r}"
    if isinstance(value, bool) or not isinstance(value, int) or not -1000 <= value <= 1000:
        return f"invalid oom_score_adj {value!r}"
    try:
        files = ProcessFiles(procfs_root)
        old = files.read(pid, OOM_SCORE_ADJ).strip()
        if old != str(value):
            files.write(pid, OOM_SCORE_ADJ, str(value))
            log.info("process_write", path=files.path(pid, OOM_SCORE_ADJ), old=old, new=str(value), reason=reason)
        return None
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


class ProcessFiles:
    """A process's files under a procfs root, reached without following a symlink.

    The root is resolved once; below it the path is the pid's directory and a fixed file name,
    both opened with O_NOFOLLOW (the directory through an O_PATH descriptor), so no write can
    leave the root, whatever a fake or hostile tree holds. No path resolution per process: the
    reconcile pass reads every container process's value each period.
    """

    def __init__(self, procfs_root: Path | str) -> None:
        self.root = str(ConfinedRoot(procfs_root).root)

    def path(self, pid: int, name: str) -> str:
        return f"{self.root}/{pid}/{name}"

    def _open(self, pid: int, name: str, flags: int) -> int:
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise ValueError(f"invalid pid {pid!r}")
        directory = os.open(f"{self.root}/{pid}", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
        finally:
            os.close(directory)

    def read(self, pid: int, name: str) -> str:
        fd = self._open(pid, name, os.O_RDONLY)
        try:
            return os.read(fd, 4096).decode("ascii", errors="replace")
        finally:
            os.close(fd)

    def write(self, pid: int, name: str, text: str) -> None:
        """One write(2) of `text`; O_TRUNC keeps a fake tree's plain files exact."""
        fd = self._open(pid, name, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, text.encode("ascii"))
        finally:
            os.close(fd)


@dataclass(frozen=True)
class ProcessWrite:
    """A value for one process (named like a sysctl write, so metrics count it by `name`)."""

    pid: int
    value: int
    reason: str = ""
    name: str = OOM_SCORE_ADJ


@dataclass(frozen=True)
class ProcessResult:
    write: ProcessWrite
    status: WriteStatus
    old: str | None = None
    detail: str = ""
    # The process had another value than its class's: this write restored it (when ok).
    overwritten: bool = False


class ProcessExecutor:
    """Keeps processes at a value: reads it, writes only a different one, counts those
    (another writer, or a creation that went on without koordnode's value). A process that
    exits meanwhile is no failure."""

    def __init__(self, procfs_root: Path | str = "/proc", *, dry_run: bool = False,
                 floor: int | None = None) -> None:
        self._files = ProcessFiles(procfs_root)
        self.dry_run = dry_run
        # oom_score_adj_floor() of this process: the lowest value its writes can set.
        self.floor = floor
        self._lock = threading.Lock()
        self._overwrites = 0
        self._last_overwrite: dict[str, str] = {}

    @property
    def overwrites(self) -> dict[str, int]:
        with self._lock:
            return {OOM_SCORE_ADJ: self._overwrites} if self._overwrites else {}

    @property
    def last_overwrites(self) -> dict[str, dict[str, str]]:
        with self._lock:
            return {OOM_SCORE_ADJ: dict(self._last_overwrite)} if self._last_overwrite else {}

    def keep_oom_score_adj(self, pids: list[int], value: int, reason: str) -> list[ProcessResult]:
        return [self._keep_one(ProcessWrite(pid, value, reason)) for pid in pids if pid > 1]

    def _keep_one(self, write: ProcessWrite) -> ProcessResult:
        files = self._files
        try:
            old = files.read(write.pid, OOM_SCORE_ADJ).strip()
        except FileNotFoundError:
            return ProcessResult(write, WriteStatus.MISSING, detail="the process exited")
        except (OSError, ValueError) as exc:
            return ProcessResult(write, WriteStatus.FAILED, detail=f"{type(exc).__name__}: {exc}")
        try:
            have = int(old)
        except ValueError:
            return ProcessResult(write, WriteStatus.FAILED, old, f"unreadable value {old!r}")
        want = oom_score_adj_wanted(write.value, have, self.floor)
        if want == have:
            return ProcessResult(write, WriteStatus.UNCHANGED, old)
        path = files.path(write.pid, OOM_SCORE_ADJ)
        if self.dry_run:
            log.info("dry_run_would_set_oom_score_adj", path=path, old=old, new=want, reason=write.reason)
            return ProcessResult(write, WriteStatus.WOULD_WRITE, old)
        try:
            files.write(write.pid, OOM_SCORE_ADJ, str(want))
        except FileNotFoundError:
            return ProcessResult(write, WriteStatus.MISSING, old, "the process exited")
        except OSError as exc:
            log.warning("process_write_failed", path=path, old=old, new=want, error=str(exc))
            return ProcessResult(write, WriteStatus.FAILED, old, f"{type(exc).__name__}: {exc}")
        with self._lock:
            self._overwrites += 1
            self._last_overwrite = {"path": path, "found": old, "restored": str(want)}
        log.warning("process_value_restored", path=path, found=old, new=want, reason=write.reason)
        return ProcessResult(write, WriteStatus.WRITTEN, old, "restored", overwritten=True)
