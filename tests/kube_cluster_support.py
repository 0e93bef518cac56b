"""The control plane of the [kubernetes] tests (tests/test_kube_apiserver.py, test_kube_daemon.py):
a real etcd + kube-apiserver with Koordinator's own CRDs for NodeSLO and NodeMetric
(tests/data/koordinator_crds, from github.com/koordinator-sh/koordinator v1.6.0,
config/crd/bases), the shipped RBAC manifest, and koord-manager's NodeSLO rendering as a test
double (cluster strategy, then the first node strategy whose selector matches the node).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from k8s_support import require_component
from testbed.kube_client import ApiError as AdminApiError
from testbed.kube_client import KubeClient as AdminClient
from testbed.koord_bed import crd_established, install_koordinator, install_koordnode_rbac, register_ready_node
from testbed.kube_bed import ControlPlane
from testbed.real_node import NODE_NAMES

from koordnode.config import Config, parse_config, with_nodeslo
from koordnode.config.kubernetes import KubernetesConfig
from koordnode.kube.agent import NODESLOS, ClusterLink

REPO = Path(__file__).resolve().parent.parent
CRDS = Path(__file__).with_name("data") / "koordinator_crds"
NS = "koordinator-system"
NODES = ("kn-a", "kn-b")


# ---------------------------------------------------------------------------------------------
# the control plane, CRDs, RBAC


@pytest.fixture(scope="session")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of these tests' own (tests stop and restart its API server), with
    Koordinator's CRDs, the shipped RBAC and two nodes."""
    require_component("kubernetes")
    require_component("etcd")
    cp = ControlPlane(tmp_path_factory.mktemp("kube-cluster-mode"), node_names=NODE_NAMES).start()  # kubelets too
    try:
        admin = cp.client()
        for crd in sorted(CRDS.glob("*.yaml")):
            doc = yaml.safe_load(crd.read_text())
            admin.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)
            name = doc["metadata"]["name"]
            admin.wait_for(f"CRD {name} established", lambda name=name: crd_established(admin, name), timeout=60)
        admin.create("/api/v1/namespaces", {"metadata": {"name": NS}})
        install_koordnode_rbac(admin)
        for node in NODES:
            admin.create("/api/v1/nodes", {"metadata": {"name": node, "labels": {"pool": node[-1]}}})
        admin.wait_for("RBAC for koordnode", lambda: _can_list_nodeslos(cp), timeout=30)
        yield cp
    finally:
        cp.stop()


@contextlib.contextmanager
def koordinator_plane(workdir: Path, node: str, cpus: int = 0, memory_bytes: int = 0) -> Iterator[ControlPlane]:
    """A control plane with Koordinator's CRDs, namespace, priority classes and RBAC, koordnode's
    RBAC, and `node` registered Ready with `cpus` and `memory_bytes` (cpus 0: a real kubelet will
    register it); stopped on the way out."""
    for component in ("kubernetes", "etcd", "koordinator"):
        require_component(component)
    cp = ControlPlane(workdir / "plane", node_names=(node,)).start()
    try:
        install_koordinator(cp)
        install_koordnode_rbac(cp.client())
        if cpus:
            register_ready_node(cp.client(), node, cpus, memory_bytes)
        yield cp
    finally:
        cp.stop()


def _can_list_nodeslos(cp: ControlPlane) -> bool:
    try:
        cp.client("koordnode").get(NODESLOS)
        return True
    except AdminApiError:
        return False


