"""EEVDF slices of tasks: sched_setattr(2)'s `sched_runtime` for SCHED_NORMAL, SCHED_BATCH and
SCHED_IDLE tasks (Linux >= 6.12; the kernel clamps it to 0.1-100 ms, 0 puts its default back).

Why BE gets one: with BE in an idle group, the kernel still picks a BE task when an LS group has
run past its fair share (EEVDF eligibility, after an LS burst longer than a slice), and that BE
task keeps the CPU until something reschedules it, at worst the next tick (4 ms at HZ=250),
while LS tasks wait runnable. A task past its slice's deadline is rescheduled at the first
scheduling event on its CPU, so a BE task with the shortest slice gives the CPU back at once.

A slice is per thread, and a child inherits its parent's: a container's processes keep it,
a process started by an exec gets it at the next pass.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

log = structlog.get_logger("koordnode.executor")

SLICE_MIN_NS, SLICE_MAX_NS = 100_000, 100_000_000
_MAX_HOLDERS = 16384  # pods remembered as holding a slice; beyond it every pod is checked
SCHED_NORMAL, SCHED_BATCH, SCHED_IDLE = 0, 3, 5
FAIR_POLICIES = frozenset({SCHED_NORMAL, SCHED_BATCH, SCHED_IDLE})
# struct sched_attr up to sched_period (SCHED_ATTR_SIZE_VER0; the kernel accepts that size):
# size, policy, flags, nice, priority, runtime, deadline, period.
_ATTR = struct.Struct("=IIQiIQQQ")
# (sched_setattr, sched_getattr) system call numbers.
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275), "ppc64le": (355, 356), "s390x": (345, 346),
             "riscv64": (274, 275)}


@dataclass(frozen=True)
class SchedAttr:
    """What sched_getattr says of a task (the fields a slice change must carry over)."""

    policy: int
    nice: int
    runtime_ns: int  # fair tasks, Linux >= 6.12: the task's slice; older kernels: 0


class SliceCalls(Protocol):
    def get(self, tid: int) -> SchedAttr: ...

    def set(self, tid: int, attr: SchedAttr) -> None: ...


class SliceKernel:
    """sched_getattr / sched_setattr through libc's syscall(); raises OSError with the errno."""

    def __init__(self) -> None:
        numbers = _SYSCALLS.get(platform.machine())
        if numbers is None:
            raise OSError(errno.ENOSYS, f"no sched_setattr number known for {platform.machine()}")
        self._set_nr, self._get_nr = numbers
        self._syscall = ctypes.CDLL(None, use_errno=True).syscall

    def get(self, tid: int) -> SchedAttr:
        buf = ctypes.create_string_buffer(_ATTR.size)
        if self._syscall(self._get_nr, tid, buf, _ATTR.size, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        _size, policy, _flags, nice, _prio, runtime, _deadline, _period = _ATTR.unpack(buf.raw)
        return SchedAttr(policy, nice, runtime)

    def set(self, tid: int, attr: SchedAttr) -> None:
        buf = ctypes.create_string_buffer(_ATTR.pack(_ATTR.size, attr.policy, 0, attr.nice, 0, attr.runtime_ns, 0, 0))
        if self._syscall(self._set_nr, tid, buf, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))


@dataclass(frozen=True)
class SliceResult:
    """One pod's tasks after a pass."""

    tasks: int = 0  # fair-policy threads of its processes
    changed: int = 0  # given the slice (or the kernel's default back) by this pass
    errors: tuple[str, ...] = ()


