"""`koordnode run` with [kubernetes] on, against the real kube-apiserver and the real containerd
test bed: a NodeSLO change reaches a pod's cgroup without touching the node, every key's source
is in status, a pod is planned from CRI alone while the API server is away (CRI not blocked)
and planned again when its facts arrive, and the NodeMetric it publishes matches its status.

Pods are created twice, as kubelet and the scheduler would have them: in the API (bound to the
node by spec.nodeName) and through CRI with the same UID (no kubelet runs here).
"""

from __future__ import annotations

# ruff: noqa: F811  (the `plane` fixture is imported, then requested by name)

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k8s_support import cg_read
from support.cri import Cri, container_config, remove_pod, run_pod, sandbox_config, start_container
from support.koordnode_runner import KoordnodeProcess
from kube_cluster_support import NODES, configmap, kubeconfig_for, plane, set_configmap  # noqa: F401
from testbed.kube_bed import ControlPlane

from koordnode.kube.agent import NODEMETRICS, NODESLOS
from koordnode.kube.topology import NODE_RESOURCE_TOPOLOGIES
from koordnode.model.cpulist import parse_cpu_list

NODE = NODES[0]


def _wait(what: str, probe: Any, timeout: float = 30.0, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout} s (last: {last!r})")


@pytest.fixture
def cluster_koordnode(plane: ControlPlane, containerd_bed, tmp_path: Path) -> Iterator[KoordnodeProcess]:
    kubeconfig = kubeconfig_for(plane, tmp_path / "identity", plane.tokens["koordnode"])
    extra = (f'[kubernetes]\nenable = true\nkubeconfig = "{kubeconfig}"\nnode_name = "{NODE}"\n'
             "backoff_max_s = 2.0\nnode_metric_interval_s = 5\n"
             "[qos_manager]\ntick_ms = 500\n")
    proc = KoordnodeProcess(tmp_path / "koordnode", str(containerd_bed.socket), extra_toml=extra,
                            kubepods=containerd_bed.kubepods_cgroup)
    yield proc
    proc.stop()


def _api_pod(cp: ControlPlane, name: str, labels: dict[str, str], memory: str | None) -> dict[str, Any]:
    resources = {"requests": {"memory": memory}, "limits": {"memory": "1Gi"}} if memory else {}
    return cp.client().create("/api/v1/namespaces/default/pods", {
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "busybox", "resources": resources}]}})


def _pod_status(proc: KoordnodeProcess, sandbox_id: str) -> dict[str, Any]:
    return next(p for p in proc.status()["pods"] if p["sandbox_id"] == sandbox_id)


def _container_notes(proc: KoordnodeProcess, sandbox_id: str) -> str:
    pod = _pod_status(proc, sandbox_id)
    return json.dumps([c.get("notes", []) for c in pod.get("containers", [])])


