"""The daemon's periodic work: reconcile passes (on a timer, after a reload, when pod facts
change) and the node usage report."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import structlog

from koordnode.hooks.host_apps import HostApplications
from koordnode.hooks.qos_engine import QoSEngine
from koordnode.metrics.recorder import Metrics
from koordnode.model.state import NodeState, NodeView
from koordnode.policy.net import PodNetwork
from koordnode.qos.net_control import NetQoSController
from koordnode.qos.pod_networks import PodNetworks
from koordnode.qos.resctrl_control import ResctrlController, ResctrlPlacement

if TYPE_CHECKING:
    from koordnode.kube.agent import ClusterLink
    from koordnode.qos.node_usage import NodeUsageReporter

log = structlog.get_logger("koordnode")


async def prepare_be_group_once_kubelet_is_up(qos: QoSEngine, every_s: float = 1.0) -> None:
    """Until kubelet has made its top cgroup: looked for once a second (a stat), so that its BE
    group slice is ready before kubelet's first BE pod (hooks/be_group.py)."""
    while not qos.prepare_be_group_once_kubelet_is_up():
        await asyncio.sleep(every_s)


class Reconciler:
    """Puts back what another writer changed: the pods' cgroup values, resctrl groups, tc/nft."""

    def __init__(self, state: NodeState, qos: QoSEngine | None, resctrl: ResctrlController,
                 resctrl_placement: ResctrlPlacement, netqos: NetQoSController, pod_networks: PodNetworks,
                 *, interval_s: Callable[[], float], host_apps: HostApplications | None = None) -> None:
        self.state = state
        self.host_apps = host_apps
        self.qos = qos
        self.resctrl = resctrl
        self.resctrl_placement = resctrl_placement
        self.netqos = netqos
        self.pod_networks = pod_networks
        self._interval_s = interval_s  # [cgroup] reconcile_interval_s of the running config

    async def run(self) -> None:
        if self.host_apps is not None:  # they do not wait for the pods to be known
            await asyncio.to_thread(self._host_apps_pass)
        while True:
            interval = self._interval_s()
            await asyncio.sleep(interval if interval > 0 else 10.0)
            if interval <= 0 or self.state.rebuilt_at is None:
                continue  # disabled, or not before the running pods are known
            await self.reconcile_once()

    async def replan_on(self, facts_changed: asyncio.Event) -> None:
        """Pods whose API facts arrived or changed are planned again (a pass re-plans only
        pods whose inputs changed); bursts of watch events make one pass."""
        while True:
            await facts_changed.wait()
            await asyncio.sleep(0.2)
            facts_changed.clear()
            if self.state.rebuilt_at is not None:
                await self.reconcile_once()

    async def reconcile_once(self) -> None:
        # What the workers need from the state, taken here on the loop; the pods' containers and
        # networks only for the features that use them (a disabled one only removes leftovers).
        view = self.state.view()
        groups = self.resctrl_placement.groups()
        networks = self.pod_networks.for_reconcile()
        classes = await asyncio.to_thread(self._reconcile_pass, view, groups, networks)  # one thread hop
        if classes:
            self.record_classes(classes)

    def _reconcile_pass(self, view: NodeView, groups: dict[str, list[str]],
                        networks: list[PodNetwork]) -> dict[str, tuple[str, str]]:
        """One pass, in a worker thread; returns the pods' classes for the loop to record."""
        classes: dict[str, tuple[str, str]] = {}
        if self.qos is not None:
            try:
                # Not forced: every file is read and compared, and only values another writer
                # changed are written back (a rewrite of the same value changes nothing in the kernel).
                classes = self.qos.reconcile(False, view)
            except Exception:
                log.exception("reconcile_pass_failed")
        self._host_apps_pass()
        try:
            self.resctrl.reconcile(groups)
        except Exception:
            log.exception("resctrl_reconcile_failed")
        try:
            self.netqos.reconcile(networks)
        except Exception:
            log.exception("net_qos_reconcile_failed")
        # Pods come and go: what their bookkeeping freed goes back to the OS as well (0.9 MB
        # after 30 pods came and went behind a real kubelet; the call takes under a millisecond).
        return_free_memory_to_the_os()
        return classes

    def _host_apps_pass(self) -> None:
        if self.host_apps is None:
            return
        try:
            self.host_apps.apply()
        except Exception:
            log.exception("host_applications_failed")

    def record_classes(self, classes: dict[str, tuple[str, str]]) -> None:
        for sandbox_id, (qos_class, why) in classes.items():
            self.state.set_pod_class(sandbox_id, qos_class, why)


async def usage_loop(usage: NodeUsageReporter | None, cluster_of: Callable[[], ClusterLink | None],
                     metrics: Metrics) -> None:
    """The batch allocatable as a metric and in status, API server or not; whether the API
    server answers ([kubernetes], the link a reload may have replaced)."""
    while True:
        await asyncio.sleep(10.0)
        cluster = cluster_of()
        if cluster is not None:
            metrics.kube_api_up.set(1 if cluster.reachable()[0] else 0)
        if usage is None:
            continue
        try:
            await asyncio.to_thread(usage.refresh)  # sets the metric
        except Exception:
            log.exception("node_usage_failed")


def return_free_memory_to_the_os() -> None:
    # Start-up (imports, the state rebuild) leaves freed heap pages in glibc's arenas; give them
    # back so the resident size reflects what the daemon keeps. Not glibc: nothing to do.
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, loaded once (a CDLL load each pass cost more than the trim)."""
    try:
        import ctypes

        return cast("Callable[[int], int]", ctypes.CDLL("libc.so.6").malloc_trim)
    except (OSError, AttributeError):
        return None
