"""PR_SCHED_CORE as the kernel keeps it, for tests on a machine without SMT or CONFIG_SCHED_CORE."""

from __future__ import annotations

import ctypes
import errno
import os
import threading

from koordnode.executor.core_sched import (
    PIDTYPE_PID,
    PIDTYPE_TGID,
    PR_SCHED_CORE,
    PR_SCHED_CORE_CREATE,
    PR_SCHED_CORE_GET,
    PR_SCHED_CORE_SHARE_FROM,
    PR_SCHED_CORE_SHARE_TO,
)


def _own_thread(tid: int) -> bool:
    return os.path.isdir(f"/proc/self/task/{tid}")


class FakeCoreKernel:
    """PR_SCHED_CORE as the kernel keeps it: a cookie per task (the pods' processes by pid, in
    `cookies`; koordnode's own threads by thread id, in `threads`), 0 when untagged; pid 0 is
    the calling thread; CREATE makes a new cookie, SHARE_FROM copies a task's cookie to the
    calling thread and SHARE_TO the calling thread's (0 too: that clears) to a task."""

    def __init__(self, error: int | None = None, exited: frozenset[int] = frozenset()) -> None:
        self.cookies: dict[int, int] = {}
        self.threads: dict[int, int] = {}  # koordnode's own threads' cookies
        self.error, self.exited = error, exited
        self.next = 1000
        self.calls: list[tuple[int, int]] = []

    def _forget_ended_threads(self) -> None:
        for tid in [tid for tid in self.threads if not _own_thread(tid)]:
            del self.threads[tid]

    def _table(self, task: int) -> dict[int, int]:
        return self.threads if _own_thread(task) else self.cookies

    def __call__(self, option: int, cmd: int, pid: int, pid_type: int, addr: int) -> int:
        assert option == PR_SCHED_CORE
        if self.error is not None:
            raise OSError(self.error, os.strerror(self.error))
        if pid in self.exited:
            raise OSError(errno.ESRCH, "No such process")
        if pid_type not in (PIDTYPE_PID, PIDTYPE_TGID):
            raise OSError(errno.EINVAL, "Invalid argument")
        self.calls.append((cmd, pid))
        self._forget_ended_threads()  # a thread id may be reused: an ended thread's cookie is gone
        me = threading.get_native_id()
        task = pid or me
        if cmd == PR_SCHED_CORE_GET:
            if pid_type != PIDTYPE_PID:
                raise OSError(errno.EINVAL, "Invalid argument")
            ctypes.c_ulong.from_address(addr).value = self._table(task).get(task, 0)
        elif cmd == PR_SCHED_CORE_CREATE:
            self.next += 1
            self._table(task)[task] = self.next
        elif cmd == PR_SCHED_CORE_SHARE_FROM:
            if pid_type != PIDTYPE_PID:
                raise OSError(errno.EINVAL, "Invalid argument")
            self.threads[me] = self._table(task).get(task, 0)
        elif cmd == PR_SCHED_CORE_SHARE_TO:
            self._table(task)[task] = self.threads.get(me, 0)
        return 0
