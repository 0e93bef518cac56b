"""Network QoS policy: pods, their classes and IPs -> HTB trees and an nftables classifier.

Pure: no netlink, no subprocess. The controller (koordnode/qos/net_control.py) has the
interfaces resolved, calls :func:`plan_network`, and has koordnode/executor/netqos.py converge
the kernel to the returned :class:`NetPlan`.

How pod traffic is classified (docs/architecture.md material)
-----------------------------------------------
Each shaped uplink gets an HTB root qdisc with handle ``4b4e:`` ("KN"), a root class
``4b4e:1`` at ``[net] link_rate_mbps``, and per QoS priority ``p`` (SYSTEM/LSE 0, LSR 1,
LS 2, BE 3 by default) an inner class ``4b4e:1p`` with a leaf ``4b4e:2p`` under it. BE's
inner class is held to ``be_rate_mbps`` / ``be_ceil_mbps``; the others share the rest of the
link as their guaranteed rate and may each borrow up to the whole link ("unrestricted"),
lower priorities first. Traffic nobody classified (the node's own, host-network pods)
goes to SYSTEM's leaf.

Packets are steered into those classes by their *pod IP*, before NAT: an nftables table
``inet koordnode`` has a chain on the postrouting hook at priority ``mangle`` (-150), which
runs before source NAT (``srcnat``, 100) rewrites a masqueraded pod's address to the node's.
Its rule ``oifname @uplinks meta priority set ip saddr map @egress4`` sets ``skb->priority``
to the class id of the pod's class; HTB uses a ``skb->priority`` whose major number is its
own handle as the class directly, with no tc filter at all. That survives SNAT (the
priority is not part of the packet), works for IPv4 and IPv6, for bridged (routed through
the node) and routed CNIs alike, and needs nothing the kernel lacks here: tc ``u32``
filters matching the source IP on the uplink would see the node's address after
masquerade, and the cgroup/flower/fw classifiers are not available on every kernel.

Per-pod limits (``koordinator.sh/networkQOS: {"egressLimit": "200M", "ingressLimit":
"100M"}``, bits per second): an egress limit adds a leaf ``4b4e:<n>`` (n >= 0x100) under the
pod's priority class with that ceiling, and the pod's IPs map to it. An ingress limit is
applied where traffic *to* the pod leaves the node's stack: the device the node routes the
pod's IP to (the CNI bridge, or the pod's host-side veth). That device gets its own
``4b4e:`` HTB with an unlimited default leaf and a leaf per limited pod, and the rule
``meta priority set oifname . ip daddr map @ingress4`` steers the pod's downloads into it
(after DNAT, which runs at prerouting, so the daddr is the pod's). Nothing else on those
devices is touched, and they get no qdisc while no pod there has an ingress limit.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from koordnode.model.annotations import QuantityError, quantity_to_int
from koordnode.config.netqos import NET_CLASS_NAMES, NetQoSConfig

__all__ = [
    "HTB_MAJOR",
    "HtbClass",
    "HtbTree",
    "NETWORK_QOS_ANNOTATION",
    "NFT_TABLE",
    "NetPlan",
    "PodLimits",
    "PodNetwork",
    "classid",
    "parse_network_qos",
    "plan_network",
]

NETWORK_QOS_ANNOTATION = "koordinator.sh/networkQOS"
HTB_MAJOR = 0x4B4E  # "KN": recognisably koordnode's qdisc; a restart adopts it
NFT_FAMILY = "inet"
NFT_TABLE = "koordnode"
_ROOT_MINOR = 0x1
_INNER_BASE = 0x10  # 4b4e:1p: a priority's inner class
_SHARED_BASE = 0x20  # 4b4e:2p: its leaf for pods without their own limit
_INGRESS_DEFAULT_MINOR = 0x2
_POD_MINOR_FIRST = 0x100
_POD_MINOR_LAST = 0xFFFE
# An ingress-shaping device (bridge / veth) is not a bottleneck of its own: its tree's total.
INGRESS_DEVICE_RATE_BPS = 100_000_000_000
_MIN_RATE_BPS = 8_000  # HTB needs a positive guaranteed rate; 1 kB/s


def classid(minor: int) -> int:
    """The 32-bit tc handle 4b4e:<minor>."""
    return (HTB_MAJOR << 16) | minor


def _nft_classid(minor: int) -> str:
    return f"{HTB_MAJOR:x}:{minor:x}"


# ---------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True)
class PodLimits:
    egress_bps: int | None = None
    ingress_bps: int | None = None


@dataclass(frozen=True)
class PodNetwork:
    """What the policy needs to know of a pod (from NodeState + PodSandboxStatus)."""

    sandbox_id: str
    name: str  # "namespace/name", for logs
    qos_class: str | None
    ips: tuple[str, ...]
    host_network: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)


def parse_network_qos(text: Any) -> PodLimits:
    """``{"ingressLimit": "100M", "egressLimit": "200M"}`` (bits/s quantities) -> PodLimits.

    Key case is not significant (Koordinator writes both ``ingressLimit`` and
    ``IngressLimit``). Raises ValueError with a message on anything malformed.
    """
    if not isinstance(text, str):
        raise ValueError(f"{NETWORK_QOS_ANNOTATION} must be a JSON string")
    if len(text) > 4096:
        raise ValueError(f"{NETWORK_QOS_ANNOTATION} is too long")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{NETWORK_QOS_ANNOTATION} is not JSON: {err.msg}") from None
    except RecursionError:
        # A few thousand "[" fit in 4 KiB: deeper than the parser's recursion limit.
        raise ValueError(f"{NETWORK_QOS_ANNOTATION} is nested too deeply") from None
    if not isinstance(data, dict):
        raise ValueError(f"{NETWORK_QOS_ANNOTATION} must be a JSON object")
    values: dict[str, int | None] = {"ingresslimit": None, "egresslimit": None}
    for key, raw in data.items():
        lowered = str(key).lower()
        if lowered not in values:
            continue  # other keys belong to other agents
        if raw in (None, "", 0, "0"):
            continue  # no limit
        if isinstance(raw, bool) or not isinstance(raw, (str, int)):
            raise ValueError(f"{NETWORK_QOS_ANNOTATION}: {key} must be a quantity such as \"100M\"")
        try:
            bps = quantity_to_int(str(raw))
        except QuantityError as err:
            raise ValueError(f"{NETWORK_QOS_ANNOTATION}: {key}: {err}") from None
        if bps < _MIN_RATE_BPS:
            raise ValueError(f"{NETWORK_QOS_ANNOTATION}: {key} {raw!r} is below 8k (bits/s)")
        values[lowered] = bps
    return PodLimits(egress_bps=values["egresslimit"], ingress_bps=values["ingresslimit"])


# ---------------------------------------------------------------------------------------------
# Outputs


@dataclass(frozen=True)
class HtbClass:
    minor: int
    parent_minor: int  # 0: directly under the qdisc
    rate_bps: int  # bits/s
    ceil_bps: int
    prio: int
    label: str  # what it is for, in logs and status

    @property
    def handle(self) -> int:
        return classid(self.minor)

    @property
    def parent(self) -> int:
        return classid(self.parent_minor)


@dataclass(frozen=True)
class HtbTree:
    """koordnode's qdisc on one device: HTB 4b4e: with these classes (parents first)."""

    device: str
    default_minor: int
    classes: tuple[HtbClass, ...]
    role: str  # "uplink" or "ingress"


