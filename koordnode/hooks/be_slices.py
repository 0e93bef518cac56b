"""koordnode's BE group under the systemd cgroup driver: its slices, made through systemd.

With kubelet's systemd driver, containerd's runc places a sandbox whose cgroup parent is
`kubepods-koordnode_be-pod<uid>.slice` in a scope inside that slice, and systemd starts the
slice and its parents (`kubepods-koordnode_be.slice`, named by the dashes) on demand. The
group slice is therefore made idle through systemd (`CPUWeight=idle`), so that systemd itself
writes cpu.idle = 1 whenever it realizes the slice again. Talking to systemd takes a fork and
a D-Bus round trip (tens of ms, more on a busy node), too slow for the CRI path: the group is
prepared in a worker thread (at start, and again whenever it is found not giving way), and
RunPodSandbox only moves a pod into a group that gives way: it reads cpu.idle = 1, or the lowest
weight, the state the QoS manager's cpu_suppress keeps it in while LS is quiet (written to the
cgroup files directly; should systemd realize the slice again, it is idle until the next tick).
Pod slices in the group are koordnode's to stop (systemd keeps a slice it started until told
otherwise).

kubelet's own pod slice of a moved pod stays, empty, and kubelet (cgroup v2) kills a running pod
whose pod slice does not list cpu, cpuset, memory, hugetlb and pids in its cgroup.controllers
(SyncPod: `pcm.Exists`). systemd keeps a controller enabled for a slice only while a unit in it
needs that controller, and an empty slice with kubelet's properties (CPUWeight, the accounting
flags) needs no cpuset: at systemd's next realization of kubelet's besteffort tier the pod slice
loses cpuset and kubelet kills the pod (seen with kubelet 1.37 and systemd 257, every 30-40 s).
So kubelet's pod slice gets `AllowedMemoryNodes` (all memory nodes, a no-op on an empty slice),
which makes it need cpuset.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any
from concurrent.futures import Future, ThreadPoolExecutor

import structlog

from koordnode.executor import systemd

log = structlog.get_logger("koordnode.be_group")

# At most this many leftover pod slices are stopped per reconcile pass (each is a systemctl call).
MAX_STOPS_PER_PASS = 20
# After a failed attempt (no systemd, systemd < 252, ...) the next one waits this long: BE pods
# meanwhile stay in kubelet's tier at no cost to the CRI call.
RETRY_AFTER_S = 60.0
# kubelet's pod slice found without its property (or the call failed): asked again at most this
# often (kubelet kills the pod at its next sync while cpuset is missing, so not RETRY_AFTER_S).
RECHECK_AFTER_S = 10.0


class SystemdBeGroup:
    """Makes BE group slices idle through systemd and stops pod slices, off the CRI path.

    `gives_way(cgroup)` tells whether a group is idle or at the lowest weight (False when
    missing); `start_idle` and `stop` are the systemd calls (executor.systemd), replaceable in
    tests."""

    def __init__(self, gives_way: Callable[[str], bool], *,
                 start_idle: Callable[[str], str | None] = systemd.start_idle_slice,
                 stop: Callable[[str], str | None] = systemd.stop_slice,
                 cpu_weight: Callable[[str], str | None] = systemd.slice_cpu_weight,
                 allow_memory_nodes: Callable[[str, str], str | None] = systemd.set_allowed_memory_nodes,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._gives_way = gives_way
        self._cpu_weight = cpu_weight
        self._clock = clock
        self._failed_at: dict[str, float] = {}
        self._start_idle = start_idle
        self._stop = stop
        self._allow_memory_nodes = allow_memory_nodes
        self._cpuset_kept: set[str] = set()  # kubelet pod slices given AllowedMemoryNodes by this process
        self._cpuset_pending: dict[str, Future[str | None]] = {}
        self._cpuset_at: dict[str, float] = {}  # when each kubelet pod slice was last given it
        self._lock = threading.Lock()
        self._ensured: set[str] = set()  # slices this process made idle through systemd
        self._pending: dict[str, Future[str | None]] = {}
        self.problems: dict[str, str] = {}  # slice -> why it is not idle (for status)
        self._worker: ThreadPoolExecutor | None = None

    def _submit(self, fn: Callable[..., str | None], *args: Any) -> Future[str | None]:
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="koordnode-systemd")
        return self._worker.submit(fn, *args)

    def _giving_way(self, group: str) -> bool:
        """The group gives way to LS (idle, or the lowest weight while LS is quiet)."""
        try:
            return self._gives_way(group)
        except Exception:
            return False

    def _weight(self, slice_name: str) -> str | None:
        try:
            return self._cpu_weight(slice_name)
        except Exception:
            return None

    def _retry_later(self, slice_name: str) -> bool:
        failed_at = self._failed_at.get(slice_name)
        return failed_at is not None and self._clock() - failed_at < RETRY_AFTER_S

    def prepare(self, slice_name: str, group: str) -> Future[str | None]:
        """Make the group slice idle through systemd, in the worker (one run per slice at a time)."""
        with self._lock:
            pending = self._pending.get(slice_name)
            if pending is not None:
                return pending
            self._failed_at.pop(slice_name, None)
            self._ensured.discard(slice_name)
            future = self._submit(self._prepare, slice_name, group)
            self._pending[slice_name] = future
            return future

    def _prepare(self, slice_name: str, group: str) -> str | None:
        try:
            problem = self._start_idle(slice_name)
        except Exception as exc:  # a failed prepare leaves BE pods in kubelet's tier, never more
            problem = f"{type(exc).__name__}: {exc}"
        retry_later = True
        if problem is None and not self._giving_way(group):
            weight = self._weight(slice_name)
            if weight not in (None, "idle"):
                # Another writer (an operator's set-property) changed it since our call: not an
                # old systemd, so no back-off; the next reconcile pass makes it idle again.
                problem = f"{slice_name}: CPUWeight set to {weight} by another writer after koordnode's CPUWeight=idle"
                retry_later = False
            else:
                problem = (f"{slice_name} has CPUWeight=idle but {group}/cpu.idle is not 1 "
                           "(systemd older than 252 does not map it to cpu.idle)")
        with self._lock:
            self._pending.pop(slice_name, None)
            if problem is None:
                self._ensured.add(slice_name)
                self.problems.pop(slice_name, None)
            else:
                self.problems[slice_name] = problem
                if retry_later:
                    self._failed_at[slice_name] = self._clock()
        if problem is None:
            log.info("be_group_slice_idle", slice=slice_name, cgroup=group)
        else:
            log.warning("be_group_slice_not_idle", slice=slice_name, cgroup=group, problem=problem)
        return problem

    def ready(self, slice_name: str, group: str, wait_s: float) -> str | None:
        """None when pods may go into the group now (it gives way), else why not.

        A group found idle but not (or no longer known to be) made idle by this process, e.g.
        left by a previous koordnode, is re-asserted through systemd in the background; one
        that is not idle is prepared, waiting at most `wait_s` (a bound inside the hook's)."""
        giving_way = self._giving_way(group)
        with self._lock:
            ensured = slice_name in self._ensured
        if giving_way and ensured:
            return None
        with self._lock:
            if self._retry_later(slice_name):
                return None if giving_way else self.problems.get(slice_name, "not idle")
        future = self.prepare(slice_name, group)
        if giving_way:
            return None
        try:
            future.result(timeout=max(wait_s, 0.0))
        except Exception:
            pass
        if self._giving_way(group):
            return None
        with self._lock:
            return self.problems.get(slice_name) or f"{slice_name} is being made idle through systemd"

    def check(self, slice_name: str, group: str) -> None:
        """Reconcile: a group slice that gives way no more (its systemd property lost, and not
        at the lowest weight) is made idle through systemd again."""
        with self._lock:
            if self._retry_later(slice_name):
                return
        if not self._giving_way(group):
            self.prepare(slice_name, group)

    def keep_cpuset(self, kubelet_slice: str, nodes: str, *, again: bool = False) -> Future[str | None] | None:
        """Give kubelet's (empty) pod slice of a moved pod AllowedMemoryNodes=``nodes`` in the
        worker, so that systemd keeps cpuset enabled for it (module docstring). Once per slice,
        unless ``again`` (the reconcile pass found the property's effect gone); None when nothing
        was submitted (done, in progress, or a failure less than RETRY_AFTER_S ago)."""
        with self._lock:
            pending = self._cpuset_pending.get(kubelet_slice)
            if pending is not None:
                return None
            if kubelet_slice in self._cpuset_kept and (
                    not again or self._clock() - self._cpuset_at.get(kubelet_slice, 0.0) < RECHECK_AFTER_S):
                return None
            failed_at = self._failed_at.get(kubelet_slice)
            if failed_at is not None and self._clock() - failed_at < RECHECK_AFTER_S:
                return None
            future = self._submit(self._keep_cpuset, kubelet_slice, nodes)
            self._cpuset_pending[kubelet_slice] = future
            return future

    def _keep_cpuset(self, kubelet_slice: str, nodes: str) -> str | None:
        try:
            problem = self._allow_memory_nodes(kubelet_slice, nodes)
        except Exception as exc:  # kubelet's pod then meets its check unprotected, never worse
            problem = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self._cpuset_pending.pop(kubelet_slice, None)
            if problem is None:
                self._cpuset_kept.add(kubelet_slice)
                self._cpuset_at[kubelet_slice] = self._clock()
                self._failed_at.pop(kubelet_slice, None)
                self.problems.pop(kubelet_slice, None)
            else:
                self._failed_at[kubelet_slice] = self._clock()
                self.problems[kubelet_slice] = (f"{kubelet_slice}: AllowedMemoryNodes={nodes} not set ({problem}); "
                                                "kubelet may kill the pod when systemd drops cpuset from its slice")
        if problem is None:
            log.info("kubelet_pod_slice_keeps_cpuset", slice=kubelet_slice, memory_nodes=nodes)
        else:
            log.warning("kubelet_pod_slice_cpuset_not_kept", slice=kubelet_slice, problem=problem)
        return problem

    def forget_kubelet_slice(self, kubelet_slice: str) -> None:
        """The pod is gone: kubelet stops its slice (and systemd drops the property with it)."""
        with self._lock:
            self._cpuset_kept.discard(kubelet_slice)
            self._cpuset_at.pop(kubelet_slice, None)
            self._failed_at.pop(kubelet_slice, None)
            self.problems.pop(kubelet_slice, None)

    def stop_pod_slice(self, slice_name: str, still_unused: Callable[[], bool] | None = None) -> Future[str | None]:
        """Stop an (empty) pod slice of the group in the worker; ``still_unused`` is asked again
        right before (the worker may run seconds later, when a new sandbox is in the slice)."""
        return self._submit(self._stop_logged, slice_name, still_unused)

    def _stop_logged(self, slice_name: str, still_unused: Callable[[], bool] | None = None) -> str | None:
        try:
            if still_unused is not None and not still_unused():
                log.info("be_pod_slice_kept", slice=slice_name, reason="in use again")
                return "in use again"
            problem = self._stop(slice_name)
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if problem is None:
            log.info("be_pod_slice_stopped", slice=slice_name)
        else:
            log.info("be_pod_slice_not_stopped", slice=slice_name, problem=problem)
        return problem

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=False, cancel_futures=True)
