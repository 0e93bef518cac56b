"""koordnode's BE group (model/be_group.py) on the node: BE pods moved into it at RunPodSandbox,
the group kept giving way to LS, pod cgroups and slices left in it cleaned up.

Under the cgroupfs driver the group is a directory koordnode makes and marks idle (cpu.idle = 1).
Under the systemd driver, containerd's runc places a sandbox whose cgroup parent is
`kubepods-koordnode_be-pod<uid>.slice` in a scope inside that slice, and systemd starts the
slice and its parents (`kubepods-koordnode_be.slice`, named by the dashes) on demand. The
group slice is therefore made idle through systemd (`CPUWeight=idle`), so that systemd itself
writes cpu.idle = 1 whenever it realizes the slice again. Talking to systemd takes a fork and
a D-Bus round trip (tens of ms, more on a busy node), too slow for the CRI path: the group is
prepared in a worker thread (as soon as kubelet has made its top slice, and again whenever it
is found not giving way), and RunPodSandbox only moves a pod into a group that gives way: it
reads cpu.idle = 1, or the lowest weight, the state the QoS manager's cpu_suppress keeps it in
while LS is quiet (written to the cgroup files directly; should systemd realize the slice again,
it is idle until the next tick). Pod slices in the group are koordnode's to stop (systemd keeps
a slice it started until told otherwise).

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

from koordnode.config.components import EngineSettings
from koordnode.cri import api_pb2 as pb
from koordnode.executor import systemd
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.executor.paths import CgroupVersion, UnsafePathError, pod_cgroup_path
from koordnode.metrics.recorder import METRICS
from koordnode.model.be_group import (
    KUBELET_POD_CONTROLLERS, be_group_of, be_group_parent, in_be_group, kubelet_parent_of, systemd_group_slice,
)
from koordnode.model.kernel import is_lowest_cpu_weight
from koordnode.model.kubelet_layout import KubeletLayout
from koordnode.model.qos_class import ClassDecision, QoSClass
from koordnode.model.state import POD_READY, NodeState, NodeView, PodRecord
from koordnode.policy.plan import CgroupWrite

log = structlog.get_logger("koordnode.be_group")

# At most this many leftover pod slices are stopped per reconcile pass (each is a systemctl call).
MAX_STOPS_PER_PASS = 20
# After a failed attempt (no systemd, systemd < 252, ...) the next one waits this long: BE pods
# meanwhile stay in kubelet's tier at no cost to the CRI call.
RETRY_AFTER_S = 60.0
# kubelet's pod slice found without its property (or the call failed): asked again at most this
# often (kubelet kills the pod at its next sync while cpuset is missing, so not RETRY_AFTER_S).
RECHECK_AFTER_S = 10.0
# A pod cgroup in the BE group with no pod recorded is removed by the reconcile pass once older
# than this: RunPodSandbox creates it before koordnode records the pod.
BE_GROUP_SWEEP_AGE_S = 60.0


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


class BeGroup:
    """The BE group's life on the node: BE pods placed into it, the group made and kept giving
    way, pod cgroups and slices left behind removed. Called under the engine's lock, apart from
    `slices`' worker."""

    def __init__(self, settings: EngineSettings, executor: CgroupExecutor, state: NodeState,
                 layout: KubeletLayout, *, memory_nodes: str = "0",
                 starting: Callable[[], bool] | None = None) -> None:
        self.settings = settings
        self.starting = starting  # a BE pod is starting: cpu_suppress may have lifted the group
        self.memory_nodes = memory_nodes  # AllowedMemoryNodes for kubelet's pod slices
        self.executor = executor
        self.state = state
        self.layout = layout
        self.notes: list[str] = []  # why pods stayed in kubelet's tier, for status
        self._groups: set[str] = set()  # cgroupfs BE groups seen, swept by the reconcile pass
        # systemd driver: the group slices, made idle through systemd off the CRI path.
        self.slices = SystemdBeGroup(self.gives_way)

    def reconfigure(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.notes = []

    def _pod_cgroup(self, cgroup_parent: str) -> str:
        return pod_cgroup_path(cgroup_parent, self.layout.driver)

    def status_notes(self) -> list[str]:
        problems = dict(self.slices.problems)
        return [f"BE group slice {name} not idle (BE pods stay in kubelet's slice): {problem}"
                for name, problem in sorted(problems.items())]

    # ---- the CRI path ---------------------------------------------------------------------

    def place(self, cfg: pb.PodSandboxConfig, decision: ClassDecision) -> str | None:
        """RunPodSandbox: move a BestEffort pod of class BE into the idle BE group by rewriting
        its cgroup parent. Returns the new parent, or None when the pod stays where kubelet
        put it (option off, not BestEffort, or the group could not be made idle: fail-open)."""
        if not self.settings.cgroup.be_idle_group or decision.qos_class is not QoSClass.BE:
            return None
        new_parent = be_group_parent(cfg.linux.cgroup_parent)
        if new_parent is None:
            return None
        if systemd_group_slice(new_parent) is not None and not self.settings.cgroup.be_idle_group_systemd:
            return None
        problem = self._ensure(new_parent)
        if problem is not None:
            log.warning("be_pod_not_moved_to_be_group",
                        detail="BE pod stays in kubelet's besteffort tier: the BE group is not idle",
                        pod=f"{cfg.metadata.namespace}/{cfg.metadata.name}", problem=problem)
            self.notes = list(dict.fromkeys([*self.notes, f"BE group unavailable: {problem}"]))
            return None
        kubelet_parent = cfg.linux.cgroup_parent
        cfg.linux.cgroup_parent = new_parent
        if systemd_group_slice(new_parent) is not None:
            self._keep_kubelet_slice_cpuset(kubelet_parent)
        return new_parent

    def _keep_kubelet_slice_cpuset(self, kubelet_parent: str, *, again: bool = False) -> None:
        """kubelet's pod slice of a pod moved into the systemd group stays empty; on cgroup v2
        kubelet kills the pod once systemd drops cpuset from that slice (module docstring): the
        slice is given a property that needs cpuset, in the systemd worker."""
        if self.executor.version is not CgroupVersion.V2 or self.executor.dry_run:
            return
        self.slices.keep_cpuset(kubelet_parent.strip("/").rsplit("/", 1)[-1], self.memory_nodes, again=again)

    def has_kubelet_slice(self, cgroup_parent: str) -> bool:
        """Whether a pod is one check_kubelet_slice looks after (cgroup v2, in the systemd group):
        a string test, for the event loop to decide whether there is file work at all."""
        return (self.executor.version is CgroupVersion.V2 and not self.executor.dry_run
                and systemd_group_slice(cgroup_parent) is not None)

    def check_kubelet_slice(self, cgroup_parent: str) -> None:
        """kubelet's pod slice of a pod in the systemd group keeps the controllers kubelet
        checks for: one missing in the slice's cgroup.controllers (systemd dropped it before the
        property reached it, which took minutes on a busy systemd in the VM lane) is enabled
        again in its parent at once, as kubelet's own cgroup library does; a slice without its
        own cpuset.mems (the property lost: kubelet made the slice again, or an older koordnode
        moved the pod) gets the property again. Reads two files when all is well. Called after
        RunPodSandbox and StartContainer (runc started a scope, and systemd realizes kubelet's
        tier with it) and by the reconcile pass."""
        if not self.has_kubelet_slice(cgroup_parent):
            return
        kubelet_parent = kubelet_parent_of(cgroup_parent)
        if kubelet_parent is None:
            return
        try:
            kubelet_cgroup = self._pod_cgroup(kubelet_parent)
            if not self.executor.cgroup_exists(kubelet_cgroup):
                return
            enabled, problem = self.executor.enable_subtree_controllers(
                kubelet_cgroup.rsplit("/", 1)[0] or "/", KUBELET_POD_CONTROLLERS)
            if enabled or problem:
                log.warning("kubelet_pod_slice_controllers_restored" if enabled else
                            "kubelet_pod_slice_controllers_not_restored", cgroup=kubelet_cgroup,
                            controllers=enabled, problem=problem)
            if self.executor.read(kubelet_cgroup, "cpuset.mems"):
                return
        except (OSError, UnsafePathError):
            return
        self._keep_kubelet_slice_cpuset(kubelet_parent, again=True)

    def follow_sandbox_parent(self, req: pb.CreateContainerRequest) -> None:
        """CreateContainer: containerd takes the container's cgroup parent from the request's
        sandbox config, which kubelet fills with its own parent: point it where the sandbox is."""
        kubelet_parent = req.sandbox_config.linux.cgroup_parent
        pod = self.state.pods.get(req.pod_sandbox_id)
        if pod is not None:
            if in_be_group(pod.cgroup_parent) and pod.cgroup_parent != kubelet_parent:
                req.sandbox_config.linux.cgroup_parent = pod.cgroup_parent
            return
        # Not recorded (e.g. the state is being rebuilt): the pod cgroup on disk tells.
        moved = be_group_parent(kubelet_parent)
        if moved is None:
            return
        try:
            if self.executor.cgroup_exists(self._pod_cgroup(moved)):
                req.sandbox_config.linux.cgroup_parent = moved
        except UnsafePathError:
            return

    def gives_way(self, group: str) -> bool:
        """The group yields to LS: idle, or the lowest weight (v1 cpu.shares 2, v2 cpu.weight 1),
        the state the QoS manager's cpu_suppress keeps it in while LS is quiet; or, while a BE pod
        is starting, whatever cpu_suppress's start allowance made it (it restores the group after)."""
        if self.executor.read(group, "cpu.idle") == "1":
            return True
        if self.starting is not None and self.starting():
            return True
        v2 = self.executor.version is CgroupVersion.V2
        return is_lowest_cpu_weight(self.executor.read(group, "cpu.shares"), v2) is True

    def gives_way_safely(self, group: str) -> bool:
        try:
            return self.gives_way(group)
        except (OSError, UnsafePathError):
            return False

    def _ensure(self, pod_parent: str) -> str | None:
        """Make the BE group of a pod parent exist and give way (a new group is made idle; the
        QoS manager decides from there); the problem, or None."""
        try:
            group = be_group_of(self._pod_cgroup(pod_parent))
        except UnsafePathError as exc:
            return str(exc)
        if self.executor.dry_run:  # the request diff shows the move; nothing is created
            log.info("dry_run_would_make_be_group_idle", group=group)
            return None
        slice_name = systemd_group_slice(pod_parent)
        if slice_name is not None:
            # systemd owns the slice (and starts it with the pod's): it must know it is idle.
            # Half the hook's time bound at most: the call goes on without the move after that.
            wait_s = self.settings.proxy.hook_timeout_ms / 2000
            return self.slices.ready(slice_name, group, wait_s)
        try:
            self.executor.make_cgroup(group, "cpu")
        except (OSError, UnsafePathError) as exc:
            return f"cannot create {group}: {exc}"
        self._groups.add(group)
        if self.gives_way_safely(group):
            return None
        result = self.executor.apply([CgroupWrite(group, "cpu.idle", 1, "koordnode BE group")])[0]
        METRICS.record_writes([result])
        return None if result.ok else f"cpu.idle on {group}: {result.status.value}: {result.detail}"

    def remove_pod_cgroup(self, cgroup_parent: str, *, removed: bool = True) -> None:
        """After StopPodSandbox / RemovePodSandbox: kubelet removes its own pod cgroup, the one
        in the BE group is koordnode's to remove (runc never removes a parent).

        A systemd pod slice is stopped at RemovePodSandbox only (``removed``): after
        StopPodSandbox kubelet may start the pod's next sandbox at once, in the same slice (its
        name is the pod's uid), and stopping the slice then kills that sandbox too -- with the
        real kubelet in the VM lane a BE pod was recreated again and again that way. A slice
        left by a stop without a removal goes with the reconcile pass's sweep (empty, a minute old,
        no pod recorded in it)."""
        if not in_be_group(cgroup_parent):
            return
        if systemd_group_slice(cgroup_parent) is not None:
            if removed:
                self._stop_pod_slice(cgroup_parent)
                kubelet_parent = kubelet_parent_of(cgroup_parent)
                if kubelet_parent is not None:
                    self.slices.forget_kubelet_slice(kubelet_parent.strip("/").rsplit("/", 1)[-1])
            return
        try:
            pod_cgroup = self._pod_cgroup(cgroup_parent)
            problems = self.executor.remove_cgroup(pod_cgroup)
        except UnsafePathError as exc:
            problems = [str(exc)]
        if problems:
            log.info("be_pod_cgroup_not_removed_yet", cgroup_parent=cgroup_parent, problems=problems)

    def _stop_pod_slice(self, cgroup_parent: str) -> bool:
        """systemd keeps a pod slice it started for a scope after the scope is gone: stop it
        once empty (no scope left below it). True when a stop was requested."""
        if self.executor.dry_run:
            return False
        try:
            pod_cgroup = self._pod_cgroup(cgroup_parent)
            if not self.executor.cgroup_exists(pod_cgroup) or self.executor.child_cgroups(pod_cgroup) \
                    or self.executor.read_pids(pod_cgroup):
                return False
        except UnsafePathError:
            return False
        slice_name = cgroup_parent.strip("/").rsplit("/", 1)[-1]

        def still_unused() -> bool:
            """Checked again in the worker right before the stop: a sandbox started in the slice
            since (the pod's next one) keeps it."""
            if any(pod.state == POD_READY and pod.cgroup_parent.strip("/").rsplit("/", 1)[-1] == slice_name
                   for pod in self.state.view().pods.values()):
                return False
            try:
                return not (self.executor.child_cgroups(pod_cgroup) or self.executor.read_pids(pod_cgroup))
            except (OSError, UnsafePathError):
                return False

        self.slices.stop_pod_slice(slice_name, still_unused)
        return True

    # ---- whole-node passes ----------------------------------------------------------------

    def _systemd_groups(self, view: NodeView) -> dict[str, str]:
        """Group slice -> its cgroup, for the systemd driver: the one beside kubelet's tiers
        (from the layout, once kubelet has made its top slice) and those of recorded pods."""
        cg = self.settings.cgroup
        if not (cg.be_idle_group and cg.be_idle_group_systemd) or self.executor.dry_run:
            return {}
        groups: dict[str, str] = {}
        paths = self.layout.paths()
        default = paths.systemd_be_group
        # Only beside a kubepods slice kubelet made: starting the group would start its parents.
        if default is not None and self.executor.cgroup_exists(paths.kubepods):
            groups[default[0]] = default[1]
        for pod in view.pods.values():
            slice_name = systemd_group_slice(pod.cgroup_parent)
            if slice_name is None:
                continue
            try:
                groups[slice_name] = be_group_of(self._pod_cgroup(pod.cgroup_parent))
            except UnsafePathError:
                continue
        return groups

    def prepare(self, view: NodeView) -> None:
        """At start, before the first BE pod arrives: its group slice made idle through systemd
        (in the worker)."""
        for slice_name, group in self._systemd_groups(view).items():
            self.slices.prepare(slice_name, group)

    def prepare_once_kubelet_is_up(self) -> bool:
        """koordnode usually starts before kubelet, which makes its top cgroup at its own start
        and runs its first pods right after: the group slice beside the tiers is prepared as soon
        as that cgroup exists (asked about once a second until then), not at the next reconcile
        pass, so that the first BE pod finds the group idle instead of waiting on systemd in its
        RunPodSandbox (seconds on a loaded node, past the hook's bound: the pod then stays in
        kubelet's tier for its life). A stat per call. True once there is nothing left to wait
        for: kubelet's top cgroup exists (its group slice, if any, handed to the worker; the
        reconcile pass keeps it from there), or no systemd group is wanted at all."""
        cg = self.settings.cgroup
        if not (cg.be_idle_group and cg.be_idle_group_systemd) or self.executor.dry_run:
            return True
        if self.layout.driver == "cgroupfs":
            return True  # the group is a directory made in the hook itself, in microseconds
        paths = self.layout.paths()
        try:
            if not self.executor.cgroup_exists(paths.kubepods):
                return False
        except UnsafePathError:
            return True  # a configured kubepods outside the roots: nothing to prepare, ever
        default = paths.systemd_be_group
        if default is not None:
            self.slices.check(*default)  # made idle through systemd unless it gives way already
        return True

    def sweep_systemd(self, view: NodeView) -> None:
        """systemd driver: a group slice that lost its idleness is made idle through systemd
        again; pod slices of pods that are gone (koordnode stopped in between), empty and a
        minute old, are stopped."""
        live = {pod.cgroup_parent.strip("/").rsplit("/", 1)[-1] for pod in view.pods.values()}
        for pod in view.pods.values():
            if pod.state == POD_READY:
                self.check_kubelet_slice(pod.cgroup_parent)
        stops = 0
        for slice_name, group in self._systemd_groups(view).items():
            self.slices.check(slice_name, group)
            for child, age_s in self.executor.child_cgroups(group).items():
                name = child.rsplit("/", 1)[-1]
                if name in live or systemd_group_slice(name) is None or age_s < BE_GROUP_SWEEP_AGE_S:
                    continue
                if stops < MAX_STOPS_PER_PASS and self._stop_pod_slice(name):
                    stops += 1

    def sweep(self, view: NodeView, pod_cgroup_of: Callable[[PodRecord], str]) -> None:
        """Remove pod cgroups left in the BE group by pods that are gone (koordnode stopped
        between a pod's removal and its clean-up). Only empty ones go (rmdir), and only after a
        minute: a pod being created has its cgroup before koordnode records it.
        `pod_cgroup_of`: a recorded pod's cgroup (raises UnsafePathError)."""
        live: set[str] = set()
        for pod in view.pods.values():
            if in_be_group(pod.cgroup_parent) and systemd_group_slice(pod.cgroup_parent) is None:
                try:
                    cgroup = pod_cgroup_of(pod)
                except UnsafePathError:
                    continue
                live.add(cgroup)
                self._groups.add(be_group_of(cgroup))
        for group in list(self._groups):
            for child, age_s in self.executor.child_cgroups(group, skip=live).items():
                name = child.rsplit("/", 1)[-1]
                if not name.startswith("pod") or age_s < BE_GROUP_SWEEP_AGE_S:
                    continue
                problems = self.executor.remove_cgroup(child)
                if not problems:
                    log.info("leftover_be_pod_cgroup_removed", cgroup=child)

    def close(self) -> None:
        self.slices.close()
