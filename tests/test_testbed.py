"""Proves the containerd test bed: images, CRI readiness, a real pod, clean teardown.

The first group runs anywhere (pure image building and helpers); the e2e group
needs root and the real containerd bed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import tarfile
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

import pytest

from testbed.containerd_bed import (
    CGROUP_FS_ROOT,
    SHIM_SOCKET_DIR,
    BedError,
    ContainerdBed,
    _decode_conditions,
    _decode_fields,
    _encode_bytes_field,
    _encode_str_field,
    _encode_varint,
    _listening_unix_paths,
    _mount_points,
    _processes,
)
from testbed.images import (
    BUSYBOX_IMAGE_REF,
    PAUSE_CMD,
    PAUSE_IMAGE_REF,
    ImageBuildError,
    build_image_archive,
    build_test_images,
    oci,
)

# --------------------------------------------------------------------------
# Fast tests (no root, no containerd)
# --------------------------------------------------------------------------


def _read_archive(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_image_archives_are_deterministic(tmp_path: Path) -> None:
    first = build_test_images(tmp_path / "a")
    second = build_test_images(tmp_path / "b")
    for one, two in zip(first, second, strict=True):
        assert one.archive.read_bytes() == two.archive.read_bytes()
        assert one.config_digest == two.config_digest


def test_image_archive_is_a_valid_oci_layout(tmp_path: Path) -> None:
    pause, _ = build_test_images(tmp_path)
    files = _read_archive(pause.archive)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]

    index = json.loads(files["index.json"])
    (entry,) = index["manifests"]
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == PAUSE_IMAGE_REF
    manifest = json.loads(files["blobs/sha256/" + entry["digest"].split(":")[1]])
    assert manifest["config"]["digest"] == pause.config_digest
    config = json.loads(files["blobs/sha256/" + pause.config_digest.split(":")[1]])
    assert config["config"]["Cmd"] == PAUSE_CMD
    (layer_desc,) = manifest["layers"]
    assert layer_desc["mediaType"] == oci.MEDIA_TYPE_LAYER
    assert config["rootfs"]["diff_ids"] == [layer_desc["digest"]]

    layer_path = tmp_path / "layer.tar"
    layer_path.write_bytes(files["blobs/sha256/" + layer_desc["digest"].split(":")[1]])
    with tarfile.open(layer_path) as layer:
        members = {m.name: m for m in layer.getmembers()}
    assert members["bin/busybox"].isfile() and members["bin/busybox"].mode & 0o111
    for applet in ("bin/sh", "bin/sleep", "bin/cat", "bin/echo"):
        assert members[applet].issym() and members[applet].linkname == "/bin/busybox"


def test_image_build_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ImageBuildError):
        build_image_archive(tmp_path / "x.tar", "docker.io/x/y:t", ["sh"], busybox=tmp_path / "missing")
    with pytest.raises(ValueError):
        build_image_archive(tmp_path / "x.tar", "docker.io/x/untagged", ["sh"])


def test_pause_command_exits_promptly_on_sigterm_without_orphans() -> None:
    # Run the pause command on the host busybox: it must idle, then stop on TERM
    # and take its idle `sleep` child with it.
    assert PAUSE_CMD[0] == "/bin/sh"
    proc = subprocess.Popen(
        ["/bin/busybox", "sh", *PAUSE_CMD[1:]], start_new_session=True, stdout=subprocess.DEVNULL
    )
    try:
        time.sleep(0.3)
        assert proc.poll() is None
        proc.terminate()
        assert proc.wait(timeout=3) == 0
        _wait_for(lambda: not _live_group_members(proc.pid), 3, "the pause's sleep child to die")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _live_group_members(pgid: int) -> list[int]:
    """Non-zombie processes in process group ``pgid`` (zombies may linger unreaped under PID 1)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(stat.parent.name))
    return members


def test_protobuf_wire_helpers_round_trip() -> None:
    assert _encode_varint(300) == b"\xac\x02"
    condition = _encode_str_field(1, "RuntimeReady") + _encode_varint((2 << 3) | 0) + _encode_varint(1)
    status = _encode_bytes_field(1, _encode_bytes_field(1, condition))
    assert _decode_conditions(status) == {"RuntimeReady": True}
    assert list(_decode_fields(_encode_str_field(3, "x"))) == [(3, b"x")]


