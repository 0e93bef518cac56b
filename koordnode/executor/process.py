"""Per-process values under a procfs root: a container's oom_score_adj, which is a process
attribute (no cgroup file holds it). Set where the runtime cannot (containerd 1.7's NRI has no
oom_score_adj adjustment) and kept by the reconcile pass (a container created while a hook
timed out runs with kubelet's value)."""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from koordnode.executor.cgroup import ConfinedRoot, read_file, write_file
from koordnode.executor.executor import WriteStatus

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
        path = ConfinedRoot(procfs_root).file(f"{pid}/oom_score_adj")
        old = read_file(path).strip()
        if old != str(value):
            write_file(path, str(value))
            log.info("process_write", path=str(path), old=old, new=str(value), reason=reason)
        return None
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


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
        self._root = ConfinedRoot(procfs_root)
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
        try:
            path = self._root.file(f"{write.pid}/{OOM_SCORE_ADJ}")
            old = read_file(path).strip()
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
        if self.dry_run:
            log.info("dry_run_would_set_oom_score_adj", path=str(path), old=old, new=want, reason=write.reason)
            return ProcessResult(write, WriteStatus.WOULD_WRITE, old)
        try:
            write_file(path, str(want))
        except FileNotFoundError:
            return ProcessResult(write, WriteStatus.MISSING, old, "the process exited")
        except OSError as exc:
            log.warning("process_write_failed", path=str(path), old=old, new=want, error=str(exc))
            return ProcessResult(write, WriteStatus.FAILED, old, f"{type(exc).__name__}: {exc}")
        with self._lock:
            self._overwrites += 1
            self._last_overwrite = {"path": str(path), "found": old, "restored": str(want)}
        log.warning("process_value_restored", path=str(path), found=old, new=want, reason=write.reason)
        return ProcessResult(write, WriteStatus.WRITTEN, old, "restored", overwritten=True)


# ---- core scheduling (prctl PR_SCHED_CORE, Linux >= 5.14 with CONFIG_SCHED_CORE) ------------

PR_SCHED_CORE = 62
PR_SCHED_CORE_GET, PR_SCHED_CORE_CREATE, PR_SCHED_CORE_SHARE_TO, PR_SCHED_CORE_SHARE_FROM = 0, 1, 2, 3
PIDTYPE_PID, PIDTYPE_TGID = 0, 1

# prctl(option, arg2, arg3, arg4, arg5) -> 0, or raises OSError with the errno.
Prctl = Callable[[int, int, int, int, int], int]


def _libc_prctl() -> Prctl:
    libc = ctypes.CDLL(None, use_errno=True)
    call = libc.prctl
    call.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    call.restype = ctypes.c_int

    def prctl(option: int, arg2: int, arg3: int, arg4: int, arg5: int) -> int:
        if call(option, arg2, arg3, arg4, arg5) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return 0

    return prctl


@dataclass(frozen=True)
class CoreSchedResult:
    """One pod's processes after a pass: how many share its cookie, and what went wrong."""

    processes: int = 0
    shared: int = 0  # given the pod's cookie by this pass
    errors: tuple[str, ...] = ()


