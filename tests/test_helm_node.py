"""The Helm chart on a real node: koordnode's image imported into the node's containerd, the
chart installed with helm on an API server whose kube-controller-manager runs the DaemonSet,
ServiceAccount, root CA and garbage collector controllers and kube-scheduler binds the
DaemonSet's pod (ServiceAccount admission on, as in a real cluster), and
kubelet running the DaemonSet's pod: koordnode in it connects to containerd over NRI with the
account's mounted token, the example pods get their class values, a rolling update keeps every
value and BE suppressed, and uninstalling leaves what `koordnode restore` (a one-off pod with the
chart's mounts) puts back.

The bed's differences from a cluster, each a chart value: the API server listens on the node's
loopback (hostNetwork and apiServer.host/port), its paths are the test's (hostPaths,
settings.nri.socket, settings.qos_manager.kubepods_cgroup), and this machine's root lacks
CAP_SYS_RESOURCE, which runc cannot then give a container (capabilities without it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from k8s_support import cg_read, example_pods, require_component
from test_helm_chart import CHART, _helm
from test_k8s_node import FIRST_ROUND, check_class_values
from testbed.fixtures import skip_or_fail_in_ci
from testbed.koord_bed import install_koordinator
from testbed.kube_bed import ControlPlane, ControllerManager, KubeScheduler, free_port
from testbed.real_node import NODE_NAMES, RealNode, real_node

from koordnode.admin.client import fetch_status
from koordnode.executor.process import oom_score_adj_floor

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "koordinator-system"
IMAGE, TAG = "docker.io/koordnode/koordnode", "test"
NODE = NODE_NAMES[2]
CAPABILITIES = ["DAC_OVERRIDE", "SYS_RESOURCE", "SYS_PTRACE", "PERFMON"]
TICK_S = 1.0  # [qos_manager] tick_ms, shipped


@dataclass
class AdminSocket:
    """koordnode in the DaemonSet's pod, asked through the admin socket its hostPath shares."""

    path: Path

    def status(self) -> dict[str, Any]:
        return fetch_status(str(self.path), timeout_s=30)


@dataclass
class ChartNode:
    node: RealNode  # its koordnode: the pod's, through the admin socket
    helm: Path
    kubeconfig: Path
    values: list[str]
    host_paths: Path

    def install(self, *extra: str, command: str = "install") -> None:
        args = [command, "koordnode", str(CHART), "--namespace", NAMESPACE, "--create-namespace"]
        for item in (*self.values, *extra):
            args += ["--set", item]
        _helm(self.helm, *args, kubeconfig=self.kubeconfig)

    def agent_pods(self) -> list[dict[str, Any]]:
        return self.node.client().get(f"/api/v1/namespaces/{NAMESPACE}/pods").get("items", [])

    def wait_agent_ready(self, not_uid: str = "", timeout: float = 180) -> dict[str, Any]:
        """The DaemonSet's pod on the node Ready (a new one when `not_uid` names the old)."""
        def ready() -> dict[str, Any] | None:
            for pod in self.agent_pods():
                conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
                if pod["metadata"]["uid"] != not_uid and conditions.get("Ready") == "True":
                    return pod
            return None
        try:
            return self.node.client().wait_for("koordnode's DaemonSet pod Ready", ready, timeout=timeout, interval=1)
        except Exception as err:
            raise AssertionError(f"{err}; pods: {json.dumps([p.get('status') for p in self.agent_pods()])[:3000]}; "
                                 f"kubelet log tail: {self.node.kubelet.log_text()[-3000:]}") from None


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.geteuid() != 0:
        skip_or_fail_in_ci("packaging/image.py needs root")
    out = tmp_path_factory.mktemp("image")
    done = subprocess.run([sys.executable, str(REPO / "packaging" / "image.py"), "--tag", f"{IMAGE}:{TAG}",
                           "--out", str(out)], capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-4000:]
    return Path(done.stdout.split()[-1])


