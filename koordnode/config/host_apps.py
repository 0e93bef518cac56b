"""``[host_applications.<name>]``: processes outside Kubernetes (a systemd unit, a cgroup of the
operator's) that get a QoS class's values and count as that class in the budgets, as
Koordinator's NodeSLO ``hostApplications`` describes them."""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass
from typing import Literal

from koordnode.config.classes import ClassName
from koordnode.config.fields import setting

__all__ = ["HOST_APP_NAME", "KoordPriority", "PRIORITY_CLASSES", "HostApplication", "cgroup_path_problem",
           "default_host_app_cgroup", "host_app_cgroup"]

# Koordinator's priority classes; "" = none given.
KoordPriority = Literal["", "koord-prod", "koord-mid", "koord-batch", "koord-free"]
PRIORITY_CLASSES: tuple[str, ...] = typing.get_args(KoordPriority)

HOST_APP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,62}$")
_COMPONENT = re.compile(r"^[A-Za-z0-9_.@:+-]{1,255}$")
# Koordinator's default parents (koordlet util.GetHostAppCgroupRelativePath) when none is given.
_DEFAULT_PARENT = {"LSE": "host-latency-sensitive", "LSR": "host-latency-sensitive",
                   "LS": "host-latency-sensitive", "BE": "host-best-effort", "SYSTEM": ""}


def cgroup_path_problem(value: str) -> str | None:
    if len(value) > 1024:
        return "a cgroup path of at most 1024 characters"
    parts = [p for p in value.strip("/").split("/") if p]
    if value and not parts:
        return "a cgroup path below the root, not the root itself"
    for part in parts:
        if part in (".", "..") or not _COMPONENT.match(part):
            return f"{part!r} is not a cgroup directory name (letters, digits, _ . @ : + -; no . or ..)"
    return None


@dataclass(frozen=True)
class HostApplication:
    """One host application; its name is the table's key."""

    qos: ClassName = setting(
        "LS", doc="the class whose values the application's cgroup gets, and whose budget its CPU counts in")
    priority: KoordPriority = setting(
        "", doc='Koordinator priority class reported in the NodeMetric; "" = koord-batch for BE, else koord-prod')
    cgroup: str = setting(
        "", check=cgroup_path_problem,
        doc='cgroup below the cgroup root, e.g. "system.slice/nginx.service"; '
            '"" = Koordinator\'s default host-latency-sensitive/<name> or host-best-effort/<name>')

    @property
    def priority_class(self) -> str:
        return self.priority or ("koord-batch" if self.qos == "BE" else "koord-prod")


def default_host_app_cgroup(name: str, qos: str) -> str:
    parent = _DEFAULT_PARENT.get(qos, "")
    return f"/{parent}/{name}" if parent else f"/{name}"


def host_app_cgroup(name: str, app: HostApplication) -> str:
    """The application's cgroup, relative to the hierarchy root, with a leading "/"."""
    if app.cgroup:
        return "/" + "/".join(p for p in app.cgroup.strip("/").split("/") if p)
    return default_host_app_cgroup(name, app.qos)
