"""Koordinator's control plane in the test bed: the real koord-manager v1.8 (built from its Go
module by ``scripts/k8s-bed.sh koordinator``) against a ``ControlPlane``, with what Koordinator's
own manifests install: every CRD of the module's ``config/crd/bases``, the ``koordinator-system``
namespace, the priority classes ``koord-prod``, ``koord-mid``, ``koord-batch``, ``koord-free``,
and koord-manager's ClusterRole (``config/rbac/role.yaml``) bound to the bed's ``koord-manager``
user, so it runs with exactly the rights its chart gives it.

koord-scheduler v1.8 runs beside it under the scheduler name ``koord-scheduler`` with the plugin
a node agent serves (NodeNUMAResource: CPU binding from the node's NodeResourceTopology) on top of
kube-scheduler's defaults, with its chart's rights (``config/rbac/scheduler_role.yaml`` plus
``system:kube-scheduler`` and ``system:volume-scheduler``) as the bed's ``koord-scheduler`` user.

koord-manager runs as the issue that brought it describes Koordinator without its webhooks:
``--feature-gates=WebhookFramework=false --enable-leader-election=false`` and only the
controllers a node agent deals with (``nodemetric``, ``noderesource``, ``nodeslo``); metrics and
health on free loopback ports, no pprof.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from .k8s_dist import component_bin
from .kube_bed import ControlPlane, _stop_process, _tail, _wait, free_port

NAMESPACE = "koordinator-system"
CONTROLLERS = ("nodemetric", "noderesource", "nodeslo")


def koordinator_dir() -> Path:
    """The built component: bin/koord-manager, crd/, rbac/, manager/ (priority classes)."""
    return component_bin("koordinator").parent


def crd_established(admin: Any, name: str) -> bool:
    """The API server serves the CRD `name` (its Established condition is True)."""
    crd = admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    return any(c["type"] == "Established" and c["status"] == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])


def install_koordinator(plane: ControlPlane) -> None:
    """CRDs, namespace, priority classes and koord-manager's RBAC, as Koordinator installs them.
    Idempotent: what exists already is left as it is."""
    from .kube_client import ApiError

    admin = plane.client()
    top = koordinator_dir()

    def create(collection: str, obj: dict[str, Any]) -> None:
        try:
            admin.create(collection, obj)
        except ApiError as err:
            if err.status != 409:
                raise

    crds = [yaml.safe_load(path.read_text()) for path in sorted((top / "crd").glob("*.yaml"))]
    for crd in crds:
        create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    for crd in crds:
        name = crd["metadata"]["name"]
        admin.wait_for(f"CRD {name} established", lambda name=name: crd_established(admin, name), timeout=60)
    create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    for path in sorted((top / "manager").glob("koord-*.yaml")):
        priority_class = yaml.safe_load(path.read_text())
        name = priority_class["metadata"]["name"]  # kustomize prefixes "koord-" in the chart
        priority_class["metadata"]["name"] = name if name.startswith("koord-") else f"koord-{name}"
        create("/apis/scheduling.k8s.io/v1/priorityclasses", priority_class)
    def bind(user: str, role: str) -> None:
        create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "metadata": {"name": f"{user}-{role.replace(':', '-')}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}]})

    for user in ("koord-manager", "koord-scheduler"):
        for role in yaml.safe_load_all((top / "rbac" / f"{user}-role.yaml").read_text()):
            if role:
                create("/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
                bind(user, role["metadata"]["name"])
    for role in ("system:kube-scheduler", "system:volume-scheduler"):
        bind("koord-scheduler", role)


KOORDNODE_RBAC = Path(__file__).resolve().parents[2] / "packaging" / "helm" / "koordnode" / "files" / "koordnode-rbac.yaml"


def install_koordnode_rbac(admin: Any) -> None:
    """koordnode's shipped RBAC manifest (its namespace must exist), and the bed's plain user
    "koordnode" bound to exactly the shipped ClusterRole."""
    for doc in yaml.safe_load_all(KOORDNODE_RBAC.read_text()):
        kind = doc["kind"]
        collection = {"ServiceAccount": f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
                      "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
                      "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"}[kind]
        admin.create(collection, doc)
    admin.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "metadata": {"name": "koordnode-user"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "koordnode"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "koordnode"}]})


def register_ready_node(admin: Any, name: str, cpus: int, memory_bytes: int) -> None:
    """A Node object the scheduler may bind to, as a kubelet would leave it: its capacity and
    allocatable, Ready, and without the not-ready taint the admission gives a new Node (no node
    controller runs here to take it away)."""
    admin.create("/api/v1/nodes", {"metadata": {"name": name}})
    resources = {"cpu": str(cpus), "memory": str(memory_bytes), "pods": "110"}
    ready = [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "the test's node"}]
    admin.patch(f"/api/v1/nodes/{name}/status", {"status": {"capacity": resources, "allocatable": resources,
                                                            "conditions": ready}})
    admin.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})


class _Component:
    """A Koordinator component as a process of the test, logging to ``workdir/<name>.log``."""

    def __init__(self, plane: ControlPlane, workdir: Path, name: str) -> None:
        self.plane = plane
        self.workdir = Path(workdir)
        self.name = name
        self.log_path = self.workdir / f"{name}.log"
        self._process: subprocess.Popen | None = None
        self._log: Any = None

    def _spawn(self, args: list[str], ready: Any, what: str, timeout: float, *, binary: Path | None = None,
               env: dict[str, str] | None = None) -> None:
        """`binary`: default the koordinator build's bin/<name>."""
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        cmd = [str(binary or koordinator_dir() / "bin" / self.name), *args]
        self._process = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=self.workdir, start_new_session=True)
        try:
            _wait(what, ready, timeout, self._process, self.log_path)
        except BaseException:
            self.stop()  # the caller never gets an object to stop
            raise

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self.running and self._process is not None else None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def tail(self) -> str:
        return _tail(self.log_path, 40)

    def stop(self) -> None:
        _stop_process(self._process)
        self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def start(self, timeout: float = 120.0) -> Any:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        """Stopped with the end of its log printed (pytest shows it with a failure)."""
        print(f"{self.name} log tail:{self.tail()}")
        self.stop()


