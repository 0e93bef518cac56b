"""Core-scheduling cookies (prctl PR_SCHED_CORE, Linux >= 5.14 with CONFIG_SCHED_CORE).

The kernel runs two tasks on SMT siblings of one physical core at the same time only when they
have the same cookie (untagged tasks: cookie 0). A task's cookie is copied to its children. A
cookie cannot be named: it is created on a task, and copied from a task (SHARE_FROM, to the
calling thread) to a task (SHARE_TO, from the calling thread). koordnode gives

* a pod's own cookie (`share`): created on its first process, copied to the others;
* one shared cookie (`share_group`: BE's, with Koordinator's coreExpeller): created on a thread
  of koordnode's own that only sleeps, so the cookie lives while BE tasks come and go;
* no cookie (`clear`): a cookie koordnode gave is taken back (the class's setting changed).

Copies run on a short-lived thread, so no working thread of koordnode keeps a pod's cookie.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import structlog

log = structlog.get_logger("koordnode.executor")

PR_SCHED_CORE = 62
PR_SCHED_CORE_GET, PR_SCHED_CORE_CREATE, PR_SCHED_CORE_SHARE_TO, PR_SCHED_CORE_SHARE_FROM = 0, 1, 2, 3
PIDTYPE_PID, PIDTYPE_TGID = 0, 1
# Cookies koordnode created, kept to know which to take back (bounded: pods come and go).
_GIVEN_MAX = 4096

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
    shared: int = 0  # given the pod's (or the group's) cookie by this pass
    errors: tuple[str, ...] = ()
    cleared: int = 0  # a cookie koordnode gave taken back by this pass


class _Anchor:
    """A thread of koordnode that holds the shared cookie and never runs: sleeping, it costs
    nothing and keeps the cookie alive when no BE task is left."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        started = threading.Event()

        def sleep() -> None:
            started.set()
            self._stop.wait()

        self.thread = threading.Thread(target=sleep, name="koordnode-core-sched-anchor", daemon=True)
        self.thread.start()
        started.wait()
        self.tid: int = self.thread.native_id or 0
        self.cookie = 0

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)