def test_pod_cgroup_parent_follows_kubelet_cgroupfs_layout(tmp_path: Path) -> None:
    bed = ContainerdBed(tmp_path)
    prefix = bed.cgroup_prefix
    assert prefix.startswith("/koordnode-test-")
    assert bed.pod_cgroup_parent("BestEffort", "u1") == f"{prefix}/kubepods/besteffort/podu1"
    assert bed.pod_cgroup_parent("burstable", "u1") == f"{prefix}/kubepods/burstable/podu1"
    assert bed.pod_cgroup_parent("Guaranteed", "u1") == f"{prefix}/kubepods/podu1"
    assert ContainerdBed(tmp_path, cgroup_prefix="").pod_cgroup_parent("burstable", "u") == "/kubepods/burstable/podu"
    with pytest.raises(ValueError):
        bed.pod_cgroup_parent("platinum", "u1")
    with pytest.raises(ValueError):
        bed.cleanup_cgroups("/kubepods/not-ours")


def _run_pytest_with_missing_prerequisites(tmp_path: Path, ci: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(
        "import testbed.fixtures as f\n"
        "f.missing_prerequisites = lambda: ['pretend binary missing']\n"
        "from testbed.fixtures import containerd_bed\n"
    )
    (tmp_path / "test_uses_bed.py").write_text("def test_uses_bed(containerd_bed):\n    pass\n")
    # tests/ for the bed, the checkout for koordnode (the bed reads its oom_score_adj floor).
    env = dict(os.environ, CI=ci, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parents[1])]))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )


def test_beds_made_before_any_pod_get_distinct_subnets(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bed's route appears only with its first pod: beds made one after another (the bench's
    five nodes) must not be given one subnet twice (two bridges, one route: a pod unreachable)."""
    from testbed import containerd_bed

    monkeypatch.setattr(containerd_bed, "_used_ipv4_networks", lambda: [])
    monkeypatch.setattr(containerd_bed, "_PICKED_SUBNETS", set())
    picked = [containerd_bed._pick_subnet() for _ in range(60)]
    assert len(set(picked)) == 60


def test_fixture_skips_without_prerequisites_but_fails_in_ci(tmp_path: Path) -> None:
    skipped = _run_pytest_with_missing_prerequisites(tmp_path, ci="false")
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout
    assert "pretend binary missing" in skipped.stdout
    failed = _run_pytest_with_missing_prerequisites(tmp_path, ci="true")
    assert failed.returncode != 0 and "1 error" in failed.stdout, failed.stdout
    assert "CI=true" in failed.stdout


# --------------------------------------------------------------------------
# End-to-end tests on the real bed
# --------------------------------------------------------------------------

try:
    from koordnode.cri import api_pb2 as api
    from support import api_pb2_grpc as api_grpc
except ImportError:  # the generated stubs are a build product
    api = api_grpc = None

requires_stubs = pytest.mark.skipif(api is None, reason="generated CRI stubs koordnode.cri.api_pb2* missing")


def _wait_for(check: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class BusyboxPod:
    """A one-container pod run straight against the bed's CRI."""

    def __init__(self, bed: ContainerdBed, log_root: Path, command: list[str], qos: str = "besteffort") -> None:
        self.bed = bed
        self.runtime = api_grpc.RuntimeServiceStub(bed.channel())
        self.uid = str(uuid.uuid4())
        self.cgroup_parent = bed.pod_cgroup_parent(qos, self.uid)
        self.log_dir = log_root / self.uid
        self.log_dir.mkdir(parents=True)
        self.sandbox_config = api.PodSandboxConfig(
            metadata=api.PodSandboxMetadata(name="bed-probe", uid=self.uid, namespace="default", attempt=0),
            hostname="bed-probe",
            log_directory=str(self.log_dir),
            linux=api.LinuxPodSandboxConfig(cgroup_parent=self.cgroup_parent),
        )
        self.command = command
        self.pod_id = ""
        self.container_id = ""

    def run(self) -> None:
        self.pod_id = self.runtime.RunPodSandbox(
            api.RunPodSandboxRequest(config=self.sandbox_config), timeout=60
        ).pod_sandbox_id
        container_config = api.ContainerConfig(
            metadata=api.ContainerMetadata(name="main", attempt=0),
            image=api.ImageSpec(image=self.bed.busybox_image),
            command=self.command,
            log_path="main/0.log",
            linux=api.LinuxContainerConfig(resources=api.LinuxContainerResources(cpu_shares=2)),
        )
        self.container_id = self.runtime.CreateContainer(
            api.CreateContainerRequest(
                pod_sandbox_id=self.pod_id, config=container_config, sandbox_config=self.sandbox_config
            ),
            timeout=60,
        ).container_id
        self.runtime.StartContainer(api.StartContainerRequest(container_id=self.container_id), timeout=60)

    def state(self) -> int:
        return self.runtime.ContainerStatus(
            api.ContainerStatusRequest(container_id=self.container_id), timeout=10
        ).status.state

    def log_text(self) -> str:
        path = self.log_dir / "main" / "0.log"
        return path.read_text() if path.exists() else ""

    def remove(self) -> None:
        self.runtime.StopPodSandbox(api.StopPodSandboxRequest(pod_sandbox_id=self.pod_id), timeout=60)
        self.runtime.RemovePodSandbox(api.RemovePodSandboxRequest(pod_sandbox_id=self.pod_id), timeout=60)