@pytest.fixture(scope="module")
def chart_node(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartNode]:
    for component in ("containerd", "kubernetes", "etcd", "helm", "koordinator"):
        require_component(component)
    work = tmp_path_factory.mktemp("helm-node")
    helm = require_component("helm") / "helm"
    with ControlPlane(work / "plane", node_names=(NODE,), service_accounts=True) as plane, \
            ControllerManager(plane, work / "controllers"), KubeScheduler(plane, work / "scheduler"), \
            real_node(work / "node", mode="nri", control_plane=plane, node_name=NODE, other_agent=True) as node:
        install_koordinator(plane)  # the CRDs of koordnode's cluster mode (NodeSLO, NodeMetric)
        node.containerd.ctr("images", "import", "--snapshotter", node.containerd.snapshotter, str(image),
                            timeout=300)
        host_paths = work / "host"
        # Without CAP_SYS_RESOURCE of its own (oom_score_adj_floor is then set), runc cannot grant it.
        capabilities = [c for c in CAPABILITIES if c != "SYS_RESOURCE" or oom_score_adj_floor() is None]
        values = [f"image.repository={IMAGE}", f"image.tag={TAG}", "image.pullPolicy=Never",
                  f"settings.nri.socket={node.nri_socket}",
                  f"settings.qos_manager.kubepods_cgroup={node.kubepods}",
                  f"settings.metrics.listen=127.0.0.1:{free_port()}",
                  "hostNetwork=true", f"apiServer.host={plane.host}", f"apiServer.port={plane.port}",
                  f"hostPaths.state={host_paths / 'state'}", f"hostPaths.run={host_paths / 'run'}",
                  f"capabilities={{{','.join(capabilities)}}}"]
        kubeconfig = plane.kubeconfig(work / "admin.kubeconfig", plane.tokens["admin"])
        view = replace(node, koordnode=AdminSocket(host_paths / "run" / "admin.sock"))
        yield ChartNode(view, helm, kubeconfig, values, host_paths)  # type: ignore[arg-type]
        _helm(helm, "uninstall", "koordnode", "--namespace", NAMESPACE, check=False, kubeconfig=kubeconfig)


def node_client_wait(chart_node: ChartNode, what: str, probe, timeout: float = 60) -> Any:
    return chart_node.node.client().wait_for(what, probe, timeout=timeout, interval=1)


def _values_of(node: RealNode, classes) -> dict[str, str]:
    """Every value koordnode says it applied to the example pods, read from the files."""
    from test_k8s_node import _APPLIED, _file_value, _status_pod

    values: dict[str, str] = {}
    for cls in classes:
        uid = node.pod(example_pods()[cls]["metadata"]["name"])["metadata"]["uid"]
        pod = _status_pod(node, uid)
        for entry in [*pod.get("applied", []), *(e for c in pod.get("containers", []) for e in c.get("applied", []))]:
            match = _APPLIED.match(entry)
            assert match, entry
            values[f"{match['resource']} on {match['cgroup']}"] = _file_value(match["resource"], match["cgroup"])
    return values


def test_the_charts_pod_runs_koordnode_on_the_node_and_the_example_pods_get_their_values(chart_node):
    chart_node.install()
    agent = chart_node.wait_agent_ready()
    spec = agent["spec"]
    assert spec["hostPID"] and spec["serviceAccountName"] == "koordnode"
    # The account's token, mounted by ServiceAccount admission: cluster mode is working with it.
    status = chart_node.node.koordnode.status()
    assert status["mode"] == "nri" and status["nri"]["connected"], status.get("nri")
    def cluster_mode_works() -> dict[str, Any] | None:
        kube = chart_node.node.koordnode.status().get("kubernetes") or {}
        return kube if kube.get("api_server") == "ok" and kube.get("identity") else None
    kube = node_client_wait(chart_node, "koordnode's cluster mode on the account's token", cluster_mode_works)
    assert "serviceaccount" in str(kube["identity"]).lower() or "in-cluster" in str(kube["identity"]).lower(), kube
    for cls in FIRST_ROUND:
        chart_node.node.create_pod(example_pods()[cls])
    for cls in FIRST_ROUND:
        chart_node.node.wait_running(example_pods()[cls]["metadata"]["name"], timeout=120)
    check_class_values(chart_node.node, FIRST_ROUND)