class KoordManager(_Component):
    """koord-manager, with the controllers a node agent deals with."""

    def __init__(self, plane: ControlPlane, workdir: Path, *, controllers: tuple[str, ...] = CONTROLLERS,
                 extra_args: tuple[str, ...] = ()) -> None:
        super().__init__(plane, workdir, "koord-manager")
        self.controllers = controllers
        self.extra_args = extra_args

    def start(self, timeout: float = 120.0) -> KoordManager:
        self.workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.plane.kubeconfig(self.workdir / "kubeconfig", self.plane.tokens["koord-manager"])
        self._spawn([f"--kubeconfig={kubeconfig}",
                     "--feature-gates=WebhookFramework=false", "--enable-leader-election=false",
                     f"--controllers={','.join(self.controllers)}", f"--config-namespace={NAMESPACE}",
                     f"--metrics-addr=127.0.0.1:{free_port()}", f"--health-probe-addr=127.0.0.1:{free_port()}",
                     "--enable-pprof=false", "--v=4", *self.extra_args],
                    self._started, "koord-manager's controllers started", timeout)
        return self

    def _started(self) -> bool:
        """Each controller's workers started (its log says so). Its health endpoint has no check
        without the webhooks (only the webhook's readiness is registered), so it answers 404."""
        started = [line for line in self.log_text().splitlines() if '"msg"="Starting workers"' in line]
        return all(any(f'"controller"="{name}"' in line for line in started) for name in self.controllers)



SCHEDULER_NAME = "koord-scheduler"
# kube-scheduler's default plugins plus Koordinator's CPU binding, as its chart's profile enables it.
_NUMA_POINTS = ("preFilter", "filter", "score", "reserve", "preBind")


def scheduler_config(kubeconfig: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "profiles": [{"schedulerName": SCHEDULER_NAME, "plugins": {
            point: {"enabled": [{"name": "NodeNUMAResource", **({"weight": 1} if point == "score" else {})}]}
            for point in _NUMA_POINTS}}],
    }


class KoordScheduler(_Component):
    """koord-scheduler with scheduler_config()'s profile."""

    def __init__(self, plane: ControlPlane, workdir: Path) -> None:
        super().__init__(plane, workdir, "koord-scheduler")

    def start(self, timeout: float = 120.0) -> KoordScheduler:
        self.workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.plane.kubeconfig(self.workdir / "kubeconfig", self.plane.tokens["koord-scheduler"])
        config = self.workdir / "scheduler-config.yaml"
        config.write_text(yaml.safe_dump(scheduler_config(kubeconfig)))
        # --port=0: no deprecated insecure port (its default listens on every address).
        self._spawn([f"--config={config}", "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--port=0",
                     "--authentication-skip-lookup=true", "--v=4"],
                    lambda: '"Handlers synced"' in self.log_text(), "koord-scheduler's informers synced", timeout)
        return self



__all__ = ["CONTROLLERS", "KoordManager", "KoordScheduler", "NAMESPACE", "SCHEDULER_NAME", "crd_established",
           "install_koordinator", "install_koordnode_rbac", "koordinator_dir", "register_ready_node",
           "scheduler_config"]
