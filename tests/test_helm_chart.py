"""The Helm chart (packaging/helm/koordnode) and the DaemonSet manifest rendered from it
(packaging/koordnode-daemonset.yaml), with the real helm v3 (built from its Go module by
``scripts/k8s-bed.sh helm``): it lints, renders a configuration koordnode accepts, refuses what a
DaemonSet cannot run, installs on the bed's API server, and its ServiceAccount may do what
koordnode's cluster mode needs and nothing else (asked of the API server's RBAC).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from k8s_support import require_component
from testbed.kube_bed import ControlPlane

from koordnode.config.loader import load_config

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "packaging" / "helm" / "koordnode"
MANIFEST = REPO / "packaging" / "koordnode-daemonset.yaml"
NAMESPACE = "koordinator-system"


@pytest.fixture(scope="module")
def helm() -> Path:
    return require_component("helm") / "helm"


def _helm(helm: Path, *args: str, check: bool = True, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "HELM_CACHE_HOME": "/tmp/helm-cache",
           "HELM_CONFIG_HOME": "/tmp/helm-config", "HELM_DATA_HOME": "/tmp/helm-data"}
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    done = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120, env=env)
    if check and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return done


def _render(helm: Path, *sets: str) -> list[dict[str, Any]]:
    args = ["template", "koordnode", str(CHART), "--namespace", NAMESPACE]
    for item in sets:
        args += ["--set", item]
    return [doc for doc in yaml.safe_load_all(_helm(helm, *args).stdout) if doc]


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [found] = [doc for doc in docs if doc["kind"] == kind]
    return found


def test_chart_lints_and_the_committed_manifest_is_its_rendering(helm: Path) -> None:
    _helm(helm, "lint", "--strict", str(CHART))
    rendered = _helm(helm, "template", "koordnode", str(CHART), "--namespace", NAMESPACE).stdout
    lines = MANIFEST.read_text().splitlines(keepends=True)
    header = next(i for i, line in enumerate(lines) if not line.startswith("# "))  # the file's own comment
    committed = "".join(lines[header:])
    assert committed.strip() == rendered.strip(), (
        "packaging/koordnode-daemonset.yaml is stale: regenerate it with the command in its header")


def test_rendered_configuration_is_one_koordnode_accepts_and_values_win(helm: Path, tmp_path: Path) -> None:
    docs = _render(helm, "settings.qos_manager.tick_ms=500", "settings.cgroup.root=/elsewhere",
                   "settings.kubernetes.enable=false")
    toml = _one(docs, "ConfigMap")["data"]["koordnode.toml"]
    (tmp_path / "koordnode.toml").write_text(toml)
    config = load_config(str(tmp_path / "koordnode.toml"))
    assert config.runtime.mode == "nri"
    assert config.qos_manager.tick_ms == 500  # a value set in the chart's values
    assert config.kubernetes.enable is False
    assert config.cgroup.root == "/host/sys/fs/cgroup"  # the mount decides, not the value
    assert (config.procfs.root, config.sysfs.root) == ("/host/proc", "/host/sys")
    daemonset = _one(docs, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    [container] = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["cgroup"] == config.cgroup.root and volumes["cgroup"]["hostPath"]["path"] == "/sys/fs/cgroup"
    assert mounts["nri"] == str(Path(config.nri.socket).parent) == volumes["nri"]["hostPath"]["path"]
    assert mounts["state"] == config.daemon.state_dir == volumes["state"]["hostPath"]["path"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
    security = container["securityContext"]
    assert security["privileged"] is False and security["capabilities"]["drop"] == ["ALL"]
    assert "NET_ADMIN" not in security["capabilities"]["add"] and pod["hostNetwork"] is False
    assert container["readinessProbe"]["exec"]["command"] == ["/usr/bin/koordnode", "status", "--ready"]


def test_a_configuration_change_rolls_the_pods(helm: Path) -> None:
    def checksum(*sets: str) -> str:
        template = _one(_render(helm, *sets), "DaemonSet")["spec"]["template"]
        return str(template["metadata"]["annotations"]["checksum/config"])

    assert checksum() == checksum()
    assert checksum() != checksum("settings.qos_manager.tick_ms=500")


@pytest.mark.parametrize(("setting", "message"), [
    ("settings.runtime.mode=proxy", "a DaemonSet runs koordnode in NRI mode only"),
    ("settings.qos.BE.cpu_shares_fixed=2", 'name it settings."qos.BE" instead'),
])
def test_chart_refuses_what_a_daemonset_cannot_run(helm: Path, setting: str, message: str) -> None:
    done = _helm(helm, "template", "koordnode", str(CHART), "--set", setting, check=False)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_dotted_tables_reach_koordnode(helm: Path, tmp_path: Path) -> None:
    docs = _render(helm, 'settings.qos\\.BE.cpu_shares_fixed=4')
    (tmp_path / "koordnode.toml").write_text(_one(docs, "ConfigMap")["data"]["koordnode.toml"])
    assert load_config(str(tmp_path / "koordnode.toml")).qos.BE.cpu_shares_fixed == 4


def _can(plane: ControlPlane, verb: str, resource: str, *, group: str = "", namespace: str = "",
         subresource: str = "") -> bool:
    review = plane.client().create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": f"system:serviceaccount:{NAMESPACE}:koordnode",
                 "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"],
                 "resourceAttributes": {"verb": verb, "resource": resource, "group": group, "namespace": namespace,
                                        "subresource": subresource}}})
    return bool(review["status"].get("allowed"))


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """An API server of its own: the chart's cluster-wide objects meet nobody else's."""
    require_component("kubernetes")
    require_component("etcd")
    plane = ControlPlane(tmp_path_factory.mktemp("helm-plane")).start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def installed(helm: Path, control_plane: ControlPlane, tmp_path: Path) -> Iterator[Path]:
    kubeconfig = control_plane.kubeconfig(tmp_path / "admin.kubeconfig", control_plane.tokens["admin"])
    _helm(helm, "install", "koordnode", str(CHART), "--namespace", NAMESPACE, "--create-namespace",
          kubeconfig=kubeconfig)
    try:
        yield kubeconfig
    finally:
        _helm(helm, "uninstall", "koordnode", "--namespace", NAMESPACE, check=False, kubeconfig=kubeconfig)


def test_chart_installs_upgrades_and_uninstalls_and_its_account_has_least_privilege(
        helm: Path, control_plane: ControlPlane, installed: Path) -> None:
    admin = control_plane.client()
    daemonset = admin.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/koordnode")
    assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == "koordnode"
    assert admin.exists(f"/api/v1/namespaces/{NAMESPACE}/configmaps/koordnode")
    # what koordnode's cluster mode does (koordnode/kube/): allowed
    for verb, resource, group, sub in (("watch", "nodeslos", "slo.koordinator.sh", ""),
                                       ("update", "nodemetrics", "slo.koordinator.sh", "status"),
                                       ("create", "nodemetrics", "slo.koordinator.sh", ""),
                                       ("list", "pods", "", ""), ("create", "pods", "", "eviction"),
                                       ("update", "noderesourcetopologies", "topology.node.k8s.io", ""),
                                       ("get", "nodes", "", "")):
        assert _can(control_plane, verb, resource, group=group, subresource=sub), f"{verb} {resource}/{sub} refused"
    # what it never does: refused
    for verb, resource, group, sub in (("list", "secrets", "", ""), ("get", "configmaps", "", ""),
                                       ("delete", "pods", "", ""), ("create", "pods", "", ""),
                                       ("patch", "nodes", "", ""), ("update", "nodes", "", "status"),
                                       ("update", "nodeslos", "slo.koordinator.sh", ""),
                                       ("delete", "nodemetrics", "slo.koordinator.sh", ""),
                                       ("create", "daemonsets", "apps", "")):
        assert not _can(control_plane, verb, resource, group=group, subresource=sub), f"{verb} {resource}/{sub} allowed"
    before = daemonset["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    _helm(helm, "upgrade", "koordnode", str(CHART), "--namespace", NAMESPACE, "--set",
          "settings.qos_manager.tick_ms=500", kubeconfig=installed)
    upgraded = admin.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/koordnode")
    assert upgraded["spec"]["template"]["metadata"]["annotations"]["checksum/config"] != before
    assert "tick_ms = 500" in admin.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/koordnode")["data"]["koordnode.toml"]
    _helm(helm, "uninstall", "koordnode", "--namespace", NAMESPACE, kubeconfig=installed)
    for path in (f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/koordnode",
                 f"/api/v1/namespaces/{NAMESPACE}/configmaps/koordnode",
                 f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/koordnode",
                 "/apis/rbac.authorization.k8s.io/v1/clusterroles/koordnode",
                 "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/koordnode"):
        assert not admin.exists(path), f"{path} left behind by helm uninstall"
