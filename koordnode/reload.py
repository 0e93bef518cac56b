"""The running config and the one path that changes it: SIGHUP's file and a NodeSLO's values,
validated, then handed to each component that reads them; dry run switched across every writer."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

import structlog

from koordnode import sdnotify
from koordnode.config import CgroupConfig, Config, ConfigError, NetQoSConfig, reload_config, with_nodeslo
from koordnode.cri.client import RuntimeBackend
from koordnode.hooks.chain import HookChain
from koordnode.logsetup import configure_logging
from koordnode.metrics.recorder import Metrics
from koordnode.proxy.server import ProxyServer

log = structlog.get_logger("koordnode")

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


def kubelet_layout_of(config: Config) -> tuple[str, str]:
    return config.cgroup.driver, config.qos_manager.kubepods_cgroup


def cgroup_section(config: Config) -> CgroupConfig:
    return config.cgroup


def net_section(config: Config) -> NetQoSConfig:
    return config.net


def _roots(config: Config) -> dict[str, str]:
    """Where the kernel's filesystems are: the executors and collectors keep them until restart."""
    return {"cgroup": config.cgroup.root, "procfs": config.procfs.root, "sysfs": config.sysfs.root}


class RunningConfig:
    """The config the daemon runs with, whether dry run is on, and how the last reload went."""

    def __init__(self, config: Config, *, metrics: Metrics, chain: HookChain, server: ProxyServer,
                 backend: RuntimeBackend, reloads: list[Reload[Any]], dry_run_parts: list[DryRunSwitch],
                 restart_metrics: Callable[[bool], None], reconcile: Callable[[], Awaitable[None]],
                 restart_cluster: Callable[[Config], Awaitable[None]] | None = None) -> None:
        self.config = config
        self.last_reload: dict[str, Any] = {"result": "never reloaded"}
        self._metrics = metrics
        self._chain = chain
        self._server = server
        self._backend = backend
        # What a reload hands new settings to (in a worker thread, in this order).
        self._reloads = reloads
        # Every part that writes to the kernel, changes CRI calls or evicts: dry run switches them.
        self._dry_run_parts = dry_run_parts
        self._restart_metrics = restart_metrics  # [metrics] changed (True), or start it if it is not up
        self._reconcile = reconcile
        self._restart_cluster = restart_cluster  # [kubernetes] changed: a new link from the new section
        # One config change at a time: SIGHUP reloads and NodeSLO updates take the same path.
        self._lock = asyncio.Lock()
        self.dry_run = False
        self.set_dry_run(config.daemon.dry_run)

    def set_dry_run(self, dry_run: bool) -> None:
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
        self._metrics.dry_run.set(1 if dry_run else 0)

    async def reload(self) -> None:
        """SIGHUP: apply a valid new config at once; keep the old one if the new one is bad."""
        async with self._lock:
            sdnotify.reloading()
            try:
                new = reload_config(self.config)
            except ConfigError as exc:
                for error in exc.errors:
                    log.error("config_reload_rejected", detail="keeping the running config", error=error)
                self.last_reload = {"result": "rejected", "at": time.time(), "errors": exc.errors}
                self._metrics.record_config_reload(False)
                sdnotify.ready()
                return
            if not new.kubernetes.enable and new.nodeslo is not None:
                new = with_nodeslo(new, None)  # no API server link: the file and defaults alone
            await self._apply(new, trigger="sighup")
            sdnotify.ready()

    async def apply_nodeslo(self, values: dict[str, Any] | None) -> None:
        """A NodeSLO's table (None: no NodeSLO) below the local file, applied the way SIGHUP
        applies a file; ConfigError (nothing applied) when it does not validate."""
        async with self._lock:
            new = with_nodeslo(self.config, values)
            await self._apply(new, trigger="nodeslo")

    async def _apply(self, new: Config, *, trigger: str) -> None:
        """A validated config, applied at once: SIGHUP's file and a NodeSLO's values alike."""
        old, self.config = self.config, new
        configure_logging(new.log.level, new.log.format)
        self._chain.configure(timeout_s=new.proxy.hook_timeout_ms / 1000.0,
                              failure_policy=new.proxy.failure_policy)
        self._server.backend = new.proxy.backend
        await self._backend.reconfigure(new.proxy.backend)
        if new.runtime != old.runtime or new.nri != old.nri:
            log.warning("runtime_mode_change_needs_restart",
                        detail="[runtime] and [nri] take effect at the next restart",
                        mode=old.runtime.mode, nri_socket=old.nri.socket)
        if new.proxy.listen != old.proxy.listen or new.admin.socket != old.admin.socket:
            log.warning("socket_paths_change_needs_restart",
                        detail="socket paths take effect at the next restart",
                        listen=old.proxy.listen, admin=old.admin.socket)
        if new.kubernetes != old.kubernetes and self._restart_cluster is not None:
            log.info("kubernetes_link_restarting", detail="[kubernetes] changed: a new API server link")
            await self._restart_cluster(new)
        if _roots(new) != _roots(old):
            log.warning("filesystem_roots_change_needs_restart",
                        detail="[cgroup], [procfs] and [sysfs] root take effect at the next restart", **_roots(old))
        await asyncio.to_thread(self._reconfigure_components, new)
        self.set_dry_run(new.daemon.dry_run)
        self._restart_metrics(new.metrics != old.metrics)
        if trigger == "sighup":
            self.last_reload = {"result": "applied", "at": time.time(), "source": new.source}
            self._metrics.record_config_reload(True)
            log.info("config_reloaded", source=new.source)
        await self._reconcile()

    def _reconfigure_components(self, new: Config) -> None:
        for reload in self._reloads:
            reload.apply(new)