def test_cluster_mode_end_to_end(plane: ControlPlane, containerd_bed, cluster_koordnode: KoordnodeProcess,
                                 tmp_path: Path) -> None:
    # A pod no API server knows keeps prodReclaimableMetric unpublished (asserted below).
    assert not containerd_bed.list_pod_ids(), "pods left in the session's containerd by an earlier test"
    admin = plane.client()
    ls = _api_pod(plane, "e2e-ls", {"koordinator.sh/qosClass": "LS"}, "256Mi")
    be = _api_pod(plane, "e2e-be", {"koordinator.sh/qosClass": "BE"}, None)
    set_configmap(admin, configmap(65, 50, 40))
    cri: Cri | None = None
    sandboxes: list[str] = []
    plane.stop_apiserver()
    try:
        # The API server is away: koordnode starts, serves CRI and plans from CRI alone.
        cluster_koordnode.start()
        cri = Cri(cluster_koordnode.listen)
        cluster_koordnode.wait_rebuilt()
        started = time.monotonic()
        ls_cfg = sandbox_config(containerd_bed, "e2e-ls", qos="burstable", uid=ls["metadata"]["uid"],
                                labels={"koordinator.sh/qosClass": "LS"})
        ls_sid = run_pod(cri, ls_cfg)
        sandboxes.append(ls_sid)
        start_container(cri, ls_sid, ls_cfg, container_config(containerd_bed, "app", ["sleep", "3600"],
                                                              resources={"memory_limit_in_bytes": 1 << 30}))
        be_cfg = sandbox_config(containerd_bed, "e2e-be", qos="besteffort", uid=be["metadata"]["uid"],
                                labels={"koordinator.sh/qosClass": "BE"})
        be_sid = run_pod(cri, be_cfg)
        sandboxes.append(be_sid)
        start_container(cri, be_sid, be_cfg, container_config(containerd_bed, "app", ["sleep", "3600"]))
        cri_seconds = time.monotonic() - started
        assert cri_seconds < 10  # nothing on the CRI path waits for the API server
        assert "not known to the API server" in _container_notes(cluster_koordnode, ls_sid)
        assert _pod_status(cluster_koordnode, ls_sid)["api"].startswith("not known to the API server")
        status = cluster_koordnode.status()
        assert status["kubernetes"]["api_server"].startswith("unreachable: ")
        assert status["config"]["keys"]["qos.LS.memory_min_percent"] == {"value": 50, "source": "default"}

        # Back: the NodeSLO and the pod facts arrive; the pod is planned again.
        plane.start_apiserver()
        # the NodeSLO's lsClass minLimitPercent 40 of the 256 Mi request (either may arrive first)
        _wait("pod facts and the NodeSLO", lambda: "memory.min 40% / memory.low 70% of request 268435456 "
              "(request from the pod spec (API server))" in _container_notes(cluster_koordnode, ls_sid), 60)
        assert _pod_status(cluster_koordnode, ls_sid)["api"]["memory_requests"] == {"app": 256 << 20}
        keys = cluster_koordnode.status()["config"]["keys"]
        assert keys["qos.LS.memory_min_percent"] == {"value": 40, "source": "nodeslo"}
        assert keys["proxy.listen"]["source"] == "toml"
        assert keys["qos.BE.cpu_idle"] == {"value": 0, "source": "default"}

        # A NodeSLO change reaches the BE pod's cgroup without touching the node.
        be_cgroup = _pod_status(cluster_koordnode, be_sid)["cgroup_parent"]
        assert cg_read("cpu", be_cgroup, "cpu.idle") == "0"
        slo = admin.get(f"{NODESLOS}/{NODE}")
        slo["spec"]["resourceQOSStrategy"]["beClass"] = {"cpuQOS": {"enable": True, "schedIdle": 1}}
        changed = time.monotonic()
        admin.request("PUT", f"{NODESLOS}/{NODE}", slo)
        _wait("cpu.idle from the NodeSLO", lambda: cg_read("cpu", be_cgroup, "cpu.idle") == "1", 15, 0.02)
        print(f"NodeSLO edit -> BE pod cpu.idle = 1: {(time.monotonic() - changed) * 1000:.0f} ms")
        assert cluster_koordnode.status()["config"]["keys"]["qos.BE.cpu_idle"] == {"value": 1, "source": "nodeslo"}

        # NodeMetric, published by the daemon, matches its status.
        stored = _wait("NodeMetric status", lambda: (admin.get(f"{NODEMETRICS}/{NODE}").get("status") or None), 60)
        names = {(p["namespace"], p["name"]): p for p in stored["podsMetric"]}
        assert names[("default", "e2e-be")]["qos"] == "BE" and names[("default", "e2e-ls")]["qos"] == "LS"
        status = cluster_koordnode.status()
        assert status["kubernetes"]["node_metric"]["state"] == "reported"
        batch = status["batch_allocatable"]
        assert batch["cpu_cores"] >= 0 and batch["memory_bytes"] >= 0 and "formula" in batch
        stored_now = admin.get(f"{NODEMETRICS}/{NODE}")["status"]
        assert status["kubernetes"]["node_metric"]["node_usage"] == stored_now["nodeMetric"]["nodeUsage"] or \
            stored_now["updateTime"] != stored["updateTime"]
        metrics_text = cluster_koordnode.log_text()
        assert "nodeslo_applied" in metrics_text
        # prodReclaimableMetric once the peak models are trained: nothing, as every prod pod here
        # (no Koordinator priority counts as prod) is within its 24 h cold start
        reclaimable = _wait("prodReclaimableMetric", lambda: admin.get(f"{NODEMETRICS}/{NODE}")["status"]
                            .get("prodReclaimableMetric") or None, 90)
        assert reclaimable == {"resource": {"resources": {"cpu": "0m", "memory": "0"}}}, reclaimable

        # NodeResourceTopology, made by the daemon from its engine's CPU pools.
        nrt = _wait("NodeResourceTopology", lambda: admin.get(f"{NODE_RESOURCE_TOPOLOGIES}/{NODE}")
                    if admin.exists(f"{NODE_RESOURCE_TOPOLOGIES}/{NODE}") else None, 60)
        cpus = cluster_koordnode.status()["qos"]["cpus"]
        pools = json.loads(nrt["metadata"]["annotations"]["node.koordinator.sh/cpu-shared-pools"])
        assert sorted(c for pool in pools for c in parse_cpu_list(pool["cpuset"])) == cpus["share_pool"]
        detail = json.loads(nrt["metadata"]["annotations"]["node.koordinator.sh/cpu-topology"])["detail"]
        assert len(detail) == os.cpu_count() and nrt["zones"][0]["name"] == "node-0"
        assert cluster_koordnode.status()["kubernetes"]["node_resource_topology"]["state"] in ("created", "updated")
    finally:
        if not _api_up(plane):
            plane.start_apiserver()
        if cri is not None:
            for sid in sandboxes:
                remove_pod(cri, sid)
            cri.close()
        for name in ("e2e-ls", "e2e-be"):
            admin.delete(f"/api/v1/namespaces/default/pods/{name}", grace_seconds=0)


