"""The real koord-scheduler v1.8.0 places LSE and LSR pods with CPU binding on a koordnode node:
koordnode's NodeResourceTopology (kube/topology.py, reported by its ClusterLink as the daemon
does) is what Koordinator's NodeNUMAResource plugin reads, the CPUs koordnode keeps from pods are
never handed out, and the cpuset the scheduler writes into the pod's resource-status is the one
koordnode's policy gives the container.

No kubelet here: the scheduler binds pods to a registered Node object; what a real node then does
with the cpuset is the policy's (tests/test_policy.py, the real-node tests).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kube_cluster_support import Node, _start, _stop, koordinator_plane
from testbed.koord_bed import SCHEDULER_NAME, KoordScheduler
from testbed.kube_bed import ControlPlane

from koordnode.kube.topology import NODE_RESOURCE_TOPOLOGIES, TopologyFacts
from koordnode.model.annotations import RESOURCE_STATUS
from koordnode.model.cpu_topology import CpuTopology
from koordnode.model.cpulist import parse_cpu_list
from koordnode.model.qos_class import resolve_qos_class
from koordnode.policy.class_inputs import ContainerInput, ContainerResources, KernelFeatures, PodInput
from koordnode.config.classes import QoSConfig
from koordnode.policy.container_policy import allocate_cpuset, plan_container
from koordnode.policy.cpuset import CpusetAllocator

NODE = "kn-sched"
NS = "default"
# One socket, two cores of two threads: cores {0,1} and {2,3}. koordnode keeps CPU 0 from pods.
TOPOLOGY = CpuTopology.describe(sockets=1, numa_per_socket=1, cores_per_numa=2, threads_per_core=2,
                                sibling_layout="adjacent")
RESERVED = frozenset({0})
FACTS = TopologyFacts(TOPOLOGY, share_pool=frozenset({1, 2, 3}), be_pool=frozenset({1, 2, 3}), reserved=RESERVED,
                      numa_memory_bytes={0: 8 << 30})
BIND_S = 120.0


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, KoordScheduler]]:
    workdir = tmp_path_factory.mktemp("koord-scheduler")
    with koordinator_plane(workdir, NODE, 4, 8 << 30) as cp:
        with KoordScheduler(cp, workdir / "koord-scheduler") as sched:
            yield cp, sched


def bound_pod(name: str, qos: str, cpus: int, policy: str) -> dict[str, Any]:
    """A pod as Koordinator's users write an LSE/LSR one (the webhook is off: set by hand)."""
    amount = {"cpu": str(cpus), "memory": "256Mi"}
    return {"metadata": {"name": name, "namespace": NS, "labels": {"koordinator.sh/qosClass": qos},
                         "annotations": {"scheduling.koordinator.sh/resource-spec":
                                         json.dumps({"preferredCPUBindPolicy": policy})}},
            "spec": {"schedulerName": SCHEDULER_NAME, "priorityClassName": "koord-prod",
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": amount, "limits": amount}}]}}


def test_koord_scheduler_binds_cpus_from_koordnodes_topology(scheduler: tuple[ControlPlane, KoordScheduler],
                                                             tmp_path: Path) -> None:
    cp, sched = scheduler
    admin = cp.client()
    node = Node(cp, tmp_path, NODE, topology=FACTS, nodeslo=False, pod_facts=False, node_reservation=False)
    placed: dict[str, dict[str, Any]] = {}

    async def scenario() -> None:
        stop, tasks = await _start(node)
        try:
            await node.wait("the NodeResourceTopology", lambda: node.link.topology.status.get("state") == "created")
            for name, qos, cpus, policy in (("lse", "LSE", 2, "FullPCPUs"), ("lsr", "LSR", 1, "SpreadByPCPUs")):
                await asyncio.to_thread(admin.create, f"/api/v1/namespaces/{NS}/pods", bound_pod(name, qos, cpus,
                                                                                                  policy))
                path = f"/api/v1/namespaces/{NS}/pods/{name}"

                def bound(path: str = path) -> dict[str, Any] | None:
                    pod = admin.get(path)
                    status = pod["metadata"].get("annotations", {}).get(RESOURCE_STATUS)
                    return pod if pod["spec"].get("nodeName") == NODE and status else None

                placed[name] = await asyncio.to_thread(admin.wait_for, f"{name} bound with a cpuset", bound,
                                                       timeout=BIND_S)
        finally:
            await _stop(stop, tasks)

    try:
        asyncio.run(scenario())
    except (AssertionError, TimeoutError):
        print(sched.tail())
        raise
    nrt = admin.get(f"{NODE_RESOURCE_TOPOLOGIES}/{NODE}")
    assert [z["name"] for z in nrt["zones"]] == ["node-0"]
    cpusets = {name: parse_cpu_list(json.loads(pod["metadata"]["annotations"][RESOURCE_STATUS])["cpuset"])
               for name, pod in placed.items()}
    print(f"koord-scheduler chose: {cpusets}")
    # LSE: a whole core, not the one holding koordnode's reserved CPU; LSR: what is left, never CPU 0.
    assert cpusets["lse"] == frozenset({2, 3})
    assert cpusets["lsr"] == frozenset({1})
    assert not (cpusets["lse"] | cpusets["lsr"]) & RESERVED

    # koordnode's policy gives each container the scheduler's cpuset (resource-status honoured).
    allocator = CpusetAllocator(TOPOLOGY, reserved=set(RESERVED))
    for name, pod in placed.items():
        meta = pod["metadata"]
        parent = f"/kubepods/pod{meta['uid']}"
        pod_input = PodInput(uid=meta["uid"], name=name, namespace=NS, labels=meta["labels"],
                             annotations=meta["annotations"], cgroup_parent=parent)
        decision = resolve_qos_class(meta["labels"], parent)
        cpus = len(cpusets[name])
        container = ContainerInput("main", ContainerResources(cpu_period=100000, cpu_quota=cpus * 100000,
                                                              cpu_shares=cpus * 1024, memory_limit_in_bytes=256 << 20))
        cpuset = allocate_cpuset(allocator, pod_input, container, decision.qos_class)
        assert cpuset.allocation is not None and allocator.record(cpuset.allocation) is None
        plan = plan_container(pod_input, container, decision=decision,
                              config=QoSConfig().for_class(decision.qos_class), features=KernelFeatures("v1"),
                              cpuset=cpuset)
        assert plan.qos_class.value == meta["labels"]["koordinator.sh/qosClass"]
        assert parse_cpu_list(plan.cri.cpuset_cpus or "") == cpusets[name], (name, plan.notes)