@dataclass(frozen=True)
class Skipped:
    pod: str
    reason: str


@dataclass(frozen=True)
class NetPlan:
    trees: tuple[HtbTree, ...]
    uplinks: tuple[str, ...]
    egress4: tuple[tuple[str, str], ...]  # (pod IP, nft class id), sorted
    egress6: tuple[tuple[str, str], ...]
    ingress4: tuple[tuple[str, str, str], ...]  # (device, pod IP, nft class id)
    ingress6: tuple[tuple[str, str, str], ...]
    skipped: tuple[Skipped, ...] = ()

    def nft_body(self) -> str:
        """The ``inet koordnode`` table's definition (without its identifying comment)."""
        lines = [f"table {NFT_FAMILY} {NFT_TABLE} {{"]
        if self.uplinks:
            lines += ["  set uplinks {", "    type ifname", _elements(f'"{d}"' for d in self.uplinks) or "", "  }"]
        lines += _map("egress4", "ipv4_addr", [f"{ip} : {cid}" for ip, cid in self.egress4])
        lines += _map("egress6", "ipv6_addr", [f"{ip} : {cid}" for ip, cid in self.egress6])
        lines += _map("ingress4", "ifname . ipv4_addr",
                      [f'"{dev}" . {ip} : {cid}' for dev, ip, cid in self.ingress4])
        lines += _map("ingress6", "ifname . ipv6_addr",
                      [f'"{dev}" . {ip} : {cid}' for dev, ip, cid in self.ingress6])
        lines += [
            "  chain postrouting {",
            # mangle (-150) runs before srcnat (100): the source is still the pod's address.
            "    type filter hook postrouting priority mangle; policy accept;",
        ]
        if self.uplinks:
            lines += ["    oifname @uplinks meta priority set ip saddr map @egress4",
                      "    oifname @uplinks meta priority set ip6 saddr map @egress6"]
        lines += ["    meta priority set oifname . ip daddr map @ingress4",
                  "    meta priority set oifname . ip6 daddr map @ingress6",
                  "  }", "}"]
        return "\n".join(line for line in lines if line is not None) + "\n"

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.nft_body().encode()).hexdigest()[:16]

    def nft_script(self) -> str:
        """An atomic ``nft -f`` script replacing the table (created first so delete works)."""
        body = self.nft_body()
        comment = f'  comment "koordnode netqos {self.fingerprint}"\n'
        body = body.replace(f"table {NFT_FAMILY} {NFT_TABLE} {{\n",
                            f"table {NFT_FAMILY} {NFT_TABLE} {{\n{comment}", 1)
        return (f"table {NFT_FAMILY} {NFT_TABLE}\n"
                f"delete table {NFT_FAMILY} {NFT_TABLE}\n" + body)


