"""Koordinator's node.koordinator.sh/reservation annotation (kube/reservation.py) and its way
through the cluster link into koordnode's config, with the NodeSLO's values."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from koordnode.config.kubernetes import KubernetesConfig
from koordnode.config.loader import parse_config, with_nodeslo
from koordnode.kube.agent import ClusterLink
from koordnode.kube.credentials import Credentials
from koordnode.kube.reservation import RESERVATION_ANNOTATION, reservation_of

GIB = 1 << 30


def node(annotation: Any = None, capacity: str = "16Gi", allocatable: str = "15Gi") -> dict[str, Any]:
    annotations = {} if annotation is None else {
        RESERVATION_ANNOTATION: annotation if isinstance(annotation, str) else json.dumps(annotation)}
    return {"metadata": {"name": "n1", "resourceVersion": "1", "annotations": annotations},
            "status": {"capacity": {"cpu": "8", "memory": capacity},
                       "allocatable": {"cpu": "7", "memory": allocatable}}}


def test_reserved_cpus_list_wins_over_a_cpu_count_as_in_koordinator() -> None:
    found = reservation_of(node({"resources": {"cpu": "3"}, "reservedCPUs": "3,1-2"}))
    assert found.values == {"node.reserved_cpus": "1-3"} and found.problems == ()
    assert reservation_of(node({"resources": {"cpu": "1500m"}})).values == {"node.reserved_cpus": 2}  # ceil
    assert reservation_of(node({"resources": {"cpu": "0"}})).values == {}
    assert reservation_of(node()).values == {} and reservation_of(node()).annotation is None


def test_reserved_memory_is_the_larger_of_kubelets_and_the_annotations() -> None:
    """koordlet: max(capacity - allocatable, annotation), here in MiB rounded up."""
    assert reservation_of(node({"resources": {"memory": "2Gi"}})).values == {
        "strategy.be_memory.reserved_mib": 2048}
    assert reservation_of(node({"resources": {"memory": "100Mi"}})).values == {
        "strategy.be_memory.reserved_mib": 1024}  # kubelet's 1 GiB is larger
    odd = reservation_of(node({"resources": {"memory": "1000001"}}, capacity="1Gi", allocatable="1Gi"))
    assert odd.values == {"strategy.be_memory.reserved_mib": 1}


@pytest.mark.parametrize("annotation,problem", [
    ("{not json", "not JSON"),
    ("[1, 2]", "expected a JSON object"),
    ({"resources": "lots"}, "resources: expected an object"),
    ({"reservedCPUs": "0-x"}, "reservedCPUs:"),
    ({"reservedCPUs": 5}, "reservedCPUs: expected a CPU list string"),
    ({"resources": {"cpu": "-2"}}, "resources.cpu:"),
    ({"resources": {"cpu": "1e999999"}}, "resources.cpu:"),
    ({"applyPolicy": "Sometimes"}, "applyPolicy"),
    ("x" * 5000, "at most 4096 characters"),
])
def test_a_malformed_reservation_is_named_not_raised(annotation: Any, problem: str) -> None:
    found = reservation_of(node(annotation))
    assert len(found.problems) == 1 and problem in found.problems[0], found.problems
    assert RESERVATION_ANNOTATION in found.problems[0]


def test_a_bad_field_is_left_out_and_the_rest_applied() -> None:
    found = reservation_of(node({"reservedCPUs": "zero", "resources": {"memory": "4Gi"}}))
    assert found.values == {"strategy.be_memory.reserved_mib": 4096}
    assert len(found.problems) == 1 and "reservedCPUs" in found.problems[0]


class NoApi:
    credentials = Credentials("https://fake")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_the_link_applies_the_reservation_with_the_nodeslo_and_takes_it_back() -> None:
    applied: list[Any] = []

    async def apply(values: Any) -> None:
        applied.append(with_nodeslo(parse_config(""), values))

    link = ClusterLink(KubernetesConfig(enable=True, node_name="n1"), apply_nodeslo=apply,
                       on_pod_facts=lambda: None, node_metric_status=lambda request: None,
                       client=NoApi())  # type: ignore[arg-type]

    async def scenario() -> None:
        # No NodeSLO: the reservation alone applies.
        link._node_changed({"n1": reservation_of(node({"reservedCPUs": "0-1", "resources": {"memory": "3Gi"}}))})
        await asyncio.gather(*link._tasks)
        assert applied[-1].node.reserved_cpus == "0-1"
        assert applied[-1].strategy.be_memory.reserved_mib == 3072
        assert link.nodeslo_status["state"] == "no NodeSLO for this node: the Node's reservation applied below the local file"
        # A NodeSLO arrives: both apply; the keys name where each came from.
        spec = {"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 50}}
        link._nodeslo_changed({"n1": {"metadata": {"name": "n1", "resourceVersion": "4"}, "spec": spec}})
        await asyncio.gather(*link._tasks)
        assert applied[-1].node.reserved_cpus == "0-1" and applied[-1].strategy.cpu_suppress.threshold_percent == 50
        keys = link.nodeslo_status["keys"]
        assert keys["node.reserved_cpus"] == f"Node annotation {RESERVATION_ANNOTATION}"
        # The same Node again (a status update): nothing applied anew.
        count = len(applied)
        link._node_changed({"n1": reservation_of(node({"reservedCPUs": "0-1", "resources": {"memory": "3Gi"}}))})
        assert not link._tasks and len(applied) == count
        # A CPU list that does not parse is named and left out; the NodeSLO's values stay applied.
        link._node_changed({"n1": reservation_of(node({"reservedCPUs": "0-99999"}))})
        await asyncio.gather(*link._tasks)
        assert link.status()["node_reservation"]["problems"], link.status()["node_reservation"]
        assert applied[-1].node.reserved_cpus == "" and applied[-1].strategy.cpu_suppress.threshold_percent == 50
        # The annotation removed: the file's (default) values again.
        link._node_changed({"n1": reservation_of(node())})
        await asyncio.gather(*link._tasks)
        assert applied[-1].node.reserved_cpus == "" and applied[-1].strategy.be_memory.reserved_mib != 3072

    run(scenario())
