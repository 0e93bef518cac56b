"""Network QoS backend: HTB qdiscs and classes via pyroute2, the classifier via nftables.

Converges the kernel to a koordnode/policy/net.py NetPlan (the controller,
koordnode/qos/net_control.py, decides when) (see its docstring for the
design):

- a root HTB qdisc with handle ``4b4e:`` on every planned device: adopted when it is
  already there (a koordnode restart), otherwise installed with ``replace``. On uplinks
  (configured, or the default route's) whatever root qdisc was there goes; on pod-facing
  devices (ingress limits) only the kernel's default one (handle 0) is replaced, a qdisc
  someone installed is left alone and reported. Ingress/clsact qdiscs are never touched;
- its classes: added, changed or deleted only where rate, ceil, prio or parent differ;
- the ``inet koordnode`` nftables table, replaced atomically (one ``nft -f`` transaction)
  only when its fingerprint comment differs from the plan's;
- devices carrying a ``4b4e:`` HTB that the plan no longer wants lose it, and with
  ``[net] enable = false`` every such qdisc and the table are removed. Other qdiscs, other
  tables and other devices are never touched.

Needs CAP_NET_ADMIN and the ``nft`` program (Debian/RHEL package ``nftables``). Everything
can target a named network namespace (``ip netns``), which is how the tests run it.
"""

from __future__ import annotations

import re
import socket
import subprocess
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from koordnode.executor import rtnl
from koordnode.executor.originals import OriginalsError, OriginalsJournal
from koordnode.policy.net import (
    HTB_MAJOR,
    NFT_FAMILY,
    NFT_TABLE,
    HtbClass,
    HtbTree,
    NetPlan,
    classid,
)

if TYPE_CHECKING:
    from pyroute2 import IPRoute

__all__ = ["NetQoSExecutor", "NetReport", "netlink_errors", "tc_id"]

_TC_H_ROOT = 0xFFFFFFFF
_QDISC_HANDLE = classid(0)
_NFT_TIMEOUT_S = 10.0
_FINGERPRINT = re.compile(r'comment "koordnode netqos ([0-9a-f]+)"')


@dataclass
class NetReport:
    enabled: bool
    uplinks: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)  # what was written, one line each
    failures: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # pods left unclassified, with why

    @property
    def changed(self) -> bool:
        return bool(self.changes)


@dataclass(frozen=True)
class _KernelClass:
    handle: int
    parent: int
    rate_Bps: int
    ceil_Bps: int
    prio: int