@pytest.mark.e2e
@requires_stubs
def test_cri_answers_version_over_the_bed_socket(containerd_bed: ContainerdBed) -> None:
    runtime = api_grpc.RuntimeServiceStub(containerd_bed.channel())
    version = runtime.Version(api.VersionRequest(version="v1"), timeout=10)
    assert version.runtime_name == "containerd"
    assert version.runtime_api_version == "v1"
    assert containerd_bed.runtime_conditions() == {"RuntimeReady": True, "NetworkReady": True}
    assert containerd_bed.socket.is_socket()
    assert containerd_bed.address == f"unix://{containerd_bed.socket}"


@pytest.mark.e2e
@requires_stubs
def test_bed_images_are_listed_by_cri(containerd_bed: ContainerdBed) -> None:
    images = api_grpc.ImageServiceStub(containerd_bed.channel())
    tags = {tag for image in images.ListImages(api.ListImagesRequest(), timeout=10).images for tag in image.repo_tags}
    assert {containerd_bed.pause_image, containerd_bed.busybox_image} <= tags
    assert containerd_bed.pause_image == PAUSE_IMAGE_REF and containerd_bed.busybox_image == BUSYBOX_IMAGE_REF


@pytest.mark.e2e
@requires_stubs
def test_busybox_pod_runs_logs_and_lands_in_expected_cgroup(
    containerd_bed: ContainerdBed, tmp_path: Path
) -> None:
    bed = containerd_bed
    pod = BusyboxPod(bed, tmp_path, ["sh", "-c", "echo hello; sleep 3600"])
    started = time.monotonic()
    pod.run()
    try:
        _wait_for(lambda: pod.state() == api.CONTAINER_RUNNING, 30, "container RUNNING")
        print(f"pod start to RUNNING: {time.monotonic() - started:.2f}s")
        _wait_for(lambda: "hello" in pod.log_text(), 10, "'hello' in the container log")

        container_cgroup = bed.cgroup_path("cpu", f"{pod.cgroup_parent}/{pod.container_id}")
        assert container_cgroup.is_dir()
        assert (container_cgroup / "cpu.shares").read_text().strip() == "2"
        assert (container_cgroup / "cgroup.procs").read_text().split(), "container has processes"
        assert bed.cgroup_path("cpu", f"{pod.cgroup_parent}/{pod.pod_id}").is_dir(), "sandbox cgroup"
        assert str(bed.state) in "".join(mp for mp, _ in _mount_points()), "netns mounted under bed state"
        assert Path(f"/sys/class/net/{bed.bridge_name}").exists()
        assert bed.shim_pids(pod.pod_id), "the pod's own shim is found by its sandbox id"
    finally:
        pod.remove()

    assert pod.pod_id not in bed.list_pod_ids()
    assert pod.container_id not in bed.list_container_ids()
    assert not bed.cgroup_path("cpu", f"{pod.cgroup_parent}/{pod.container_id}").exists()
    assert not bed.cgroup_path("cpu", f"{pod.cgroup_parent}/{pod.pod_id}").exists()
    # Only this pod's shim: the bed is shared with the session's other tests.
    _wait_for(lambda: not bed.shim_pids(pod.pod_id), 10, "the pod's shim to exit")
    # containerd leaves the pod-level parent (kubelet's job); the bed removes it.
    bed.cleanup_cgroups(pod.cgroup_parent)
    assert not any((mount / pod.cgroup_parent.lstrip("/")).exists() for mount in CGROUP_FS_ROOT.iterdir())