def test_a_rolling_update_keeps_every_value_and_be_suppressed(chart_node):
    """A configuration change rolls the pod: the new koordnode adopts the running pods over NRI's
    synchronization; every value read from the files is the same after, and BE (busy, beside an
    LS pod busy on both CPUs) is never without its quota or idle flag for more than a tick."""
    node = chart_node.node
    ls_name = "ls-busy"
    node.create_pod({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": ls_name, "labels": {"koordinator.sh/qosClass": "LS"}},
                     "spec": {"terminationGracePeriodSeconds": 0, "containers": [{
                         "name": "app", "image": example_pods()["BE"]["spec"]["containers"][0].get("image")
                         or "docker.io/koordnode/busybox:test", "imagePullPolicy": "Never",
                         "command": ["sh", "-c", "for i in 1 2; do (while :; do :; done) & done; wait"],
                         "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}}}]}})
    node.wait_running(ls_name)
    group = f"{node.kubepods}/koordnode_be"

    def suppressed() -> bool:
        quota = int(cg_read("cpu", group, "cpu.cfs_quota_us"))
        return 0 < quota and cg_read("cpu", group, "cpu.idle") == "1"
    node.client().wait_for("BE suppressed beside the busy LS pod", suppressed, timeout=60)
    before = _values_of(node, FIRST_ROUND)
    old = chart_node.wait_agent_ready()
    unsuppressed: list[float] = []
    done = threading.Event()

    def watch() -> None:  # the longest stretch BE ran without its quota or idle flag
        since = None
        while not done.is_set():
            now = time.monotonic()
            if suppressed():
                if since is not None:
                    unsuppressed.append(now - since)
                since = None
            elif since is None:
                since = now
            time.sleep(0.02)
        if since is not None:
            unsuppressed.append(time.monotonic() - since)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        chart_node.install("settings.qos_manager.reconcile_interval_s=20", command="upgrade")
        chart_node.wait_agent_ready(not_uid=old["metadata"]["uid"])
        time.sleep(3 * TICK_S)
    finally:
        done.set()
        watcher.join(10)
    after = _values_of(node, FIRST_ROUND)
    print(f"{len(before)} values the same after the roll: {after == before}; BE without its quota or idle flag: "
          f"{len(unsuppressed)} times, longest {max(unsuppressed, default=0.0):.3f} s")
    assert after == before
    assert max(unsuppressed, default=0.0) <= TICK_S, sorted(unsuppressed)[-5:]
    node.client().delete(node.pod_path(ls_name), grace_seconds=0)


def test_removing_the_chart_with_restore_on_stop_puts_the_node_back(chart_node):
    """The removal operations.md gives: `helm upgrade --reuse-values --set
    settings.daemon.restore_on_stop=true` (the pods roll; a roll's stop is not a removal, and the
    old pods keep their values), then, the BE pods gone, `helm uninstall`: each node's koordnode
    runs `koordnode restore` on its stop, in its pod with the chart's mounts. No record is left
    under hostPaths.state, and the BE group koordnode made is gone."""
    node = chart_node.node
    records = chart_node.host_paths / "state" / "originals.json"
    kept = json.loads(records.read_text())["originals"]
    assert kept, "koordnode kept no originals of what it changed on the node"
    old = chart_node.wait_agent_ready()
    _helm(chart_node.helm, "upgrade", "koordnode", str(CHART), "--namespace", NAMESPACE, "--reuse-values",
          "--set", "settings.daemon.restore_on_stop=true", kubeconfig=chart_node.kubeconfig)
    chart_node.wait_agent_ready(not_uid=old["metadata"]["uid"])
    client = node.client()
    for cls in FIRST_ROUND:
        client.delete(node.pod_path(example_pods()[cls]["metadata"]["name"]), grace_seconds=0)
    client.wait_for("the example pods gone", lambda: not any(
        client.exists(node.pod_path(example_pods()[cls]["metadata"]["name"])) for cls in FIRST_ROUND), timeout=120)
    # Gone from the API at once (no grace period), they still run until kubelet has stopped them:
    # the BE group can only go once it holds no pod.
    group = Path("/sys/fs/cgroup/cpu") / node.kubepods.lstrip("/") / "koordnode_be"
    client.wait_for("the BE pods' cgroups gone from the group", lambda: not [
        child for child in group.iterdir() if child.is_dir()], timeout=120)
    _helm(chart_node.helm, "uninstall", "koordnode", "--namespace", NAMESPACE, "--wait",
          kubeconfig=chart_node.kubeconfig)
    client.wait_for("koordnode's pod gone", lambda: not chart_node.agent_pods(), timeout=120)
    # Every entry restored: the file goes with its last entry (the next start records afresh).
    left = json.loads(records.read_text())["originals"] if records.exists() else []
    assert left == [], left
    assert not group.exists(), "the BE group koordnode made is still there"
