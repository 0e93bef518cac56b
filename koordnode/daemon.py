"""`koordnode run`: wire the proxy, hooks, state and QoS loops together and serve until stopped."""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
import time
from collections.abc import Coroutine
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from koordnode import __version__, sdnotify
from koordnode.tls_modules import let_tls_in
from koordnode.admin.server import AdminServer
from koordnode.config import Config, EngineSettings, HostAppSettings, ManagerSettings, ResctrlSettings
from koordnode.cri.client import CriClient, CriError, RuntimeBackend
from koordnode.cri.rebuild import rebuild, rebuild_until_done
from koordnode.daemon_status import StatusReport
from koordnode.executor.netqos import NetQoSExecutor
from koordnode.executor.originals import OriginalsJournal
from koordnode.executor.restore import RestoreRoots, restore
from koordnode.hooks.cpu_pools import CPUS_OWNER_KOORDNODE
from koordnode.hooks.chain import HookChain, RuntimeHook
from koordnode.hooks.host_apps import HostApplications
from koordnode.hooks.hw_qos import HardwareQoSHook
from koordnode.hooks.be_start import BeStartWatch
from koordnode.hooks.interceptor import ChainInterceptor
from koordnode.hooks.pool_updates import PoolUpdates
from koordnode.hooks.qos_engine import QoSEngine
from koordnode.hooks.qos_hook import QoSHook
from koordnode.hooks.resized import ResizedResources
from koordnode.hooks.state_recorder import StateRecorder
from koordnode.metrics.recorder import METRICS, Metrics
from koordnode.metrics.server import MetricsServer, MetricsStartError, start as start_metrics
from koordnode.model.be_starts import BeStarts
from koordnode.model.cpu_topology import read_numa_memory
from koordnode.model.kubelet_layout import KubeletLayout
from koordnode.model.state import NodeState
from koordnode.nodelock import NodeLock, NodeLockError, lock_path, refuse_if_proxy_serves
from koordnode.periodic import (
    Reconciler, prepare_be_group_once_kubelet_is_up, return_free_memory_to_the_os, usage_loop,
)
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.proxy.handler import InterceptingHandler, ProxyStats
from koordnode.proxy.server import ProxyServer, SocketInUseError
from koordnode.qos.eviction import BeEviction
from koordnode.qos.manager import QoSManager
from koordnode.qos.metrics_feed import PodInterferenceReader, TickMetrics
from koordnode.qos.net_control import NetQoSController
from koordnode.qos.pod_networks import PodNetworks
from koordnode.qos.resctrl_control import ResctrlController, ResctrlPlacement
from koordnode.reload import (
    DryRunSwitch,
    Reload,
    RunningConfig,
    cgroup_section,
    kubelet_layout_of,
    net_section,
    reload_of,
)

if TYPE_CHECKING:
    from koordnode.kube.agent import ClusterLink
    from koordnode.nri.plugin import NriPlugin
    from koordnode.qos.node_usage import NodeUsageReporter

log = structlog.get_logger("koordnode")

SHUTDOWN_GRACE_S = 5.0
# READY is sent once the state is rebuilt, but not later than this: with containerd down,
# waiting for it would make systemd kill and restart koordnode in a loop.
READY_AT_THE_LATEST_S = 30.0


