"""The network QoS controller: runs the network policy (policy/net.py) through the tc/nft writer
(executor/netqos.py): shaping when enabled, nothing of ours when disabled."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import structlog

from koordnode.executor.netqos import NetQoSExecutor, NetReport, netlink_errors, tc_id
from koordnode.config.netqos import NetQoSConfig
from koordnode.policy.net import HTB_MAJOR, NETWORK_QOS_ANNOTATION, NFT_FAMILY, NFT_TABLE, NetPlan, PodNetwork, plan_network

__all__ = ["NetQoSController"]


class NetQoSController:
    """Runs the network policy: shaping when enabled, nothing of ours when disabled."""

    def __init__(self, config: NetQoSConfig, executor: NetQoSExecutor | None = None, *, logger: Any = None) -> None:
        self.config = config
        self.executor = executor or NetQoSExecutor(logger=logger)
        self._log = logger if logger is not None else structlog.get_logger("koordnode.netqos")
        self.last_report = NetReport(enabled=config.enable)
        # Dry run: plan and report what would be configured; no tc or nft change.
        self.dry_run = False
        # Disabled, and a pass left nothing of ours: later passes have nothing to remove (only
        # koordnode adds its qdiscs and table) and skip the netlink dump and the nft run.
        self._clean_while_disabled = False

    def update_config(self, config: NetQoSConfig) -> None:
        self.config = config
        self._clean_while_disabled = False  # the reload's pass looks again

    reconfigure = update_config  # what the daemon's reload calls on each component

    def uplinks(self) -> list[str]:
        return list(self.config.interfaces) or self.executor.default_route_interfaces()

    def reconcile(self, pods: Iterable[PodNetwork]) -> NetReport:
        if not self.config.enable:
            if self.dry_run:
                report = NetReport(enabled=False)
                report.changes = [f"would remove koordnode's qdisc on {device}"
                                  for device in self.executor.owned_devices()]
            elif self._clean_while_disabled:
                report = NetReport(enabled=False)
            else:
                report = self.executor.remove_all()
                self._clean_while_disabled = not report.failures
            self.last_report = report
            return report
        report = NetReport(enabled=True)
        pods = list(pods)
        try:
            uplinks = self.uplinks()
            if not uplinks:
                report.failures.append("no uplink: [net] interfaces is empty and there is no default route")
            limited = [ip for pod in pods for ip in pod.ips
                       if self.config.pod_limits and pod.annotations.get(NETWORK_QOS_ANNOTATION)]
            route_devices = self.executor.route_devices(limited) if limited else {}
            plan = plan_network(self.config, pods, uplinks, route_devices=route_devices,
                                local_ips=self.executor.local_addresses())
        except (netlink_errors(), OSError, ValueError) as err:
            report.failures.append(f"planning failed: {err}")
            self._log.warning("netqos_plan_failed", error=str(err))
            self.last_report = report
            return report
        report.uplinks = list(plan.uplinks)
        report.skipped = [f"{s.pod}: {s.reason}" for s in plan.skipped]
        if self.dry_run:
            report.changes = _describe_plan(plan)
            if report.changes != self.last_report.changes:
                for line in report.changes:
                    self._log.info("netqos_dry_run", would=line)
            self.last_report = report
            return report
        self.executor.apply(plan, report=report)
        self.last_report = report
        return report

    def status(self) -> dict[str, Any]:
        report = self.last_report
        status = {"enabled": report.enabled, "uplinks": report.uplinks,
                  "failures": list(report.failures), "skipped": list(report.skipped)}
        if self.dry_run:
            status["would"] = list(report.changes)
        return status


def _describe_plan(plan: NetPlan) -> list[str]:
    """What applying the plan would configure, one line per qdisc, class and nft table."""
    lines = []
    for tree in plan.trees:
        lines.append(f"would set HTB qdisc {HTB_MAJOR:x}: on {tree.device} ({tree.role}), "
                     f"default class {HTB_MAJOR:x}:{tree.default_minor:x}")
        for spec in tree.classes:
            lines.append(f"would set class {tc_id(spec.handle)} on {tree.device}: rate "
                         f"{spec.rate_bps} ceil {spec.ceil_bps} bit/s prio {spec.prio} ({spec.label})")
    pods = len(plan.egress4) + len(plan.egress6) + len(plan.ingress4) + len(plan.ingress6)
    lines.append(f"would load nftables table {NFT_FAMILY} {NFT_TABLE} classifying {pods} pod address(es)")
    return lines
