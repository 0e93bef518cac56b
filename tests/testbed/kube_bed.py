"""A real Kubernetes node for end-to-end tests: etcd + kube-apiserver on loopback, and kubelet.

``ControlPlane`` runs etcd and one kube-apiserver in a private directory, on free loopback
ports, with static bearer tokens (``tokens``: ``admin`` in ``system:masters``, one node identity
per node name handed to ``node_token``, and ``koordnode``, a plain user for RBAC tests), Node and
RBAC authorization, and a service-account key pair — envtest's shape. The ServiceAccount
admission plugin is off: nothing here runs the controllers that create service accounts, so
pods are created with ``spec.nodeName`` set and no token volume.

``Kubelet`` runs a real kubelet against a CRI endpoint (koordnode's socket, or containerd's for
a direct run), standalone (``control_plane=None``: static pods from ``static_pod_dir``) or
registered with a ``ControlPlane``. Its pods live under ``cgroup_root`` (``<root>/kubepods``),
so they never meet a real kubelet's tree; everything else (root dir, logs, certificates,
static pods) is under its workdir. ``stop()`` unmounts what kubelet mounted there.

Binaries come from ``scripts/k8s-bed.sh`` (``k8s_dist.component_bin``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from .containerd_bed import BedError, _mount_points, _unmount
from .k8s_dist import component_bin
from .kube_client import KubeClient

CGROUP_V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids", "blkio", "devices", "freezer", "systemd")
_SERVICE_CIDR = "10.96.0.0/24"  # never routed: kubelet and the API server only need a range to name


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(what: str, probe, timeout: float, process: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise BedError(f"{what}: exited with {process.returncode}{_tail(log)}")
        try:
            last = probe()
            if last:
                return last
        except Exception as err:  # noqa: BLE001 - any failure means "not yet"
            last = err
        time.sleep(0.25)
    raise BedError(f"{what}: not ready within {timeout:.0f} s (last: {last!r}){_tail(log)}")


def _tail(log: Path | None, lines: int = 25) -> str:
    if log is None:
        return ""
    with contextlib.suppress(OSError):
        return "\n--- last lines of " + str(log) + " ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    return ""


def _stop_process(process: subprocess.Popen | None, timeout: float = 15.0) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


# The line the bed writes into kubelet's log before each start: it splits the log by run.
KUBELET_START_MARK = "===== koordnode test bed: starting kubelet"


class ControlPlane:
    """etcd + kube-apiserver on loopback, private to ``workdir``.

    ``start_timeout_s``: how long etcd, then kube-apiserver, may take to answer ready (the VM
    lane's guest, under TCG, needs several times the default). ``service_accounts``: the
    ServiceAccount admission plugin on, so pods get their account's token mounted as in a real
    cluster (it needs the ServiceAccount and root CA controllers: ControllerManager); off by
    default, where pods are made before any controller runs."""

    def __init__(self, workdir: Path, node_names: tuple[str, ...] = (), start_timeout_s: float = 120.0,
                 service_accounts: bool = False) -> None:
        self.workdir = Path(workdir).resolve()
        self.start_timeout_s = start_timeout_s
        self.service_accounts = service_accounts
        self.id = secrets.token_hex(3)
        self.host = "127.0.0.1"
        self.port = 0
        self.tokens = {"admin": secrets.token_hex(16), "koordnode": secrets.token_hex(16),
                       "koord-manager": secrets.token_hex(16), "koord-scheduler": secrets.token_hex(16),
                       "koordlet": secrets.token_hex(16)}
        self._node_tokens = {name: secrets.token_hex(16) for name in node_names}
        self.cert_dir = self.workdir / "apiserver-pki"
        self.ca_file = self.cert_dir / "apiserver.crt"  # self-signed by the API server at start
        self.client_ca = self.cert_dir / "client-ca.crt"
        self.etcd_log = self.workdir / "etcd.log"
        self.log_path = self.workdir / "kube-apiserver.log"
        self._etcd: subprocess.Popen | None = None
        self._apiserver: subprocess.Popen | None = None
        self._logs: list[Any] = []

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def node_token(self, node_name: str) -> str:
        if node_name not in self._node_tokens:
            raise KeyError(f"node {node_name!r} was not named when the control plane was created")
        return self._node_tokens[node_name]

    def start(self) -> ControlPlane:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cert_dir.mkdir(exist_ok=True)
        self._start_etcd()
        self._start_apiserver()
        return self

    def stop(self) -> None:
        _stop_process(self._apiserver)
        _stop_process(self._etcd)
        self._apiserver = self._etcd = None
        for log in self._logs:
            log.close()
        self._logs.clear()

    def stop_apiserver(self) -> None:
        """The API server alone goes away (etcd keeps the data): for tests of an unreachable server."""
        _stop_process(self._apiserver)
        self._apiserver = None

    def start_apiserver(self) -> None:
        self._start_apiserver(self.port)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _open_log(self, path: Path):
        log = open(path, "ab")  # noqa: SIM115 - lives as long as the process
        self._logs.append(log)
        return log

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._etcd = subprocess.Popen(
            [str(component_bin("etcd") / "etcd"), "--name", "bed", "--data-dir", str(self.workdir / "etcd"),
             "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
             "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
             f"http://127.0.0.1:{peer}", "--initial-cluster", f"bed=http://127.0.0.1:{peer}",
             "--unsafe-no-fsync", "--log-level", "warn"],
            stdin=subprocess.DEVNULL, stdout=self._open_log(self.etcd_log), stderr=subprocess.STDOUT,
            start_new_session=True)

        def healthy() -> bool:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as response:
                return json.loads(response.read()).get("health") == "true"
        _wait("etcd", healthy, self.start_timeout_s / 2, self._etcd, self.etcd_log)

    def _write_credentials(self) -> None:
        key = self.cert_dir / "service-account.key"
        if not key.exists():
            subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
            subprocess.run(["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(key.with_suffix(".pub"))],
                           check=True, capture_output=True)
        rows = [f"{self.tokens['admin']},admin,admin,system:masters",
                f"{self.tokens['koordnode']},koordnode,koordnode,koordnode",
                f"{self.tokens['koord-manager']},koord-manager,koord-manager,koordinator",
                f"{self.tokens['koord-scheduler']},koord-scheduler,koord-scheduler,koordinator",
                f"{self.tokens['koordlet']},koordlet,koordlet,koordinator"]
        rows += [f"{token},system:node:{name},node-{name},system:nodes" for name, token in self._node_tokens.items()]
        tokens = self.cert_dir / "tokens.csv"
        tokens.write_text("\n".join(rows) + "\n")
        tokens.chmod(0o600)
        if not self.client_ca.exists():  # the CA of client certificates (client_certificate)
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                            "-subj", "/CN=koordnode-test-client-ca", "-keyout", str(self.client_ca.with_suffix(".key")),
                            "-out", str(self.client_ca)], check=True, capture_output=True)

    def client_certificate(self, directory: Path, user: str, groups: tuple[str, ...] = ()) -> tuple[Path, Path]:
        """A client certificate for ``user`` in ``groups`` (CN and O, as the API server reads
        them), signed by the bed's client CA: (certificate file, key file) in ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        key, csr, cert = directory / f"{user}.key", directory / f"{user}.csr", directory / f"{user}.crt"
        subject = f"/CN={user}" + "".join(f"/O={group}" for group in groups)
        subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(key),
                        "-out", str(csr)], check=True, capture_output=True)
        subprocess.run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(self.client_ca),
                        "-CAkey", str(self.client_ca.with_suffix(".key")), "-CAcreateserial", "-days", "1",
                        "-out", str(cert)], check=True, capture_output=True)
        return cert, key

    def _start_apiserver(self, port: int = 0) -> None:
        self._write_credentials()
        self.port = port or free_port()
        key = self.cert_dir / "service-account.key"
        self._apiserver = subprocess.Popen(
            [str(component_bin("kubernetes") / "kube-apiserver"),
             f"--etcd-servers={self.etcd_url}", f"--etcd-prefix=/registry-{self.id}",
             "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
             "--endpoint-reconciler-type=none",  # a loopback advertise address needs no kubernetes endpoint
             f"--cert-dir={self.cert_dir}", f"--token-auth-file={self.cert_dir / 'tokens.csv'}",
             f"--client-ca-file={self.client_ca}",
             "--authorization-mode=Node,RBAC", "--allow-privileged=true",
             f"--service-account-key-file={key.with_suffix('.pub')}",
             f"--service-account-signing-key-file={key}",
             "--service-account-issuer=https://kubernetes.default.svc",
             f"--service-cluster-ip-range={_SERVICE_CIDR}",
             *([] if self.service_accounts else ["--disable-admission-plugins=ServiceAccount"]),
             "--enable-priority-and-fairness=false", "--v=1",
             # Never resolve node names through DNS: this bed's nodes exist on loopback only.
             "--kubelet-preferred-address-types=InternalIP"],
            stdin=subprocess.DEVNULL, stdout=self._open_log(self.log_path), stderr=subprocess.STDOUT,
            start_new_session=True)
        _wait("kube-apiserver", self._ready, self.start_timeout_s, self._apiserver, self.log_path)

    def _ready(self) -> bool:
        if not self.ca_file.exists():
            return False
        client = KubeClient(self.host, self.port, self.tokens["admin"], str(self.ca_file), timeout=5)
        return client.raw("GET", "/readyz") == "ok"

    def client(self, user: str = "admin") -> KubeClient:
        return KubeClient(self.host, self.port, self.tokens[user], str(self.ca_file))

    def kubeconfig(self, path: Path, token: str) -> Path:
        """A kubeconfig for ``token`` (JSON is YAML; kubelet and clients read either)."""
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "bed",
            "clusters": [{"name": "bed", "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": "bed", "user": {"token": token}}],
            "contexts": [{"name": "bed", "context": {"cluster": "bed", "user": "bed"}}],
        }
        path.write_text(json.dumps(config, indent=1))
        path.chmod(0o600)
        return path


