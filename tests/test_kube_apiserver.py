"""[kubernetes] against a real kube-apiserver (the real-node test bed's etcd + kube-apiserver),
with Koordinator's own CRDs for NodeSLO and NodeMetric (tests/data/koordinator_crds, from
github.com/koordinator-sh/koordinator v1.6.0, config/crd/bases) and the shipped RBAC manifest.

koordnode's side is its ClusterLink (the watches, evictions, the NodeMetric report) applying
NodeSLOs through koordnode.config.with_nodeslo, as the daemon does; the API server is real.
NodeSLOs are rendered from the slo-controller-config ConfigMap the way koord-manager renders
them (cluster strategy, then the first node strategy whose selector matches the node).
"""

from __future__ import annotations

# ruff: noqa: F811  (the `plane` fixture is imported, then requested by name)

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kube_cluster_support import (  # noqa: F401
    NODES, NS, REPO, Node, _start, _stop, configmap, kubeconfig_for, plane, set_configmap)
from testbed.kube_client import ApiError as AdminApiError
from testbed.kube_client import KubeClient as AdminClient
from testbed.kube_bed import ControlPlane

from koordnode.config import Config, ConfigError, key_sources, parse_config, with_nodeslo
from koordnode.kube.agent import NODEMETRICS, NODESLOS, EvictTarget
from koordnode.kube.client import Unreachable
from koordnode.kube.nodemetric import MetricRequest, PodUsage, node_metric_status
from koordnode.model.qos_class import ClassDecision, KubeQoS, QoSClass
from koordnode.policy.class_inputs import ContainerInput, ContainerResources, KernelFeatures
from koordnode.policy.container_policy import plan_container

# "Within one watch round trip": the ConfigMap edit, the rendering and the watch event together.
ROUND_TRIP_BOUND_S = 5.0


# ---------------------------------------------------------------------------------------------
# NodeSLO


def test_configmap_change_reaches_every_node_within_one_watch_round_trip(plane: ControlPlane, tmp_path: Path) -> None:
    admin = plane.client()
    nodes = [Node(plane, tmp_path, name) for name in NODES]

    async def scenario() -> list[float]:
        await asyncio.to_thread(set_configmap, admin, configmap(65, 50, 40))
        stop, tasks = await _start(*nodes)
        try:
            a, b = nodes
            # Both values of the NodeSLO: 65 is also the default threshold, so a node that has
            # not seen its NodeSLO yet already passes the threshold's wait.
            await a.wait("first NodeSLO", lambda: a.config.strategy.cpu_suppress.threshold_percent == 65
                         and a.config.qos.LS.memory_min_percent == 40)
            await b.wait("first NodeSLO", lambda: b.config.strategy.cpu_suppress.threshold_percent == 50
                         and b.config.qos.LS.memory_min_percent == 40)
            started = time.monotonic()
            await asyncio.to_thread(set_configmap, admin, configmap(70, 55, 30))
            for node, threshold in ((a, 70), (b, 55)):
                await node.wait("the ConfigMap change", lambda n=node, t=threshold: (
                    n.config.strategy.cpu_suppress.threshold_percent == t and n.config.qos.LS.memory_min_percent == 30),
                    timeout=ROUND_TRIP_BOUND_S)
            return [time.monotonic() - started]
        finally:
            await _stop(stop, tasks)

    [latency] = asyncio.run(scenario())
    print(f"ConfigMap edit -> rendered NodeSLOs -> both nodes' values: {latency * 1000:.0f} ms")
    assert latency < ROUND_TRIP_BOUND_S
    status = nodes[0].link.status()
    assert status["api_server"] == "ok" and status["nodeslo"]["state"] == "applied"
    assert status["nodeslo"]["keys"]["strategy.cpu_suppress.threshold_percent"] == \
        "resourceUsedThresholdWithBE.cpuSuppressThresholdPercent"


