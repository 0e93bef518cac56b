"""What `koordnode status` shows: every part's status in one table, from published snapshots."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from koordnode import __version__
from koordnode.config import key_sources, to_dict
from koordnode.cri import api_pb2 as pb
from koordnode.cri.client import CriError, RuntimeBackend
from koordnode.cri.kubelet_calls import kubelet_view
from koordnode.cri.methods import RUNTIME_SERVICE
from koordnode.hooks.chain import HookChain
from koordnode.hooks.host_apps import HostApplications
from koordnode.hooks.qos_engine import QoSEngine
from koordnode.metrics.recorder import Metrics
from koordnode.model.state import NodeState
from koordnode.proxy.handler import InterceptingHandler, ProxyStats
from koordnode.qos.manager import QoSManager
from koordnode.qos.net_control import NetQoSController
from koordnode.qos.resctrl_control import ResctrlController
from koordnode.reload import RunningConfig

if TYPE_CHECKING:
    from koordnode.kube.agent import ClusterLink
    from koordnode.nri.plugin import NriPlugin
    from koordnode.qos.node_usage import NodeUsageReporter

BACKEND_PROBE_TIMEOUT_S = 1.0


class StatusReport:
    """The daemon's parts, read for a status request (the admin socket's one question)."""

    def __init__(self, running: RunningConfig, *, mode: str, started_at: float, state: NodeState,
                 backend: RuntimeBackend, stats: ProxyStats, handler: InterceptingHandler, chain: HookChain,
                 metrics: Metrics, qos: QoSEngine | None, qos_error: str | None, qos_manager: QoSManager | None,
                 usage: NodeUsageReporter | None, cluster: ClusterLink | None, cluster_error: str | None,
                 nri: NriPlugin | None, resctrl: ResctrlController, netqos: NetQoSController,
                 host_apps: HostApplications | None = None) -> None:
        self.running = running
        self.host_apps = host_apps
        self.mode = mode
        self.started_at = started_at
        self.state = state
        self.backend = backend
        self.stats = stats
        self.handler = handler
        self.chain = chain
        self.metrics = metrics
        self.qos = qos
        self.qos_error = qos_error
        self.qos_manager = qos_manager
        self.usage = usage
        self.cluster = cluster
        self.cluster_error = cluster_error
        self.nri = nri
        self.resctrl = resctrl
        self.netqos = netqos

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
        config = self.running.config
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
            "listen": config.proxy.listen,
            "backend": config.proxy.backend,
            "backend_health": backend_health,
            "config": {"source": config.source, "last_reload": self.running.last_reload,
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
            "kubelet": kubelet_view(self.metrics.cri_calls_by_method(), config.cgroup.be_idle_group)
                       if self.mode == "proxy" else None,
            "qos": self.qos.status() if self.qos is not None else {"error": self.qos_error},
            "qos_manager": qos_manager,
            "resctrl": _safe(self.resctrl.status),
            "net": _safe(self.netqos.status),
            "host_applications": self._host_apps_status(),
            **snapshot,
        }

    def _host_apps_status(self) -> dict[str, Any]:
        """Per host application: its class, cgroup, what it got, and the CPUs it used last tick."""
        found: dict[str, Any] = _safe(self.host_apps.status) if self.host_apps is not None else {}
        used = self.qos_manager.host_app_used_cpus if self.qos_manager is not None else {}
        for name, entry in found.items():
            if isinstance(entry, dict) and name in used:
                entry["used_cpus"] = round(used[name], 3)
        return found

    def _config_keys(self) -> dict[str, dict[str, Any]]:
        """Per key: its value and where it came from (source: toml|nodeslo|default)."""
        config = self.running.config
        values = to_dict(config)
        return {key: {"value": _value_at(values, key), "source": source}
                for key, source in key_sources(config).items()}

    def _kubernetes_status(self) -> dict[str, Any]:
        if self.cluster is not None:
            return _safe(self.cluster.status)  # type: ignore[no-any-return]
        if self.cluster_error is not None:
            return {"enable": True, "error": self.cluster_error}
        return {"enable": False}

    def _dry_run_status(self) -> dict[str, Any]:
        if not self.running.dry_run:
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


def _safe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:
        return {"error": repr(exc)}