def _elements(items: Iterable[str]) -> str | None:
    items = list(items)
    return f"    elements = {{ {', '.join(items)} }}" if items else None


def _map(name: str, key_type: str, items: list[str]) -> list[Any]:
    return [f"  map {name} {{", f"    type {key_type} : classid", _elements(items), "  }"]


# ---------------------------------------------------------------------------------------------
# Planning


def _mbit(value: int) -> int:
    return value * 1_000_000


def _pod_minors(keys: Iterable[str]) -> dict[str, int]:
    """A stable minor per key: crc32-placed in 0x100..0xfffe, probing on collision."""
    span = _POD_MINOR_LAST - _POD_MINOR_FIRST + 1
    taken: dict[int, str] = {}
    out: dict[str, int] = {}
    for key in sorted(set(keys)):
        slot = zlib.crc32(key.encode()) % span
        for _ in range(span):
            minor = _POD_MINOR_FIRST + slot
            if minor not in taken:
                taken[minor] = key
                out[key] = minor
                break
            slot = (slot + 1) % span
    return out


_SAFE_IFNAME = re.compile(r"^[A-Za-z0-9_.@-]{1,15}\Z")


def _usable_ips(pod: PodNetwork, excluded: list[Any]) -> tuple[list[str], str | None]:
    if pod.host_network:
        return [], "host network: shares the node's addresses"
    ips = []
    for text in pod.ips:
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            return [], f"bad pod IP {text!r}"
        if ip.is_loopback or ip.is_unspecified or ip.is_multicast or ip.is_link_local:
            continue
        if any(ip in network for network in excluded):
            continue
        ips.append(str(ip))
    if not ips:
        return [], "no pod IP to classify"
    return ips, None


