"""A private, real containerd (with its CRI plugin) for end-to-end tests.

Each ``ContainerdBed`` owns everything it touches:

* root, state, socket, CNI config, host-local IPAM data and containerd log
  live under its ``workdir`` (the socket moves to a short /tmp dir when the
  workdir path is too long for a unix socket);
* runc state is kept under the bed's state dir (runtime option ``Root``) and
  network namespaces are mounted under it (``netns_mounts_under_state_dir``);
* pods get a unique CNI network name, bridge (``knbr<id>``) and /24;
* pod cgroups live under a per-bed prefix ``/koordnode-test-<id>`` so the
  kubelet-like layout is ``/koordnode-test-<id>/kubepods/{burstable,besteffort}/pod<uid>``
  and can never clash with a real kubelet's ``/kubepods`` tree. Pass
  ``cgroup_prefix=""`` to get the real ``/kubepods`` layout instead.

Things containerd 1.6 hard-codes and we cannot move: shim sockets in
``/run/containerd/s/`` and the CNI result cache in ``/var/lib/cni/results``.
``stop()`` deletes the entries this bed created there.

Readiness and cleanup speak CRI through raw gRPC calls with hand-encoded
protobuf, so the bed does not depend on generated CRI stubs.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Callable, Iterator, Sequence

import grpc

from koordnode.executor.process import oom_score_adj_floor

from .images import BUSYBOX_IMAGE_REF, PAUSE_IMAGE_REF, BuiltImage, build_test_images

CNI_BIN_DIR = Path("/usr/lib/cni")
CGROUP_FS_ROOT = Path("/sys/fs/cgroup")
CRI_NAMESPACE = "k8s.io"
REQUIRED_BINARIES = ("containerd", "ctr", "runc", "containerd-shim-runc-v2", "ip")
REQUIRED_CNI_PLUGINS = ("bridge", "host-local", "portmap")
SHIM_SOCKET_DIR = Path("/run/containerd/s")
CNI_RESULT_CACHE = Path("/var/lib/cni/results")
_HARDCODED_HOST_DIRS = (SHIM_SOCKET_DIR, SHIM_SOCKET_DIR.parent, CNI_RESULT_CACHE, CNI_RESULT_CACHE.parent)
# containerd refuses socket paths over 104 bytes (its limit, below sun_path's 108), and its
# ttrpc socket is the main one plus ".ttrpc".
_MAX_UNIX_SOCKET_PATH = 104 - len(".ttrpc")
_SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_LOG_RUN_MARKER = "===== koordnode test bed"

_QOS_SUBDIR = {"guaranteed": "", "burstable": "burstable", "besteffort": "besteffort"}


class BedError(RuntimeError):
    """The test bed could not be started or used."""


def missing_prerequisites() -> list[str]:
    """Human-readable reasons the bed cannot run here (empty list: it can)."""
    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append("must run as root")
    env_path = os.environ.get("PATH", "") + ":" + _SEARCH_PATH
    for binary in REQUIRED_BINARIES:
        if shutil.which(binary, path=env_path) is None:
            problems.append(f"binary {binary!r} not found")
    for plugin in REQUIRED_CNI_PLUGINS:
        if not (CNI_BIN_DIR / plugin).is_file():
            problems.append(f"CNI plugin {CNI_BIN_DIR / plugin} not found")
    if not Path("/bin/busybox").is_file():
        problems.append("/bin/busybox not found (busybox-static)")
    if not (CGROUP_FS_ROOT / "cpu" / "cpu.shares").exists() and not (CGROUP_FS_ROOT / "cgroup.controllers").exists():
        problems.append("neither a cgroup v1 cpu hierarchy nor cgroup v2 mounted at /sys/fs/cgroup")
    return problems


# --------------------------------------------------------------------------
# Minimal protobuf wire format, just enough for the CRI calls the bed makes.
# --------------------------------------------------------------------------

def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _encode_bytes_field(number: int, payload: bytes) -> bytes:
    return _encode_varint((number << 3) | 2) + _encode_varint(len(payload)) + payload


def _encode_str_field(number: int, text: str) -> bytes:
    return _encode_bytes_field(number, text.encode())


def _decode_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _decode_fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """Yield (field number, value): int for varint/fixed, bytes for length-delimited."""
    pos = 0
    while pos < len(data):
        key, pos = _decode_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _decode_varint(data, pos)
            yield number, value
        elif wire_type == 2:
            length, pos = _decode_varint(data, pos)
            yield number, data[pos : pos + length]
            pos += length
        elif wire_type == 1:
            yield number, int.from_bytes(data[pos : pos + 8], "little")
            pos += 8
        elif wire_type == 5:
            yield number, int.from_bytes(data[pos : pos + 4], "little")
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire_type}")


def _string_fields(data: bytes, number: int) -> list[str]:
    return [v.decode() for n, v in _decode_fields(data) if n == number and isinstance(v, bytes)]


def _message_fields(data: bytes, number: int) -> list[bytes]:
    return [v for n, v in _decode_fields(data) if n == number and isinstance(v, bytes)]


@dataclass(frozen=True)
class RuntimeVersion:
    version: str
    runtime_name: str
    runtime_version: str
    runtime_api_version: str


def _decode_version(data: bytes) -> RuntimeVersion:
    values = {n: v.decode() for n, v in _decode_fields(data) if isinstance(v, bytes)}
    return RuntimeVersion(values.get(1, ""), values.get(2, ""), values.get(3, ""), values.get(4, ""))


def _decode_conditions(status_response: bytes) -> dict[str, bool]:
    """StatusResponse.status(1).conditions(1) -> {type: status}."""
    conditions: dict[str, bool] = {}
    for runtime_status in _message_fields(status_response, 1):
        for condition in _message_fields(runtime_status, 1):
            kind, ok = "", False
            for number, value in _decode_fields(condition):
                if number == 1 and isinstance(value, bytes):
                    kind = value.decode()
                elif number == 2 and isinstance(value, int):
                    ok = bool(value)
            conditions[kind] = ok
    return conditions


# --------------------------------------------------------------------------
# Host helpers
# --------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_MNT_DETACH = 2


def _unmount(path: str) -> None:
    if _libc.umount2(path.encode(), 0) != 0 and _libc.umount2(path.encode(), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {path}: {os.strerror(err)}")


def _mount_points() -> list[tuple[str, str]]:
    """(mount point, fs type) for every mount, from /proc/self/mountinfo."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        mount_point = left.split()[4].encode().decode("unicode_escape")
        points.append((mount_point, right.split()[0]))
    return points


