"""NodeResourceTopology in koordlet's shape (kube/topology.py) and its reporter
(kube/topology_report.py) against a fake API server."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from koordnode.kube.client import ApiError
from koordnode.kube.topology import (
    NODE_RESOURCE_TOPOLOGIES,
    TopologyFacts,
    node_resource_topology,
)
from koordnode.kube.topology_report import INTERVAL_S, TopologyReporter
from koordnode.model.cpu_topology import CpuTopology

# 2 sockets x 1 NUMA node x 2 cores x 2 threads: CPUs 0-3 on node 0, 4-7 on node 1.
TOPOLOGY = CpuTopology.describe(sockets=2, numa_per_socket=1, cores_per_numa=2, threads_per_core=2,
                                sibling_layout="adjacent")
FACTS = TopologyFacts(TOPOLOGY, share_pool=frozenset({2, 3, 4, 5, 6, 7}), be_pool=frozenset({1, 2, 3, 4, 5, 6, 7}),
                      reserved=frozenset({0}), numa_memory_bytes={0: 4 << 30, 1: 4 << 30})


def annotation(obj: dict[str, Any], key: str) -> Any:
    return json.loads(obj["metadata"]["annotations"][key])


def test_the_object_has_koordlets_zones_and_annotations() -> None:
    obj = node_resource_topology("n1", FACTS)
    assert obj["metadata"]["name"] == "n1" and obj["topologyPolicies"] == ["None"]
    assert [z["name"] for z in obj["zones"]] == ["node-0", "node-1"] and {z["type"] for z in obj["zones"]} == {"Node"}
    cpu = obj["zones"][0]["resources"][0]
    assert cpu == {"name": "cpu", "capacity": "4", "allocatable": "4", "available": "4"}
    assert obj["zones"][1]["resources"][1]["capacity"] == str(4 << 30)
    detail = annotation(obj, "node.koordinator.sh/cpu-topology")["detail"]
    by_id = {d["id"]: d for d in detail}
    assert len(detail) == 8 and {by_id[c.cpu]["core"] for c in TOPOLOGY.cpu_infos if c.numa_node == 1} == \
        {c.core for c in TOPOLOGY.cpu_infos if c.numa_node == 1}
    assert all(by_id[c.cpu] == {"id": c.cpu, "core": c.core, "socket": c.socket, "node": c.numa_node}
               for c in TOPOLOGY.cpu_infos)
    assert annotation(obj, "node.koordinator.sh/cpu-shared-pools") == [
        {"socket": 0, "node": 0, "cpuset": "2-3"}, {"socket": 1, "node": 1, "cpuset": "4-7"}]
    assert annotation(obj, "node.koordinator.sh/be-cpu-shared-pools")[0]["cpuset"] == "1-3"
    assert annotation(obj, "node.koordinator.sh/reservation") == {"reservedCPUs": "0"}
    assert annotation(obj, "kubelet.koordinator.sh/cpu-manager-policy") == {"policy": "none"}
    assert annotation(obj, "node.koordinator.sh/pod-cpu-allocs") == []
    unreserved = node_resource_topology("n1", TopologyFacts(TOPOLOGY, frozenset(), frozenset(), frozenset()))
    assert "node.koordinator.sh/reservation" not in unreserved["metadata"]["annotations"]
    assert [r["name"] for r in unreserved["zones"][0]["resources"]] == ["cpu"]  # no NUMA memory known


class FakeApi:
    def __init__(self, crd: bool = True) -> None:
        self.crd = crd
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.version = 0

    def _stored(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.objects[obj["metadata"]["name"]] = obj
        return copy.deepcopy(obj)

    async def get(self, path: str) -> Any:
        self.calls.append("GET")
        name = path.rsplit("/", 1)[1]
        if not self.crd or name not in self.objects:
            raise ApiError(404, "NotFound", "not found")
        return copy.deepcopy(self.objects[name])

    async def create(self, path: str, obj: dict[str, Any]) -> Any:
        self.calls.append("POST")
        assert path == NODE_RESOURCE_TOPOLOGIES
        if not self.crd:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return self._stored(obj)

    async def replace(self, path: str, obj: dict[str, Any]) -> Any:
        self.calls.append("PUT")
        stored = self.objects[obj["metadata"]["name"]]
        if obj["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "changed")
        return self._stored(obj)


def test_created_kept_updated_only_on_change_and_others_annotations_kept() -> None:
    api = FakeApi()
    facts = [FACTS]
    reporter = TopologyReporter(api, "n1", lambda: facts[0])  # type: ignore[arg-type]

    async def scenario() -> None:
        assert await reporter.report_once() == INTERVAL_S
        assert api.calls == ["GET", "POST"] and reporter.status["state"] == "created"
        await reporter.report_once()
        assert api.calls == ["GET", "POST"]  # nothing changed: no request at all
        api.objects["n1"]["metadata"]["annotations"]["someone/else"] = "x"  # another writer's
        api.objects["n1"]["metadata"]["resourceVersion"] = "99"
        facts[0] = TopologyFacts(TOPOLOGY, share_pool=frozenset({4, 5, 6, 7}), be_pool=FACTS.be_pool,
                                 reserved=frozenset(), numa_memory_bytes=FACTS.numa_memory_bytes)
        try:
            await reporter.report_once()  # its copy is stale: a conflict, read again next time
        except ApiError as exc:
            assert exc.status == 409
        await reporter.report_once()
        stored = api.objects["n1"]
        assert annotation(stored, "node.koordinator.sh/cpu-shared-pools") == [{"socket": 1, "node": 1,
                                                                               "cpuset": "4-7"}]
        assert stored["metadata"]["annotations"]["someone/else"] == "x"
        assert "node.koordinator.sh/reservation" not in stored["metadata"]["annotations"]  # no longer reserved

    asyncio.run(scenario())


def test_without_the_crd_it_says_so_and_asks_rarely() -> None:
    api = FakeApi(crd=False)
    reporter = TopologyReporter(api, "n1", lambda: FACTS, backoff_max_s=60)  # type: ignore[arg-type]
    assert asyncio.run(reporter.report_once()) == 60
    assert "CRD not installed" in reporter.status["state"]
    waiting = TopologyReporter(api, "n1", lambda: None)  # type: ignore[arg-type]
    assert asyncio.run(waiting.report_once()) == INTERVAL_S and api.calls == ["GET", "POST"]