def _classify_pod(pod: PodNetwork, config: NetQoSConfig, prio_of: Mapping[str, int],
                  excluded: list[Any], claimed: dict[str, str],
                  skipped: list[Skipped]) -> tuple[PodNetwork, list[str], PodLimits] | None:
    """One pod's place in the plan: (pod, its IPs, its limits), or None with a reason in skipped."""
    if pod.qos_class not in prio_of:
        skipped.append(Skipped(pod.name, f"no network class for QoS class {pod.qos_class!r}"))
        return None
    ips, why = _usable_ips(pod, excluded)
    if why:
        skipped.append(Skipped(pod.name, why))
        return None
    taken = [ip for ip in ips if ip in claimed]
    if taken:
        skipped.append(Skipped(pod.name, f"IP {taken[0]} is already {claimed[taken[0]]}'s"))
        return None
    limits = PodLimits()
    annotation = pod.annotations.get(NETWORK_QOS_ANNOTATION)
    if config.pod_limits and annotation is not None:
        try:
            limits = parse_network_qos(annotation)
        except ValueError as err:
            skipped.append(Skipped(pod.name, f"limits ignored: {err}"))
    claimed.update((ip, pod.name) for ip in ips)
    return pod, ips, limits


def plan_network(
    config: NetQoSConfig,
    pods: Iterable[PodNetwork],
    uplinks: Iterable[str],
    *,
    route_devices: Mapping[str, str] | None = None,
    local_ips: Iterable[str] = (),
) -> NetPlan:
    """The whole desired state.

    ``uplinks``: the interfaces to shape (config.interfaces, or the default route's).
    ``route_devices``: pod IP -> device the node routes it to (needed for ingress limits;
    IPs missing here get no ingress limit). ``local_ips``: the node's own addresses, never
    classified as a pod's (a host-network pod reported as a normal one would otherwise drag
    the node's traffic into its class).
    """
    uplinks = tuple(dict.fromkeys(uplinks))
    for uplink in uplinks:
        if not _SAFE_IFNAME.match(uplink):
            raise ValueError(f"interface name {uplink!r} cannot be shaped (unusual characters)")
    route_devices = {ip: dev for ip, dev in (route_devices or {}).items() if _SAFE_IFNAME.match(dev)}
    excluded = [ipaddress.ip_network(c, strict=False) for c in config.exclude_cidrs]
    excluded += [ipaddress.ip_network(ip) for ip in local_ips]
    link = _mbit(config.link_rate_mbps)
    prio_of = {name: config.priority_of(name) for name in NET_CLASS_NAMES}
    be_prio = prio_of["BE"]
    priorities = sorted(set(prio_of.values()))
    others = [p for p in priorities if p != be_prio]
    be_rate = min(_mbit(config.be_rate_mbps), link)
    other_rate = max((link - be_rate) // max(len(others), 1), _MIN_RATE_BPS)

    skipped: list[Skipped] = []
    claimed: dict[str, str] = {}  # IP -> pod that has it (stale records may repeat an IP)
    members: dict[int, list[tuple[PodNetwork, list[str], PodLimits]]] = {p: [] for p in priorities}
    for pod in sorted(pods, key=lambda p: p.sandbox_id):
        try:
            member = _classify_pod(pod, config, prio_of, excluded, claimed, skipped)
        except Exception as err:  # one pod's bad data must never stop shaping for the node
            skipped.append(Skipped(pod.name, f"skipped: {type(err).__name__}: {str(err)[:200]}"))
            continue
        if member is not None:
            members[prio_of[pod.qos_class]].append(member)  # type: ignore[index]

    # Uplink tree: root, per priority inner + shared leaf, per limited pod a leaf.
    egress_minor = _pod_minors(pod.sandbox_id for group in members.values()
                               for pod, _, limits in group if limits.egress_bps)
    classes = [HtbClass(_ROOT_MINOR, 0, link, link, 0, "link")]
    egress4: list[tuple[str, str]] = []
    egress6: list[tuple[str, str]] = []
    for prio in priorities:
        names = "/".join(n for n in NET_CLASS_NAMES if prio_of[n] == prio)
        if prio == be_prio:
            rate, ceil = be_rate, min(_mbit(config.be_ceil_mbps), link)
        else:
            rate, ceil = other_rate, link
        inner = _INNER_BASE + prio
        classes.append(HtbClass(inner, _ROOT_MINOR, rate, ceil, prio, f"priority {prio} ({names})"))
        limited = [(pod, ips, limits) for pod, ips, limits in members[prio] if limits.egress_bps]
        share = max(rate // (len(limited) + 1), _MIN_RATE_BPS)
        classes.append(HtbClass(_SHARED_BASE + prio, inner, min(share, ceil), ceil, prio,
                                f"{names} pods"))
        for pod, _ips, limits in limited:
            minor = egress_minor[pod.sandbox_id]
            pod_ceil = min(limits.egress_bps or ceil, ceil)
            classes.append(HtbClass(minor, inner, min(share, pod_ceil), pod_ceil, prio,
                                    f"egress limit of {pod.name}"))
        for pod, ips, _limits in members[prio]:
            minor = egress_minor.get(pod.sandbox_id, _SHARED_BASE + prio)
            for ip in ips:
                (egress6 if ":" in ip else egress4).append((ip, _nft_classid(minor)))
    system_leaf = _SHARED_BASE + prio_of["SYSTEM"]
    trees = [HtbTree(dev, system_leaf, tuple(classes), "uplink") for dev in uplinks]

    # Ingress trees: one per device that leads to a pod with an ingress limit.
    per_device: dict[str, list[tuple[PodNetwork, list[str], int]]] = {}
    for group in members.values():
        for pod, ips, limits in group:
            if not limits.ingress_bps:
                continue
            for ip in ips:
                device = route_devices.get(ip)
                if device is None or device in uplinks:
                    continue  # not routed to a local device: nowhere to shape it
                entries = per_device.setdefault(device, [])
                entries.append((pod, [ip], limits.ingress_bps))
    ingress4: list[tuple[str, str, str]] = []
    ingress6: list[tuple[str, str, str]] = []
    for device in sorted(per_device):
        entries = per_device[device]
        minors = _pod_minors(pod.sandbox_id for pod, _, _ in entries)
        total = INGRESS_DEVICE_RATE_BPS
        limits_by_pod = {pod.sandbox_id: (pod, bps) for pod, _, bps in entries}
        reserved = sum(min(bps, total) for _, bps in limits_by_pod.values())
        device_classes = [
            HtbClass(_ROOT_MINOR, 0, total, total, 0, "device"),
            HtbClass(_INGRESS_DEFAULT_MINOR, _ROOT_MINOR, max(total - reserved, _MIN_RATE_BPS),
                     total, 0, "unlimited"),
        ]
        for sandbox_id in sorted(limits_by_pod):
            pod, bps = limits_by_pod[sandbox_id]
            device_classes.append(HtbClass(minors[sandbox_id], _ROOT_MINOR, min(bps, total),
                                           min(bps, total), 0, f"ingress limit of {pod.name}"))
        for pod, ips, _ in entries:
            for ip in ips:
                item = (device, ip, _nft_classid(minors[pod.sandbox_id]))
                (ingress6 if ":" in ip else ingress4).append(item)
        trees.append(HtbTree(device, _INGRESS_DEFAULT_MINOR, tuple(device_classes), "ingress"))

    return NetPlan(
        trees=tuple(trees),
        uplinks=uplinks,
        egress4=tuple(sorted(egress4)),
        egress6=tuple(sorted(egress6)),
        ingress4=tuple(sorted(ingress4)),
        ingress6=tuple(sorted(ingress6)),
        skipped=tuple(skipped),
    )