class SchedSlices:
    """Keeps pods' threads at a slice. `unavailable` says why the kernel has none (probed once,
    on this process: before 6.12 sched_getattr reports no slice for a fair task)."""

    def __init__(self, kernel: SliceCalls | None = None,
                 procfs_root: Path | str = "/proc", *, dry_run: bool = False) -> None:
        self._kernel = kernel
        self.procfs_root = Path(procfs_root)
        self.dry_run = dry_run
        self._probed = False
        self._unavailable: str | None = None
        self._lock = threading.Lock()
        self._given: set[int] = set()  # slices koordnode gave (to know which to take back)
        # Pods whose threads koordnode gave a slice: only theirs can need one taken back, so a
        # pass does not list the threads of every pod whose class asks for none.
        self._holders: set[str] = set()
        self._holders_overflowed = False  # past the bound: every pod may hold one

    def _k(self) -> SliceCalls:
        if self._kernel is None:
            self._kernel = SliceKernel()
        return self._kernel

    @property
    def unavailable(self) -> str | None:
        if not self._probed:
            self._probed = True
            if self._kernel is None and os.path.realpath(self.procfs_root) != "/proc":
                # The thread ids found there are not the kernel's (a test tree): never touch them.
                self._unavailable = f"procfs root {self.procfs_root} is not /proc"
                return self._unavailable
            try:
                attr = self._k().get(0)
                if attr.policy in FAIR_POLICIES and attr.runtime_ns == 0:
                    self._unavailable = "the kernel has no per-task slices (sched_attr.sched_runtime of fair tasks: Linux 6.12+)"
            except OSError as err:
                self._unavailable = f"sched_getattr: {err.strerror or err}"
        return self._unavailable

    @property
    def gave_any(self) -> bool:
        with self._lock:
            return bool(self._given)

    def may_hold(self, pod: str) -> bool:
        """Whether `pod`'s threads may hold a slice koordnode gave (to be taken back)."""
        with self._lock:
            return pod in self._holders or (self._holders_overflowed and bool(self._given))

    def forget(self, pod: str) -> None:
        """The pod is gone: its threads hold nothing any more."""
        with self._lock:
            self._holders.discard(pod)

    def _threads(self, pid: int) -> list[int]:
        try:
            return [int(name) for name in os.listdir(self.procfs_root / str(pid) / "task") if name.isdigit()]
        except OSError:
            return []  # exited meanwhile

    def keep(self, pids: list[int], slice_ns: int, pod: str | None = None) -> SliceResult:
        """Every fair-policy thread of `pids` (those of `pod`, when named) at `slice_ns` (0: the
        kernel's default, given back only to threads at a slice koordnode gave). RT and deadline
        tasks are left alone."""
        if self.unavailable is not None or not pids:
            return SliceResult()
        with self._lock:
            if slice_ns:
                slice_ns = min(max(slice_ns, SLICE_MIN_NS), SLICE_MAX_NS)
                self._given.add(slice_ns)
                if pod is not None:
                    if len(self._holders) >= _MAX_HOLDERS:
                        self._holders.clear()
                        self._holders_overflowed = True
                    self._holders.add(pod)
            given = frozenset(self._given)
        kernel = self._k()
        tasks = changed = 0
        errors: list[str] = []
        for pid in pids:
            for tid in self._threads(pid):
                try:
                    attr = kernel.get(tid)
                except OSError as err:
                    if err.errno != errno.ESRCH:
                        errors.append(f"tid {tid}: get: {err.strerror}")
                    continue
                if attr.policy not in FAIR_POLICIES:
                    continue
                tasks += 1
                if slice_ns and attr.runtime_ns == slice_ns:
                    continue
                if not slice_ns and attr.runtime_ns not in given:
                    continue  # the default, or a slice someone else chose
                if self.dry_run:
                    log.info("dry_run_would_set_sched_slice", tid=tid, slice_ns=slice_ns)
                    continue
                try:
                    kernel.set(tid, SchedAttr(attr.policy, attr.nice, slice_ns))
                    changed += 1
                except OSError as err:
                    if err.errno != errno.ESRCH:
                        errors.append(f"tid {tid}: set: {err.strerror}")
        if changed:
            log.info("sched_slice_set", pids=pids[:20], slice_ns=slice_ns, threads=changed)
        if not slice_ns and pod is not None and not errors and not self.dry_run:
            self.forget(pod)  # every slice it held is back to the default
        return SliceResult(tasks, changed, tuple(errors))