def test_local_file_wins_and_every_key_names_its_source(plane: ControlPlane, tmp_path: Path) -> None:
    admin = plane.client()
    node = Node(plane, tmp_path, NODES[0], local_toml="[strategy.cpu_suppress]\nthreshold_percent = 80\n")

    async def scenario() -> None:
        await asyncio.to_thread(set_configmap, admin, configmap(60, 50, 35))
        stop, tasks = await _start(node)
        try:
            await node.wait("NodeSLO", lambda: node.config.qos.LS.memory_min_percent == 35)
        finally:
            await _stop(stop, tasks)

    asyncio.run(scenario())
    assert node.config.strategy.cpu_suppress.threshold_percent == 80.0  # the node operator's word is last
    sources = key_sources(node.config)
    assert sources["strategy.cpu_suppress.threshold_percent"] == "toml"
    assert sources["qos.LS.memory_min_percent"] == "nodeslo"
    assert sources["strategy.cpu_suppress.policy"] == "nodeslo"
    assert sources["qos.BE.oom_score_adj"] == "default"


def test_a_nodeslo_field_koordnode_cannot_take_is_left_out_and_the_rest_applied(plane: ControlPlane,
                                                                                tmp_path: Path) -> None:
    admin = plane.client()
    node = Node(plane, tmp_path, NODES[0])

    async def scenario() -> None:
        await asyncio.to_thread(set_configmap, admin, configmap(62, 50, 33))
        stop, tasks = await _start(node)
        try:
            await node.wait("good NodeSLO", lambda: node.config.strategy.cpu_suppress.threshold_percent == 62)
            # Valid for the CRD (its schema has no bound here), not for koordnode: a quota burst
            # below the pod's limit. The other change in the same version applies.
            bad = admin.get(f"{NODESLOS}/{NODES[0]}")
            bad["spec"]["cpuBurstStrategy"] = {"policy": "auto", "cfsQuotaBurstPercent": 50}
            bad["spec"]["resourceQOSStrategy"]["lsClass"]["memoryQOS"]["minLimitPercent"] = 20
            await asyncio.to_thread(admin.request, "PUT", f"{NODESLOS}/{NODES[0]}", bad)
            await node.wait("applied in part", lambda: node.config.qos.LS.memory_min_percent == 20)
            status = node.link.nodeslo_status
            assert status["state"] == "applied in part" and "last_refused" not in status
            assert status["not_applied"] == ["spec.cpuBurstStrategy.cfsQuotaBurstPercent "
                                             "(strategy.cpu_burst.max_quota_percent): "
                                             "expected a number in [100, 10000], got 50.0"]
            assert node.config.strategy.cpu_burst.enable  # the policy applied, the bad percent not
            assert node.config.strategy.cpu_burst.max_quota_percent == parse_config("").strategy.cpu_burst.max_quota_percent
            # A contradiction between two fields: the one that contradicts is left out.
            bad = admin.get(f"{NODESLOS}/{NODES[0]}")
            bad["spec"]["cpuBurstStrategy"] = {}
            # 72, not the default 70, so the wait below cannot pass before this version applies.
            bad["spec"]["resourceUsedThresholdWithBE"].update(memoryEvictThresholdPercent=72, memoryEvictLowerPercent=75)
            await asyncio.to_thread(admin.request, "PUT", f"{NODESLOS}/{NODES[0]}", bad)
            await node.wait("second version", lambda: node.config.strategy.be_evict.memory_threshold_percent == 72)
        finally:
            await _stop(stop, tasks)

    asyncio.run(scenario())
    assert node.config.strategy.cpu_suppress.threshold_percent == 62
    assert node.config.qos.LS.memory_min_percent == 20 and not node.config.strategy.cpu_burst.enable
    status = node.link.nodeslo_status
    assert status["not_applied"] == ["spec.resourceUsedThresholdWithBE.memoryEvictLowerPercent: must be below "
                                     "memoryEvictThresholdPercent (75 >= 72)"]
    assert node.observed.count(("nodeslo", "refused")) == 0