class Daemon:
    """Everything a running koordnode owns, constructed and wired here, started and stopped;
    `koordnode status` reads it through its StatusReport (daemon_status.py)."""

    def __init__(self, config: Config, *, metrics: Metrics = METRICS) -> None:
        self.metrics = metrics
        started_at = time.time()
        self.state = NodeState()
        self.stats = ProxyStats()
        self._background: set[asyncio.Task[Any]] = set()
        self.backend = RuntimeBackend(config.proxy.backend)
        # BE pods the runtime is starting: noted by the interceptor (proxy) or the NRI events,
        # read by the QoS manager (its start allowance) and the engine (the group lifted for it).
        self.be_starts = BeStarts(lambda: self.config.strategy.cpu_suppress.pod_start_max_s)
        be_start_watch = BeStartWatch(self.state, self.be_starts)
        hooks: list[RuntimeHook] = [StateRecorder(self.state)]
        # NRI mode: the engine's pool moves go to the runtime through the plugin (the one channel).
        pool_updates = PoolUpdates() if config.runtime.mode == "nri" else None
        self.qos: QoSEngine | None = None
        self.layout: KubeletLayout | None = None
        self.qos_error: str | None = None
        # The originals of node-level values, kept before koordnode's first write (restore).
        self.originals = OriginalsJournal(config.daemon.state_dir)
        try:
            # Beside the admin socket: koordnode's runtime directory (/var/run/koordnode).
            resized = ResizedResources(Path(config.admin.socket).parent / "kubelet-resized.json")
            executor = CgroupExecutor(Path(config.cgroup.root), originals=self.originals)
            # Where kubelet keeps the pods, resolved here once for the engine and the QoS manager.
            self.layout = KubeletLayout(config.cgroup.driver, config.qos_manager.kubepods_cgroup,
                                        executor.cgroup_exists)
            engine = self.qos = QoSEngine(EngineSettings.of(config), self.state, executor=executor, resized=resized,
                                          be_cpuset=self._be_cpuset, pool_updates=pool_updates, layout=self.layout,
                                          be_starting=lambda: self.be_starts.in_flight() > 0)
            hooks.append(QoSHook(self.qos))
        except Exception as exc:  # the proxy must serve even where QoS cannot be applied
            self.qos_error = f"QoS hooks disabled: {exc}"
            log.error("qos_hooks_disabled", detail="proxying without them", error=str(exc))
        resctrl_settings = ResctrlSettings.of(config)
        self.resctrl = ResctrlController(
            resctrl_settings.resctrl, resctrl_settings.classes,
            threads_of=partial(self.qos.executor.read_pids, threads=True) if self.qos is not None else _threads_unknown,
            originals=self.originals,
        )
        self.resctrl_placement = ResctrlPlacement(self.resctrl, self.state, config.cgroup)
        self.netqos = NetQoSController(config.net, NetQoSExecutor(originals=self.originals))
        self.pod_networks = PodNetworks(self.state, self.netqos, self.backend, self.spawn)
        hooks.append(HardwareQoSHook(networks=self.pod_networks, resctrl=self.resctrl_placement))
        self.eviction = BeEviction(self.state, self.backend, metrics)
        self.qos_manager: QoSManager | None = None
        if self.qos is not None:
            try:
                self.qos_manager = QoSManager(
                    ManagerSettings.of(config), self.state, engine.executor,
                    procfs_root=config.procfs.root,
                    layout=self.layout,
                    originals=self.originals,
                    evict=self.eviction,
                    # [strategy.memory_qos]: the pods' memory values when the engine's pass does not keep them.
                    memory_plan=engine.memory_fallback,
                    reserved_cpus=engine.reserved_cpus,
                    on_tick=TickMetrics(metrics),
                    be_starts=self.be_starts,
                )
            except Exception as exc:
                log.error("qos_manager_disabled", error=str(exc))
                self.qos_error = f"QoS manager disabled: {exc}"
        self.chain = HookChain(
            hooks,
            timeout_s=config.proxy.hook_timeout_ms / 1000.0,
            failure_policy=config.proxy.failure_policy,
        )
        self.handler = InterceptingHandler(ChainInterceptor(self.chain, self.state.pod_labels_for, metrics,
                                                            be_starts=be_start_watch),
                                           self.stats, on_completed=metrics.observe_cri_call)
        self.server = ProxyServer(config.proxy.listen, config.proxy.backend, self.handler)
        self.mode = config.runtime.mode
        self.nri: NriPlugin | None = None
        if self.mode == "nri":
            from koordnode.nri.plugin import NriPlugin  # only NRI mode loads it

            self.nri = NriPlugin(config.nri.socket, config.nri.plugin_name, config.nri.plugin_index,
                                 chain=self.chain, state=self.state, engine=self.qos,
                                 on_synchronized=self._adopted_from_nri, procfs_root=config.procfs.root,
                                 pool_updates=pool_updates, be_starts=be_start_watch)
        self.node_lock = NodeLock(lock_path(config.admin.socket))
        self.metrics_server: MetricsServer | None = None
        self.interference = PodInterferenceReader(self.state, config.cgroup, config.procfs.root)
        self._stop = asyncio.Event()
        self._rebuilt = asyncio.Event()
        self.host_apps: HostApplications | None = None
        if self.qos is not None:
            self.host_apps = HostApplications(HostAppSettings.of(config), engine.executor, lambda: engine.features)
        self.reconciler = Reconciler(self.state, self.qos, self.resctrl, self.resctrl_placement, self.netqos,
                                     self.pod_networks, interval_s=lambda: self.config.cgroup.reconcile_interval_s,
                                     host_apps=self.host_apps)
        # Every part that writes to the kernel, changes CRI calls or evicts: dry run switches them.
        dry_run_parts: list[DryRunSwitch] = [
            self.handler, self.resctrl, self.netqos, self.eviction,
            *([self.qos.executor] if self.qos is not None else []),
            *([self.qos_manager] if self.qos_manager is not None else []),
            *([self.nri] if self.nri is not None else []),
        ]
        # What a reload hands new settings to (in a worker thread, in this order): each component
        # with the settings it reads.
        reloads: list[Reload[Any]] = [
            *([reload_of(kubelet_layout_of, self.layout)] if self.layout is not None else []),
            *([reload_of(EngineSettings.of, self.qos)] if self.qos is not None else []),
            *([reload_of(ManagerSettings.of, self.qos_manager)] if self.qos_manager is not None else []),
            *([reload_of(HostAppSettings.of, self.host_apps)] if self.host_apps is not None else []),
            reload_of(ResctrlSettings.of, self.resctrl),
            reload_of(cgroup_section, self.resctrl_placement),
            reload_of(net_section, self.netqos),
            reload_of(cgroup_section, self.interference),
        ]
        self.running_config = RunningConfig(config, metrics=metrics, chain=self.chain, server=self.server,
                                            backend=self.backend, reloads=reloads, dry_run_parts=dry_run_parts,
                                            restart_metrics=self._restart_metrics,
                                            reconcile=self.reconciler.reconcile_once,
                                            restart_cluster=self._restart_cluster_link)
        self._facts_changed = asyncio.Event()
        self.usage: NodeUsageReporter | None = None
        if self.qos_manager is not None:
            from koordnode.qos.node_usage import NodeUsageReporter

            self.usage = NodeUsageReporter(self.qos_manager, config.procfs.root, config.cgroup.root, metrics,
                                           facts_of=self.eviction.facts_of)
        self.cluster: ClusterLink | None = None
        self.cluster_error: str | None = None
        self._cluster_task: asyncio.Task[Any] | None = None
        self._replanning = False  # the reconciler's replan on pod-fact changes is running
        if config.kubernetes.enable:
            self._start_cluster_link(config)
        self.status_report = StatusReport(
            self.running_config, mode=self.mode, started_at=started_at, state=self.state, backend=self.backend,
            stats=self.stats, handler=self.handler, chain=self.chain, metrics=metrics, qos=self.qos,
            qos_error=self.qos_error, qos_manager=self.qos_manager, usage=self.usage, cluster=self.cluster,
            cluster_error=self.cluster_error, nri=self.nri, resctrl=self.resctrl, netqos=self.netqos,
            host_apps=self.host_apps)
        self.admin = AdminServer(config.admin.socket, self.status_report.status)

    @property
    def config(self) -> Config:
        """The running config (a reload replaces it)."""
        return self.running_config.config

    @property
    def dry_run(self) -> bool:
        return self.running_config.dry_run

    # ---- [kubernetes] ---------------------------------------------------------------------

    def _start_cluster_link(self, config: Config) -> None:
        from koordnode.kube.agent import ClusterLink  # only a node in a cluster loads it
        from koordnode.kube.credentials import CredentialsError

        usage = self.usage
        try:
            self.cluster = ClusterLink(config.kubernetes, apply_nodeslo=self.running_config.apply_nodeslo,
                                       on_pod_facts=self._facts_changed.set,
                                       node_metric_status=usage.node_metric_status if usage else _not_measured,
                                       memory_total_bytes=usage.memory_total_bytes if usage else _not_measured,
                                       node_topology=self._node_topology,
                                       observe=self.metrics.observe_cluster)
        except (CredentialsError, ValueError) as exc:
            # The node keeps working from its file: say why the cluster part is off.
            self.cluster_error = f"[kubernetes] not started: {exc}"
            log.error("kubernetes_not_started", detail="working from the local file alone", error=str(exc))
            return
        # Made after the QoS side, whose numbers it reports: those two learn of it now.
        self.eviction.cluster = self.cluster
        if self.qos is not None:
            self.qos.set_pod_facts(self.cluster.facts_of)

    async def _run_cluster(self) -> None:
        if self.cluster is None:
            return
        try:
            await self.cluster.run(self._stop)
        except Exception:
            log.exception("kubernetes_link_failed")

    def _spawn_cluster(self) -> None:
        if self.cluster is None:
            return
        self._cluster_task = self.spawn(self._run_cluster())
        if not self._replanning:
            self._replanning = True
            self.spawn(self.reconciler.replan_on(self._facts_changed))

    async def _restart_cluster_link(self, config: Config) -> None:
        """SIGHUP changed [kubernetes]: the old link's watches and reports end, a link from the
        new section starts (or none). Its NodeSLO values stay until the new link's first one;
        with [kubernetes] off the reload has dropped them."""
        if self._cluster_task is not None:
            self._cluster_task.cancel()
            await asyncio.gather(self._cluster_task, return_exceptions=True)
            self._cluster_task = None
        self.cluster, self.cluster_error = None, None
        self.eviction.cluster = None
        if self.qos is not None:
            self.qos.set_pod_facts(None)
        if config.kubernetes.enable:
            let_tls_in()  # left out when the daemon started without [kubernetes]
            self._start_cluster_link(config)
        self.status_report.cluster, self.status_report.cluster_error = self.cluster, self.cluster_error
        self._spawn_cluster()

    def _node_topology(self) -> Any:
        """The NodeResourceTopology's facts (kube/topology.py): the engine's topology and pools."""
        from koordnode.kube.topology import TopologyFacts

        engine = self.qos
        if engine is None:
            return None
        with engine.lock:
            pools = engine.pools.status()
        topology = engine.topology
        memory = read_numa_memory(self.config.sysfs.root, topology.numa_nodes.keys())
        if pools.get("owner") != CPUS_OWNER_KOORDNODE:  # kubelet's static CPU manager places containers
            return TopologyFacts(topology, share_pool=topology.online, be_pool=topology.online,
                                 reserved=frozenset(), numa_memory_bytes=memory, kubelet_static=True)
        return TopologyFacts(topology, share_pool=frozenset(pools["share_pool"]), be_pool=frozenset(pools["be_pool"]),
                             reserved=frozenset(pools["reserved"]), numa_memory_bytes=memory)

    def _be_cpuset(self) -> frozenset[int] | None:
        """The QoS manager's BE cpuset for the engine (built after the engine, which it uses)."""
        return self.qos_manager.be_cpuset() if self.qos_manager is not None else None

    # ---- lifecycle ------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    @property
    def endpoint(self) -> str:
        return self.config.nri.socket if self.mode == "nri" else self.config.proxy.listen

    async def start(self) -> None:
        self.node_lock.acquire(self.mode, self.endpoint)
        try:
            if self.mode == "nri":
                refuse_if_proxy_serves(self.config.proxy.listen)
            else:
                await self.server.start()
            await self.admin.start()
        except BaseException:
            self.node_lock.release()
            raise
        self.metrics.follow_hook_failures(self.chain.failure_counts)
        self.metrics.follow_proxy_stats(self.stats)
        self.metrics.follow_interference(self.interference)
        self._start_metrics()
        if self.nri is not None:
            self.spawn(self._run_nri())
        else:
            # Serve first: if the runtime is down, calls fail as they would without us, and the
            # state is rebuilt once it answers.
            self.spawn(rebuild_until_done(self.state, self.config.proxy.backend, on_done=self._adopt))
        self.spawn(self.reconciler.run())
        if self.qos is not None:
            self.spawn(prepare_be_group_once_kubelet_is_up(self.qos))
        self.spawn(self._notify_ready())
        self.spawn(sdnotify.watchdog_loop(self._stop))
        if self.qos_manager is not None:
            self.spawn(self._run_qos_manager())
        self.spawn(usage_loop(self.usage, lambda: self.cluster, self.metrics))
        self._spawn_cluster()

    async def _run_nri(self) -> None:
        """NRI mode: the runtime's Synchronize is the state; its CRI view only tells which
        resources kubelet itself asked for (NRI adjustments change the OCI spec, not that)."""
        if self.nri is None:
            return
        kubelet_view: NodeState | None = None
        cri = CriClient(self.config.proxy.backend)
        try:
            read = NodeState()
            await asyncio.wait_for(rebuild(read, cri), 10.0)
            kubelet_view = read
        except (TimeoutError, CriError, OSError) as exc:
            log.warning("kubelet_resources_not_read",
                        detail="kubelet's container resources not read from CRI; the runtime's are used",
                        backend=self.config.proxy.backend, error=str(exc) or type(exc).__name__)
        finally:
            await cri.close()
        try:
            await self.nri.run(self._stop, kubelet_view=kubelet_view)
        except Exception:
            log.exception("nri_plugin_failed")

    async def _adopted_from_nri(self) -> None:
        # Allocations were restored during Synchronize; one full pass writes the cgroup-level
        # values NRI cannot carry (pod cpu.idle, memory protection, blkio) for every pod.
        self._rebuilt.set()
        await self.reconciler.reconcile_once()

    async def _run_qos_manager(self) -> None:
        await self._rebuilt.wait()  # strategies need to know which pods are LS and which BE
        if self.qos_manager is None:
            return
        try:
            await self.qos_manager.run(self._stop)
        except Exception:
            log.exception("qos_manager_failed")

    def _start_metrics(self) -> None:
        try:
            self.metrics_server = start_metrics(self.config.metrics, self.metrics)
        except MetricsStartError as exc:
            log.error("metrics_endpoint_not_started", error=str(exc))
            self.metrics_server = None

    def _restart_metrics(self, changed: bool) -> None:
        """After a reload: the endpoint again if [metrics] changed, or if it did not start before."""
        if changed or self.metrics_server is None:
            if self.metrics_server is not None:
                self.metrics_server.stop()
            self._start_metrics()

    async def _notify_ready(self) -> None:
        serving = (f"NRI plugin on {self.config.nri.socket}" if self.mode == "nri"
                   else f"serving CRI on {self.config.proxy.listen}")
        try:
            await asyncio.wait_for(self._rebuilt.wait(), READY_AT_THE_LATEST_S)
            sdnotify.ready(f"{serving}{self._dry_run_note()}")
        except TimeoutError:
            sdnotify.ready(f"{serving}; runtime not answering yet{self._dry_run_note()}")

    def _dry_run_note(self) -> str:
        return " (dry run: nothing written)" if self.dry_run else ""

    async def _adopt(self) -> None:
        if self.qos is not None:
            # The worker gets the loop's snapshot and hands back what the loop records.
            classes = await asyncio.to_thread(self.qos.adopt, self.state.view())
            self.reconciler.record_classes(classes)
        self._rebuilt.set()

    def request_stop(self) -> None:
        self._stop.set()

    async def serve_forever(self) -> None:
        await self._stop.wait()

    async def stop(self) -> None:
        sdnotify.stopping()
        if self.mode != "nri":
            await self.server.stop(SHUTDOWN_GRACE_S)
        await self.admin.stop()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.backend.close()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        self.chain.close()
        if self.config.daemon.restore_on_stop and not self.dry_run:
            await asyncio.to_thread(self._restore_originals)
        self.node_lock.release()

    def _restore_originals(self) -> None:
        """[daemon] restore_on_stop: node-level values back to their originals, once every writer
        has stopped (a reconcile pass still finishing in its thread writes nothing more)."""
        if self.qos is not None:
            self.qos.executor.dry_run = True
        if self.qos_manager is not None:
            self.qos_manager.set_dry_run(True)
        self.resctrl.dry_run = self.netqos.dry_run = True
        cfg = self.config
        report = restore(self.originals, RestoreRoots(cgroup=cfg.cgroup.root, procfs=cfg.procfs.root,
                                                      resctrl=cfg.resctrl.root, resctrl_prefix=cfg.resctrl.group_prefix))
        for action in report.actions:
            log.info("restored_on_stop", kind=action.kind, target=action.target, outcome=action.outcome,
                     detail=action.detail)
        if not report.ok:
            log.error("restore_on_stop_incomplete", error=report.error,
                      left=[a.line() for a in report.actions if not a.done])


