"""The cluster check ([kubernetes]): koordnode's identity reaches the API server and reads its NodeSLO."""

from __future__ import annotations

import asyncio
from typing import Any

from koordnode.doctor.report import ACTIVE, DEGRADED, FAIL, OFF, OK, WARN, Report


def check_kubernetes(report: Report, config: Any) -> None:
    """[kubernetes]: whether koordnode's identity reaches the API server and may read its NodeSLO."""
    kube = config.kubernetes
    if not kube.enable:
        report.feature("cluster (NodeSLO, pod facts, Eviction API, NodeMetric)", OFF,
                       "[kubernetes] enable = false: the node works from its file alone")
        return
    from koordnode.kube.agent import NODESLOS, credentials_of, node_name_of
    from koordnode.kube.client import ApiError, KubeClient, Unreachable
    from koordnode.kube.credentials import CredentialsError

    try:
        node = node_name_of(kube)
    except ValueError as exc:
        report.feature("cluster (NodeSLO, pod facts, Eviction API, NodeMetric)", DEGRADED, str(exc))
        report.add("kubernetes", FAIL, str(exc), "set [kubernetes] node_name, or a valid $NODE_NAME")
        return
    report.facts["kubernetes_node_name"] = node
    try:
        client = KubeClient(credentials_of(kube), timeout_s=min(kube.request_timeout_s, 5.0))
    except CredentialsError as exc:
        report.feature("cluster (NodeSLO, pod facts, Eviction API, NodeMetric)", DEGRADED, str(exc))
        report.add("kubernetes", FAIL, str(exc), "fix [kubernetes] kubeconfig / service_account_dir")
        return
    server = client.credentials.server
    try:
        asyncio.run(client.get(f"{NODESLOS}/{node}"))
    except ApiError as exc:
        if exc.status == 404:
            report.feature("cluster (NodeSLO, pod facts, Eviction API, NodeMetric)", ACTIVE,
                           f"{server} answers; no NodeSLO named {node} yet (the file and defaults apply)")
            report.add("kubernetes", WARN, f"{server} answers, but there is no NodeSLO named {node}",
                       "check koord-manager runs, and that [kubernetes] node_name is the node's name in the API")
            return
        fix = ("apply /usr/share/doc/koordnode/koordnode-rbac.yaml (or install the Helm chart) and bind koordnode's identity to it"
               if exc.status in (401, 403) else "check the API server's log")
        report.feature("cluster (NodeSLO, pod facts, Eviction API, NodeMetric)", DEGRADED, f"{server}: {exc}")
        report.add("kubernetes", FAIL, f"{server} refuses reading NodeSLO {node}: {exc}", fix)
        return
    except Unreachable as exc:
        report.feature("cluster (NodeSLO, pod facts, Eviction API, NodeMetric)", DEGRADED,
                       f"API server unreachable: the daemon keeps its last good values: {exc}")
        report.add("kubernetes", WARN, f"{server} does not answer: {exc}",
                   "check the network path and the server address; CRI is not affected")
        return
    report.feature("cluster (NodeSLO, pod facts, Eviction API, NodeMetric)", ACTIVE,
                   f"{server} answers; NodeSLO {node} readable")
    report.add("kubernetes", OK, f"{server} answers as {client.credentials.source}; NodeSLO {node} readable")
