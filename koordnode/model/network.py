"""A pod's network as CRI reports it (PodSandboxStatus): its IPs and whether it uses the
node's network namespace."""

from __future__ import annotations

from typing import Any


def pod_network_from_status(status: Any) -> tuple[tuple[str, ...], bool]:
    """(IPs, host_network) from a CRI PodSandboxStatus message."""
    network = status.network
    ips = [network.ip] if network.ip else []
    ips += [extra.ip for extra in network.additional_ips if extra.ip]
    # NamespaceMode NODE = 2: the pod shares the node's network namespace.
    host_network = status.linux.namespaces.options.network == 2
    return tuple(dict.fromkeys(ips)), host_network

