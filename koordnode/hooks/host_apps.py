"""Host applications ([host_applications.<name>], NodeSLO hostApplications): their cgroups get
their class's values (policy/host_apps.py) on every reconcile pass, and the status says what
each one got. A cgroup that does not exist (the unit not started yet) is reported, not created:
the process's manager (systemd, the operator's script) owns it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from koordnode.config.classes import QoSConfig
from koordnode.config.components import HostAppSettings
from koordnode.config.host_apps import HostApplication, host_app_cgroup
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.executor.write_result import WriteStatus
from koordnode.model.qos_class import QoSClass
from koordnode.policy.class_inputs import KernelFeatures
from koordnode.policy.host_apps import plan_host_app

__all__ = ["HostApplications"]

log = structlog.get_logger("koordnode")


class HostApplications:
    def __init__(self, settings: HostAppSettings, executor: CgroupExecutor,
                 features: Callable[[], KernelFeatures]) -> None:
        self._executor = executor
        self._features = features
        self._lock = threading.Lock()
        self._apps: Mapping[str, HostApplication] = {}
        self._qos = QoSConfig()
        self._status: dict[str, dict[str, Any]] = {}
        self.reconfigure(settings)

    def reconfigure(self, settings: HostAppSettings) -> None:
        with self._lock:
            self._apps = dict(settings.host_applications)
            self._qos = settings.qos
            self._status = {name: state for name, state in self._status.items() if name in self._apps}

    def apply(self) -> None:
        """Every application's values, in a worker thread; only changed files are written."""
        with self._lock:
            apps, qos = dict(self._apps), self._qos
        features = self._features()
        status: dict[str, dict[str, Any]] = {}
        for name, app in sorted(apps.items()):
            cgroup = host_app_cgroup(name, app)
            entry: dict[str, Any] = {"qos": app.qos, "priority": app.priority_class, "cgroup": cgroup}
            if not self._executor.cgroup_exists(cgroup):
                entry["state"] = "cgroup not found"
                status[name] = entry
                continue
            writes = plan_host_app(name, app, qos.for_class(QoSClass(app.qos)), features)
            results = self._executor.apply(writes)
            failed = [r for r in results if not r.ok and r.status is not WriteStatus.SKIPPED]
            entry["values"] = {f"{r.cgroup_write.cgroup}/{r.cgroup_write.resource}": str(r.cgroup_write.value)
                               for r in results if r.ok}
            if failed:
                entry["state"] = "failed"
                entry["errors"] = [f"{r.cgroup_write.cgroup}/{r.cgroup_write.resource}: {r.status.value} {r.detail}"
                                   for r in failed]
                log.warning("host_application_failed", name=name, cgroup=cgroup, errors=entry["errors"])
            else:
                entry["state"] = "applied"
            status[name] = entry
        with self._lock:
            self._status = {name: state for name, state in status.items() if name in self._apps}

    def status(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {name: dict(state) for name, state in self._status.items()}