class CoreScheduling:
    """Core-scheduling cookies: the tasks of one pod share one cookie, so the kernel never runs
    them on a physical core (SMT siblings) at the same time as another cookie's tasks (another
    pod, or untagged work). The kernel refuses it without SMT (ENODEV) or without
    CONFIG_SCHED_CORE (EINVAL): `unavailable` says why, and nothing is attempted then."""

    def __init__(self, prctl: Prctl | None = None, *, dry_run: bool = False) -> None:
        self._prctl = prctl
        self.dry_run = dry_run
        self._unavailable: str | None = None
        self._probed = False

    def _call(self, *args: int) -> int:
        if self._prctl is None:
            self._prctl = _libc_prctl()
        return self._prctl(PR_SCHED_CORE, *args)

    @property
    def unavailable(self) -> str | None:
        """Why this kernel gives no cookies (probed once, on this process); None: it does."""
        if not self._probed:
            self._probed = True
            try:
                self.cookie(os.getpid())
            except OSError as err:
                self._unavailable = describe_core_sched_error(err)
            except (AttributeError, TypeError) as err:  # no prctl in this libc
                self._unavailable = f"prctl not callable: {err}"
        return self._unavailable

    def cookie(self, pid: int) -> int:
        """The task's cookie (0: none). Raises OSError."""
        value = ctypes.c_ulong(0)
        self._call(PR_SCHED_CORE_GET, pid, PIDTYPE_PID, ctypes.addressof(value))
        return value.value

    def share(self, pids: list[int]) -> CoreSchedResult:
        """Give every process of `pids` one cookie: the one most of them have already (a pod's
        first process got it and its children inherit it), else a new one on the first."""
        if self.unavailable is not None or not pids:
            return CoreSchedResult(len(pids))
        errors: list[str] = []
        cookies: dict[int, int] = {}
        for pid in pids:
            try:
                cookies[pid] = self.cookie(pid)
            except OSError as err:
                if err.errno != errno.ESRCH:  # exited meanwhile: nothing to do
                    errors.append(f"pid {pid}: get: {err.strerror}")
        if not cookies:
            return CoreSchedResult(len(pids), 0, tuple(errors))
        tagged = [c for c in cookies.values() if c]
        if tagged:
            reference = max(set(tagged), key=tagged.count)
            source = next(pid for pid, c in cookies.items() if c == reference)
        else:
            source, reference = next(iter(cookies)), 0
            if self.dry_run:
                log.info("dry_run_would_create_core_sched_cookie", pid=source)
                return CoreSchedResult(len(pids), 0, tuple(errors))
            try:
                self._call(PR_SCHED_CORE_CREATE, source, PIDTYPE_TGID, 0)
                reference = cookies[source] = self.cookie(source)
            except OSError as err:
                return CoreSchedResult(len(pids), 0, (*errors, f"pid {source}: create: {err.strerror}"))
        targets = [pid for pid, c in cookies.items() if c != reference]
        if not targets:
            return CoreSchedResult(len(pids), 0, tuple(errors))
        if self.dry_run:
            log.info("dry_run_would_share_core_sched_cookie", source=source, pids=targets)
            return CoreSchedResult(len(pids), 0, tuple(errors))
        shared = self._share_from(source, targets, errors)
        if shared:
            log.info("core_sched_cookie_shared", source=source, pids=targets[:20], count=shared)
        return CoreSchedResult(len(pids), shared, tuple(errors))

    def _share_from(self, source: int, targets: list[int], errors: list[str]) -> int:
        """SHARE_FROM copies a cookie to the calling thread and SHARE_TO from it: a thread of
        its own does both and ends, so no thread of koordnode keeps a pod's cookie."""
        shared = [0]

        def run() -> None:
            try:
                self._call(PR_SCHED_CORE_SHARE_FROM, source, PIDTYPE_PID, 0)
            except OSError as err:
                errors.append(f"pid {source}: share from: {err.strerror}")
                return
            for pid in targets:
                try:
                    self._call(PR_SCHED_CORE_SHARE_TO, pid, PIDTYPE_TGID, 0)
                    shared[0] += 1
                except OSError as err:
                    if err.errno != errno.ESRCH:
                        errors.append(f"pid {pid}: share to: {err.strerror}")

        worker = threading.Thread(target=run, name="koordnode-core-sched", daemon=True)
        worker.start()
        worker.join()
        return shared[0]


def describe_core_sched_error(err: OSError) -> str:
    if err.errno == errno.ENODEV:
        return "the kernel refuses core scheduling without SMT (no sibling threads on this CPU: ENODEV)"
    if err.errno == errno.EINVAL:
        return "the kernel has no core scheduling (CONFIG_SCHED_CORE, Linux >= 5.14: EINVAL)"
    if err.errno == errno.EPERM:
        return "not permitted (EPERM): koordnode needs to be root"
    return f"prctl(PR_SCHED_CORE) failed: {err.strerror}"