@pytest.mark.e2e
@requires_stubs
def test_a_pod_whose_answer_was_lost_is_removed_with_the_tests_pods(containerd_bed: ContainerdBed) -> None:
    # As when a test kills koordnode while RunPodSandbox is on its way back: containerd made the
    # sandbox, the test never got its id. Left behind, later tests in this session's containerd
    # saw a pod no API server knew (test_cluster_mode_end_to_end waited for a NodeMetric field
    # in vain).
    from support.cri import Cri, Pods, run_pod, sandbox_config

    cri = Cri(str(containerd_bed.socket))
    try:
        pods = Pods(containerd_bed, cri)
        kept = pods.run("answered", qos="besteffort")[1]
        lost = sandbox_config(containerd_bed, "answer-lost", qos="besteffort")
        pods.uids.add(lost.metadata.uid)
        lost_id = run_pod(cri, lost)
        assert {kept, lost_id} <= set(containerd_bed.list_pod_ids()) and lost_id not in pods.ids
        pods.cleanup()
        assert not {kept, lost_id} & set(containerd_bed.list_pod_ids())
    finally:
        cri.close()


@pytest.mark.e2e
@requires_stubs
def test_stop_leaves_nothing_behind_even_with_a_running_pod(
    containerd_bed: ContainerdBed, tmp_path: Path
) -> None:
    # A second bed next to the session one also proves two beds don't collide.
    bed = ContainerdBed(tmp_path / "bed")
    bed.start()
    assert bed.socket != containerd_bed.socket and bed.cni_subnet != containerd_bed.cni_subnet
    pod = BusyboxPod(bed, tmp_path / "logs", ["sleep", "3600"], qos="burstable")
    pod.run()
    _wait_for(lambda: pod.state() == api.CONTAINER_RUNNING, 30, "container RUNNING")
    shims = bed.shim_pids()
    assert shims
    shim_sockets = [path for pid in shims for path in _listening_unix_paths(pid)]
    assert any(path.startswith(str(SHIM_SOCKET_DIR)) for path in shim_sockets)
    containerd_pid = bed._process.pid

    bed.stop()

    assert not bed.running and not Path(f"/proc/{containerd_pid}").exists()
    assert not bed.shim_pids()
    assert not any(os.path.exists(path) for path in shim_sockets)
    assert not [mp for mp, _ in _mount_points() if mp.startswith(str(bed.workdir))]
    assert not Path(f"/sys/class/net/{bed.bridge_name}").exists()
    assert not [m for m in CGROUP_FS_ROOT.iterdir() if (m / bed.cgroup_prefix.lstrip("/")).exists()]
    assert not bed.root.exists() and not bed.state.exists()
    assert bed.log_path.exists(), "log kept for post-mortems"
    # The session bed is untouched by its neighbour's teardown.
    assert containerd_bed.runtime_conditions()["RuntimeReady"]

    # Restarting the same object works (sequential start/stop in one session).
    started = time.monotonic()
    bed.start()
    try:
        assert bed.version().runtime_name == "containerd"
        assert time.monotonic() - started < 30
    finally:
        bed.stop()


