"""What the two QoS components read of the configuration: exactly their sections, typed.

The QoS engine (hooks/qos_engine.py) and the QoS manager (qos/manager.py) each read several
sections; each is handed one frozen object naming them, never the whole `Config`. The
composition root (koordnode.daemon) builds them with `of(config)` at start and on reload;
tests and benchmarks build them from the sections they set (the others keep their defaults).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from koordnode.config.cgroup import CgroupConfig, ProcfsConfig, SysfsConfig
from koordnode.config.classes import KubeQoSMapping, QoSConfig
from koordnode.config.host_apps import HostApplication
from koordnode.config.node import NodeConfig
from koordnode.config.qos_manager import QoSManagerConfig
from koordnode.config.resctrl import RESCTRL_GROUP_CLASSES, ResctrlClassConfig, ResctrlConfig
from koordnode.config.root import Config
from koordnode.config.runtime import ProxyConfig
from koordnode.config.strategies import StrategyConfig

__all__ = ["EngineSettings", "HostAppSettings", "ManagerSettings", "ResctrlSettings"]


@dataclass(frozen=True)
class EngineSettings:
    """The sections the QoS engine reads."""

    # root (fixed at start), driver, the BE group switches
    cgroup: CgroupConfig = field(default_factory=CgroupConfig)
    # where the CPU topology is read, once at start
    sysfs: SysfsConfig = field(default_factory=SysfsConfig)
    # reserved and SYSTEM CPUs (the allocator), block devices
    node: NodeConfig = field(default_factory=NodeConfig)
    qos: QoSConfig = field(default_factory=QoSConfig)
    qos_mapping: KubeQoSMapping = field(default_factory=KubeQoSMapping)
    # hook_timeout_ms: bounds the wait for systemd to make the BE group slice idle
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    # kubepods_cgroup: beside which kubepods slice the systemd BE group goes
    qos_manager: QoSManagerConfig = field(default_factory=QoSManagerConfig)
    # where the containers' processes' oom_score_adj is kept, fixed at start
    procfs: ProcfsConfig = field(default_factory=ProcfsConfig)

    @classmethod
    def of(cls, config: Config) -> EngineSettings:
        return cls(cgroup=config.cgroup, sysfs=config.sysfs, node=config.node, qos=config.qos,
                   qos_mapping=config.qos_mapping, proxy=config.proxy, qos_manager=config.qos_manager,
                   procfs=config.procfs)


@dataclass(frozen=True)
class ManagerSettings:
    """The sections the QoS manager reads."""

    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    qos_manager: QoSManagerConfig = field(default_factory=QoSManagerConfig)
    # driver (where the pods' cgroups are, as the engine finds them), be_idle_group
    cgroup: CgroupConfig = field(default_factory=CgroupConfig)
    # reserved_cpus, resolved as the allocator does
    node: NodeConfig = field(default_factory=NodeConfig)
    # the CPU topology for a reserved CPU count
    sysfs: SysfsConfig = field(default_factory=SysfsConfig)
    # the class of pods without a valid class label
    qos_mapping: KubeQoSMapping = field(default_factory=KubeQoSMapping)
    # processes outside Kubernetes whose CPU counts as their class's
    host_applications: dict[str, HostApplication] = field(default_factory=dict)

    @classmethod
    def of(cls, config: Config) -> ManagerSettings:
        return cls(strategy=config.strategy, qos_manager=config.qos_manager, cgroup=config.cgroup,
                   node=config.node, sysfs=config.sysfs, qos_mapping=config.qos_mapping,
                   host_applications=config.host_applications)


@dataclass(frozen=True)
class HostAppSettings:
    """What the host applications' values come from: the applications and the class numbers."""

    host_applications: dict[str, HostApplication] = field(default_factory=dict)
    qos: QoSConfig = field(default_factory=QoSConfig)

    @classmethod
    def of(cls, config: Config) -> HostAppSettings:
        return cls(host_applications=config.host_applications, qos=config.qos)


@dataclass(frozen=True)
class ResctrlSettings:
    """What the resctrl controller reads: [resctrl] and each group class's [qos.<CLASS>.resctrl]."""

    resctrl: ResctrlConfig = field(default_factory=ResctrlConfig)
    classes: dict[str, ResctrlClassConfig] = field(default_factory=dict)

    @classmethod
    def of(cls, config: Config) -> ResctrlSettings:
        return cls(resctrl=config.resctrl,
                   classes={c: getattr(config.qos, c).resctrl for c in RESCTRL_GROUP_CLASSES})
