"""A whole node for end-to-end tests: containerd (built from its Go module), koordnode, kubelet.

``real_node(workdir, mode=...)`` starts, in order, a private containerd (``ContainerdBed``
with the containerd of ``scripts/k8s-bed.sh``), koordnode in front of it (``mode="proxy"``:
kubelet talks to koordnode's socket; ``"nri"``: koordnode is containerd's NRI plugin and
kubelet talks to containerd; ``"direct"``: no koordnode, the baseline), and a real kubelet,
registered with ``control_plane`` when one is given. On exit it deletes the node's pods through
the API (when there is one), stops kubelet, koordnode and containerd, and removes every cgroup,
mount and socket they made.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal

from koordnode.cri import api_pb2 as pb

try:  # pytest puts tests/ on sys.path; the benchmarks import this as tests.testbed
    from support.cri import Cri
    from support.koordnode_runner import KoordnodeProcess, short_socket_dir
except ImportError:
    from tests.support.cri import Cri
    from tests.support.koordnode_runner import KoordnodeProcess, short_socket_dir

from .containerd_bed import ContainerdBed
from .k8s_dist import component_bin
from .kube_bed import ControlPlane, Kubelet
from .kube_client import KubeClient

Mode = Literal["proxy", "nri", "direct"]
NODE_NAMES = ("kn-node-a", "kn-node-b", "kn-node-c", "kn-node-d", "kn-node-e")  # tokens exist for these names only


@dataclass
class RealNode:
    mode: Mode
    containerd: ContainerdBed
    koordnode: KoordnodeProcess | None
    kubelet: Kubelet
    control_plane: ControlPlane | None
    namespace: str = "default"  # where this node's pods are created: nodes sharing an API server use their own
    nri_socket: str | None = None  # containerd's NRI socket (mode "nri")
    koordlet: Any = None  # the node's koordlet (koordlet_bed.koordlet_node), when koordlet is its agent
    runtime_proxy: Any = None  # koord-runtime-proxy in front of containerd, when koordlet's hooks go through it

    @property
    def name(self) -> str:
        return self.kubelet.node_name

    @property
    def kubepods(self) -> str:
        return self.kubelet.kubepods

    def client(self) -> KubeClient:
        if self.control_plane is None:
            raise RuntimeError("a standalone node has no API server")
        return self.control_plane.client()

    def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Create ``pod`` in the node's namespace, bound to this node (no scheduler runs here)."""
        pod = dict(pod)
        pod["spec"] = dict(pod["spec"], nodeName=self.name)
        return self.client().create(f"/api/v1/namespaces/{self.namespace}/pods", pod)

    def pod(self, name: str) -> dict[str, Any]:
        return self.client().pod(name, self.namespace)

    def pod_path(self, name: str) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{name}"

    def wait_running(self, name: str, timeout: float = 120.0) -> dict[str, Any]:
        return self.client().wait_pod_phase(name, "Running", self.namespace, timeout)

    def node_ready(self) -> bool:
        node = self.client().get(f"/api/v1/nodes/{self.name}")
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))

    def containerd_pods(self) -> list[dict[str, Any]]:
        """Every sandbox containerd has (``id``, ``uid``, ``name``, ``state``), asked directly, not through koordnode."""
        cri = Cri(self.containerd.address)
        try:
            return [{"id": s.id, "uid": s.metadata.uid, "name": s.metadata.name,
                     "state": pb.PodSandboxState.Name(s.state)}
                    for s in cri.rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items]
        finally:
            cri.close()


def _delete_pods(node: RealNode, timeout: float = 60.0) -> None:
    client = node.client()
    selector = {"fieldSelector": f"spec.nodeName={node.name}"}
    for pod in client.get("/api/v1/pods", **selector).get("items", []):
        meta = pod["metadata"]
        client.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", grace_seconds=0)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and client.get("/api/v1/pods", **selector).get("items"):
        time.sleep(0.5)
    client.delete(f"/api/v1/nodes/{node.name}")