def test_api_server_stopped_and_restarted(plane: ControlPlane, tmp_path: Path) -> None:
    admin = plane.client()
    node = Node(plane, tmp_path, NODES[0])
    lags: dict[str, list[float]] = {"up": [], "away": []}
    phase: list[str] = []  # where lags go now: "up" (a baseline while it answers), "away"

    async def loop_lag(stop: asyncio.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            await asyncio.sleep(0.01)
            if phase:
                lags[phase[-1]].append(time.monotonic() - started - 0.01)

    async def scenario() -> None:
        await asyncio.to_thread(set_configmap, admin, configmap(64, 50, 31))
        stop, tasks = await _start(node)
        tasks.append(asyncio.create_task(loop_lag(stop)))
        try:
            await node.wait("NodeSLO", lambda: node.config.strategy.cpu_suppress.threshold_percent == 64)
            phase.append("up")
            await asyncio.sleep(3)
            phase.clear()
            await asyncio.to_thread(plane.stop_apiserver)
            await node.wait("unreachable", lambda: not node.link.reachable()[0], timeout=60)
            ok, detail = node.link.reachable()
            assert "nodeslo" in detail and node.link.status()["api_server"].startswith("unreachable: ")
            assert node.config.strategy.cpu_suppress.threshold_percent == 64  # last good values kept
            failures = sum(node.link.nodeslo_watch.health.errors.values())
            phase.append("away")
            await asyncio.sleep(4)  # backoff rounds while it is away
            phase.clear()
            attempts = sum(node.link.nodeslo_watch.health.errors.values()) - failures
            assert 1 <= attempts <= 6, attempts  # backing off (0.5, 1, 2, 2 s), not spinning
            await asyncio.to_thread(plane.start_apiserver)
            await asyncio.to_thread(set_configmap, admin, configmap(66, 50, 31))
            await node.wait("NodeSLO after the restart",
                            lambda: node.config.strategy.cpu_suppress.threshold_percent == 66, timeout=30)
            assert node.link.reachable() == (True, "ok")
        finally:
            await _stop(stop, tasks)

    asyncio.run(scenario())

    def p99(samples: list[float]) -> float:
        return sorted(samples)[int(len(samples) * 0.99)]

    print(f"event loop lag (10 ms sleeps), p99: {p99(lags['up']) * 1000:.1f} ms while the API server answered, "
          f"{p99(lags['away']) * 1000:.1f} ms while it was away (max {max(lags['away']) * 1000:.1f} ms)")
    # The loop serving CRI never waits for the API server: no worse than while it answered (the
    # shared test machine's scheduling noise is in both).
    assert p99(lags["away"]) < p99(lags["up"]) + 0.02


def test_rotated_token_is_used_without_a_restart(plane: ControlPlane, tmp_path: Path) -> None:
    """The service account's tokens are bound to Secrets: deleting the first Secret makes the
    first token invalid, so a request that succeeds afterwards used the rotated one."""
    admin = plane.client()
    tokens = []
    for index in (1, 2):
        secret = admin.create(f"/api/v1/namespaces/{NS}/secrets", {"metadata": {"name": f"rotation-{index}"}})
        answer = admin.create(f"/api/v1/namespaces/{NS}/serviceaccounts/koordnode/token", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600, "boundObjectRef": {
                "kind": "Secret", "apiVersion": "v1", "name": f"rotation-{index}", "uid": secret["metadata"]["uid"]}}})
        tokens.append(answer["status"]["token"])
    node = Node(plane, tmp_path, NODES[1], token=tokens[0], node_metric=True, pod_facts=False)
    node.link._node_metric_status = lambda request: node_metric_status(  # type: ignore[method-assign]
        node_cpu_cores=1.0, node_memory_bytes=1 << 30, system_cpu_cores=0.1, system_memory_bytes=1 << 28, pods=[],
        now=__import__("datetime").datetime.now(__import__("datetime").UTC))

    async def scenario() -> None:
        await node.link.report_once()
        token_file = node.kubeconfig.parent / "token"
        staged = token_file.with_suffix(".new")
        staged.write_text(tokens[1])
        os.replace(staged, token_file)  # the kubelet's way: a new file, atomically
        await asyncio.to_thread(admin.delete, f"/api/v1/namespaces/{NS}/secrets/rotation-1")
        old = AdminClient(plane.host, plane.port, tokens[0], str(plane.ca_file))
        await asyncio.to_thread(admin.wait_for, "the first token refused",
                                lambda: _refused(old, f"{NODEMETRICS}/{NODES[1]}"), 30)
        await node.link.report_once()  # with the rotated token, read from the file again

    asyncio.run(scenario())
    assert node.link.client.credentials.token_reads == 2
    assert node.link.node_metric["state"] == "reported"


def _refused(client: AdminClient, path: str) -> bool:
    try:
        client.get(path)
    except AdminApiError as err:
        return err.status == 401
    return False


