"""koordnode configuration: TOML parsed into typed, validated, frozen dataclasses.

One module per part of the file, each component is handed its own section:

    fields        setting() / section() declare keys; shared value checks
    runtime       [runtime], [proxy]            nri          [nri]
    daemon        [daemon], [log], [admin]      cgroup       [cgroup], [procfs], [sysfs]
    node          [node]                        classes      [qos.<CLASS>], [qos_mapping]
    resctrl       [resctrl], [qos.<CLASS>.resctrl]           netqos       [net]
    metrics       [metrics]                     qos_manager  [qos_manager]
    strategies    [strategy.<name>]             kubernetes   [kubernetes]
    components    EngineSettings, ManagerSettings, ResctrlSettings, HostAppSettings: the sections the QoS engine / manager / resctrl controller / host applications read
    root          Config: one field per section, checks across sections
    loader        parse / load / reload, errors with key paths, TOML output, key descriptions

Adding a key: see "Adding a config key" in docs/developing.md.
"""

from __future__ import annotations

from koordnode.config.cgroup import CgroupConfig, CgroupDriverName, ProcfsConfig, SysfsConfig
from koordnode.config.components import EngineSettings, HostAppSettings, ManagerSettings, ResctrlSettings
from koordnode.config.classes import KubeQoSMapping, QoSClassConfig, QoSConfig
from koordnode.config.daemon import AdminConfig, DaemonConfig, LogConfig, LogFormat, LogLevel
from koordnode.config.fields import section, setting, unix_socket_path
from koordnode.config.loader import (
    DEFAULT_CONFIG_PATH,
    ConfigError,
    Setting,
    describe_settings,
    from_dict,
    key_sources,
    load_config,
    parse_config,
    reload_config,
    to_dict,
    to_toml,
    with_nodeslo,
)
from koordnode.config.kubernetes import KubernetesConfig
from koordnode.config.metrics import MetricsConfig
from koordnode.config.netqos import NetQoSConfig
from koordnode.config.node import NodeConfig
from koordnode.config.nri import NriConfig
from koordnode.config.qos_manager import QoSManagerConfig
from koordnode.config.resctrl import ResctrlClassConfig, ResctrlConfig
from koordnode.config.root import DEFAULTS_SOURCE, Config
from koordnode.config.runtime import FailurePolicy, ProxyConfig, RuntimeConfig, RuntimeMode
from koordnode.config.strategies import StrategyConfig

__all__ = [
    "AdminConfig",
    "CgroupConfig",
    "CgroupDriverName",
    "Config",
    "ConfigError",
    "DEFAULTS_SOURCE",
    "DEFAULT_CONFIG_PATH",
    "DaemonConfig",
    "EngineSettings",
    "HostAppSettings",
    "FailurePolicy",
    "KubeQoSMapping",
    "KubernetesConfig",
    "LogConfig",
    "LogFormat",
    "LogLevel",
    "ManagerSettings",
    "MetricsConfig",
    "NetQoSConfig",
    "NodeConfig",
    "NriConfig",
    "ProcfsConfig",
    "ProxyConfig",
    "QoSClassConfig",
    "QoSConfig",
    "QoSManagerConfig",
    "ResctrlClassConfig",
    "ResctrlConfig",
    "ResctrlSettings",
    "RuntimeConfig",
    "RuntimeMode",
    "Setting",
    "StrategyConfig",
    "SysfsConfig",
    "describe_settings",
    "from_dict",
    "key_sources",
    "load_config",
    "parse_config",
    "reload_config",
    "section",
    "setting",
    "to_dict",
    "to_toml",
    "unix_socket_path",
    "with_nodeslo",
]