class NetQoSExecutor:
    """The only code that changes tc and nftables state."""

    def __init__(
        self,
        *,
        netns: str | None = None,
        nft_command: Sequence[str] = ("nft",),
        logger: Any = None,
        originals: OriginalsJournal | None = None,
    ) -> None:
        self.netns = netns
        # Root qdiscs replaced and the table created are kept there first (restore).
        self.originals = originals
        self._nft_command = list(nft_command)
        self._log = logger if logger is not None else structlog.get_logger("koordnode.executor")
        self._lock = threading.RLock()
        self._last_nft_error: str | None = None

    # ---------------------------------------------------------------- netlink helpers

    def _ipr(self) -> IPRoute:
        ipr_class = _pyroute2().IPRoute
        return ipr_class(netns=self.netns) if self.netns else ipr_class()

    @staticmethod
    def _names(ipr: IPRoute) -> dict[int, str]:
        return {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}

    def default_route_interfaces(self) -> list[str]:
        """Interfaces of the main table's default routes (IPv4 first, then IPv6)."""
        out: list[str] = []
        with self._ipr() as ipr:
            names = self._names(ipr)
            for family in (socket.AF_INET, socket.AF_INET6):
                for route in ipr.get_routes(family=family, table=254):
                    if route["dst_len"] != 0:
                        continue
                    oifs = [route.get_attr("RTA_OIF")]
                    for hop in route.get_attr("RTA_MULTIPATH") or []:
                        oifs.append(hop["oif"])
                    for oif in oifs:
                        name = names.get(oif)
                        if name and name != "lo" and name not in out:
                            out.append(name)
        return out

    def local_addresses(self) -> set[str]:
        with self._ipr() as ipr:
            return {addr.get_attr("IFA_ADDRESS") for addr in ipr.get_addr()} - {None}

    def route_devices(self, ips: Iterable[str]) -> dict[str, str]:
        """IP -> device the node routes it to (IPs that are local or unroutable are left out)."""
        out: dict[str, str] = {}
        with self._ipr() as ipr:
            names = self._names(ipr)
            for ip in ips:
                try:
                    routes = ipr.route("get", dst=ip)
                except netlink_errors():
                    continue
                for route in routes:
                    name = names.get(route.get_attr("RTA_OIF"))
                    if name and name != "lo":
                        out[ip] = name
                        break
        return out

    # ---------------------------------------------------------------- apply

    def apply(self, plan: NetPlan, *, report: NetReport | None = None) -> NetReport:
        """Converge tc and nftables to ``plan``. Idempotent: an applied plan changes nothing."""
        report = report or NetReport(enabled=True)
        with self._lock, self._ipr() as ipr:
            names = self._names(ipr)
            index_of = {name: index for index, name in names.items()}
            wanted = set()
            for tree in plan.trees:
                index = index_of.get(tree.device)
                if index is None:
                    report.failures.append(f"{tree.device}: no such interface")
                    continue
                wanted.add(index)
                try:
                    self._converge_tree(ipr, index, tree, report)
                except netlink_errors() as err:
                    report.failures.append(f"{tree.device}: {_netlink_error(err)}")
                    self._log.warning("netqos_tc_failed", device=tree.device, error=_netlink_error(err))
            for index in sorted(self._owned_indexes(ipr)):
                if index not in wanted:
                    self._remove_qdisc(ipr, index, names.get(index, str(index)), report, "no longer planned")
        self._converge_nft(plan, report)
        return report

    def remove_all(self, *, report: NetReport | None = None) -> NetReport:
        """Delete every ``4b4e:`` HTB root qdisc and the ``inet koordnode`` table."""
        report = report or NetReport(enabled=False)
        if self._may_own_qdiscs():
            with self._lock, self._ipr() as ipr:
                names = self._names(ipr)
                for index in sorted(self._owned_indexes(ipr)):
                    self._remove_qdisc(ipr, index, names.get(index, str(index)), report, "network QoS disabled")
        if self._nft_fingerprint() is not None:
            if self._nft(["delete", "table", NFT_FAMILY, NFT_TABLE], report, "delete table") is not None:
                report.changes.append(f"nft: deleted table {NFT_FAMILY} {NFT_TABLE}")
                self._log.info("netqos_nft_removed", table=f"{NFT_FAMILY} {NFT_TABLE}")
        return report

    def restore_root(self, device: str, was: str | None, *, dry_run: bool = False) -> tuple[str, str]:
        """Give a device back the root qdisc it had before koordnode's HTB: the kernel's default
        when that was it (deleting ours is enough; its classes go with it), otherwise that kind
        again with the kernel's default parameters (they were not recorded).
        (outcome, detail): outcome "restored", "unchanged", "would restore" or "failed"."""
        kind, _, handle = (was or "none").partition(" ")
        default = kind == "none" or handle in ("", "0:")
        with self._lock, self._ipr() as ipr:
            index = {name: i for i, name in self._names(ipr).items()}.get(device)
            if index is None:
                return "unchanged", f"{device} is gone"
            if self._owned_root(ipr, index) is None:
                return "unchanged", f"{device} no longer has koordnode's htb {HTB_MAJOR:x}: root qdisc"
            if dry_run:
                return "would restore", f"would delete htb {HTB_MAJOR:x}: on {device}" + (
                    "" if default else f" and install {kind} (default parameters)")
            try:
                ipr.tc("del", index=index, handle=_QDISC_HANDLE, parent=_TC_H_ROOT)
            except netlink_errors() as err:
                return "failed", f"deleting htb {HTB_MAJOR:x}: on {device}: {_netlink_error(err)}"
            self._log.info("netqos_qdisc_removed", device=device, reason="restore", netns=self.netns)
            if default:
                return "restored", f"deleted htb {HTB_MAJOR:x}: on {device}: the kernel's default root qdisc is back"
            try:
                ipr.tc("replace", kind, index, int(handle.rstrip(":"), 16) << 16)
            except (netlink_errors(), ValueError, TypeError, KeyError) as err:
                return "failed", (f"deleted htb {HTB_MAJOR:x}: on {device} (the kernel's default is back), but "
                                  f"could not install its {kind} {handle} again: {err}")
            return "restored", f"{device}: {kind} {handle} root qdisc installed again (default parameters)"

    def restore_table(self, *, dry_run: bool = False) -> tuple[str, str]:
        """Delete the ``inet koordnode`` table (koordnode created it; absent was its original)."""
        if self._nft_fingerprint() is None:
            return "unchanged", f"no table {NFT_FAMILY} {NFT_TABLE}"
        if dry_run:
            return "would restore", f"would delete table {NFT_FAMILY} {NFT_TABLE}"
        report = NetReport(enabled=False)
        if self._nft(["delete", "table", NFT_FAMILY, NFT_TABLE], report, "delete table") is None:
            return "failed", "; ".join(report.failures)
        self._log.info("netqos_nft_removed", table=f"{NFT_FAMILY} {NFT_TABLE}", reason="restore")
        return "restored", f"deleted table {NFT_FAMILY} {NFT_TABLE}"

    def owned_devices(self) -> list[str]:
        """Devices carrying koordnode's HTB root qdisc."""
        with self._ipr() as ipr:
            names = self._names(ipr)
            return [names.get(index, str(index)) for index in sorted(self._owned_indexes(ipr))]

    # ---------------------------------------------------------------- tc

    def _may_own_qdiscs(self) -> bool:
        """False only when a stdlib netlink dump shows no koordnode HTB root qdisc, so that the
        disabled path, run on every reconcile pass, does not load pyroute2 for nothing. Any
        doubt (another namespace, a failed dump) answers True and pyroute2 looks itself."""
        if self.netns:
            return True
        try:
            qdiscs = rtnl.dump_qdiscs()
        except (OSError, ValueError):
            return True
        return any(q.parent == _TC_H_ROOT and q.handle == _QDISC_HANDLE and q.kind == "htb" for q in qdiscs)

    @staticmethod
    def _owned_indexes(ipr: IPRoute) -> set[int]:
        """Interfaces whose root qdisc is koordnode's HTB (one dump for all interfaces)."""
        return {q["index"] for q in ipr.get_qdiscs()
                if q["parent"] == _TC_H_ROOT and q["handle"] == _QDISC_HANDLE
                and q.get_attr("TCA_KIND") == "htb"}

    @staticmethod
    def _root_qdisc(ipr: IPRoute, index: int) -> Any | None:
        for qdisc in ipr.get_qdiscs(index):
            if qdisc["parent"] == _TC_H_ROOT:
                return qdisc
        return None

    def _owned_root(self, ipr: IPRoute, index: int) -> Any | None:
        qdisc = self._root_qdisc(ipr, index)
        if qdisc is not None and qdisc.get_attr("TCA_KIND") == "htb" and qdisc["handle"] == _QDISC_HANDLE:
            return qdisc
        return None

    def _converge_tree(self, ipr: IPRoute, index: int, tree: HtbTree, report: NetReport) -> None:
        device = tree.device
        ours = self._owned_root(ipr, index)
        if ours is None:
            previous = self._root_qdisc(ipr, index)
            kind = previous.get_attr("TCA_KIND") if previous is not None else "none"
            if tree.role == "ingress" and previous is not None and previous["handle"] != 0:
                # Handle 0 marks the kernel's default qdisc; anything else someone installed
                # on purpose. Uplinks are ours by configuration; pod-facing devices are not.
                detail = (f"{device}: keeps its {kind} {previous['handle'] >> 16:x}: root qdisc; "
                          "pod ingress limits there are not applied")
                report.failures.append(detail)
                self._log.warning("netqos_foreign_qdisc", device=device, kind=kind)
                return
            was = f"{kind} {previous['handle'] >> 16:x}:" if previous is not None else "none"
            problem = self._keep_original("tc_root", device, was)
            if problem is not None:
                report.failures.append(f"{device}: {problem}")
                return
            ipr.tc("replace", "htb", index, _QDISC_HANDLE, default=tree.default_minor)
            self._change(report, "netqos_qdisc_installed", f"{device}: htb {HTB_MAJOR:x}: replaces {kind}",
                         device=device, replaced=kind, role=tree.role)
        else:
            init = ours.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_INIT") or {}
            if init.get("defcls") != tree.default_minor:
                ipr.tc("change", "htb", index, _QDISC_HANDLE, default=tree.default_minor)
                self._change(report, "netqos_qdisc_changed",
                             f"{device}: default class {HTB_MAJOR:x}:{tree.default_minor:x}", device=device)

        current = {c.handle: c for c in self._classes(ipr, index)}
        desired = {c.handle: c for c in tree.classes}
        # Remove what is not wanted (or hangs off another parent), deepest first.
        stale = [h for h, c in current.items()
                 if h not in desired or desired[h].parent != c.parent]
        for handle in sorted(stale, key=lambda h: _depth(h, current), reverse=True):
            # No kind: pyroute2 would build (and fail on) class options for a delete.
            ipr.tc("del-class", index=index, handle=handle)
            self._change(report, "netqos_class_removed", f"{device}: removed class {tc_id(handle)}",
                         device=device, classid=tc_id(handle))
            current.pop(handle)
        for spec in tree.classes:  # parents first
            have = current.get(spec.handle)
            want = _KernelClass(spec.handle, spec.parent, spec.rate_bps // 8, spec.ceil_bps // 8, spec.prio)
            if have == want:
                continue
            command = "add-class" if have is None else "change-class"
            ipr.tc(command, "htb", index, spec.handle, parent=spec.parent, **_htb_params(spec))
            verb = "added" if have is None else "changed"
            self._change(
                report, f"netqos_class_{verb}",
                f"{device}: {verb} class {tc_id(spec.handle)} rate {spec.rate_bps} ceil "
                f"{spec.ceil_bps} prio {spec.prio} ({spec.label})",
                device=device, classid=tc_id(spec.handle), rate_bps=spec.rate_bps,
                ceil_bps=spec.ceil_bps, prio=spec.prio, label=spec.label,
            )

    @staticmethod
    def _classes(ipr: IPRoute, index: int) -> list[_KernelClass]:
        out = []
        for msg in ipr.get_classes(index):
            if msg.get_attr("TCA_KIND") != "htb" or (msg["handle"] >> 16) != HTB_MAJOR:
                continue
            options = msg.get_attr("TCA_OPTIONS")
            parms = options.get_attr("TCA_HTB_PARMS")
            rate = options.get_attr("TCA_HTB_RATE64") or parms["rate"]
            ceil = options.get_attr("TCA_HTB_CEIL64") or parms["ceil"]
            parent = msg["parent"] if msg["parent"] != _TC_H_ROOT else _QDISC_HANDLE
            out.append(_KernelClass(msg["handle"], parent, rate, ceil, parms["prio"]))
        return out

    def _remove_qdisc(self, ipr: IPRoute, index: int, name: str, report: NetReport, why: str) -> None:
        try:
            ipr.tc("del", index=index, handle=_QDISC_HANDLE, parent=_TC_H_ROOT)
        except netlink_errors() as err:
            report.failures.append(f"{name}: removing htb {HTB_MAJOR:x}: failed: {_netlink_error(err)}")
            self._log.warning("netqos_tc_failed", device=name, error=_netlink_error(err))
            return
        self._change(report, "netqos_qdisc_removed", f"{name}: removed htb {HTB_MAJOR:x}: ({why})",
                     device=name, reason=why)

    def _keep_original(self, kind: str, target: str, value: str | None) -> str | None:
        """Keep the original before the first change; the problem when it could not be kept."""
        if self.originals is None:
            return None
        try:
            if self.originals.keep(kind, self.netns or "", target, value):
                self._log.info("original_kept", kind=kind, target=target, value=value, netns=self.netns,
                               state_file=str(self.originals.path))
        except OriginalsError as err:
            self._log.error("original_not_kept", kind=kind, target=target, error=str(err))
            return f"not changed: its original could not be kept ({err})"
        return None

    def _change(self, report: NetReport, event: str, line: str, **fields: Any) -> None:
        report.changes.append(line)
        self._log.info(event, netns=self.netns, **fields)

    # ---------------------------------------------------------------- nftables

    def _nft_argv(self, args: list[str]) -> list[str]:
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        return prefix + self._nft_command + args

    def _nft(self, args: list[str], report: NetReport, what: str, stdin: str | None = None) -> str | None:
        try:
            done = subprocess.run(self._nft_argv(args), input=stdin, capture_output=True, text=True,
                                  timeout=_NFT_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            self._nft_failed(report, what, str(err))
            return None
        if done.returncode != 0:
            self._nft_failed(report, what, (done.stderr or done.stdout).strip())
            return None
        self._last_nft_error = None
        return done.stdout

    def _nft_failed(self, report: NetReport, what: str, error: str) -> None:
        report.failures.append(f"nft {what}: {error}")
        # Every reconcile retries; log a persisting error (e.g. nft not installed) once.
        if error != self._last_nft_error:
            self._log.warning("netqos_nft_failed", action=what, error=error)
        self._last_nft_error = error

    def _nft_fingerprint(self) -> str | None:
        """The fingerprint comment of our table ("" without one); None: no table."""
        try:
            done = subprocess.run(self._nft_argv(["list", "table", NFT_FAMILY, NFT_TABLE]),
                                  capture_output=True, text=True, timeout=_NFT_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0:
            return None
        match = _FINGERPRINT.search(done.stdout)
        return match.group(1) if match else ""

    def _converge_nft(self, plan: NetPlan, report: NetReport) -> None:
        found = self._nft_fingerprint()
        if found == plan.fingerprint:
            return
        if found is None:  # koordnode creates the table: its original is its absence
            problem = self._keep_original("nft_table", f"{NFT_FAMILY} {NFT_TABLE}", None)
            if problem is not None:
                report.failures.append(f"nft: {problem}")
                return
        if self._nft(["-f", "-"], report, "replace table", stdin=plan.nft_script()) is None:
            return
        self._change(report, "netqos_nft_applied",
                     f"nft: table {NFT_FAMILY} {NFT_TABLE} set to plan {plan.fingerprint} "
                     f"({len(plan.egress4) + len(plan.egress6)} egress, "
                     f"{len(plan.ingress4) + len(plan.ingress6)} ingress entries)",
                     fingerprint=plan.fingerprint)


def tc_id(handle: int) -> str:
    return f"{handle >> 16:x}:{handle & 0xFFFF:x}"


def _depth(handle: int, classes: dict[int, _KernelClass]) -> int:
    depth, seen = 0, set()
    while handle in classes and handle not in seen:
        seen.add(handle)
        handle = classes[handle].parent
        depth += 1
    return depth


def _htb_params(spec: HtbClass) -> dict[str, int]:
    rate, ceil = spec.rate_bps // 8, spec.ceil_bps // 8  # bytes/s
    return {
        "rate": rate,
        "ceil": ceil,
        "prio": spec.prio,
        # ~1 ms worth of bytes, at least two full frames; what tc's defaults aim at.
        "burst": max(rate // 1000, 3200),
        "cburst": max(ceil // 1000, 3200),
        # Explicit DRR quantum (bytes per round): the kernel's rate/r2q overflows and warns
        # for fast classes.
        "quantum": min(max(rate // 10, 1600), 200_000),
    }


def _netlink_error(err: Exception) -> str:
    return f"{getattr(err, 'code', None)}: {err.args[1] if len(err.args) > 1 else err}"


def _pyroute2() -> Any:
    """pyroute2, imported on first use: it adds ~10 MB to the daemon (sqlite3, psutil, ctypes
    and all its netlink families), which only a node that shapes traffic or has our qdiscs to
    remove should pay for."""
    import pyroute2

    return pyroute2


def netlink_errors() -> type[Exception]:
    """pyroute2's NetlinkError, for except clauses (evaluated only when something was raised)."""
    return _pyroute2().NetlinkError
