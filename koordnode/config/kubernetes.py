"""``[kubernetes]``: koordnode in a cluster (off by default).

With ``enable = true`` koordnode talks to the API server under its own identity: it watches its
node's NodeSLO (fleet configuration, below the local file), the pods bound to its node (facts CRI
does not carry), evicts through the Eviction API and publishes its NodeMetric. Off, nothing of
it runs and the node works from the TOML file alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from koordnode.config.fields import setting

__all__ = ["IN_CLUSTER_ACCOUNT_DIR", "KubernetesConfig"]

IN_CLUSTER_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

# A node's name is a DNS subdomain (RFC 1123), lower case.
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")


def check_node_name(value: str) -> str | None:
    if value == "":
        return None
    if len(value) > 253 or not _NODE_NAME.match(value):
        return f"expected a node name (lower-case DNS subdomain, at most 253 characters) or \"\", got {value!r}"
    return None


def _check_path(value: str) -> str | None:
    if value and (not value.startswith("/") or "\0" in value):
        return f"expected an absolute path or \"\", got {value!r}"
    return None


@dataclass(frozen=True)
class KubernetesConfig:
    enable: bool = setting(
        False,
        doc="talk to the API server: NodeSLO below the local file, pod facts, evictions through the "
        "Eviction API, NodeMetric; false = the node works from this file alone",
    )
    kubeconfig: str = setting(
        "", check=_check_path,
        doc='kubeconfig file of koordnode\'s own identity (its current context); "" = in-cluster: '
        "the service account's token and CA under service_account_dir, the server from "
        "KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT",
    )
    service_account_dir: str = setting(
        IN_CLUSTER_ACCOUNT_DIR, check=_check_path,
        doc="in-cluster: directory of the service account's token and ca.crt (both re-read when they "
        "change, so a rotated token is used at once)",
    )
    node_name: str = setting(
        "", check=check_node_name,
        doc='this node\'s name in the API; "" = $NODE_NAME if set (a DaemonSet pod\'s, from the downward '
        'API), else the host name in lower case, as kubelet names its node',
    )
    request_timeout_s: float = setting(
        10.0, min=1, max=300, doc="longest wait for one API request (not a watch), seconds",
    )
    watch_timeout_s: int = setting(
        300, min=10, max=3600,
        doc="a watch asks the server to end it after this many seconds and resumes from its last "
        "resourceVersion (bounds a silently dead connection), seconds",
    )
    max_response_bytes: int = setting(
        4 * 1024 * 1024, min=64 * 1024, max=1024 * 1024 * 1024,
        doc="largest API response (a list, one watch event) read; a bigger one is refused with an error, bytes",
    )
    backoff_max_s: float = setting(
        60.0, min=1, max=3600,
        doc="longest wait between attempts while the API server fails (exponential from 0.5 s), seconds",
    )
    nodeslo: bool = setting(
        True, doc="watch this node's NodeSLO (slo.koordinator.sh/v1alpha1) and apply it below the local file",
    )
    pod_facts: bool = setting(
        True, doc="watch the pods bound to this node for memory requests, priority and owners",
    )
    node_topology: bool = setting(
        True, doc="report this node's NodeResourceTopology (CPU topology and koordnode's CPU pools, as koordlet "
        "does) so that koord-scheduler can bind LSE/LSR pods to CPUs here",
    )
    node_reservation: bool = setting(
        True, doc="watch this node's Node for Koordinator's node.koordinator.sh/reservation annotation and apply "
        "its reserved CPUs ([node] reserved_cpus) and memory ([strategy.be_memory] reserved_mib) with the "
        "NodeSLO's values, below the local file",
    )
    evictions_per_window: int = setting(
        3, min=1, max=1000,
        doc="most evictions requested through the Eviction API per eviction_window_s (a pod already "
        "terminating is not counted again)",
    )
    eviction_window_s: float = setting(
        60.0, min=1, max=86400, doc="the window of evictions_per_window, seconds",
    )
    node_metric: bool = setting(
        True,
        doc="publish this node's NodeMetric status (node, LS/BE and per-pod usage) at the NodeMetric's "
        "spec.metricCollectPolicy.reportIntervalSeconds (node_metric_interval_s when it has none)",
    )
    node_metric_interval_s: int = setting(
        60, min=5, max=3600, doc="NodeMetric report interval when the object names none, seconds",
    )
