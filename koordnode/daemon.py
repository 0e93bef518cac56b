"""`koordnode run`: wire the proxy, hooks, state and QoS loops together and serve until stopped."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import structlog

from koordnode import __version__, sdnotify
from koordnode.admin.server import AdminServer
from koordnode.config import (
    CgroupConfig,
    Config,
    ConfigError,
    EngineSettings,
    ManagerSettings,
    NetQoSConfig,
    ResctrlSettings,
    key_sources,
    reload_config,
    to_dict,
    with_nodeslo,
)
from koordnode.cri import api_pb2 as pb
from koordnode.cri.client import CriClient, CriError, RuntimeBackend
from koordnode.cri.kubelet_calls import kubelet_view
from koordnode.cri.methods import RUNTIME_SERVICE
from koordnode.cri.rebuild import rebuild, rebuild_until_done
from koordnode.executor.netqos import NetQoSExecutor
from koordnode.executor.originals import OriginalsJournal
from koordnode.executor.restore import RestoreRoots, restore
from koordnode.hooks.chain import HookChain, RuntimeHook
from koordnode.hooks.hw_qos import HardwareQoSHook
from koordnode.hooks.interceptor import ChainInterceptor
from koordnode.hooks.pool_updates import PoolUpdates
from koordnode.hooks.qos_engine import QoSEngine
from koordnode.hooks.qos_hook import QoSHook
from koordnode.hooks.resized import ResizedResources
from koordnode.hooks.state_recorder import StateRecorder
from koordnode.logsetup import configure_logging
from koordnode.metrics import METRICS, Metrics, MetricsServer, MetricsStartError
from koordnode.metrics import start as start_metrics
from koordnode.model.kubelet_layout import KubeletLayout
from koordnode.model.state import NodeState, NodeView
from koordnode.nodelock import NodeLock, NodeLockError, lock_path
from koordnode.policy.net import PodNetwork
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.proxy.handler import InterceptingHandler, ProxyStats
from koordnode.proxy.server import ProxyServer, SocketInUseError
from koordnode.qos.eviction import BeEviction
from koordnode.qos.manager import QoSManager
from koordnode.qos.metrics_feed import PodInterferenceReader, TickMetrics
from koordnode.qos.net_control import NetQoSController
from koordnode.qos.pod_networks import PodNetworks
from koordnode.qos.resctrl_control import ResctrlController, ResctrlPlacement

if TYPE_CHECKING:
    from koordnode.kube.agent import ClusterLink
    from koordnode.nri.plugin import NriPlugin
    from koordnode.qos.node_usage import NodeUsageReporter

log = structlog.get_logger("koordnode")

SHUTDOWN_GRACE_S = 5.0
# READY is sent once the state is rebuilt, but not later than this: with containerd down,
# waiting for it would make systemd kill and restart koordnode in a loop.
READY_AT_THE_LATEST_S = 30.0
BACKEND_PROBE_TIMEOUT_S = 1.0


class Daemon:
    """Everything a running koordnode owns; also what `koordnode status` reports on."""

    def __init__(self, config: Config, *, metrics: Metrics = METRICS) -> None:
        self.config = config
        self.metrics = metrics
        self.started_at = time.time()
        self.last_reload: dict[str, Any] = {"result": "never reloaded"}
        self.state = NodeState()
        self.stats = ProxyStats()
        self._background: set[asyncio.Task[Any]] = set()
        self.backend = RuntimeBackend(config.proxy.backend)
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
                                          be_cpuset=self._be_cpuset, pool_updates=pool_updates, layout=self.layout)
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
                )
            except Exception as exc:
                log.error("qos_manager_disabled", error=str(exc))
                self.qos_error = f"QoS manager disabled: {exc}"
        self.chain = HookChain(
            hooks,
            timeout_s=config.proxy.hook_timeout_ms / 1000.0,
            failure_policy=config.proxy.failure_policy,
        )
        self.handler = InterceptingHandler(ChainInterceptor(self.chain, self.state.pod_labels_for, metrics),
                                           self.stats, on_completed=metrics.observe_cri_call)
        self.server = ProxyServer(config.proxy.listen, config.proxy.backend, self.handler)
        self.mode = config.runtime.mode
        self.nri: NriPlugin | None = None
        if self.mode == "nri":
            from koordnode.nri.plugin import NriPlugin  # only NRI mode loads it

            self.nri = NriPlugin(config.nri.socket, config.nri.plugin_name, config.nri.plugin_index,
                                 chain=self.chain, state=self.state, engine=self.qos,
                                 on_synchronized=self._adopted_from_nri, procfs_root=config.procfs.root,
                                 pool_updates=pool_updates)
        self.node_lock = NodeLock(lock_path(config.admin.socket))
        self.admin = AdminServer(config.admin.socket, self.status)
        self.metrics_server: MetricsServer | None = None
        self.interference = PodInterferenceReader(self.state, config.cgroup, config.procfs.root)
        self._stop = asyncio.Event()
        self._rebuilt = asyncio.Event()
        # Every part that writes to the kernel, changes CRI calls or evicts: dry run switches them.
        self._dry_run_parts: list[DryRunSwitch] = [
            self.handler, self.resctrl, self.netqos, self.eviction,
            *([self.qos.executor] if self.qos is not None else []),
            *([self.qos_manager] if self.qos_manager is not None else []),
            *([self.nri] if self.nri is not None else []),
        ]
        self.dry_run = False
        self._set_dry_run(config.daemon.dry_run)
        # One config change at a time: SIGHUP reloads and NodeSLO updates take the same path.
        self._config_lock = asyncio.Lock()
        self._facts_changed = asyncio.Event()
        self.usage: NodeUsageReporter | None = None
        if self.qos_manager is not None:
            from koordnode.qos.node_usage import NodeUsageReporter

            self.usage = NodeUsageReporter(self.qos_manager, config.procfs.root, config.cgroup.root, metrics,
                                           priority_of=self.eviction.priority_of)
        self.cluster: ClusterLink | None = None
        self.cluster_error: str | None = None
        if config.kubernetes.enable:
            self._start_cluster_link(config)
        # What a reload hands new settings to (in a worker thread, in this order): each component
        # with the settings it reads.
        self._reloads: list[Reload[Any]] = [
            *([reload_of(_kubelet_layout_of, self.layout)] if self.layout is not None else []),
            *([reload_of(EngineSettings.of, self.qos)] if self.qos is not None else []),
            *([reload_of(ManagerSettings.of, self.qos_manager)] if self.qos_manager is not None else []),
            reload_of(ResctrlSettings.of, self.resctrl),
            reload_of(_cgroup_section, self.resctrl_placement),
            reload_of(_net_section, self.netqos),
            reload_of(_cgroup_section, self.interference),
        ]

    # ---- [kubernetes] ---------------------------------------------------------------------

    def _start_cluster_link(self, config: Config) -> None:
        from koordnode.kube.agent import ClusterLink  # only a node in a cluster loads it
        from koordnode.kube.credentials import CredentialsError

        usage = self.usage
        try:
            self.cluster = ClusterLink(config.kubernetes, apply_nodeslo=self.apply_nodeslo,
                                       on_pod_facts=self._facts_changed.set,
                                       node_metric_status=usage.node_metric_status if usage else _not_measured,
                                       memory_total_bytes=usage.memory_total_bytes if usage else _not_measured,
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

    async def apply_nodeslo(self, values: dict[str, Any] | None) -> None:
        """A NodeSLO's table (None: no NodeSLO) below the local file, applied the way SIGHUP
        applies a file; ConfigError (nothing applied) when it does not validate."""
        async with self._config_lock:
            new = with_nodeslo(self.config, values)
            await self._apply_config(new, trigger="nodeslo")

    async def _run_cluster(self) -> None:
        if self.cluster is None:
            return
        try:
            await self.cluster.run(self._stop)
        except Exception:
            log.exception("kubernetes_link_failed")

    async def _replan_on_facts(self) -> None:
        """Pods whose API facts arrived or changed are planned again (a pass re-plans only
        pods whose inputs changed); bursts of watch events make one pass."""
        while True:
            await self._facts_changed.wait()
            await asyncio.sleep(0.2)
            self._facts_changed.clear()
            if self.state.rebuilt_at is not None:
                await self.reconcile_once()

    async def _usage_loop(self) -> None:
        """The batch allocatable as a metric and in status, API server or not; whether the API
        server answers ([kubernetes])."""
        while True:
            await asyncio.sleep(10.0)
            if self.cluster is not None:
                self.metrics.kube_api_up.set(1 if self.cluster.reachable()[0] else 0)
            if self.usage is None:
                continue
            try:
                await asyncio.to_thread(self.usage.refresh)  # sets the metric
            except Exception:
                log.exception("node_usage_failed")

    def _be_cpuset(self) -> frozenset[int] | None:
        """The QoS manager's BE cpuset for the engine (built after the engine, which it uses)."""
        return self.qos_manager.be_cpuset() if self.qos_manager is not None else None

    def _set_dry_run(self, dry_run: bool) -> None:
        """Dry run on or off for every part that writes to the kernel or changes CRI calls."""
        if dry_run != self.dry_run:
            if dry_run:
                log.warning("dry_run_on",
                            detail="nothing is written to the kernel, CRI requests are forwarded unchanged")
            else:
                log.warning("dry_run_off", detail="decisions are applied")
        self.dry_run = dry_run
        for part in self._dry_run_parts:
            part.dry_run = dry_run
        self.metrics.dry_run.set(1 if dry_run else 0)

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
                _refuse_if_proxy_serves(self.config.proxy.listen)
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
        self.spawn(self._reconcile_loop())
        self.spawn(self._notify_ready())
        self.spawn(sdnotify.watchdog_loop(self._stop))
        if self.qos_manager is not None:
            self.spawn(self._run_qos_manager())
        if self.qos_manager is not None or self.cluster is not None:
            self.spawn(self._usage_loop())
        if self.cluster is not None:
            self.spawn(self._run_cluster())
            self.spawn(self._replan_on_facts())

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
        await self.reconcile_once()

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
            self._record_classes(classes)
        self._rebuilt.set()

    def _record_classes(self, classes: dict[str, tuple[str, str]]) -> None:
        for sandbox_id, (qos_class, why) in classes.items():
            self.state.set_pod_class(sandbox_id, qos_class, why)

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

    # ---- periodic work --------------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        while True:
            interval = self.config.cgroup.reconcile_interval_s
            await asyncio.sleep(interval if interval > 0 else 10.0)
            if interval <= 0 or self.state.rebuilt_at is None:
                continue  # disabled, or not before the running pods are known
            await self.reconcile_once()

    async def reconcile_once(self) -> None:
        # What the workers need from the state, taken here on the loop; the pods' containers and
        # networks only for the features that use them (a disabled one only removes leftovers).
        view = self.state.view()
        groups = self.resctrl_placement.groups()
        networks = self.pod_networks.for_reconcile()
        classes = await asyncio.to_thread(self._reconcile_pass, view, groups, networks)  # one thread hop
        if classes:
            self._record_classes(classes)

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
        _return_free_memory_to_the_os()
        return classes

    # ---- reload ---------------------------------------------------------------------------

    async def reload(self) -> None:
        """SIGHUP: apply a valid new config at once; keep the old one if the new one is bad."""
        async with self._config_lock:
            sdnotify.reloading()
            try:
                new = reload_config(self.config)
            except ConfigError as exc:
                for error in exc.errors:
                    log.error("config_reload_rejected", detail="keeping the running config", error=error)
                self.last_reload = {"result": "rejected", "at": time.time(), "errors": exc.errors}
                self.metrics.record_config_reload(False)
                sdnotify.ready()
                return
            await self._apply_config(new, trigger="sighup")
            sdnotify.ready()

    async def _apply_config(self, new: Config, *, trigger: str) -> None:
        """A validated config, applied at once: SIGHUP's file and a NodeSLO's values alike."""
        old, self.config = self.config, new
        configure_logging(new.log.level, new.log.format)
        self.chain.configure(timeout_s=new.proxy.hook_timeout_ms / 1000.0,
                             failure_policy=new.proxy.failure_policy)
        self.server.backend = new.proxy.backend
        await self.backend.reconfigure(new.proxy.backend)
        if new.runtime != old.runtime or new.nri != old.nri:
            log.warning("runtime_mode_change_needs_restart",
                        detail="[runtime] and [nri] take effect at the next restart",
                        mode=old.runtime.mode, nri_socket=old.nri.socket)
        if new.proxy.listen != old.proxy.listen or new.admin.socket != old.admin.socket:
            log.warning("socket_paths_change_needs_restart",
                        detail="socket paths take effect at the next restart",
                        listen=old.proxy.listen, admin=old.admin.socket)
        if new.kubernetes != old.kubernetes:
            log.warning("kubernetes_change_needs_restart", detail="[kubernetes] takes effect at the next restart")
        if _roots(new) != _roots(old):
            log.warning("filesystem_roots_change_needs_restart",
                        detail="[cgroup], [procfs] and [sysfs] root take effect at the next restart", **_roots(old))
        await asyncio.to_thread(self._reconfigure_components, new)
        self._set_dry_run(new.daemon.dry_run)
        if new.metrics != old.metrics or self.metrics_server is None:
            if self.metrics_server is not None:
                self.metrics_server.stop()
            self._start_metrics()
        if trigger == "sighup":
            self.last_reload = {"result": "applied", "at": time.time(), "source": new.source}
            self.metrics.record_config_reload(True)
            log.info("config_reloaded", source=new.source)
        await self.reconcile_once()

    def _reconfigure_components(self, new: Config) -> None:
        for reload in self._reloads:
            reload.apply(new)

    # ---- status ---------------------------------------------------------------------------

    async def backend_health(self) -> str:
        """"ok" when containerd answers a Version call now; else why not. Asked at each status
        request (one round trip), so it reports the runtime as it is, not as it was at start-up."""
        try:
            await self.backend.call(RUNTIME_SERVICE + "Version", pb.VersionRequest(),
                                    pb.VersionResponse, timeout=BACKEND_PROBE_TIMEOUT_S)
        except CriError as exc:
            return f"down: {exc.code_name}: {exc.details}"
        except Exception as exc:  # a status request must answer whatever the probe hit
            return f"down: {exc!r}"
        if self.state.rebuilt_at is None:
            return "ok (answering; state not rebuilt yet: " + (self.state.rebuild_error or "in progress") + ")"
        return "ok"

    async def status(self) -> dict[str, Any]:
        health = await self.backend_health()
        return self.status_now(health)

    def status_now(self, backend_health: str) -> dict[str, Any]:
        """Everything but the backend probe; reads only published snapshots (no worker locks)."""
        snapshot = self.state.snapshot()
        if self.qos is not None:
            snapshot = self.qos.decorate(snapshot)
        if self.cluster is not None:
            snapshot = self.cluster.decorate(snapshot)

        qos_manager = _safe(self.qos_manager.status) if self.qos_manager is not None else None
        if self.qos_manager is not None:
            _safe(partial(self.qos_manager.decorate, snapshot))  # a failure leaves the pods as they were
        return {
            "version": __version__,
            "mode": self.mode,
            "uptime_s": round(time.time() - self.started_at, 1),
            "dry_run": self._dry_run_status(),
            "listen": self.config.proxy.listen,
            "backend": self.config.proxy.backend,
            "backend_health": backend_health,
            "config": {"source": self.config.source, "last_reload": self.last_reload,
                       "keys": self._config_keys()},
            "kubernetes": self._kubernetes_status(),
            "batch_allocatable": self.usage.last.batch_status() if self.usage is not None and self.usage.last
            is not None else {"state": "not measured yet"},
            "proxy": {
                "connections_open": self.stats.connections_open,
                "connections_total": self.stats.connections_total,
                "intercepted_calls": self.stats.intercepted_calls,
                "calls_by_method": self.metrics.cri_calls_by_method(),
                "hook_failures": {
                    f"{hook}.{phase}.{kind}": n for (hook, phase, kind), n in self.chain.failures.items()
                },
            },
            "nri": _safe(self.nri.status) if self.nri is not None else None,
            # Proxy mode only: in NRI mode kubelet's calls do not pass through koordnode.
            "kubelet": kubelet_view(self.metrics.cri_calls_by_method(), self.config.cgroup.be_idle_group)
                       if self.mode == "proxy" else None,
            "qos": self.qos.status() if self.qos is not None else {"error": self.qos_error},
            "qos_manager": qos_manager,
            "resctrl": _safe(self.resctrl.status),
            "net": _safe(self.netqos.status),
            **snapshot,
        }


    def _config_keys(self) -> dict[str, dict[str, Any]]:
        """Per key: its value and where it came from (source: toml|nodeslo|default)."""
        values = to_dict(self.config)
        return {key: {"value": _value_at(values, key), "source": source}
                for key, source in key_sources(self.config).items()}

    def _kubernetes_status(self) -> dict[str, Any]:
        if self.cluster is not None:
            return _safe(self.cluster.status)  # type: ignore[no-any-return]
        if self.cluster_error is not None:
            return {"enable": True, "error": self.cluster_error}
        return {"enable": False}

    def _dry_run_status(self) -> dict[str, Any]:
        if not self.dry_run:
            return {"enabled": False}
        return {
            "enabled": True,
            "meaning": "decisions are reported as 'would_write'; nothing is written to the kernel, "
                       "no container is evicted, CRI requests reach the runtime unchanged",
            "requests_forwarded_unchanged": self.stats.dry_run_changed_requests,
            "calls_failure_policy_would_fail": self.stats.dry_run_would_fail,
            "last_request_changes": dict(self.handler.last_dry_run_changes),
        }


