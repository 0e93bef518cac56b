"""koordnode in front of a real containerd: kubelet's calls must come back as containerd answers them."""

from __future__ import annotations

import json
import os
import signal
import time

import grpc
import pytest

from koordnode.cri import api_pb2 as pb
from koordnode.hooks.chain import CallContext, RuntimeHook
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

pytestmark = pytest.mark.e2e


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
        # containerd 1.6 does not implement these: UNIMPLEMENTED must come back as it is.
        (lambda c: next(iter(c.rt.GetContainerEvents(pb.GetEventsRequest())))),
        (lambda c: c.rt.RuntimeConfig(pb.RuntimeConfigRequest())),
    ]
    for case in cases:
        direct, proxied = rpc_error(case, cri_direct), rpc_error(case, cri_proxy)
        assert (proxied.code(), proxied.details()) == (direct.code(), direct.details())
    events = rpc_error(lambda: next(iter(cri_proxy.rt.GetContainerEvents(pb.GetEventsRequest()))))
    assert events.code() == grpc.StatusCode.UNIMPLEMENTED


def test_unknown_method_and_old_api_are_forwarded(containerd_bed, cri_proxy, cri_direct):
    for path in ("/runtime.v1.RuntimeService/NoSuchMethod", "/foo.Bar/Baz"):
        direct = rpc_error(cri_direct.channel.unary_unary(path), b"")
        proxied = rpc_error(cri_proxy.channel.unary_unary(path), b"")
        assert (proxied.code(), proxied.details()) == (direct.code(), direct.details())
    # containerd 1.6 still serves runtime.v1alpha2: relayed untouched, byte for byte.
    old = "/runtime.v1alpha2.RuntimeService/Version"
    answer = cri_proxy.channel.unary_unary(old)(b"", timeout=10)
    assert answer == cri_direct.channel.unary_unary(old)(b"", timeout=10)
    assert b"v1alpha2" in answer


class _Raising(RuntimeHook):
    name = "test-raising"
    methods = frozenset({"RunPodSandbox", "CreateContainer", "StartContainer"})

    def pre(self, call: CallContext) -> None:
        raise RuntimeError("deliberate failure")


class _Hanging(RuntimeHook):
    name = "test-hanging"
    methods = frozenset({"RunPodSandbox", "CreateContainer", "StartContainer"})

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
