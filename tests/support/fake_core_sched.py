"""PR_SCHED_CORE as the kernel keeps it, for tests on a machine without SMT or CONFIG_SCHED_CORE."""

from __future__ import annotations

import ctypes
import errno
import os
import threading

from koordnode.executor.process import (
    PIDTYPE_PID,
    PIDTYPE_TGID,
    PR_SCHED_CORE,
    PR_SCHED_CORE_CREATE,
    PR_SCHED_CORE_GET,
    PR_SCHED_CORE_SHARE_FROM,
    PR_SCHED_CORE_SHARE_TO,
)


class FakeCoreKernel:
    """PR_SCHED_CORE as the kernel keeps it: a cookie per task (here per pid, and per thread of
    koordnode for SHARE_FROM), copied by SHARE_TO from the calling thread."""

    def __init__(self, error: int | None = None, exited: frozenset[int] = frozenset()) -> None:
        self.cookies: dict[int, int] = {}
        self.threads: dict[int, int] = {}  # koordnode's own threads' cookies
        self.error, self.exited = error, exited
        self.next = 1000
        self.calls: list[tuple[int, int]] = []

    def __call__(self, option: int, cmd: int, pid: int, pid_type: int, addr: int) -> int:
        assert option == PR_SCHED_CORE
        if self.error is not None:
            raise OSError(self.error, os.strerror(self.error))
        if pid in self.exited:
            raise OSError(errno.ESRCH, "No such process")
        self.calls.append((cmd, pid))
        me = threading.get_native_id()
        if cmd == PR_SCHED_CORE_GET:
            ctypes.c_ulong.from_address(addr).value = self.cookies.get(pid, 0)
        elif cmd == PR_SCHED_CORE_CREATE:
            assert pid_type == PIDTYPE_TGID
            self.next += 1
            self.cookies[pid] = self.next
        elif cmd == PR_SCHED_CORE_SHARE_FROM:
            assert pid_type == PIDTYPE_PID
            self.threads[me] = self.cookies.get(pid, 0)
        elif cmd == PR_SCHED_CORE_SHARE_TO:
            self.cookies[pid] = self.threads.get(me, 0)
        return 0
