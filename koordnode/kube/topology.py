"""This node's NodeResourceTopology (topology.node.k8s.io/v1alpha1) in the shape koordlet
reports it, so that koord-scheduler's NodeNUMAResource plugin can bind LSE/LSR pods to CPUs here.

What Koordinator v1.8.0's scheduler reads (pkg/scheduler/plugins/nodenumaresource): zones
"node-<N>" of type "Node" with cpu (and memory) capacity, allocatable and available, and the
annotations: `node.koordinator.sh/cpu-topology` (every CPU's id, core, socket, NUMA node),
`node.koordinator.sh/cpu-shared-pools` and `be-cpu-shared-pools` (per socket and NUMA node),
`node.koordinator.sh/pod-cpu-allocs` (CPUs kubelet's static CPU manager gave pods),
`kubelet.koordinator.sh/cpu-manager-policy` and `node.koordinator.sh/reservation` (reserved
CPUs, which it never hands out). koordnode reports its own pools: the CPUs it keeps from pods
([node] reserved_cpus, from the Node's reservation or the file) go out as the reservation.
Pure: facts in, the object out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from koordnode.kube.reservation import RESERVATION_ANNOTATION
from koordnode.model.cpu_topology import CpuTopology
from koordnode.model.cpulist import format_cpu_list

__all__ = ["NODE_RESOURCE_TOPOLOGIES", "TopologyFacts", "node_resource_topology"]

NODE_RESOURCE_TOPOLOGIES = "/apis/topology.node.k8s.io/v1alpha1/noderesourcetopologies"
CPU_TOPOLOGY = "node.koordinator.sh/cpu-topology"
CPU_SHARED_POOLS = "node.koordinator.sh/cpu-shared-pools"
BE_CPU_SHARED_POOLS = "node.koordinator.sh/be-cpu-shared-pools"
POD_CPU_ALLOCS = "node.koordinator.sh/pod-cpu-allocs"
KUBELET_CPU_MANAGER_POLICY = "kubelet.koordinator.sh/cpu-manager-policy"


@dataclass(frozen=True)
class TopologyFacts:
    """What the node is and how koordnode splits it now."""

    topology: CpuTopology
    share_pool: frozenset[int]  # LS and fallback containers
    be_pool: frozenset[int]
    reserved: frozenset[int]  # kept from every pod
    numa_memory_bytes: Mapping[int, int] = field(default_factory=dict)  # NUMA node -> MemTotal
    # kubelet's static CPU manager owns the cpusets: (namespace, name, uid, cpus) of its pods
    kubelet_static: bool = False
    kubelet_allocs: tuple[tuple[str, str, str, frozenset[int]], ...] = ()


def _pools(topology: CpuTopology, cpus: Iterable[int]) -> list[dict[str, Any]]:
    """CPUs per (socket, NUMA node), as koordlet's CPUSharedPool list."""
    by_cpu = topology.by_cpu
    grouped: dict[tuple[int, int], set[int]] = {}
    for cpu in cpus:
        info = by_cpu.get(cpu)
        if info is not None:
            grouped.setdefault((info.socket, info.numa_node), set()).add(cpu)
    return [{"socket": socket, "node": node, "cpuset": format_cpu_list(found)}
            for (socket, node), found in sorted(grouped.items())]


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def node_resource_topology(node_name: str, facts: TopologyFacts) -> dict[str, Any]:
    """The NodeResourceTopology object koordnode wants for this node."""
    topology = facts.topology
    detail = [{"id": c.cpu, "core": c.core, "socket": c.socket, "node": c.numa_node}
              for c in sorted(topology.cpu_infos, key=lambda c: c.cpu)]
    annotations = {
        CPU_TOPOLOGY: _compact({"detail": detail}),
        CPU_SHARED_POOLS: _compact(_pools(topology, facts.share_pool)),
        BE_CPU_SHARED_POOLS: _compact(_pools(topology, facts.be_pool)),
        POD_CPU_ALLOCS: _compact([{"namespace": ns, "name": name, "uid": uid, "cpuset": format_cpu_list(cpus),
                                   "managedByKubelet": True} for ns, name, uid, cpus in facts.kubelet_allocs]),
        KUBELET_CPU_MANAGER_POLICY: _compact({"policy": "static" if facts.kubelet_static else "none"}),
    }
    if facts.reserved:
        annotations[RESERVATION_ANNOTATION] = _compact({"reservedCPUs": format_cpu_list(facts.reserved)})
    zones = []
    for node, cpus in sorted(topology.numa_nodes.items()):
        resources = [_resource("cpu", str(len(cpus)))]
        memory = facts.numa_memory_bytes.get(node)
        if memory:
            resources.append(_resource("memory", str(memory)))
        zones.append({"name": f"node-{node}", "type": "Node", "resources": resources})
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha1",
        "kind": "NodeResourceTopology",
        "metadata": {"name": node_name, "annotations": annotations,
                     "labels": {"app.kubernetes.io/managed-by": "koordnode"}},
        "topologyPolicies": ["None"],
        "zones": zones,
    }


def _resource(name: str, amount: str) -> dict[str, str]:
    return {"name": name, "capacity": amount, "allocatable": amount, "available": amount}


def differs(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether the stored object lacks what koordnode wants (others' annotations and labels stay)."""
    meta = current.get("metadata")
    have = meta.get("annotations") if isinstance(meta, Mapping) else None
    have = have if isinstance(have, Mapping) else {}
    want = wanted["metadata"]["annotations"]
    stale_reservation = RESERVATION_ANNOTATION in have and RESERVATION_ANNOTATION not in want
    return (any(have.get(k) != v for k, v in want.items()) or stale_reservation
            or current.get("zones") != wanted["zones"] or current.get("topologyPolicies") != wanted["topologyPolicies"])


def merged(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The stored object with koordnode's part replaced (its resourceVersion kept for the update)."""
    obj = dict(current)
    meta = dict(obj.get("metadata") or {})
    annotations = {k: v for k, v in dict(meta.get("annotations") or {}).items() if k != RESERVATION_ANNOTATION}
    annotations.update(wanted["metadata"]["annotations"])
    meta["annotations"] = annotations
    meta["labels"] = {**dict(meta.get("labels") or {}), **wanted["metadata"]["labels"]}
    obj.update(metadata=meta, zones=wanted["zones"], topologyPolicies=wanted["topologyPolicies"])
    return obj