@pytest.mark.e2e
def test_start_failure_is_a_clear_error_and_leaves_nothing_running(
    containerd_bed: ContainerdBed, tmp_path: Path  # the session bed only gates on prerequisites
) -> None:
    bed = ContainerdBed(tmp_path / "broken", snapshotter="no-such-snapshotter")
    with pytest.raises(BedError, match="CRI plugin failed to load.*no-such-snapshotter"):
        bed.start()
    assert not bed.running
    assert not [pid for pid, argv in _processes() if str(bed.config_path) in argv]
    assert not bed.root.exists() and bed.log_path.exists()


def test_a_background_build_is_waited_for_and_its_failure_reported_with_its_log(tmp_path, monkeypatch) -> None:
    from testbed import background_build
    from testbed.k8s_dist import K8sDistError, component_bin

    monkeypatch.delenv(background_build.DIR_ENV, raising=False)
    assert background_build.wait_for("k8s", "test") is None  # pytest run by hand: nothing to wait for
    monkeypatch.setenv(background_build.DIR_ENV, str(tmp_path))
    (tmp_path / "build.log").write_text("k8s-bed: building etcd\ngo: module lookup disabled\n")
    with pytest.raises(background_build.BackgroundBuildError, match="not ended after 0 s"):
        background_build.wait_for("k8s", "test", wait_s=0)
    writer = subprocess.Popen(["sh", "-c", f"sleep 1; echo 0 > {tmp_path}/k8s.rc"])
    began = time.monotonic()
    assert background_build.wait_for("k8s", "test") == 0 and time.monotonic() - began >= 0.5
    writer.wait()
    (tmp_path / "k8s.rc").write_text("1\n")
    with pytest.raises(K8sDistError, match=r"k8s step failed \(exit 1\)(.|\n)*go: module lookup disabled"):
        component_bin("etcd")


def test_a_build_wait_happens_before_the_test_and_an_overdue_build_is_waited_for_once(
        tmp_path, monkeypatch, capsys) -> None:
    """tests/conftest.py waits outside the test (no test's timeout counts a cold build); once
    the whole bound ran out, each test that needs the step fails at once with the same error."""
    from testbed import background_build

    monkeypatch.setenv(background_build.DIR_ENV, str(tmp_path))
    monkeypatch.setattr(background_build, "_GAVE_UP", {})
    monkeypatch.setattr(background_build, "WAIT_S", 0.5)
    (tmp_path / "build.log").write_text("k8s-bed: building kubernetes\n")
    background_build.await_outside_tests(("kernel",), "tests/test_x.py::test_y")  # reports, never raises
    assert "kernel step has not ended after 0 s" in capsys.readouterr().err
    monkeypatch.setattr(background_build, "WAIT_S", 60)
    began = time.monotonic()
    with pytest.raises(background_build.BackgroundBuildError, match="building kubernetes"):
        background_build.require("kernel", "a fixture")
    assert time.monotonic() - began < 1
    (tmp_path / "kernel.rc").write_text("0\n")  # it did end after all
    assert background_build.wait_for("kernel", "a fixture") == 0


def test_the_tests_that_need_a_build_wait_for_it_outside_their_timeout(tmp_path) -> None:
    """A real-node test with a 2 s timeout behind a build that takes 4 s more: the wait is not
    the test's (this suite's conftest hook runs before pytest-timeout's), so it passes."""
    suite, build = tmp_path / "suite", tmp_path / "build"
    suite.mkdir()
    build.mkdir()
    tests = Path(__file__).resolve().parent
    (suite / "conftest.py").write_text(
        f"import importlib.util, sys\nsys.path.insert(0, {str(tests)!r})\n"
        f"spec = importlib.util.spec_from_file_location('project_conftest', {str(tests / 'conftest.py')!r})\n"
        "project = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(project)\n"
        "pytest_collection_modifyitems = project.pytest_collection_modifyitems\n"
        "pytest_runtest_protocol = project.pytest_runtest_protocol\n")
    (suite / "test_k8s_fake.py").write_text(
        "import pytest\nfrom testbed.background_build import require\n\n"
        "@pytest.mark.timeout(2)\ndef test_needs_kubelet():\n    require('k8s', 'a fixture')\n")
    writer = subprocess.Popen(["sh", "-c", f"sleep 4; echo 0 > {build}/k8s.rc"])
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", str(suite), str(suite)],
            cwd=suite, capture_output=True, text=True, timeout=120,
            # this checkout's koordnode, whatever the interpreter has installed
            env={**os.environ, "KOORDNODE_BED_BUILD_DIR": str(build),
                 "PYTHONPATH": os.pathsep.join(filter(None, [str(tests.parent), os.environ.get("PYTHONPATH", "")]))})
    finally:
        writer.wait()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "waiting for the background build (k8s" in result.stderr, result.stderr