def _unmount_under(*dirs: Path) -> list[str]:
    """Unmount everything at or below ``dirs`` (deepest first); return what was unmounted."""
    prefixes = [str(d.resolve()) for d in dirs]
    targets = [
        mp for mp, _ in _mount_points()
        if any(mp == p or mp.startswith(p + "/") for p in prefixes)
    ]
    done = []
    for mp in sorted(set(targets), key=len, reverse=True):
        with contextlib.suppress(OSError):
            _unmount(mp)
            done.append(mp)
    return done


def _cgroup_mounts() -> list[Path]:
    return sorted(
        {Path(mp) for mp, fs in _mount_points() if fs in ("cgroup", "cgroup2") and mp.startswith(str(CGROUP_FS_ROOT))}
    )


def _processes() -> Iterator[tuple[int, list[str]]]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        yield int(entry.name), [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _listening_unix_paths(pid: int) -> list[str]:
    """Paths of unix sockets whose inode ``pid`` holds open."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    paths = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            cols = line.split()
            if len(cols) >= 8 and cols[6] in inodes and cols[7].startswith("/"):
                paths.append(cols[7])
    return paths


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if _pid_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _pid_alive(p)]
    return alive


def overlay_mount_works(probe_dir: Path) -> bool:
    """Try a real overlay mount in ``probe_dir`` (the snapshotter's future home)."""
    probe = probe_dir / f"overlay-probe-{secrets.token_hex(3)}"
    parts = {name: probe / name for name in ("lower", "upper", "work", "merged")}
    try:
        for part in parts.values():
            part.mkdir(parents=True)
        (parts["lower"] / "f").write_text("x")
        opts = f"lowerdir={parts['lower']},upperdir={parts['upper']},workdir={parts['work']}"
        result = subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", opts, str(parts["merged"])],
            capture_output=True, timeout=10,
        )
        if result.returncode != 0:
            return False
        try:
            return (parts["merged"] / "f").read_text() == "x"
        finally:
            _unmount(str(parts["merged"]))
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _used_ipv4_networks() -> list[ipaddress.IPv4Network]:
    result = subprocess.run(["ip", "-4", "-o", "route", "show", "table", "all"], capture_output=True, text=True)
    nets = []
    for line in result.stdout.splitlines():
        head = line.split()[0] if line.split() else ""
        if head in ("local", "broadcast", "unreachable", "blackhole", "prohibit"):
            head = line.split()[1]
        with contextlib.suppress(ValueError):
            if head != "default":
                nets.append(ipaddress.IPv4Network(head, strict=False))
    return nets


# Subnets this process gave out: a bed's bridge (and its route) appears only with its first pod,
# so beds made one after another before any pod runs would not see each other's in the routes.
_PICKED_SUBNETS: set[ipaddress.IPv4Network] = set()


def _pick_subnet() -> ipaddress.IPv4Network:
    """A free /24 in 10.213.0.0/16, an unlikely range for real networks: neither routed nor
    given to another bed of this process."""
    used = [*_used_ipv4_networks(), *_PICKED_SUBNETS]
    start = secrets.randbelow(250) + 2
    for offset in range(250):
        candidate = ipaddress.IPv4Network(f"10.213.{(start + offset) % 250 + 2}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            _PICKED_SUBNETS.add(candidate)
            return candidate
    raise BedError("no free /24 left in 10.213.0.0/16 for the test bed's CNI network")


# --------------------------------------------------------------------------
# The bed
# --------------------------------------------------------------------------

@dataclass
class BedTimings:
    images_built: float = 0.0
    containerd_ready: float = 0.0
    images_imported: float = 0.0
    total_start: float = 0.0


class ContainerdBed:
    """A private containerd + CRI plugin with local pause/busybox images.

    Usage::

        with ContainerdBed(tmp_path) as bed:
            channel = bed.channel()          # grpc channel to bed.address
            parent = bed.pod_cgroup_parent("besteffort", uid)
    """

    def __init__(
        self,
        workdir: Path,
        *,
        cgroup_prefix: str | None = None,
        snapshotter: str | None = None,
        log_level: str | None = None,
        start_timeout: float = 60.0,
        bin_dir: Path | str | None = None,
        nri_socket: Path | str | None = None,
        systemd_cgroup: bool = False,
        extra_images: Callable[[Path], Sequence[BuiltImage]] | None = None,
        pause_image: str | None = None,
        restrict_oom_score_adj: bool | None = None,
    ) -> None:
        """``bin_dir``: where ``containerd``, ``ctr`` and ``containerd-shim-runc-v2`` come from
        (e.g. ``containerd_dist.containerd_bin_dir("forky")``); default: the host's PATH.
        ``nri_socket``: enable containerd's NRI plugin on this socket (otherwise NRI is off,
        also on 2.x where it defaults to on with a host-wide socket).
        ``systemd_cgroup``: runc's systemd cgroup driver (``SystemdCgroup = true``).
        ``extra_images``: builds more image archives (in the directory it is given) to import at
        start, next to the bed's pause and busybox; ``pause_image``: the sandbox image, when it
        is not the bed's pause (then one of ``extra_images``).
        ``restrict_oom_score_adj``: containerd's option of that name (clamp a container's value to
        containerd's own, as it cannot go lower); default: on only where this process lacks
        CAP_SYS_RESOURCE (this host's sandbox: runc would fail to lower it). With it on where it
        is not needed, every negative value (kubelet's -997 too) became containerd's own 0 in the
        VM guest, where the bed runs containerd as an unconfined root with oom_score_adj 0; a
        real node runs it as root with OOMScoreAdjust=-999 and the option off (its default).
        """
        self.id = secrets.token_hex(3)
        self.bin_dir = Path(bin_dir).resolve() if bin_dir is not None else None
        self.nri_socket = Path(nri_socket) if nri_socket is not None else None
        self.systemd_cgroup = systemd_cgroup
        self.restrict_oom_score_adj = (oom_score_adj_floor() is not None if restrict_oom_score_adj is None
                                       else restrict_oom_score_adj)
        self.containerd_major = self.containerd_minor = 0  # known once started (`containerd --version`)
        self.workdir = Path(workdir).resolve()
        self.root = self.workdir / "root"
        self.state = self.workdir / "state"
        self.config_path = self.workdir / "containerd.toml"
        self.log_path = self.workdir / "containerd.log"
        self.image_dir = self.workdir / "images"
        self.cni_conf_dir = self.workdir / "cni" / "net.d"
        self.cni_ipam_dir = self.workdir / "cni" / "ipam"
        self._socket_dir: Path | None = None
        self.socket = self.state / "containerd.sock"
        if len(str(self.socket)) > _MAX_UNIX_SOCKET_PATH:
            self._socket_dir = Path(tempfile.gettempdir()) / f"koordnode-bed-{self.id}"
            self.socket = self._socket_dir / "containerd.sock"
        self.address = f"unix://{self.socket}"
        self.namespace = CRI_NAMESPACE
        self.pause_image = pause_image or PAUSE_IMAGE_REF
        self._extra_images = extra_images
        self.busybox_image = BUSYBOX_IMAGE_REF
        self.network_name = f"koordnode-test-{self.id}"
        self.bridge_name = f"knbr{self.id}"
        self.cni_subnet = str(_pick_subnet())
        self.cgroup_prefix = (
            f"/koordnode-test-{self.id}" if cgroup_prefix is None else "/" + cgroup_prefix.strip("/")
        ).rstrip("/")
        self.kubepods_cgroup = f"{self.cgroup_prefix}/kubepods"
        self._requested_snapshotter = snapshotter or os.environ.get("KOORDNODE_TEST_SNAPSHOTTER") or None
        self.snapshotter = ""
        self.log_level = log_level or os.environ.get("KOORDNODE_TEST_CONTAINERD_LOG_LEVEL", "info")
        self.start_timeout = start_timeout
        self.timings = BedTimings()
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: BinaryIO | None = None
        self._channel: grpc.Channel | None = None
        self._host_dirs_created: list[Path] = []

    # ----- lifecycle -----------------------------------------------------

    def __enter__(self) -> ContainerdBed:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Write config, start containerd, wait for CRI readiness, import images."""
        if self.running:
            return
        problems = missing_prerequisites()
        if problems:
            raise BedError("containerd test bed unavailable: " + "; ".join(problems))
        began = time.monotonic()
        for directory in (self.root, self.state, self.cni_conf_dir, self.cni_ipam_dir, self.image_dir):
            directory.mkdir(parents=True, exist_ok=True)
        if self._socket_dir is not None:
            self._socket_dir.mkdir(mode=0o700, exist_ok=True)
        # Hard-coded host dirs containerd/libcni may create; removed again at stop if empty.
        self._host_dirs_created = [d for d in _HARDCODED_HOST_DIRS if not d.exists()]

        images = [*build_test_images(self.image_dir),
                  *(self._extra_images(self.image_dir) if self._extra_images is not None else ())]
        self.timings.images_built = time.monotonic() - began

        self.snapshotter = self._requested_snapshotter or (
            "overlayfs" if overlay_mount_works(self.root) else "native"
        )
        self.containerd_major, self.containerd_minor = self._detect_version()
        self._write_cni_config()
        self._write_config()
        try:
            self._launch()
            self._wait_ready()
            if not self._snapshotter_loaded() and self._requested_snapshotter is None and self.snapshotter != "native":
                # containerd refused the snapshotter despite a working probe; fall back once.
                self._terminate_containerd()
                self.snapshotter = "native"
                self._write_config()
                self._launch()
                self._wait_ready()
            self.timings.containerd_ready = time.monotonic() - began
            for image in images:
                self.ctr("images", "import", "--snapshotter", self.snapshotter, str(image.archive))
            self._wait_images_visible(sorted({self.pause_image, self.busybox_image, *(i.ref for i in images)}))
            self.timings.images_imported = time.monotonic() - began
        except BaseException:
            self.stop()
            raise
        self.timings.total_start = time.monotonic() - began
        # A crashed test run must not leave containerd and its pods behind.
        atexit.register(self.stop)

    def stop(self) -> None:
        """Remove every pod, stop containerd and its shims, undo host changes.

        Safe to call more than once and after a failed start. The containerd
        log and config stay in ``workdir`` for post-mortems.
        """
        atexit.unregister(self.stop)
        if self.running:
            with contextlib.suppress(Exception):
                self.remove_all_pods()
        self._close_channel()
        self._terminate_containerd()
        self._kill_shims()
        self._kill_leftover_containers()
        self.cleanup_cgroups()
        _unmount_under(self.root, self.state)
        self._remove_network_leftovers()
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.state, ignore_errors=True)
        shutil.rmtree(self.cni_ipam_dir, ignore_errors=True)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        for directory in sorted(self._host_dirs_created, key=lambda d: len(d.parts), reverse=True):
            with contextlib.suppress(OSError):
                directory.rmdir()  # only when empty: another bed may still use it

    # ----- CRI / ctr access ---------------------------------------------

    def restart_containerd(self) -> None:
        """Stop containerd (SIGTERM) and start it again on the same state; shims and the
        containers they run stay up, as on a node whose containerd service restarts."""
        self._close_channel()
        self._terminate_containerd()
        self._launch()
        self._wait_ready()

    def channel(self) -> grpc.Channel:
        """A shared gRPC channel to the bed's containerd socket."""
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.address)
        return self._channel

    def cri_call(self, method: str, request: bytes = b"", timeout: float = 10.0) -> bytes:
        """Raw unary CRI call, e.g. ``cri_call("/runtime.v1.RuntimeService/Version")``."""
        call = self.channel().unary_unary(method, request_serializer=None, response_deserializer=None)
        return call(request, timeout=timeout)

    def version(self) -> RuntimeVersion:
        return _decode_version(self.cri_call("/runtime.v1.RuntimeService/Version"))

    def runtime_conditions(self) -> dict[str, bool]:
        """CRI Status conditions, e.g. {"RuntimeReady": True, "NetworkReady": True}."""
        return _decode_conditions(self.cri_call("/runtime.v1.RuntimeService/Status"))

    def image_id(self, ref: str) -> str | None:
        """CRI image id of ``ref`` or None when CRI does not know it."""
        request = _encode_bytes_field(1, _encode_str_field(1, ref))
        response = self.cri_call("/runtime.v1.ImageService/ImageStatus", request)
        for image in _message_fields(response, 1):
            ids = _string_fields(image, 1)
            if ids and ids[0]:
                return ids[0]
        return None

    def list_pod_ids(self) -> list[str]:
        response = self.cri_call("/runtime.v1.RuntimeService/ListPodSandbox")
        return [ids[0] for item in _message_fields(response, 1) if (ids := _string_fields(item, 1))]

    def list_container_ids(self) -> list[str]:
        response = self.cri_call("/runtime.v1.RuntimeService/ListContainers")
        return [ids[0] for item in _message_fields(response, 1) if (ids := _string_fields(item, 1))]

    def remove_pod(self, pod_id: str) -> None:
        request = _encode_str_field(1, pod_id)
        self.cri_call("/runtime.v1.RuntimeService/StopPodSandbox", request, timeout=30)
        self.cri_call("/runtime.v1.RuntimeService/RemovePodSandbox", request, timeout=30)

    def remove_all_pods(self) -> None:
        """Stop and remove every pod sandbox (and its containers) the bed runs."""
        errors = []
        for pod_id in self.list_pod_ids():
            try:
                self.remove_pod(pod_id)
            except grpc.RpcError as err:
                errors.append(f"{pod_id}: {err}")
        for container_id in self.list_container_ids():  # containers outside any listed pod
            with contextlib.suppress(grpc.RpcError):
                self.cri_call(
                    "/runtime.v1.RuntimeService/RemoveContainer", _encode_str_field(1, container_id), timeout=30
                )
        if errors:
            raise BedError("could not remove pods: " + "; ".join(errors))

    def ctr(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``ctr`` against this bed in the k8s.io namespace; return stdout."""
        cmd = [self._binary("ctr"), "--address", str(self.socket), "--namespace", self.namespace, *args]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self._env())
        if result.returncode != 0:
            raise BedError(f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout

    # ----- cgroups -------------------------------------------------------

    def pod_cgroup_parent(self, qos: str, uid: str) -> str:
        """Kubelet-like cgroupfs parent for a pod: ``<kubepods>[/burstable|/besteffort]/pod<uid>``.

        ``qos`` is a Kubernetes QoS class, any case: guaranteed, burstable, besteffort.
        """
        key = qos.replace("-", "").replace("_", "").lower()
        if key not in _QOS_SUBDIR:
            raise ValueError(f"unknown QoS class {qos!r}; expected guaranteed, burstable or besteffort")
        if not uid or "/" in uid:
            raise ValueError(f"invalid pod uid {uid!r}")
        middle = _QOS_SUBDIR[key]
        return "/".join(p for p in (self.kubepods_cgroup, middle, f"pod{uid}") if p)

    def cgroup_path(self, controller: str, cgroup: str) -> Path:
        """Host path of ``cgroup`` (e.g. a pod parent + container id) in a v1 controller."""
        return CGROUP_FS_ROOT / controller / cgroup.lstrip("/")

    def cleanup_cgroups(self, subtree: str | None = None) -> list[Path]:
        """Kill any process left in the bed's cgroups and remove those cgroups.

        Without ``subtree`` the whole bed prefix goes (``/koordnode-test-<id>``,
        or ``/kubepods`` when ``cgroup_prefix=""``); with it, only that subtree
        (e.g. one ``pod_cgroup_parent``), which must lie inside the prefix.
        Works across every mounted hierarchy (v1 controllers, name=systemd and
        the unified v2 mount). Returns the directories removed.

        With ``cgroup_prefix=""`` the whole-tree cleanup only removes *empty*
        cgroups under ``/kubepods``: it never kills processes there, which on a
        real node might belong to a kubelet's pods.
        """
        top = self.cgroup_prefix or self.kubepods_cgroup
        may_kill = bool(self.cgroup_prefix) or subtree is not None
        if subtree is not None:
            subtree = "/" + subtree.strip("/")
            if not subtree.startswith(top + "/"):
                raise ValueError(f"cgroup {subtree!r} is outside the bed's prefix {top!r}")
            top = subtree
        removed: list[Path] = []
        for mount in _cgroup_mounts():
            base = mount / top.lstrip("/")
            if not base.is_dir():
                continue
            dirs = sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
            dirs.append(base)
            for directory in dirs:
                if may_kill:
                    self._kill_cgroup_members(directory)
                try:
                    directory.rmdir()
                    removed.append(directory)
                except OSError:
                    pass
        return removed

    @staticmethod
    def _kill_cgroup_members(directory: Path) -> None:
        pids: list[int] = []
        with contextlib.suppress(OSError):
            pids = [int(p) for p in (directory / "cgroup.procs").read_text().split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait_gone(pids, 5)

    # ----- internals -----------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = env.get("PATH", "") + ":" + _SEARCH_PATH
        if self.bin_dir is not None:
            # First, so containerd finds its own shim (looked up in PATH) and ctr matches it.
            env["PATH"] = f"{self.bin_dir}:{env['PATH']}"
        return env

    def _binary(self, name: str) -> str:
        if self.bin_dir is not None:
            return str(self.bin_dir / name)
        return shutil.which(name, path=self._env()["PATH"]) or name

    def _detect_version(self) -> tuple[int, int]:
        """(major, minor) of the containerd binary the bed runs."""
        result = subprocess.run([self._binary("containerd"), "--version"], capture_output=True, text=True,
                                timeout=30, env=self._env())
        for word in result.stdout.split():
            parts = word.lstrip("v").split(".")
            if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
                return int(parts[0]), int(parts[1])
        raise BedError(f"cannot tell containerd's version from {result.stdout.strip()!r} {result.stderr.strip()!r}")

    def _write_cni_config(self) -> None:
        subnet = ipaddress.IPv4Network(self.cni_subnet)
        conflist = {
            "cniVersion": "0.4.0",
            "name": self.network_name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge_name,
                    "isGateway": True,
                    "ipMasq": False,  # no NAT rules: pods only need an address, not the internet
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.cni_ipam_dir),
                        "ranges": [[{"subnet": str(subnet), "gateway": str(subnet.network_address + 1)}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        for stale in self.cni_conf_dir.glob("*"):
            stale.unlink()
        (self.cni_conf_dir / "10-koordnode-test.conflist").write_text(json.dumps(conflist, indent=2))

    def _nri_section(self, header: str) -> str:
        if self.nri_socket is None:
            return f"""
  [{header}]
    disable = true
"""
        nri_home = self.workdir / "nri"
        return f"""
  [{header}]
    disable = false
    socket_path = "{self.nri_socket}"
    plugin_path = "{nri_home / 'plugins'}"
    plugin_config_path = "{nri_home / 'conf.d'}"
"""

    def _write_config(self) -> None:
        if self.containerd_major >= 2:
            self.config_path.write_text(self._config_v3())
            return
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""\
# Generated by koordnode's test bed ({self.id}); private paths only.
version = 2
root = "{self.root}"
state = "{self.state}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{self.socket}"

[debug]
  level = "{self.log_level}"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{self.root / 'opt'}"

  [{cri}]
    sandbox_image = "{self.pause_image}"
    restrict_oom_score_adj = {str(self.restrict_oom_score_adj).lower()}
    netns_mounts_under_state_dir = true
    disable_apparmor = true
    enable_selinux = false
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_cdi = false

    [{cri}.containerd]
      snapshotter = "{self.snapshotter}"
      default_runtime_name = "runc"

      [{cri}.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"

        [{cri}.containerd.runtimes.runc.options]
          SystemdCgroup = {str(self.systemd_cgroup).lower()}
          Root = "{self.state / 'runc'}"

    [{cri}.cni]
      bin_dir = "{CNI_BIN_DIR}"
      conf_dir = "{self.cni_conf_dir}"
      max_conf_num = 1
"""
        if (self.containerd_major, self.containerd_minor) >= (1, 7):  # 1.7 has NRI, off by default
            config += self._nri_section('plugins."io.containerd.nri.v1.nri"')
        elif self.nri_socket is not None:
            raise BedError("this containerd (1.6 or older) has no NRI plugin; nri_socket needs 1.7 or later")
        self.config_path.write_text(config)

    def _config_v3(self) -> str:
        """containerd 2.x: config ``version = 3``; CRI split into images/runtime/grpc plugins."""
        images = "plugins.'io.containerd.cri.v1.images'"
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        return f"""\
# Generated by koordnode's test bed ({self.id}) for containerd {self.containerd_major}.x; private paths only.
version = 3
root = "{self.root}"
state = "{self.state}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.differ.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{self.socket}"

[debug]
  level = "{self.log_level}"

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = "{self.root / 'opt'}"

  [{images}]
    snapshotter = "{self.snapshotter}"
    [{images}.pinned_images]
      sandbox = "{self.pause_image}"

  [{runtime}]
    restrict_oom_score_adj = {str(self.restrict_oom_score_adj).lower()}
    netns_mounts_under_state_dir = true
    disable_apparmor = true
    enable_selinux = false
    enable_cdi = false

    [{runtime}.containerd]
      default_runtime_name = "runc"

      [{runtime}.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"

        [{runtime}.containerd.runtimes.runc.options]
          SystemdCgroup = {str(self.systemd_cgroup).lower()}
          Root = "{self.state / 'runc'}"

    [{runtime}.cni]
      bin_dirs = ["{CNI_BIN_DIR}"]
      conf_dir = "{self.cni_conf_dir}"
      max_conf_num = 1

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"

  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = "{self.root / 'image-verifier'}"
{self._nri_section("plugins.'io.containerd.nri.v1.nri'")}"""

    def _launch(self) -> None:
        if self._log_file is None:
            self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as containerd
        self._log_file.write(f"\n{_LOG_RUN_MARKER} {self.id}: starting containerd {time.ctime()}\n".encode())
        self._log_file.flush()
        self._process = subprocess.Popen(
            [self._binary("containerd"), "--config", str(self.config_path)],
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=self._env(),
            start_new_session=True,  # keep terminal signals aimed at pytest away from it
        )

    def _log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last_problem = "socket not created"
        while time.monotonic() < deadline:
            if not self.running:
                raise BedError(f"containerd exited early; log tail:\n{self._log_tail()}")
            if self.socket.exists():
                try:
                    self.version()
                    conditions = self.runtime_conditions()
                    if conditions.get("RuntimeReady") and conditions.get("NetworkReady"):
                        return
                    last_problem = f"CRI conditions {conditions}"
                except grpc.RpcError as err:
                    last_problem = f"CRI not answering: {err.code()} {err.details()}"
                    cri_failure = self._cri_plugin_failure() if err.code() == grpc.StatusCode.UNIMPLEMENTED else ""
                    if cri_failure:
                        raise BedError(
                            f"containerd's CRI plugin failed to load: {cri_failure} (log: {self.log_path})"
                        ) from err
            time.sleep(0.1)
        raise BedError(f"containerd not ready after {self.start_timeout}s ({last_problem}); log tail:\n{self._log_tail()}")

    def _cri_plugin_failure(self) -> str:
        """The log line saying the CRI plugin failed in the current run, or ''."""
        with contextlib.suppress(OSError):
            current_run = self.log_path.read_text(errors="replace").rsplit(_LOG_RUN_MARKER, 1)[-1]
            for line in current_run.splitlines():
                if 'failed to load plugin io.containerd.grpc.v1.cri"' in line:
                    return line
        return ""

    def _snapshotter_loaded(self) -> bool:
        for line in self.ctr("plugins", "ls").splitlines():
            cols = line.split()
            if len(cols) >= 4 and cols[0] == "io.containerd.snapshotter.v1" and cols[1] == self.snapshotter:
                return cols[-1] == "ok"
        return False

    def _wait_images_visible(self, refs: list[str], timeout: float = 30.0) -> None:
        # CRI learns about `ctr import`ed images from containerd events, asynchronously.
        deadline = time.monotonic() + timeout
        missing = refs
        while time.monotonic() < deadline:
            missing = [ref for ref in refs if self.image_id(ref) is None]
            if not missing:
                return
            time.sleep(0.1)
        raise BedError(f"CRI does not see imported images {missing}")

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _terminate_containerd(self) -> None:
        process = self._process
        self._process = None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file: BinaryIO | None = None

    def shim_pids(self, sandbox_id: str | None = None) -> list[int]:
        """Pids of the containerd shims serving this bed (only the one started for
        ``sandbox_id`` when given: a runc v2 shim is started with ``-id <sandbox id>``)."""
        pids = []
        for pid, argv in _processes():
            if not argv or "containerd-shim" not in os.path.basename(argv[0]):
                continue
            flags = dict(zip(argv[1:], argv[2:], strict=False))  # each flag with the word after it
            if flags.get("-address") != str(self.socket):
                continue
            if sandbox_id is None or flags.get("-id") == sandbox_id:
                pids.append(pid)
        return pids

    def _kill_shims(self) -> None:
        pids = self.shim_pids()
        sockets = [p for pid in pids for p in _listening_unix_paths(pid)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait_gone(pids, 5)
        for path in sockets:
            if path.startswith(str(SHIM_SOCKET_DIR) + "/"):
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def _kill_leftover_containers(self) -> None:
        runc_root = self.state / "runc" / self.namespace
        if not runc_root.is_dir():
            return
        for entry in runc_root.iterdir():
            subprocess.run(
                ["runc", "--root", str(runc_root), "delete", "--force", entry.name],
                capture_output=True, timeout=30, env=self._env(),
            )

    def _remove_network_leftovers(self) -> None:
        if Path(f"/sys/class/net/{self.bridge_name}").exists():
            subprocess.run(["ip", "link", "delete", self.bridge_name], capture_output=True, timeout=10)
        if CNI_RESULT_CACHE.is_dir():
            for cached in CNI_RESULT_CACHE.glob(f"{self.network_name}-*"):
                with contextlib.suppress(OSError):
                    cached.unlink()
