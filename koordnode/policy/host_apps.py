"""A host application's cgroup values: its class's CPU priority (cpu.idle, or group identity on
Anolis kernels) and, for a class with a fixed weight (BE), that weight. Pure.

A weight ranks a cgroup only against its siblings, so an application's own weight protects
nobody when it is alone under its parent. The parents Koordinator names by default
(host-latency-sensitive, host-best-effort, directly under the root beside kubepods) get the
class's values too: a BE application there competes with the pods at BE's weight. An
application in a cgroup of the operator's (a systemd unit in system.slice) gets its own values
only; its parent stays as the operator set it.
"""

from __future__ import annotations

from koordnode.config.classes import QoSClassConfig
from koordnode.config.host_apps import HostApplication, default_host_app_cgroup, host_app_cgroup
from koordnode.model.qos_class import QoSClass
from koordnode.policy.class_inputs import KernelFeatures
from koordnode.policy.class_values import clamp_shares
from koordnode.policy.plan import CgroupWrite
from koordnode.policy.pod_policy import cpu_priority_write

__all__ = ["host_app_parent", "plan_host_app"]


def host_app_parent(name: str, app: HostApplication) -> str | None:
    """Koordinator's default parent of the application, when it lives there; else None."""
    cgroup = host_app_cgroup(name, app)
    if cgroup != default_host_app_cgroup(name, app.qos) or cgroup.count("/") < 2:
        return None
    return cgroup.rsplit("/", 1)[0]


def _values(cgroup: str, qos_class: QoSClass, config: QoSClassConfig, features: KernelFeatures,
            level: str) -> list[CgroupWrite]:
    writes = [cpu_priority_write(cgroup, qos_class, config, features, level)]
    idle = not features.group_identity and config.cpu_idle == 1
    if config.cpu_shares_fixed > 0 and not idle:  # the kernel pins an idle group's weight
        shares = clamp_shares(config.cpu_shares_fixed)
        writes.append(CgroupWrite(cgroup, "cpu.shares", shares, f"{qos_class.value}: fixed cpu.shares {shares} ({level})"))
    return writes


def plan_host_app(name: str, app: HostApplication, config: QoSClassConfig,
                  features: KernelFeatures) -> tuple[CgroupWrite, ...]:
    """The writes for one application: its default parent's first (when it lives there), then its own."""
    qos_class = QoSClass(app.qos)
    writes: list[CgroupWrite] = []
    parent = host_app_parent(name, app)
    if parent is not None:
        writes += _values(parent, qos_class, config, features, f"host applications of {qos_class.value}")
    writes += _values(host_app_cgroup(name, app), qos_class, config, features, f"host application {name}")
    return tuple(writes)
