"""The root of the schema: one field per ``[section]`` of the file.

Each component is handed its own section (``config.proxy``, ``config.strategy``, ...); only the
composition root (koordnode.daemon) and the checks across sections below see the whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from koordnode.config.cgroup import CgroupConfig, ProcfsConfig, SysfsConfig
from koordnode.config.classes import KubeQoSMapping, QoSConfig
from koordnode.config.daemon import AdminConfig, DaemonConfig, LogConfig
from koordnode.config.fields import internal, section, setting
from koordnode.config.host_apps import HOST_APP_NAME, HostApplication
from koordnode.config.kubernetes import KubernetesConfig
from koordnode.config.metrics import MetricsConfig
from koordnode.config.netqos import NetQoSConfig
from koordnode.config.node import NodeConfig
from koordnode.config.nri import NriConfig
from koordnode.config.qos_manager import QoSManagerConfig
from koordnode.config.resctrl import ResctrlConfig
from koordnode.config.runtime import ProxyConfig, RuntimeConfig
from koordnode.config.strategies import StrategyConfig

__all__ = ["Config", "DEFAULTS_SOURCE"]

# Config.source when the default file does not exist and built-in defaults are in use.
DEFAULTS_SOURCE = "<defaults>"


@dataclass(frozen=True)
class Config:
    runtime: RuntimeConfig = section(RuntimeConfig, doc="proxy or NRI mode")
    proxy: ProxyConfig = section(ProxyConfig, doc="the CRI proxy between kubelet and runtime")
    nri: NriConfig = section(NriConfig, doc="NRI mode: the runtime's NRI socket and the plugin's registration")
    log: LogConfig = section(LogConfig, doc="logging to stderr")
    daemon: DaemonConfig = section(DaemonConfig, doc="how the daemon acts: dry-run, the originals it keeps for restore")
    admin: AdminConfig = section(AdminConfig, doc="local admin endpoint")
    cgroup: CgroupConfig = section(CgroupConfig, doc="cgroup hierarchy and reconcile period")
    procfs: ProcfsConfig = section(ProcfsConfig, doc="procfs root")
    sysfs: SysfsConfig = section(SysfsConfig, doc="sysfs root")
    node: NodeConfig = section(NodeConfig, doc="node CPU reservation and block devices")
    qos_mapping: KubeQoSMapping = section(
        KubeQoSMapping, doc="class of pods without a valid koordinator.sh/qosClass label"
    )
    qos: QoSConfig = section(QoSConfig, doc="per-class numbers, [qos.<CLASS>]")
    metrics: MetricsConfig = section(MetricsConfig, doc="Prometheus metrics endpoint")
    resctrl: ResctrlConfig = section(ResctrlConfig, doc="L3 cache and memory bandwidth per class (resctrl)")
    net: NetQoSConfig = section(NetQoSConfig, doc="egress shaping per class (tc HTB + nftables)")
    qos_manager: QoSManagerConfig = section(QoSManagerConfig, doc="the QoS manager loop: ticks and PSI wake-ups")
    strategy: StrategyConfig = section(StrategyConfig, doc="QoS manager strategies, [strategy.<name>]")
    kubernetes: KubernetesConfig = section(
        KubernetesConfig, doc="in a cluster: NodeSLO, pod facts, evictions and NodeMetric through the API server"
    )
    host_applications: dict[str, HostApplication] = setting(
        default_factory=dict,
        doc="processes outside Kubernetes with a class, [host_applications.<name>] (NodeSLO hostApplications)")

    # Where the values came from: the file path, "<string>", or DEFAULTS_SOURCE.
    source: str = internal(DEFAULTS_SOURCE)
    # What load_config was called with, so reload_config can repeat it.
    path: str | None = internal(None)
    overrides: Mapping[str, Any] | None = internal(None)
    # The local file's table with the overrides merged in (what "source: toml" means), and the
    # NodeSLO's table below it ([kubernetes]; None: none applied). The values above are both merged.
    local: Mapping[str, Any] | None = internal(None)
    nodeslo: Mapping[str, Any] | None = internal(None)

    @property
    def uses_defaults(self) -> bool:
        """True when no config file was found and only built-in defaults (+ overrides) apply."""
        return self.source == DEFAULTS_SOURCE

    def validate(self) -> list[str]:
        bad = [name for name in self.host_applications if not HOST_APP_NAME.match(name)]
        if bad:
            return [f"host_applications.{bad[0]}: a name of letters, digits, _ . @ - (at most 63, "
                    "starting with a letter or digit)"]
        if self.admin.socket in (self.proxy.listen, self.proxy.backend):
            return ["admin.socket: must differ from proxy.listen and proxy.backend"]
        if self.runtime.mode == "nri" and self.nri.socket in (self.proxy.listen, self.proxy.backend, self.admin.socket):
            return ["nri.socket: must differ from proxy.listen, proxy.backend and admin.socket"]
        return []