def _api_up(cp: ControlPlane) -> bool:
    try:
        return cp.client().raw("GET", "/readyz") == "ok"
    except Exception:
        return False


def test_kubernetes_section_takes_effect_on_sighup(plane: ControlPlane, containerd_bed, tmp_path: Path) -> None:
    """[kubernetes] on, moved to another node and off again, each by SIGHUP without a restart:
    the NodeSLO of the node named applies, and with the link off its values are gone."""
    import signal

    set_configmap(plane.client(), configmap(61, 50, 40))  # pool a (NODES[0]) 61 %, pool b 50 %
    kubeconfig = kubeconfig_for(plane, tmp_path / "identity", plane.tokens["koordnode"])
    proc = KoordnodeProcess(tmp_path / "koordnode", str(containerd_bed.socket),
                            kubepods=containerd_bed.kubepods_cgroup).start()
    base = proc.config_path.read_text()
    threshold = "strategy.cpu_suppress.threshold_percent"

    def reload_with(section: str) -> None:
        proc.config_path.write_text(base + section)
        proc.proc.send_signal(signal.SIGHUP)

    def key() -> dict[str, Any]:
        return proc.status()["config"]["keys"][threshold]

    try:
        pid = proc.proc.pid
        assert proc.status()["kubernetes"] == {"enable": False} and key()["source"] == "default"
        link = f'[kubernetes]\nenable = true\nkubeconfig = "{kubeconfig}"\nbackoff_max_s = 2.0\n'
        reload_with(link + f'node_name = "{NODES[0]}"\n')
        _wait("NODES[0]'s NodeSLO applied", lambda: key() == {"value": 61.0, "source": "nodeslo"})
        assert proc.status()["kubernetes"]["node_name"] == NODES[0]
        reload_with(link + f'node_name = "{NODES[1]}"\n')
        _wait("NODES[1]'s NodeSLO applied", lambda: key() == {"value": 50.0, "source": "nodeslo"})
        assert proc.status()["kubernetes"]["node_name"] == NODES[1]
        reload_with("[kubernetes]\nenable = false\n")
        _wait("the link off, its NodeSLO gone", lambda: proc.status()["kubernetes"] == {"enable": False}
              and key()["source"] == "default")
        assert proc.proc.pid == pid and proc.proc.poll() is None  # never restarted
        assert proc.status()["config"]["last_reload"]["result"] == "applied"
    finally:
        proc.stop()