def _not_measured(*_: Any) -> None:
    return None  # without the QoS manager, nothing is measured to report


def _threads_unknown(cgroup: str) -> list[int] | None:
    return None  # without the QoS engine's executor, nobody reads cgroup tasks


async def _main(config: Config) -> int:
    daemon = Daemon(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.request_stop)
    loop.add_signal_handler(signal.SIGHUP, lambda: daemon.spawn(daemon.running_config.reload()))
    try:
        await daemon.start()
    except (SocketInUseError, NodeLockError, OSError) as exc:
        log.error("cannot_start", error=str(exc))
        return 1
    # Everything allocated so far lives as long as the daemon: keep the collector from walking
    # it again and again (full collections of those objects are the relay's latency spikes).
    gc.collect()
    gc.freeze()
    return_free_memory_to_the_os()
    # QoS ticks and reconcile passes run in threads; a relayed call waiting for the GIL waits
    # at most one switch interval (5 ms by default) for them: keep that wait short.
    sys.setswitchinterval(0.0005)
    if daemon.mode == "nri":
        log.info("koordnode_started", version=__version__, mode="nri", nri_socket=config.nri.socket,
                 backend=config.proxy.backend, dry_run=config.daemon.dry_run)
    else:
        log.info("koordnode_started", version=__version__, mode="proxy", listen=config.proxy.listen,
                 backend=config.proxy.backend, dry_run=config.daemon.dry_run)
    await daemon.serve_forever()
    log.info("shutting_down")
    await daemon.stop()
    log.info("koordnode_stopped")
    return 0


def run(config: Config) -> int:
    return asyncio.run(_main(config))