@contextlib.contextmanager
def real_node(workdir: Path, *, mode: Mode = "proxy", control_plane: ControlPlane | None = None,
              node_name: str = NODE_NAMES[0], namespace: str = "default", koordnode_toml: str = "", kubelet_config: dict[str, Any] | None = None,
              feature_gates: dict[str, bool] | None = None,
              nri_plugin: Sequence[str] | None = None, koordnode_repo: Path | None = None,
              other_agent: bool = False, cgroup_prefix: str | None = None,
              runtime_in_front: Callable[[str], contextlib.AbstractContextManager[str]] | None = None,
              ) -> Iterator[RealNode]:
    """``nri_plugin`` (``mode="nri"``): a command run as containerd's NRI plugin in koordnode's
    place, the socket appended (bench/nri_floor.py: a plugin that changes nothing).
    ``koordnode_repo``: the checkout koordnode runs from (default this one).
    ``other_agent``: no koordnode; the caller starts another node agent (koordlet) once the node
    is Ready, on ``node.nri_socket`` in NRI mode. ``cgroup_prefix``: containerd's and kubelet's
    cgroup root ("" = the hierarchy's top, where koordlet looks for kubepods).
    ``runtime_in_front``: given containerd's socket, a context that runs another CRI proxy in
    front of it and yields the endpoint kubelet talks to (koord-runtime-proxy; mode "direct")."""
    workdir = Path(workdir)
    if nri_plugin is not None and mode != "nri":
        raise ValueError(f"nri_plugin needs mode 'nri', not {mode!r}")
    if runtime_in_front is not None and mode != "direct":
        raise ValueError(f"runtime_in_front needs mode 'direct', not {mode!r}")
    nri_socket = short_socket_dir() / "nri.sock" if mode == "nri" else None
    containerd = ContainerdBed(workdir / "containerd", bin_dir=component_bin("containerd"), nri_socket=nri_socket,
                               cgroup_prefix=cgroup_prefix)
    koordnode: KoordnodeProcess | None = None
    plugin: subprocess.Popen[bytes] | None = None
    kubelet: Kubelet | None = None
    node: RealNode | None = None
    front = contextlib.ExitStack()
    try:
        containerd.start()
        endpoint = containerd.address
        if runtime_in_front is not None:
            endpoint = front.enter_context(runtime_in_front(str(containerd.socket)))
        if nri_plugin is not None:
            plugin = _start_nri_plugin([*nri_plugin, str(nri_socket)], workdir / "nri-plugin.log")
        elif mode != "direct" and not other_agent:
            koordnode = KoordnodeProcess(workdir / "koordnode", str(containerd.socket), extra_toml=koordnode_toml,
                                         kubepods=containerd.kubepods_cgroup,
                                         nri_socket=str(nri_socket) if nri_socket else "",
                                         repo=koordnode_repo).start()
            if mode == "nri":
                koordnode.wait_synchronized()
            else:
                endpoint = f"unix://{koordnode.listen}"
        kubelet = Kubelet(workdir / "kubelet", endpoint, containerd.cgroup_prefix, node_name=node_name,
                          control_plane=control_plane, config=kubelet_config, feature_gates=feature_gates)
        node = RealNode(mode, containerd, koordnode, kubelet, control_plane, namespace,
                        str(nri_socket) if nri_socket else None)
        if control_plane is not None and namespace != "default":
            client = control_plane.client()
            if not client.exists(f"/api/v1/namespaces/{namespace}"):
                client.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": namespace}})
        kubelet.start()
        if control_plane is not None:
            control_plane.client().wait_for(f"node {node_name} Ready", node.node_ready, timeout=120)
        yield node
    finally:
        if node is not None and control_plane is not None and kubelet is not None and kubelet.running():
            with contextlib.suppress(Exception):
                _delete_pods(node)
        if kubelet is not None:
            kubelet.close()
        if koordnode is not None:
            koordnode.stop()
        if plugin is not None:
            plugin.terminate()
            plugin.wait(10)
        front.close()
        containerd.stop()


def _start_nri_plugin(command: list[str], log_path: Path, timeout_s: float = 20.0) -> subprocess.Popen[bytes]:
    """Start an NRI plugin built on containerd's stub, and wait until it says it started
    (after the runtime configured it)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        plugin = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while "Started plugin" not in log_path.read_text(errors="replace"):
        if plugin.poll() is not None or time.monotonic() > deadline:
            plugin.kill()
            plugin.wait(10)
            raise RuntimeError(f"NRI plugin {command[0]} did not start: {log_path.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)
    return plugin