def test_kubelet_not_ready_lines_compare_by_reason() -> None:
    """Which readiness reasons kubelet's sync loop still lists at a given tick after a restart
    is timing (a loaded machine splits one line into two): each reason compares on its own, and
    a reason the baseline never showed is still an error."""
    from k8s_support import runtime_errors

    def klog(message: str) -> str:
        return f'E1128 12:41:25.048047   23479 kubelet.go:2697] "Skipping pod synchronization" err="{message}"'

    direct = set(runtime_errors(klog("[container runtime status check may not have completed yet, "
                                     "PLEG is not healthy: pleg has yet to be successful]")))
    node = runtime_errors("\n".join([klog("container runtime status check may not have completed yet"),
                                     klog("container runtime is down")]))
    assert [e for e in node if e not in direct] == [
        "kubelet.go:2697] Skipping pod synchronization: container runtime is down"]


def test_only_the_calls_a_stopping_kubelet_cancelled_are_dropped() -> None:
    """A relist kubelet cancelled at its own stop is not an error koordnode caused; the same
    message from the kubelet still running, or long before a stop, is kept, and so is a
    deadline (a call that ran too long)."""
    from k8s_support import without_shutdown_cancels
    from testbed.kube_bed import KUBELET_START_MARK

    def klog(time_of_day: str, message: str) -> str:
        return f'E1203 {time_of_day}   27494 remote_runtime.go:435] "ListPodSandbox failed" err="rpc error: {message}"'

    canceled = "code = Canceled desc = context canceled"
    log = "\n".join([
        f"{KUBELET_START_MARK} Thu Dec  3 08:00:00 2026",
        klog("08:03:20.000000", canceled + " (early)"),
        klog("08:03:33.900000", canceled + " (at the stop)"),
        klog("08:03:34.000000", "code = DeadlineExceeded desc = context deadline exceeded"),
        'I1203 08:03:34.466457   27494 eviction_manager.go:224] "Eviction manager: monitoring loop exiting"',
        f"{KUBELET_START_MARK} Thu Dec  3 08:03:35 2026",
        klog("08:05:00.000000", canceled + " (running)"),
        "",
    ])
    kept = without_shutdown_cancels(log)
    assert "(at the stop)" not in kept
    assert "(early)" in kept and "(running)" in kept and "DeadlineExceeded" in kept
    assert kept.count(KUBELET_START_MARK) == 2 and len(kept.splitlines()) == len(log.splitlines()) - 1


@pytest.mark.parametrize("server", ["silent", "trickle"])
def test_the_test_clients_api_call_is_bounded_whole_tls_handshake_included(server: str) -> None:
    """A server that accepts and never finishes the TLS handshake, or trickles a byte at a time
    (each read within the socket timeout): the call ends at its own bound with a clear error."""
    import socket
    import threading

    from testbed.kube_client import KubeClient

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            while not stop.wait(0.2):
                if server == "trickle":
                    try:
                        conn.send(b"\x16")
                    except OSError:
                        return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = KubeClient("127.0.0.1", listener.getsockname()[1], "t", "/etc/ssl/certs/ca-certificates.crt",
                        timeout=5, call_timeout=1)
    began = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match=r"GET /readyz: no whole answer within 1 s"):
            client.raw("GET", "/readyz")
        assert time.monotonic() - began < 3
    finally:
        stop.set()
        listener.close()
        thread.join(5)