def _value_at(table: dict[str, Any], key: str) -> Any:
    value: Any = table
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


Settings = TypeVar("Settings")
Settings_contra = TypeVar("Settings_contra", contravariant=True)


class Reconfigurable(Protocol[Settings_contra]):
    """A component a reload hands its new settings, of its own type."""

    def reconfigure(self, settings: Settings_contra, /) -> None: ...


@dataclasses.dataclass(frozen=True)
class Reload(Generic[Settings]):
    """One component of the reload, and how its settings are taken from a Config (mypy checks
    that the two agree)."""

    settings_of: Callable[[Config], Settings]
    component: Reconfigurable[Settings]

    def apply(self, config: Config) -> None:
        self.component.reconfigure(self.settings_of(config))


def reload_of(settings_of: Callable[[Config], Settings], component: Reconfigurable[Settings]) -> Reload[Any]:
    """A Reload whose two halves mypy checks against each other (a list of Reload[Any] would not)."""
    return Reload(settings_of, component)


class DryRunSwitch(Protocol):
    dry_run: bool


def _kubelet_layout_of(config: Config) -> tuple[str, str]:
    return config.cgroup.driver, config.qos_manager.kubepods_cgroup


def _cgroup_section(config: Config) -> CgroupConfig:
    return config.cgroup