def kubeconfig_for(cp: ControlPlane, directory: Path, token: str) -> Path:
    """In YAML, with a tokenFile, as an operator would write it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(token + "\n")
    return write_kubeconfig(cp, directory / "kubeconfig", "tokenFile: token\n")


def write_kubeconfig(cp: ControlPlane, path: Path, user: str, *, embed_ca: bool = False) -> Path:
    """A kubeconfig in block-style YAML whose user authenticates by `user` (YAML lines of its
    `user:` mapping); `embed_ca`: the CA as certificate-authority-data, as kubeadm writes it."""
    ca = (f"certificate-authority-data: {base64.b64encode(cp.ca_file.read_bytes()).decode()}" if embed_ca
          else f"certificate-authority: {cp.ca_file}")
    path.write_text(textwrap.dedent(f"""\
        apiVersion: v1
        kind: Config
        clusters:
        - name: bed
          cluster:
            server: {cp.url}
            {ca}
        contexts:
        - name: koordnode@bed
          context:
            cluster: bed
            user: koordnode
        current-context: koordnode@bed
        users:
        - name: koordnode
          user:
        """) + textwrap.indent(user, " " * 4))
    return path


# ---------------------------------------------------------------------------------------------
# koord-manager's rendering, as a test double: ConfigMap -> one NodeSLO per node


def configmap(cluster_threshold: int, pool_b_threshold: int, ls_min: int) -> dict[str, Any]:
    return {"metadata": {"name": "slo-controller-config", "namespace": NS}, "data": {
        "resource-threshold-config": json.dumps({
            "clusterStrategy": {"enable": True, "cpuSuppressThresholdPercent": cluster_threshold,
                                "cpuSuppressPolicy": "cfsQuota"},
            "nodeStrategies": [{"name": "pool-b", "nodeSelector": {"matchLabels": {"pool": "b"}},
                                "cpuSuppressThresholdPercent": pool_b_threshold}]}),
        "resource-qos-config": json.dumps({
            "clusterStrategy": {"lsClass": {"memoryQOS": {"enable": True, "minLimitPercent": ls_min,
                                                          "lowLimitPercent": 70}}}}),
    }}


def render_nodeslos(admin: AdminClient) -> None:
    cm = admin.get(f"/api/v1/namespaces/{NS}/configmaps/slo-controller-config")["data"]
    threshold = json.loads(cm["resource-threshold-config"])
    qos = json.loads(cm["resource-qos-config"])
    for node in admin.get("/api/v1/nodes")["items"]:
        labels = node["metadata"].get("labels", {})
        used = dict(threshold["clusterStrategy"])
        for strategy in threshold.get("nodeStrategies", []):
            selector = strategy["nodeSelector"]["matchLabels"]
            if all(labels.get(k) == v for k, v in selector.items()):
                used.update({k: v for k, v in strategy.items() if k not in ("name", "nodeSelector")})
                break
        name = node["metadata"]["name"]
        spec = {"resourceUsedThresholdWithBE": used, "resourceQOSStrategy": qos["clusterStrategy"]}
        path = f"{NODESLOS}/{name}"
        if admin.exists(path):
            current = admin.get(path)
            current["spec"] = spec
            admin.request("PUT", path, current)
        else:
            admin.create(NODESLOS, {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO",
                                    "metadata": {"name": name}, "spec": spec})


def set_configmap(admin: AdminClient, cm: dict[str, Any]) -> None:
    path = f"/api/v1/namespaces/{NS}/configmaps/slo-controller-config"
    if admin.exists(path):
        admin.request("PUT", path, cm)
    else:
        admin.create(f"/api/v1/namespaces/{NS}/configmaps", cm)
    render_nodeslos(admin)


# ---------------------------------------------------------------------------------------------
# a node's koordnode side, without the daemon


class Node:
    """One node's koordnode side: a ClusterLink applying NodeSLOs below a local file."""

    def __init__(self, cp: ControlPlane, workdir: Path, name: str, *, local_toml: str = "",
                 token: str | None = None, topology: Any = None, kubeconfig: Path | None = None,
                 **config: Any) -> None:
        self.kubeconfig = kubeconfig or kubeconfig_for(cp, workdir / name, token or cp.tokens["koordnode"])
        self.config: Config = parse_config(local_toml)
        self.applied: list[tuple[float, Config]] = []
        self.facts_changes = 0
        self.observed: list[tuple[str, str]] = []
        settings = dict(dict(enable=True, kubeconfig=str(self.kubeconfig), node_name=name, watch_timeout_s=30,
                             backoff_max_s=2.0, node_metric=False), **config)
        self.link = ClusterLink(KubernetesConfig(**settings), apply_nodeslo=self._apply,
                                on_pod_facts=self._facts, node_metric_status=lambda request: None,
                                node_topology=lambda: topology,
                                observe=lambda kind, result: self.observed.append((kind, result)))

    async def _apply(self, values: dict[str, Any] | None) -> None:
        new = with_nodeslo(self.config, values)  # ConfigError: refused, the running config kept
        self.config = new
        self.applied.append((time.monotonic(), new))

    def _facts(self) -> None:
        self.facts_changes += 1

    async def wait(self, what: str, predicate: Any, timeout: float = 20.0) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if predicate():
                return time.monotonic() - started
            await asyncio.sleep(0.02)
        raise AssertionError(f"{self.link.node_name}: {what} not within {timeout} s; status: "
                             f"{json.dumps(self.link.status(), default=str)[:1500]}")


async def _start(*nodes: Node) -> tuple[asyncio.Event, list[asyncio.Task[Any]]]:
    stop = asyncio.Event()
    return stop, [asyncio.create_task(n.link.run(stop)) for n in nodes]


async def _stop(stop: asyncio.Event, tasks: list[asyncio.Task[Any]]) -> None:
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