class _AdminProcess:
    """One of Kubernetes' control-plane programs run as the bed's admin, with its log: start()
    gives it the admin kubeconfig and waits for `ready()`."""

    binary = ""

    def __init__(self, plane: ControlPlane, workdir: Path) -> None:
        self.plane = plane
        self.workdir = Path(workdir).resolve()
        self.log_path = self.workdir / f"{self.binary}.log"
        self._process: subprocess.Popen | None = None
        self._log: Any = None

    def arguments(self, kubeconfig: Path) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self) -> _AdminProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.plane.kubeconfig(self.workdir / "admin.kubeconfig", self.plane.tokens["admin"])
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self._process = subprocess.Popen(
            [str(component_bin("kubernetes") / self.binary), *self.arguments(kubeconfig)],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        _wait(self.binary, self.ready, self.plane.start_timeout_s, self._process, self.log_path)
        return self

    def stop(self) -> None:
        _stop_process(self._process)
        self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> _AdminProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ControllerManager(_AdminProcess):
    """kube-controller-manager with the controllers a DaemonSet's pods need on the bed: the
    DaemonSet controller, ServiceAccount (each namespace's "default"), the root CA publisher
    (kube-root-ca.crt, which every mounted account token carries) and the garbage collector (a
    deleted DaemonSet's pods)."""

    binary = "kube-controller-manager"
    CONTROLLERS = ("daemonset-controller", "serviceaccount-controller", "root-ca-certificate-publisher-controller",
                   "garbage-collector-controller")

    def arguments(self, kubeconfig: Path) -> list[str]:
        return [f"--kubeconfig={kubeconfig}", f"--controllers={','.join(self.CONTROLLERS)}",
                f"--root-ca-file={self.plane.ca_file}", "--leader-elect=false",
                "--use-service-account-credentials=false", "--secure-port=0", "--v=1"]

    def ready(self) -> bool:  # the ServiceAccount controller is at work
        return self.plane.client().exists("/api/v1/namespaces/default/serviceaccounts/default")


class KubeScheduler(_AdminProcess):
    """kube-scheduler (the default scheduler's profile): it binds a DaemonSet's pods (the
    DaemonSet controller only creates them, with the node's affinity)."""

    binary = "kube-scheduler"

    def arguments(self, kubeconfig: Path) -> list[str]:
        self.port = free_port()
        return [f"--kubeconfig={kubeconfig}", "--leader-elect=false", "--bind-address=127.0.0.1",
                f"--secure-port={self.port}", "--v=1"]

    def ready(self) -> bool:  # /readyz needs no credentials (the scheduler's always-allowed paths)
        unverified = ssl._create_unverified_context()  # its own self-signed serving certificate
        with urllib.request.urlopen(f"https://127.0.0.1:{self.port}/readyz", timeout=2, context=unverified) as answer:
            return answer.read() == b"ok"


class Kubelet:
    """A real kubelet against ``runtime_endpoint`` (``unix:///...``)."""

    def __init__(self, workdir: Path, runtime_endpoint: str, cgroup_root: str, *, node_name: str,
                 control_plane: ControlPlane | None = None, cgroup_driver: str = "cgroupfs",
                 config: dict[str, Any] | None = None, feature_gates: dict[str, bool] | None = None,
                 binary: Path | None = None, verbosity: int = 2) -> None:
        """``binary``: the kubelet to run (default: the one scripts/k8s-bed.sh built); ``verbosity``:
        its ``--v`` (4 logs why SyncPod kills a pod, e.g. a pod cgroup missing controllers)."""
        self.workdir = Path(workdir).resolve()
        self.binary = binary
        self.verbosity = verbosity
        self.runtime_endpoint = runtime_endpoint
        self.cgroup_root = "/" + cgroup_root.strip("/")
        self.kubepods = f"{self.cgroup_root}/kubepods".replace("//", "/")
        if cgroup_driver == "systemd":
            # kubelet's systemd driver names its top cgroup kubepods.slice (tiers kubepods-burstable.slice,
            # pods kubepods-burstable-pod<uid>.slice); only the root is supported here (the VM lane's node).
            if self.cgroup_root != "/":
                raise ValueError(f"cgroup_root {cgroup_root!r} with the systemd driver: only '/' is supported")
            self.kubepods = "/kubepods.slice"
        self.node_name = node_name
        self.control_plane = control_plane
        self.cgroup_driver = cgroup_driver
        self.extra_config = dict(config or {})
        self.feature_gates = dict(feature_gates or {})
        self.root_dir = self.workdir / "root"
        self.static_pod_dir = self.workdir / "manifests"
        self.log_path = self.workdir / "kubelet.log"
        self.config_path = self.workdir / "kubelet-config.json"
        self.port = free_port()
        self.healthz_port = free_port()
        self._process: subprocess.Popen | None = None
        self._log: Any = None
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    def running(self) -> bool:
        return self.pid is not None

    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": self.cgroup_driver,
            "cgroupRoot": self.cgroup_root,
            "failCgroupV1": False,  # the host is cgroup v1 hybrid
            "containerRuntimeEndpoint": self.runtime_endpoint,
            "staticPodPath": str(self.static_pod_dir),
            "fileCheckFrequency": "2s",
            "syncFrequency": "10s",
            "podLogsDir": str(self.workdir / "pod-logs"),
            "volumePluginDir": str(self.workdir / "volume-plugins"),
            "address": "127.0.0.1",
            "port": self.port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "failSwapOn": False,
            "resolvConf": "",
            "registerNode": self.control_plane is not None,
            "makeIPTablesUtilChains": False,
            # The test machine's disk and memory are shared with everything else: evict only when truly short.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%", "imagefs.available": "2%",
                             "nodefs.inodesFree": "2%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "runtimeRequestTimeout": "2m",
            "featureGates": self.feature_gates,
        }
        config.update(self.extra_config)
        return config

    def start(self, timeout: float = 120.0) -> Kubelet:
        for directory in (self.root_dir, self.static_pod_dir, self.workdir / "pod-logs", self.workdir / "pki"):
            directory.mkdir(parents=True, exist_ok=True)
        self._ensure_cgroup_root()
        self._ensure_shared_root_dir()
        self.config_path.write_text(json.dumps(self.config(), indent=1))
        args = [str(self.binary or component_bin("kubernetes") / "kubelet"), f"--config={self.config_path}",
                f"--root-dir={self.root_dir}", f"--cert-dir={self.workdir / 'pki'}",
                f"--hostname-override={self.node_name}", f"--v={self.verbosity}"]
        if self.control_plane is not None:
            token = self.control_plane.node_token(self.node_name)
            kubeconfig = self.control_plane.kubeconfig(self.workdir / "kubeconfig", token)
            args.append(f"--kubeconfig={kubeconfig}")
        if self._log is None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the kubelet
        self._log.write(f"\n{KUBELET_START_MARK} {time.ctime()}\n".encode())
        self._log.flush()
        self._process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1
        _wait("kubelet /healthz", self.healthy, timeout, self._process, self.log_path)
        return self

    def healthy(self) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.healthz_port}/healthz", timeout=2) as response:
            return response.read() == b"ok"

    def stop(self, timeout: float = 30.0) -> None:
        _stop_process(self._process, timeout)
        self._process = None

    def kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(10)
        self._process = None

    def restart(self, timeout: float = 120.0) -> None:
        self.stop()
        self.start(timeout)

    def close(self) -> None:
        """Stop the kubelet and undo its mounts (the pods' cgroups belong to the containerd bed)."""
        self.stop()
        for mount_point, _fs in sorted(_mount_points(), key=lambda m: len(m[0]), reverse=True):
            if mount_point.startswith(str(self.workdir) + "/"):
                with contextlib.suppress(OSError):
                    _unmount(mount_point)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str, timeout: float = 30.0) -> Any:
        """GET from kubelet's own API (``/stats/summary``, ``/pods``, ``/metrics``...), JSON decoded when it is JSON.

        kubelet serves it with its self-signed certificate (``pki/kubelet.crt``), made for its node name."""
        tls = ssl.create_default_context(cafile=str(self.workdir / "pki" / "kubelet.crt"))
        tls.check_hostname = False  # the certificate names the node, and we dial 127.0.0.1
        with urllib.request.urlopen(f"https://127.0.0.1:{self.port}{path}", timeout=timeout, context=tls) as response:
            body = response.read().decode()
        return json.loads(body) if body.lstrip().startswith(("{", "[")) else body

    def container_log(self, pod: str, container: str, namespace: str = "default") -> str:
        """What a container printed, from the log files kubelet keeps (the API server would have to
        dial kubelet by the node's address, which this bed does not serve on)."""
        text = ""
        for path in sorted((self.workdir / "pod-logs").glob(f"{namespace}_{pod}_*/{container}/*.log")):
            text += path.read_text(errors="replace")
        return text

    def stats_summary(self) -> dict[str, Any]:
        return self.get("/stats/summary")

    def add_static_pod(self, name: str, pod: dict[str, Any]) -> Path:
        self.static_pod_dir.mkdir(parents=True, exist_ok=True)
        path = self.static_pod_dir / f"{name}.json"
        # A dot file: kubelet reads every other file of the directory as a manifest (a "<name>.tmp"
        # became a pod of its own, removed and re-added under another uid at the rename).
        tmp = self.static_pod_dir / f".{name}.json.tmp"
        tmp.write_text(json.dumps(pod))
        os.replace(tmp, path)  # kubelet must never read half a manifest
        return path

    def _ensure_shared_root_dir(self) -> None:
        """Make the root dir a shared mount of its own before kubelet starts.

        Where ``/`` is not shared (a container, some CI machines) kubelet bind-mounts its root dir
        onto itself at start-up, while its pods-API server already creates its socket there: a
        temporary file made before the mount cannot be renamed after it (EXDEV) and kubelet exits.
        Mounted here first, kubelet finds it shared and leaves it; ``close()`` unmounts it."""
        root = str(self.root_dir.resolve())
        if any(mount_point == root for mount_point, _fs in _mount_points()):
            return
        subprocess.run(["mount", "--bind", root, root], check=True, capture_output=True)
        subprocess.run(["mount", "--make-rshared", root], check=True, capture_output=True)

    def _ensure_cgroup_root(self) -> None:
        """kubelet refuses a cgroupRoot that does not exist; create it in every v1 controller."""
        if self.cgroup_driver != "cgroupfs" or self.cgroup_root == "/":
            return
        base = Path("/sys/fs/cgroup")
        if (base / "cgroup.controllers").exists():
            (base / self.cgroup_root.lstrip("/")).mkdir(parents=True, exist_ok=True)
            return
        for controller in CGROUP_V1_CONTROLLERS:
            if not (base / controller).is_dir():
                continue
            parent = base / controller
            for part in self.cgroup_root.strip("/").split("/"):
                child = parent / part
                child.mkdir(exist_ok=True)
                if controller == "cpuset":  # a v1 cpuset starts empty and admits no task: inherit the parent's
                    for name in ("cpuset.cpus", "cpuset.mems"):
                        if not (child / name).read_text().strip():
                            (child / name).write_text((parent / name).read_text().strip())
                parent = child