def _net_section(config: Config) -> NetQoSConfig:
    return config.net


def _not_measured(*_: Any) -> None:
    return None  # without the QoS manager, nothing is measured to report


def _threads_unknown(cgroup: str) -> list[int] | None:
    return None  # without the QoS engine's executor, nobody reads cgroup tasks


def _roots(config: Config) -> dict[str, str]:
    """Where the kernel's filesystems are: the executors and collectors keep them until restart."""
    return {"cgroup": config.cgroup.root, "procfs": config.procfs.root, "sysfs": config.sysfs.root}


def _safe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:
        return {"error": repr(exc)}


async def _main(config: Config) -> int:
    daemon = Daemon(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.request_stop)
    loop.add_signal_handler(signal.SIGHUP, lambda: daemon.spawn(daemon.reload()))
    try:
        await daemon.start()
    except (SocketInUseError, NodeLockError, OSError) as exc:
        log.error("cannot_start", error=str(exc))
        return 1
    # Everything allocated so far lives as long as the daemon: keep the collector from walking
    # it again and again (full collections of those objects are the relay's latency spikes).
    gc.collect()
    gc.freeze()
    _return_free_memory_to_the_os()
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


def _return_free_memory_to_the_os() -> None:
    # Start-up (imports, the state rebuild) leaves freed heap pages in glibc's arenas; give them
    # back so the resident size reflects what the daemon keeps. Not glibc: nothing to do.
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def run(config: Config) -> int:
    return asyncio.run(_main(config))


def _refuse_if_proxy_serves(listen: str) -> None:
    """NRI mode: a CRI proxy answering on [proxy] listen (kubelet may still use it) would apply
    QoS a second time; refuse instead. A stale socket file with nobody behind it is fine."""
    import socket as _socket

    probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(listen)
    except OSError:
        return
    finally:
        probe.close()
    raise NodeLockError(
        f"a CRI proxy serves {listen} (another koordnode in proxy mode?): refusing to start in "
        f"nri mode, the two would both apply QoS; stop it and point kubelet at containerd first"
    )
