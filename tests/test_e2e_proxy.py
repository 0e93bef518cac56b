"""koordnode in front of a real containerd: kubelet's calls must come back as containerd answers them.

Every test runs twice: against the host's containerd (1.6 from Debian 12) and against
containerd 2.1 (Debian forky's package, fetched by testbed.containerd_dist, run in its
own bed with config version 3).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
import time

import grpc
import pytest

from koordnode.cri import api_pb2 as pb
from koordnode.hooks.chain import CallContext, Phase, Stage
from support.cri import (
    Cri,
    container_config,
    remove_pod,
    run_pod,
    sandbox_config,
    start_container,
    wait_container_state,
)
from support.koordnode_runner import InProcessKoordnode, KoordnodeProcess
from testbed.fixtures import dist_bed

pytestmark = pytest.mark.e2e

# Bed id -> Debian suite of its containerd (None: the host's containerd, the shared session bed).
BACKENDS = {"containerd-host": None, "containerd-2.1": "forky"}


@pytest.fixture(scope="module", params=list(BACKENDS))
def containerd_bed(request, containerd_bed, tmp_path_factory):  # noqa: F811 - parametrizes the shared bed
    suite = BACKENDS[request.param]
    if suite is None:
        yield containerd_bed
        return
    with dist_bed(suite, tmp_path_factory.mktemp(f"bed-{suite}")) as bed:
        yield bed


def _is_2x(bed) -> bool:
    return int(bed.version().runtime_version.lstrip("v").split(".")[0]) >= 2


def rpc_error(fn, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        fn(*args, **kwargs)
    return err.value


def test_full_pod_lifecycle_through_proxy(containerd_bed, cri_proxy, cri_direct, tmp_path):
    bed, cri = containerd_bed, cri_proxy
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    sb_cfg = sandbox_config(bed, "lifecycle", log_dir=str(log_dir))
    sandbox_id = run_pod(cri, sb_cfg)
    try:
        cfg = container_config(bed, "app", ["sh", "-c", "echo hello-from-koordnode; sleep 3600"],
                               log_path="app.log", resources={"cpu_shares": 256})
        cid = start_container(cri, sandbox_id, sb_cfg, cfg)
        status = wait_container_state(cri, cid, pb.CONTAINER_RUNNING)
        assert status.state == pb.CONTAINER_RUNNING

        exec_resp = cri.rt.ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10), timeout=30)
        assert (exec_resp.stdout, exec_resp.stderr, exec_resp.exit_code) == (b"out\n", b"err\n", 3)

        # The container's log reached the file kubelet asked for.
        deadline = time.monotonic() + 10
        log_file = log_dir / "app.log"
        while time.monotonic() < deadline and "hello-from-koordnode" not in (log_file.read_text() if log_file.exists() else ""):
            time.sleep(0.1)
        assert "hello-from-koordnode" in log_file.read_text()

        # Status and list calls answer exactly what containerd answers.
        for call, req in (
            (lambda c, r: c.rt.PodSandboxStatus(r), pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id)),
            (lambda c, r: sorted(p.id for p in c.rt.ListPodSandbox(r).items), pb.ListPodSandboxRequest()),
            (lambda c, r: sorted(x.SerializeToString(deterministic=True) for x in c.rt.ListContainers(r).containers),
             pb.ListContainersRequest()),
            (lambda c, r: c.rt.Version(r), pb.VersionRequest()),
        ):
            assert call(cri, req) == call(cri_direct, req)
        via_proxy = cri.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid))
        direct = cri_direct.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid))
        assert via_proxy == direct
        assert via_proxy.status.id == cid

        cri.rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=5), timeout=30)
        assert wait_container_state(cri, cid, pb.CONTAINER_EXITED).state == pb.CONTAINER_EXITED
        cri.rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=30)
        assert cid not in [c.id for c in cri.rt.ListContainers(pb.ListContainersRequest()).containers]
    finally:
        remove_pod(cri, sandbox_id)
    assert sandbox_id not in [p.id for p in cri_direct.rt.ListPodSandbox(pb.ListPodSandboxRequest()).items]


def test_images_through_proxy(containerd_bed, cri_proxy, cri_direct):
    bed = containerd_bed
    # containerd lists in map order, which differs from call to call: compare as sets.
    def images(c):
        return sorted(i.SerializeToString(deterministic=True) for i in c.img.ListImages(pb.ListImagesRequest()).images)

    assert images(cri_proxy) == images(cri_direct)
    req = pb.ImageStatusRequest(image=pb.ImageSpec(image=bed.busybox_image), verbose=True)
    via_proxy = cri_proxy.img.ImageStatus(req)
    assert via_proxy.image.id and bed.busybox_image in via_proxy.image.repo_tags
    assert via_proxy == cri_direct.img.ImageStatus(req)
    # Not modelled by us: its fields travel as unknown fields and must still arrive.
    assert cri_proxy.img.ImageFsInfo(pb.ImageFsInfoRequest()).SerializeToString()


def test_errors_come_back_verbatim(containerd_bed, cri_proxy, cri_direct):
    cases = [
        (lambda c: c.rt.ContainerStatus(pb.ContainerStatusRequest(container_id="does-not-exist"))),
        (lambda c: c.rt.StartContainer(pb.StartContainerRequest(container_id="does-not-exist"))),
        (lambda c: c.img.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image="in:valid::ref")))),
    ]
    if not _is_2x(containerd_bed):
        # containerd 1.6 does not implement these: UNIMPLEMENTED must come back as it is.
        cases += [
            (lambda c: next(iter(c.rt.GetContainerEvents(pb.GetEventsRequest())))),
            (lambda c: c.rt.RuntimeConfig(pb.RuntimeConfigRequest())),
        ]
    for case in cases:
        direct, proxied = rpc_error(case, cri_direct), rpc_error(case, cri_proxy)
        assert (proxied.code(), proxied.details()) == (direct.code(), direct.details())
    if not _is_2x(containerd_bed):
        events = rpc_error(lambda: next(iter(cri_proxy.rt.GetContainerEvents(pb.GetEventsRequest()))))
        assert events.code() == grpc.StatusCode.UNIMPLEMENTED


def test_methods_only_2x_has_answer_through_koordnode_as_directly(containerd_bed, cri_proxy, cri_direct):
    """RuntimeConfig, metrics descriptors and pod metrics: unknown to 1.6, served by 2.x."""
    if not _is_2x(containerd_bed):
        pytest.skip("containerd 1.6 lacks these methods (its UNIMPLEMENTED is checked above)")
    calls = [
        lambda c: c.rt.RuntimeConfig(pb.RuntimeConfigRequest(), timeout=10),
        lambda c: c.rt.ListMetricDescriptors(pb.ListMetricDescriptorsRequest(), timeout=10),
        lambda c: c.rt.ListPodSandboxMetrics(pb.ListPodSandboxMetricsRequest(), timeout=10),
    ]
    for call in calls:
        try:
            direct = call(cri_direct)
        except grpc.RpcError as err:
            proxied = rpc_error(call, cri_proxy)
            assert (proxied.code(), proxied.details()) == (err.code(), err.details())
            continue
        assert call(cri_proxy) == direct
    assert cri_proxy.rt.RuntimeConfig(pb.RuntimeConfigRequest(), timeout=10).linux.cgroup_driver == \
        pb.CgroupDriver.CGROUPFS


def test_container_events_stream_through_koordnode(containerd_bed, cri_proxy, cri_direct):
    """GetContainerEvents (a server stream) through koordnode, from containerd 2.x, for real."""
    if not _is_2x(containerd_bed):
        pytest.skip("containerd 1.6 does not implement GetContainerEvents")
    received: queue.Queue = queue.Queue()
    stream = cri_proxy.rt.GetContainerEvents(pb.GetEventsRequest())

    def read() -> None:
        try:
            for event in stream:
                received.put(event)
        except grpc.RpcError as err:
            received.put(err)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    sb_cfg = sandbox_config(containerd_bed, "events")
    sandbox_id = run_pod(cri_proxy, sb_cfg)
    seen: list[tuple[int, str]] = []
    try:
        cid = start_container(cri_proxy, sandbox_id, sb_cfg, container_config(containerd_bed, "app", ["sleep", "3600"]))
        cri_proxy.rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=1), timeout=30)
        wanted = {(pb.CONTAINER_CREATED_EVENT, cid), (pb.CONTAINER_STARTED_EVENT, cid),
                  (pb.CONTAINER_STOPPED_EVENT, cid)}
        deadline = time.monotonic() + 20
        while not wanted <= set(seen) and time.monotonic() < deadline:
            try:
                event = received.get(timeout=0.5)
            except queue.Empty:
                continue
            assert not isinstance(event, grpc.RpcError), f"event stream ended: {event}"
            seen.append((event.container_event_type, event.container_id))
            if event.container_id == cid:
                assert event.pod_sandbox_status.id == sandbox_id
        assert wanted <= set(seen), f"events seen: {seen}"
        assert (pb.CONTAINER_CREATED_EVENT, sandbox_id) in seen, "the sandbox's own events too"
    finally:
        stream.cancel()
        remove_pod(cri_proxy, sandbox_id)
        reader.join(timeout=5)


def test_unknown_method_and_old_api_are_forwarded(containerd_bed, cri_proxy, cri_direct):
    for path in ("/runtime.v1.RuntimeService/NoSuchMethod", "/foo.Bar/Baz"):
        direct = rpc_error(cri_direct.channel.unary_unary(path), b"")
        proxied = rpc_error(cri_proxy.channel.unary_unary(path), b"")
        assert (proxied.code(), proxied.details()) == (direct.code(), direct.details())
    old = "/runtime.v1alpha2.RuntimeService/Version"
    if _is_2x(containerd_bed):
        # containerd 2.0 dropped runtime.v1alpha2: its refusal comes back as it is.
        direct = rpc_error(cri_direct.channel.unary_unary(old), b"", timeout=10)
        proxied = rpc_error(cri_proxy.channel.unary_unary(old), b"", timeout=10)
        assert (proxied.code(), proxied.details()) == (direct.code(), direct.details())
        return
    # containerd 1.6 still serves runtime.v1alpha2: relayed untouched, byte for byte.
    answer = cri_proxy.channel.unary_unary(old)(b"", timeout=10)
    assert answer == cri_direct.channel.unary_unary(old)(b"", timeout=10)
    assert b"v1alpha2" in answer


class _PreOfThree:
    def stages(self):
        return [Stage.in_thread(m, Phase.PRE, self.pre) for m in ("RunPodSandbox", "CreateContainer", "StartContainer")]


class _Raising(_PreOfThree):
    name = "test-raising"

    def pre(self, call: CallContext) -> None:
        raise RuntimeError("deliberate failure")


class _Hanging(_PreOfThree):
    name = "test-hanging"

    def pre(self, call: CallContext) -> None:
        time.sleep(5)


@pytest.mark.parametrize("hook_cls", [_Raising, _Hanging], ids=["raising", "hanging"])
def test_misbehaving_hooks_never_fail_the_call(containerd_bed, tmp_path, hook_cls):
    bed = containerd_bed
    kn = InProcessKoordnode(tmp_path, str(bed.socket), extra_hooks=[hook_cls()]).start()
    cri = Cri(kn.listen)
    try:
        sb_cfg = sandbox_config(bed, f"hooks-{hook_cls.name}")
        started = time.monotonic()
        sandbox_id = run_pod(cri, sb_cfg)
        cid = start_container(cri, sandbox_id, sb_cfg, container_config(bed, "app", ["sleep", "3600"]))
        assert wait_container_state(cri, cid, pb.CONTAINER_RUNNING).state == pb.CONTAINER_RUNNING
        # Three hooked calls, each bounded by the 200 ms default timeout, not by the 5 s hang.
        assert time.monotonic() - started < 15
        failures = kn.call(lambda: dict(kn.daemon.chain.failures))
        kind = "error" if hook_cls is _Raising else "timeout"
        assert failures[(hook_cls.name, "pre", kind)] == 3
        remove_pod(cri, sandbox_id)
    finally:
        cri.close()
        kn.stop()


def test_state_survives_a_koordnode_restart(containerd_bed, tmp_path):
    bed = containerd_bed
    kn = KoordnodeProcess(tmp_path / "kn", str(bed.socket)).start()
    cri = Cri(kn.listen)
    labels = {"koordinator.sh/qosClass": "LS", "app": "web"}
    sb_cfg = sandbox_config(bed, "restart", labels=labels, annotations={"note": "kept"})
    sandbox_id = run_pod(cri, sb_cfg)
    try:
        cid = start_container(cri, sandbox_id, sb_cfg,
                              container_config(bed, "app", ["sleep", "3600"],
                                               resources={"cpu_shares": 512, "cpu_quota": 50000,
                                                          "cpu_period": 100000,
                                                          "memory_limit_in_bytes": 64 << 20}))
        before = kn.wait_rebuilt()
        pod_before = next(p for p in before["pods"] if p["sandbox_id"] == sandbox_id)
        assert pod_before["source"] == "cri"

        assert kn.stop() == 0
        assert not os.path.exists(kn.listen)  # socket removed on SIGTERM
        kn.start()
        after = kn.wait_rebuilt()
        pod = next(p for p in after["pods"] if p["sandbox_id"] == sandbox_id)
        assert pod["source"] == "recovered"
        assert (pod["name"], pod["namespace"], pod["uid"]) == ("restart", "default", sb_cfg.metadata.uid)
        assert pod["cgroup_parent"] == sb_cfg.linux.cgroup_parent
        assert pod["state"] == "ready"
        (container,) = pod["containers"]
        assert container["container_id"] == cid and container["state"] == "running"
        assert container["resources"]["cpu_shares"] == 512
        assert container["resources"]["cpu_quota"] == 50000
        assert container["resources"]["memory_limit_in_bytes"] == 64 << 20
        # Labels and annotations too (not in the status summary; ask the full record).
        assert '"restart"' in json.dumps(after)
    finally:
        remove_pod(cri, sandbox_id)
        cri.close()
        kn.stop()


def test_serves_while_backend_is_down_and_rebuilds_when_it_returns(containerd_bed, tmp_path):
    """Backend socket missing at start-up: calls fail as containerd's absence makes them fail,
    then the state is rebuilt once it answers."""
    bed = containerd_bed
    missing = tmp_path / "later.sock"
    kn = KoordnodeProcess(tmp_path / "kn", str(missing)).start()
    cri = Cri(kn.listen)
    try:
        err = rpc_error(cri.rt.Version, pb.VersionRequest(), timeout=5)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert kn.status()["rebuild_error"]
        os.symlink(bed.socket, missing)  # the runtime "comes back"
        st = kn.wait_rebuilt(30)
        assert st["rebuild_error"] is None
        # The channel may still be in its reconnect backoff from the failed call: wait it out.
        assert cri.rt.Version(pb.VersionRequest(), timeout=10, wait_for_ready=True).runtime_name == "containerd"
    finally:
        cri.close()
        kn.stop()


def test_sigint_stops_cleanly(containerd_bed, tmp_path):
    kn = KoordnodeProcess(tmp_path / "kn", str(containerd_bed.socket)).start()
    assert kn.stop(signal.SIGINT) == 0
    assert not os.path.exists(kn.listen) and not os.path.exists(kn.admin)


@pytest.mark.parametrize("size", [70_000, 400_000])
def test_intercepted_requests_larger_than_the_flow_control_window(containerd_bed, cri_proxy, size):
    """containerd (Go) keeps 64 KiB windows: a held request body larger than that must not stall."""
    sb = sandbox_config(containerd_bed, f"big-{size}", annotations={"big": "y" * size})
    started = time.monotonic()
    sandbox_id = run_pod(cri_proxy, sb)
    try:
        cid = start_container(cri_proxy, sandbox_id, sb, container_config(
            containerd_bed, "app", ["sleep", "3600"], annotations={"big": "z" * size}))
        status = cri_proxy.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid)).status
        assert len(status.annotations["big"]) == size
        assert time.monotonic() - started < 20
    finally:
        remove_pod(cri_proxy, sandbox_id)