class CoreScheduling:
    """Core-scheduling cookies for pods' processes. The kernel refuses them without SMT
    (ENODEV) or without CONFIG_SCHED_CORE (EINVAL): `unavailable` says why, and nothing is
    attempted then."""

    def __init__(self, prctl: Prctl | None = None, *, dry_run: bool = False) -> None:
        self._prctl = prctl
        self.dry_run = dry_run
        self._unavailable: str | None = None
        self._probed = False
        self._lock = threading.Lock()
        self._anchor: _Anchor | None = None
        self._given: OrderedDict[int, None] = OrderedDict()

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

    @property
    def gave_any(self) -> bool:
        """Whether koordnode gave a cookie (then untagged pods are checked for one to take back)."""
        with self._lock:
            return bool(self._given)

    @property
    def shared_cookie(self) -> int:
        """The shared cookie (0: none made yet)."""
        with self._lock:
            return self._anchor.cookie if self._anchor is not None else 0

    def cookie(self, pid: int) -> int:
        """The task's cookie (0: none). Raises OSError."""
        value = ctypes.c_ulong(0)
        self._call(PR_SCHED_CORE_GET, pid, PIDTYPE_PID, ctypes.addressof(value))
        return value.value

    def _remember(self, cookie: int) -> None:
        with self._lock:
            self._given[cookie] = None
            self._given.move_to_end(cookie)
            while len(self._given) > _GIVEN_MAX:
                self._given.popitem(last=False)

    def _cookies(self, pids: list[int], errors: list[str]) -> dict[int, int]:
        cookies: dict[int, int] = {}
        for pid in pids:
            try:
                cookies[pid] = self.cookie(pid)
            except OSError as err:
                if err.errno != errno.ESRCH:  # exited meanwhile: nothing to do
                    errors.append(f"pid {pid}: get: {err.strerror}")
        return cookies

    def share(self, pids: list[int]) -> CoreSchedResult:
        """Give every process of `pids` one cookie of their own: the one most of them have
        already (a pod's first process got it and its children inherit it), else a new one on
        the first. The shared cookie is never taken for a pod's own."""
        if self.unavailable is not None or not pids:
            return CoreSchedResult(len(pids))
        errors: list[str] = []
        cookies = self._cookies(pids, errors)
        if not cookies:
            return CoreSchedResult(len(pids), 0, tuple(errors))
        shared = self.shared_cookie
        tagged = [c for c in cookies.values() if c and c != shared]
        if tagged:
            reference = max(set(tagged), key=tagged.count)
            source = next(pid for pid, c in cookies.items() if c == reference)
        else:
            source = next(iter(cookies))
            if self.dry_run:
                log.info("dry_run_would_create_core_sched_cookie", pid=source)
                return CoreSchedResult(len(pids), 0, tuple(errors))
            try:
                self._call(PR_SCHED_CORE_CREATE, source, PIDTYPE_TGID, 0)
                reference = cookies[source] = self.cookie(source)
            except OSError as err:
                return CoreSchedResult(len(pids), 0, (*errors, f"pid {source}: create: {err.strerror}"))
            self._remember(reference)
            created = self._copy(source, reference, cookies, len(pids), errors)
            return dataclasses.replace(created, shared=created.shared + 1)  # the source got it too
        return self._copy(source, reference, cookies, len(pids), errors)

    def share_group(self, pids: list[int]) -> CoreSchedResult:
        """Give every process of `pids` the shared cookie (made on the first call)."""
        if self.unavailable is not None or not pids:
            return CoreSchedResult(len(pids))
        errors: list[str] = []
        cookies = self._cookies(pids, errors)
        if not cookies:
            return CoreSchedResult(len(pids), 0, tuple(errors))
        if self.dry_run and self.shared_cookie == 0:
            log.info("dry_run_would_create_shared_core_sched_cookie", pids=list(cookies)[:20])
            return CoreSchedResult(len(pids), 0, tuple(errors))
        try:
            anchor = self._shared_anchor()
        except OSError as err:
            return CoreSchedResult(len(pids), 0, (*errors, f"shared cookie: create: {err.strerror}"))
        return self._copy(anchor.tid, anchor.cookie, cookies, len(pids), errors)

    def _shared_anchor(self) -> _Anchor:
        with self._lock:
            anchor = self._anchor
        if anchor is not None:
            return anchor
        anchor = _Anchor()
        try:
            self._call(PR_SCHED_CORE_CREATE, anchor.tid, PIDTYPE_PID, 0)
            anchor.cookie = self.cookie(anchor.tid)
        except OSError:
            anchor.stop()
            raise
        with self._lock:
            self._anchor = anchor
        self._remember(anchor.cookie)
        log.info("core_sched_shared_cookie_created", anchor_tid=anchor.tid)
        return anchor

    def clear(self, pids: list[int]) -> CoreSchedResult:
        """Take back from `pids` any cookie koordnode gave (a class no longer asks for it, or now
        expels BE); cookies given by others are left."""
        if self.unavailable is not None or not pids or not self.gave_any:
            return CoreSchedResult(len(pids))
        errors: list[str] = []
        cookies = self._cookies(pids, errors)
        with self._lock:
            targets = [pid for pid, c in cookies.items() if c and c in self._given]
        if not targets:
            return CoreSchedResult(len(pids), 0, tuple(errors))
        if self.dry_run:
            log.info("dry_run_would_clear_core_sched_cookie", pids=targets[:20])
            return CoreSchedResult(len(pids), 0, tuple(errors))
        cleared = self._copy_to(None, targets, errors)
        if cleared:
            log.info("core_sched_cookie_cleared", pids=targets[:20], count=cleared)
        return CoreSchedResult(len(pids), 0, tuple(errors), cleared)

    def _copy(self, source: int, reference: int, cookies: dict[int, int], processes: int,
              errors: list[str]) -> CoreSchedResult:
        targets = [pid for pid, c in cookies.items() if c != reference]
        if not targets:
            return CoreSchedResult(processes, 0, tuple(errors))
        if self.dry_run:
            log.info("dry_run_would_share_core_sched_cookie", source=source, pids=targets)
            return CoreSchedResult(processes, 0, tuple(errors))
        shared = self._copy_to(source, targets, errors)
        if shared:
            log.info("core_sched_cookie_shared", source=source, pids=targets[:20], count=shared)
        return CoreSchedResult(processes, shared, tuple(errors))

    def _copy_to(self, source: int | None, targets: list[int], errors: list[str]) -> int:
        """SHARE_FROM `source` to a new thread (None: it stays untagged, as it starts: the
        threads it is started from have no cookie), then SHARE_TO each target; the thread ends."""
        done = [0]

        def run() -> None:
            if source is None:
                try:
                    if self.cookie(0) != 0:  # started from a tagged thread: SHARE_TO would tag
                        errors.append("clear: koordnode's thread has a cookie")
                        return
                except OSError as err:
                    errors.append(f"clear: get: {err.strerror}")
                    return
            else:
                try:
                    self._call(PR_SCHED_CORE_SHARE_FROM, source, PIDTYPE_PID, 0)
                except OSError as err:
                    errors.append(f"pid {source}: share from: {err.strerror}")
                    return
            for pid in targets:
                try:
                    self._call(PR_SCHED_CORE_SHARE_TO, pid, PIDTYPE_TGID, 0)
                    done[0] += 1
                except OSError as err:
                    if err.errno != errno.ESRCH:
                        errors.append(f"pid {pid}: share to: {err.strerror}")

        worker = threading.Thread(target=run, name="koordnode-core-sched", daemon=True)
        worker.start()
        worker.join()
        return done[0]

    def close(self) -> None:
        """Ends the anchor thread (the shared cookie lives on in the tasks that have it)."""
        with self._lock:
            anchor, self._anchor = self._anchor, None
        if anchor is not None:
            anchor.stop()


def describe_core_sched_error(err: OSError) -> str:
    if err.errno == errno.ENODEV:
        return "the kernel refuses core scheduling without SMT (no sibling threads on this CPU: ENODEV)"
    if err.errno == errno.EINVAL:
        return "the kernel has no core scheduling (CONFIG_SCHED_CORE, Linux >= 5.14: EINVAL)"
    if err.errno == errno.EPERM:
        return "not permitted (EPERM): koordnode needs to be root"
    return f"prctl(PR_SCHED_CORE) failed: {err.strerror}"
