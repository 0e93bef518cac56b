"""``[net]``: egress shaping per class (tc HTB + nftables). Off by default (``enable = false``)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from koordnode.config.fields import setting
from koordnode.model.qos_class import CLASS_NAMES

__all__ = ["NET_CLASS_NAMES", "NetClassName", "NetQoSConfig"]

NET_CLASS_NAMES = CLASS_NAMES
NetClassName = Literal["SYSTEM", "LSE", "LSR", "LS", "BE"]

# Linux interface names: at most 15 bytes, no "/", no whitespace, not "." or "..".
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}\Z")

_DEFAULT_PRIORITIES: Mapping[str, int] = MappingProxyType(
    {"SYSTEM": 0, "LSE": 0, "LSR": 1, "LS": 2, "BE": 3}
)

# HTB rates are carried as 64-bit bytes/s; keep well inside that.
_MAX_MBPS = 10_000_000


def _check_interfaces(value: tuple[str, ...]) -> str | None:
    for name in value:
        if not _IFNAME.match(name) or name in (".", ".."):
            return f"{name!r} is not a network interface name"
    if len(set(value)) != len(value):
        return "lists an interface twice"
    return None


def _check_cidrs(value: tuple[str, ...]) -> str | None:
    for cidr in value:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            return f"{cidr!r} is not an IP address or network (CIDR)"
    return None


@dataclass(frozen=True)
class NetQoSConfig:
    enable: bool = setting(
        False,
        doc="shape pod egress traffic on the uplink(s) with an HTB class per QoS priority; "
        "false removes what koordnode installed",
    )
    interfaces: tuple[str, ...] = setting(
        (),
        doc="uplink interfaces to shape; empty: the interface(s) holding the default route",
        check=_check_interfaces,
    )
    link_rate_mbps: int = setting(
        10000, min=1, max=_MAX_MBPS,
        doc="total egress rate of each uplink in Mbit/s (set it a little below the real "
        "link speed so that the queue builds here, where the priorities apply)",
    )
    be_rate_mbps: int = setting(
        500, min=1, max=_MAX_MBPS, doc="bandwidth guaranteed to BE pods together, Mbit/s",
    )
    be_ceil_mbps: int = setting(
        1000, min=1, max=_MAX_MBPS,
        doc="most bandwidth BE pods together may use when others leave it idle, Mbit/s",
    )
    priorities: dict[NetClassName, int] = setting(
        default_factory=lambda: dict(_DEFAULT_PRIORITIES),
        min=0, max=7,
        doc="HTB priority (0 first .. 7) of each class; classes with the same priority share "
        "one tc class",
    )
    pod_limits: bool = setting(
        True,
        doc="honour the koordinator.sh/networkQOS pod annotation "
        '({"ingressLimit": "100M", "egressLimit": "200M"}, bits per second)',
    )
    exclude_cidrs: tuple[str, ...] = setting(
        (),
        doc="pod IPs inside these networks are never classified (e.g. the node's own "
        "networks, if pods can share them)",
        check=_check_cidrs,
    )

    def validate(self) -> list[str]:
        errors = []
        if self.be_ceil_mbps < self.be_rate_mbps:
            errors.append(f"be_ceil_mbps: must be >= be_rate_mbps ({self.be_rate_mbps})")
        if self.be_ceil_mbps > self.link_rate_mbps:
            errors.append(f"be_ceil_mbps: must be <= link_rate_mbps ({self.link_rate_mbps})")
        be = self.priorities.get("BE", _DEFAULT_PRIORITIES["BE"])
        shared = [name for name, prio in self.priorities.items() if name != "BE" and prio == be]
        if shared:
            errors.append(f"priorities: BE's priority {be} is also given to "
                          f"{', '.join(shared)}; BE needs a tc class of its own")
        return errors

    def priority_of(self, class_name: str) -> int:
        for name, priority in self.priorities.items():
            if name == class_name:
                return priority
        return _DEFAULT_PRIORITIES[class_name]