# ---------------------------------------------------------------------------------------------
# pod facts, evictions, NodeMetric


def _pod(name: str, *, labels: dict[str, str], memory: str | None = None, node: str = NODES[0]) -> dict[str, Any]:
    resources = {"requests": {"memory": memory, "cpu": "100m"}, "limits": {"memory": "1Gi"}} if memory else {}
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "busybox", "resources": resources}]}}


def test_ls_burstable_memory_protection_from_the_pod_spec(plane: ControlPlane, tmp_path: Path) -> None:
    admin = plane.client()
    node = Node(plane, tmp_path, NODES[0], nodeslo=False)
    created = admin.create("/api/v1/namespaces/default/pods",
                           _pod("ls-web", labels={"koordinator.sh/qosClass": "LS"}, memory="256Mi"))
    uid = created["metadata"]["uid"]

    async def scenario() -> None:
        stop, tasks = await _start(node)
        try:
            await node.wait("the pod's facts", lambda: node.link.facts_of(uid) is not None)
        finally:
            await _stop(stop, tasks)

    try:
        asyncio.run(scenario())
    finally:
        admin.delete("/api/v1/namespaces/default/pods/ls-web", grace_seconds=0)
    facts = node.link.facts_of(uid)
    assert facts is not None and facts.memory_requests == {"app": 256 << 20} and facts.kube_qos == "Burstable"
    assert node.facts_changes >= 1
    # The engine's plan of that container: CRI carries no request (no Memory QoS), the API does.
    from koordnode.policy.class_inputs import PodInput

    plan = plan_container(PodInput(uid=uid, memory_requests=facts.memory_requests),
                          ContainerInput("app", ContainerResources(memory_limit_in_bytes=1 << 30)),
                          decision=ClassDecision(QoSClass.LS, "label", "label", KubeQoS.BURSTABLE),
                          config=Config().qos.for_class(QoSClass.LS), features=KernelFeatures(cgroup_version="v2"),
                          container_cgroup="kubepods/burstable/pod/c")
    assert (plan.memory.min_bytes, plan.memory.low_bytes) == (128 << 20, (256 << 20) * 8 // 10)


def test_eviction_refused_by_a_pdb_then_the_next_candidate(plane: ControlPlane, tmp_path: Path) -> None:
    admin = plane.client()
    node = Node(plane, tmp_path, NODES[0], nodeslo=False, evictions_per_window=5)
    guarded = admin.create("/api/v1/namespaces/default/pods",
                           _pod("be-guarded", labels={"app": "guarded", "koordinator.sh/qosClass": "BE"}))
    free = admin.create("/api/v1/namespaces/default/pods",
                        _pod("be-free", labels={"app": "free", "koordinator.sh/qosClass": "BE"}))
    admin.create("/apis/policy/v1/namespaces/default/poddisruptionbudgets", {
        "metadata": {"name": "guarded"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
    # No disruption controller runs here: publish what it would (one healthy pod, none may go).
    # No kubelet either: the pods are made Running and Ready as kubelet would report them (a
    # Pending pod is evicted without asking its budget).
    for pod in (guarded, free):
        pod = admin.pod(pod["metadata"]["name"])
        pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        admin.request("PUT", f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}/status", pod)
    pdb = admin.get("/apis/policy/v1/namespaces/default/poddisruptionbudgets/guarded")
    pdb["status"] = {"observedGeneration": pdb["metadata"]["generation"], "disruptionsAllowed": 0,
                     "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}
    admin.request("PUT", "/apis/policy/v1/namespaces/default/poddisruptionbudgets/guarded/status", pdb)
    targets = [EvictTarget("default", "be-guarded", guarded["metadata"]["uid"]),
               EvictTarget("default", "be-free", free["metadata"]["uid"])]

    async def scenario() -> None:
        stop, tasks = await _start(node)
        try:
            await node.wait("pods known", lambda: len(node.link.facts) >= 2)
            assert await node.link.evict(targets, "memory") == ("evicted", targets[1])
            guarded_now = await asyncio.to_thread(admin.pod, "be-guarded")
            assert guarded_now["metadata"].get("deletionTimestamp") is None  # the PDB kept it
            # No kubelet: the evicted pod stays terminating; the watch shows it.
            await node.wait("be-free terminating", lambda: node.link.facts[targets[1].uid].terminating)
            assert await node.link.evict(targets[1:], "memory") == ("already terminating", targets[1])
        finally:
            await _stop(stop, tasks)

    try:
        asyncio.run(scenario())
    finally:
        for name in ("be-guarded", "be-free"):
            admin.delete(f"/api/v1/namespaces/default/pods/{name}", grace_seconds=0)
        admin.delete("/apis/policy/v1/namespaces/default/poddisruptionbudgets/guarded")
    assert node.link.eviction_counts == {"refused": 1, "evicted": 1, "already_terminating": 1}
    refused = node.link.recent_evictions[0]
    assert refused["pod"] == "default/be-guarded" and "disruption budget" in refused["detail"]


def test_node_metric_accepted_by_the_api_and_consistent_with_status(plane: ControlPlane, tmp_path: Path) -> None:
    import datetime

    admin = plane.client()
    node = Node(plane, tmp_path, NODES[1], nodeslo=False, pod_facts=False, node_metric=True)
    sent: list[dict[str, Any]] = []

    def measured(request: MetricRequest) -> dict[str, Any]:
        status = node_metric_status(node_cpu_cores=3.25, node_memory_bytes=6 << 30, system_cpu_cores=0.5,
                                    system_memory_bytes=1 << 30,
                                    pods=[PodUsage("default", "web", "LS", 9100, 1.5, 2 << 30),
                                          PodUsage("batch", "job", "BE", 5100, 1.25, 3 << 30)],
                                    now=datetime.datetime.now(datetime.UTC))
        sent.append(status)
        return status

    node.link._node_metric_status = measured  # type: ignore[method-assign]
    admin.delete(f"{NODEMETRICS}/{NODES[1]}")
    interval = asyncio.run(node.link.report_once())
    stored = admin.get(f"{NODEMETRICS}/{NODES[1]}")
    assert interval == 60 and stored["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] == 60
    assert stored["status"] == sent[-1]
    assert stored["status"]["podsMetric"][1]["priority"] == "koord-batch"
    status = node.link.status()["node_metric"]
    assert status["state"] == "reported" and status["node_usage"] == stored["status"]["nodeMetric"]["nodeUsage"]
    # koord-manager's interval wins over koordnode's default
    stored["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] = 20
    admin.request("PUT", f"{NODEMETRICS}/{NODES[1]}", stored)
    assert asyncio.run(node.link.report_once()) == 20


def test_the_shipped_rbac_is_enough_and_no_more(plane: ControlPlane) -> None:
    koordnode = plane.client("koordnode")
    koordnode.get(NODESLOS)
    koordnode.get("/api/v1/pods", fieldSelector=f"spec.nodeName={NODES[0]}")
    koordnode.get("/api/v1/nodes", fieldSelector=f"metadata.name={NODES[0]}")  # its reservation
    for forbidden in (f"/api/v1/namespaces/{NS}/secrets", "/api/v1/configmaps"):
        with pytest.raises(AdminApiError) as info:
            koordnode.get(forbidden)
        assert info.value.status == 403, forbidden
    with pytest.raises(AdminApiError) as info:  # read, never written
        koordnode.patch(f"/api/v1/nodes/{NODES[0]}", {"metadata": {"labels": {"x": "y"}}})
    assert info.value.status == 403


def test_node_reservation_annotation_reaches_the_config_and_goes_away(plane: ControlPlane,
                                                                      tmp_path: Path) -> None:
    """Koordinator's node.koordinator.sh/reservation on the Node: reserved CPUs and memory in
    koordnode's config beside the NodeSLO's values; removed, the file's values again."""
    admin = plane.client()
    node = Node(plane, tmp_path, NODES[1])
    path = f"/api/v1/nodes/{NODES[1]}"
    reservation = json.dumps({"resources": {"cpu": "2", "memory": "1536Mi"}, "applyPolicy": "Default"})

    async def scenario() -> None:
        await asyncio.to_thread(set_configmap, admin, configmap(61, 61, 35))  # pool b: 61 too
        stop, tasks = await _start(node)
        try:
            await node.wait("NodeSLO", lambda: node.config.strategy.cpu_suppress.threshold_percent == 61)
            await asyncio.to_thread(admin.patch, path, {"metadata": {"annotations": {
                "node.koordinator.sh/reservation": reservation}}})
            await node.wait("the reservation", lambda: node.config.node.reserved_cpus == 2)
            assert node.config.strategy.be_memory.reserved_mib == 1536
            assert node.config.strategy.cpu_suppress.threshold_percent == 61  # the NodeSLO's stay
            assert key_sources(node.config)["node.reserved_cpus"] == "nodeslo"
            status = node.link.status()["node_reservation"]
            assert status["values"] == {"node.reserved_cpus": 2, "strategy.be_memory.reserved_mib": 1536}
            await asyncio.to_thread(admin.patch, path, {"metadata": {"annotations": {
                "node.koordinator.sh/reservation": "{broken"}}})
            await node.wait("the broken one named", lambda: bool(node.link.reservation.problems))
            await node.wait("nothing of it applied", lambda: node.config.node.reserved_cpus == "",
                            )
            await asyncio.to_thread(admin.patch, path, {"metadata": {"annotations": {
                "node.koordinator.sh/reservation": None}}})
            await node.wait("gone", lambda: node.link.reservation.annotation is None)
        finally:
            await _stop(stop, tasks)

    asyncio.run(scenario())
    assert node.config.node.reserved_cpus == "" and node.config.strategy.cpu_suppress.threshold_percent == 61


def test_bad_credentials_are_clear_errors(plane: ControlPlane, tmp_path: Path) -> None:
    node = Node(plane, tmp_path, NODES[0], token="not-a-token")
    with pytest.raises(Exception) as info:
        asyncio.run(node.link.client.get(NODESLOS))
    assert "401" in str(info.value)
    with pytest.raises(ConfigError):
        with_nodeslo(parse_config(""), {"strategy": {"cpu_suppress": {"threshold_percent": 0.0}}})
    unreachable = Node(plane, tmp_path / "x", NODES[0])
    unreachable.link.client.credentials.server = "https://127.0.0.1:1"
    with pytest.raises(Unreachable):
        asyncio.run(unreachable.link.client.get(NODESLOS))


# ---------------------------------------------------------------------------------------------
# cost of idle watches


COST_SCRIPT = r"""
import asyncio, json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
from koordnode.config import parse_config, with_nodeslo
from koordnode.config.kubernetes import KubernetesConfig
from koordnode.kube.agent import ClusterLink

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

def cpu_s():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

async def main():
    config = parse_config("")
    async def apply(values):
        with_nodeslo(config, values)
    settle, idle = float(sys.argv[4]), float(sys.argv[5])
    link = ClusterLink(KubernetesConfig(enable=True, kubeconfig=sys.argv[2], node_name=sys.argv[3],
                                        node_metric=False), apply_nodeslo=apply, on_pod_facts=lambda: None,
                       node_metric_status=lambda request: None)
    await asyncio.sleep(0.5)
    before = rss_kib()
    stop = asyncio.Event()
    task = asyncio.create_task(link.run(stop))
    await asyncio.sleep(settle)
    synced = link.nodeslo_watch.health.synced and link.pod_watch.health.synced
    after_sync = rss_kib()
    cpu0, t0 = cpu_s(), time.monotonic()
    await asyncio.sleep(idle)
    cpu1, t1 = cpu_s(), time.monotonic()
    end = rss_kib()
    stop.set(); task.cancel()
    print(json.dumps({"synced": synced, "pods": len(link.facts), "rss_before_kib": before,
                      "rss_delta_kib": end - before, "rss_after_sync_kib": after_sync,
                      "idle_cpu_percent": 100 * (cpu1 - cpu0) / (t1 - t0), "idle_s": t1 - t0}))

asyncio.run(main())
"""


def test_idle_watches_cost(plane: ControlPlane, tmp_path: Path) -> None:
    """The issue's budget: at most 5 MB RSS and no measurable CPU while nothing changes."""
    admin = plane.client()
    set_configmap(admin, configmap(65, 50, 40))
    names = [f"cost-{i}" for i in range(50)]
    for name in names:
        admin.create("/api/v1/namespaces/default/pods",
                     _pod(name, labels={"koordinator.sh/qosClass": "LS"}, memory="64Mi", node=NODES[0]))
    kubeconfig = kubeconfig_for(plane, tmp_path / "cost", plane.tokens["koordnode"])
    try:
        out = subprocess.run([sys.executable, "-c", COST_SCRIPT, str(REPO), str(kubeconfig), NODES[0], "5", "30"],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    finally:
        for name in names:
            admin.delete(f"/api/v1/namespaces/default/pods/{name}", grace_seconds=0)
    figures = json.loads(out.strip().splitlines()[-1])
    print("idle watches (NodeSLO + 50 pods):", json.dumps(figures))
    assert figures["synced"] and figures["pods"] >= 50
    assert figures["rss_delta_kib"] < 5 * 1024
    assert figures["idle_cpu_percent"] < 0.5


def test_in_cluster_service_account_token_and_ca(plane: ControlPlane, tmp_path: Path) -> None:
    """In a pod: the token and CA from the service account directory, the server from the
    environment; a replaced CA file is read again."""
    import shutil

    from koordnode.kube.client import KubeClient
    from koordnode.kube.credentials import Credentials

    admin = plane.client()
    token = admin.create(f"/api/v1/namespaces/{NS}/serviceaccounts/koordnode/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}})["status"]["token"]
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(token)
    shutil.copy(plane.ca_file, account / "ca.crt")
    creds = Credentials.in_cluster(str(account), environ={"KUBERNETES_SERVICE_HOST": plane.host,
                                                          "KUBERNETES_SERVICE_PORT": str(plane.port)})
    client = KubeClient(creds, timeout_s=5)
    assert "items" in asyncio.run(client.get(NODESLOS))
    first = creds.ssl_context()
    staged = account / "ca.crt.new"
    shutil.copy(plane.ca_file, staged)
    os.replace(staged, account / "ca.crt")
    assert creds.ssl_context() is not first
    assert "items" in asyncio.run(client.get(NODESLOS))
    assert creds.source == f"service account {account}"


def test_doctor_reports_the_api_server(plane: ControlPlane, tmp_path: Path) -> None:
    from koordnode.doctor.cluster import check_kubernetes
    from koordnode.doctor.report import Report

    def check(toml: str) -> Any:
        report = Report()
        check_kubernetes(report, parse_config(toml))
        return next(c for c in report.checks if c.name == "kubernetes")

    kubeconfig = kubeconfig_for(plane, tmp_path / "doctor", plane.tokens["koordnode"])
    base = f'[kubernetes]\nenable = true\nkubeconfig = "{kubeconfig}"\n'
    set_configmap(plane.client(), configmap(65, 50, 40))
    ok = check(base + f'node_name = "{NODES[0]}"\n')
    assert ok.status == "OK" and "NodeSLO kn-a readable" in ok.message
    missing = check(base + 'node_name = "kn-nowhere"\n')
    assert missing.status == "WARN" and "no NodeSLO named kn-nowhere" in missing.message
    denied = check(f'[kubernetes]\nenable = true\nkubeconfig = "{kubeconfig_for(plane, tmp_path / "d2", "bad")}"\n')
    assert denied.status == "FAIL" and "401" in denied.message
    away = kubeconfig.read_text().replace(plane.url, "https://127.0.0.1:1")
    (kubeconfig.parent / "away.yaml").write_text(away)  # beside its token file
    unreachable = check(f'[kubernetes]\nenable = true\nkubeconfig = "{kubeconfig.parent / "away.yaml"}"\n')
    assert unreachable.status == "WARN" and "Connect call failed" in unreachable.message


def test_a_too_old_resource_version_relists(plane: ControlPlane, tmp_path: Path) -> None:
    """The real server's 410 for a resourceVersion its watch cache no longer holds: list again."""
    set_configmap(plane.client(), configmap(65, 50, 40))
    node = Node(plane, tmp_path, NODES[0], pod_facts=False)
    watch = node.link.nodeslo_watch

    async def scenario() -> None:
        await watch.relist()
        watch.resource_version = "1"  # long compacted away
        stop, tasks = await _start(node)
        try:
            await node.wait("a relist after 410", lambda: watch.health.relists >= 2 and watch.resource_version != "1")
        finally:
            await _stop(stop, tasks)

    asyncio.run(scenario())
    assert NODES[0] in watch.store and watch.health.synced
