"""Koordinator's node agent in the test bed: the real koordlet v1.8 (built from its Go module by
``scripts/k8s-bed.sh koordlet``, with cgo and libpfm) as a process on a real node, beside the
bed's kube-apiserver and koord-manager (koord_bed.py), with what its DaemonSet gives it, as
host paths instead of mounts: the cgroup root, /proc, /sys, kubelet's root directory, the
containerd socket, and its runtime hooks served to containerd's NRI socket (koordlet's NRI mode)
or on a socket of its own that koord-runtime-proxy v1.8 (between kubelet and containerd) calls.

koord-runtime-proxy finds its hook servers only in the hard-coded /etc/runtime/hookserver.d (no
flag sets it), where koordlet writes its registration (koordlet.json): a runtime-proxy node is
the only one on the machine that may use that directory, and its registration is removed on exit.

Its identity is the bed's ``koordlet`` user bound to the ClusterRole of Koordinator's own
``config/rbac/koordlet.yaml``. It reads its pods from kubelet's HTTPS port (the node's InternalIP
and daemon endpoint; the bed's kubelet lets anonymous callers in, so no client certificate is
needed) and its NodeSLO from the API server; without Koordinator's CRDs it hangs at start, so
``install_koordinator`` must have run.

Never two agents on one node: a koordlet node is a node of its own. koordlet looks for
``kubepods`` at the top of its cgroup root (a constant), so each koordlet node's kubelet keeps its
pods under a prefix of its own, as the other nodes do, and its koordlet gets a cgroup root made of
bind mounts of that prefix in every controller (``cgroup_view``): two koordlet nodes on one
machine then never share a ``kubepods``, and each kubelet sees only its own pods' cgroups.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from .k8s_dist import component_bin
from .koord_bed import _Component
from .kube_bed import ControlPlane, free_port

# koord-runtime-proxy v1.8.0's hook server directory (pkg/runtimeproxy/config: a constant)
RUNTIME_PROXY_HOOK_DIR = Path("/etc/runtime/hookserver.d")
CGROUP_MOUNTS = Path("/sys/fs/cgroup")

# koordlet's default feature gates leave most QoS features off; these are the ones a node agent
# comparison needs (CPU suppress, CPU burst, memory QoS, BE eviction, group identity/cpu.idle).
FEATURE_GATES = ("BECPUSuppress=true,BECPUEvict=true,BEMemoryEvict=true,CPUBurst=true,CgroupReconcile=true,"
                 "NodeTopologyReport=true")


def koordlet_dir() -> Path:
    return component_bin("koordlet").parent


def install_koordlet_rbac(plane: ControlPlane) -> None:
    """Koordinator's koordlet ClusterRole bound to the bed's ``koordlet`` user (idempotent)."""
    from .kube_client import ApiError

    admin = plane.client()
    for doc in yaml.safe_load_all((koordlet_dir() / "manager" / "koordlet-rbac.yaml").read_text()):
        if not doc or doc.get("kind") != "ClusterRole":
            continue
        name = doc["metadata"]["name"]
        for collection, obj in (
                ("/apis/rbac.authorization.k8s.io/v1/clusterroles", doc),
                ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
                    "metadata": {"name": f"koordlet-{name}"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                    "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "koordlet"}]})):
            try:
                admin.create(collection, obj)
            except ApiError as err:
                if err.status != 409:
                    raise


class Koordlet(_Component):
    """koordlet for ``node_name``; ``nri_socket``: containerd's NRI socket (None: hooks served
    on ``hook_socket`` for koord-runtime-proxy)."""

    def __init__(self, plane: ControlPlane, workdir: Path, node_name: str, *, containerd_socket: str,
                 kubelet_root: Path, nri_socket: str | None, extra_args: tuple[str, ...] = (),
                 hook_dir: Path | None = None, cgroup_root: Path = CGROUP_MOUNTS) -> None:
        """``hook_dir``: where koordlet registers its hook socket (default its own directory;
        RUNTIME_PROXY_HOOK_DIR for koord-runtime-proxy)."""
        super().__init__(plane, workdir, "koordlet")
        self.node_name = node_name
        self.containerd_socket = containerd_socket
        self.kubelet_root = kubelet_root
        self.nri_socket = nri_socket
        self.hook_dir = hook_dir or self.workdir / "hookserver.d"
        self.cgroup_root = cgroup_root
        self.hook_socket = self.workdir / "koordlet.sock"
        self.port = free_port()
        self.extra_args = extra_args

    def args(self, kubeconfig: Path) -> list[str]:
        hooks = (["-enable-nri-runtime-hook=true", f"-runtime-hooks-nri-socket-path={self.nri_socket}"]
                 if self.nri_socket else ["-enable-nri-runtime-hook=false"])
        return [f"--kubeconfig={kubeconfig}",
                # the host's own paths (its DaemonSet mounts them under /host-*); the NRI socket
                # path is taken below var-run-root-dir, so that is "/" and the socket absolute
                f"-cgroup-root-dir={self.cgroup_root}/", "-proc-root-dir=/proc/", "-sys-root-dir=/sys/",
                f"-tsdb-path={self.workdir / 'metric-data'}/",  # its default, /metric-data, is one per machine
                "-sys-fs-root-dir=/sys/fs/", "-var-run-root-dir=/", "-run-root-dir=/run/",
                f"-runtime-hooks-config-path={self.hook_dir}",
                f"-var-lib-kubelet-dir={self.kubelet_root}", f"-containerd-endpoint={self.containerd_socket}",
                # one path: the socket it serves is the one its registration names (no mounts here)
                "-runtime-hooks-network=unix", f"-runtime-hooks-addr={self.hook_socket}",
                f"-runtime-hooks-host-endpoint={self.hook_socket}", *hooks,
                f"-addr=127.0.0.1:{self.port}", f"-feature-gates={FEATURE_GATES}",
                "-kubelet-preferred-address-type=InternalIP", "--logtostderr=true", "--v=4", *self.extra_args]

    def start(self, timeout: float = 180.0) -> Koordlet:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.hook_dir.mkdir(parents=True, exist_ok=True)  # its registration for koord-runtime-proxy
        kubeconfig = self.plane.kubeconfig(self.workdir / "kubeconfig", self.plane.tokens["koordlet"])
        self._spawn(self.args(kubeconfig), self._serving, "koordlet's runtime hooks serving", timeout,
                    binary=koordlet_dir() / "bin" / "koordlet", env=dict(os.environ, NODE_NAME=self.node_name))
        return self

    def _serving(self) -> bool:
        """Its NRI plugin registered with containerd (NRI mode), or its hook socket registered
        (koordlet writes koordlet.json last, once its hooks serve)."""
        if self.nri_socket:
            return "nri mode runtime hook server has started" in self.log_text()
        return self.hook_socket.exists() and (self.hook_dir / "koordlet.json").is_file()

    def stop(self) -> None:
        super().stop()
        if self.hook_dir == RUNTIME_PROXY_HOOK_DIR:  # shared with the machine: leave no stale registration
            (self.hook_dir / "koordlet.json").unlink(missing_ok=True)


class KoordRuntimeProxy(_Component):
    """koord-runtime-proxy v1.8.0 between kubelet (on ``socket``) and containerd, calling the hook
    servers registered in RUNTIME_PROXY_HOOK_DIR."""

    def __init__(self, plane: ControlPlane, workdir: Path, *, containerd_socket: str, socket: Path) -> None:
        super().__init__(plane, workdir, "koord-runtime-proxy")
        self.containerd_socket = containerd_socket
        self.socket = socket

    def start(self, timeout: float = 60.0) -> KoordRuntimeProxy:
        self.workdir.mkdir(parents=True, exist_ok=True)
        RUNTIME_PROXY_HOOK_DIR.mkdir(parents=True, exist_ok=True)
        stale = RUNTIME_PROXY_HOOK_DIR / "koordlet.json"
        if stale.is_file():
            raise RuntimeError(f"{stale} exists: another koordlet registered there (one runtime-proxy node at a time)")
        self._spawn([f"--koord-runtimeproxy-endpoint={self.socket}",
                     f"--remote-runtime-service-endpoint={self.containerd_socket}",
                     "--backend-runtime-mode=Containerd"],
                    self.socket.exists, "koord-runtime-proxy's socket", timeout,
                    binary=koordlet_dir() / "bin" / "koord-runtime-proxy")
        return self


SEED_POD = "koordlet-seed"


@contextlib.contextmanager
def cgroup_view(prefix: str, directory: Path) -> Iterator[Path]:
    """``directory`` holding, for each controller mounted under /sys/fs/cgroup that has the
    cgroup ``prefix``, a bind mount of that cgroup: a cgroup root whose top is ``prefix``.
    Not cgroup2 itself, so koordlet sees cgroup v1 as on the host."""
    directory.mkdir(parents=True, exist_ok=True)
    mounted: list[Path] = []
    try:
        for controller in sorted(CGROUP_MOUNTS.iterdir()):
            source = controller / prefix.strip("/")
            if controller.is_symlink() or not source.is_dir():
                continue
            target = directory / controller.name
            target.mkdir(exist_ok=True)
            subprocess.run(["mount", "--bind", str(source), str(target)], check=True, capture_output=True, timeout=10)
            mounted.append(target)
        yield directory
    finally:
        for target in reversed(mounted):
            subprocess.run(["umount", "-l", str(target)], capture_output=True, timeout=10)
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def koordlet_node(workdir: Path, plane: ControlPlane, node_name: str, *, namespace: str = "default",
                  feature_gates: dict[str, bool] | None = None, runtime_proxy: bool = False,
                  koordlet_args: tuple[str, ...] = ()) -> Iterator[Any]:
    """A real node (kubelet with kubepods at the hierarchy's top) whose agent is koordlet: in
    NRI mode (containerd with NRI), or with ``runtime_proxy`` behind koord-runtime-proxy
    (kubelet → koord-runtime-proxy → containerd without NRI). The node's ``koordlet`` attribute
    is the running Koordlet, ``runtime_proxy`` the KoordRuntimeProxy (or None).
    One pod (``SEED_POD``, a sleeping busybox in ``namespace``) runs before koordlet starts, as
    koordlet's own DaemonSet pod would: koordlet waits on a non-empty pod list from kubelet.
    ``install_koordinator`` and ``install_koordlet_rbac`` must have run on ``plane``."""
    from .images import BUSYBOX_IMAGE_REF
    from .real_node import real_node, short_socket_dir

    proxies: list[KoordRuntimeProxy] = []

    @contextlib.contextmanager
    def in_front(containerd_socket: str) -> Iterator[str]:
        socket = short_socket_dir() / "runtimeproxy.sock"
        with KoordRuntimeProxy(plane, workdir / "koord-runtime-proxy", containerd_socket=containerd_socket,
                               socket=socket) as proxy:
            proxies.append(proxy)
            try:
                yield f"unix://{socket}"
            finally:
                shutil.rmtree(socket.parent, ignore_errors=True)

    with real_node(workdir / "node", mode="direct" if runtime_proxy else "nri", control_plane=plane,
                   node_name=node_name, namespace=namespace, other_agent=True,
                   kubelet_config={"address": "0.0.0.0"}, feature_gates=feature_gates,
                   runtime_in_front=in_front if runtime_proxy else None) as node, \
            cgroup_view(node.containerd.cgroup_prefix, workdir / "cgroup-root") as cgroup_root:
        node.runtime_proxy = proxies[0] if proxies else None
        node.create_pod({"metadata": {"name": SEED_POD},
                         "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                             "name": "seed", "image": BUSYBOX_IMAGE_REF, "imagePullPolicy": "Never",
                             "command": ["sleep", "86400"]}]}})
        node.wait_running(SEED_POD, timeout=120)
        assert runtime_proxy or node.nri_socket is not None
        with Koordlet(plane, workdir / "koordlet", node_name, containerd_socket=str(node.containerd.socket),
                      kubelet_root=node.kubelet.root_dir, nri_socket=node.nri_socket,
                      hook_dir=RUNTIME_PROXY_HOOK_DIR if runtime_proxy else None, cgroup_root=cgroup_root,
                      extra_args=koordlet_args) as koordlet:
            node.koordlet = koordlet
            yield node
