"""A CRI client that is not ours sees the same results through koordnode as directly against containerd.

The client is tests/js_client/cri_client.js: grpc-js on Node's own HTTP/2 stack (nghttp2), with
identity serializers, so neither our proto nor our gRPC/HTTP/2 code is on the client side. This
file chooses the request bytes (built with our generated classes, which are only a convenient
encoder here) and compares what came back: status code, details, metadata keys and the raw
response bytes. Only where containerd itself answers differently from one call to the next
(Go map order: the ListImages list, the verbose Status info map) are decoded messages compared.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from koordnode.cri import api_pb2 as pb
from support.cri import container_config, sandbox_config
from testbed.fixtures import skip_or_fail_in_ci

pytestmark = pytest.mark.e2e

JS_DIR = Path(__file__).resolve().parent / "js_client"
CLIENT_SCRIPT = JS_DIR / "cri_client.js"
RT = "/runtime.v1.RuntimeService/"
IMG = "/runtime.v1.ImageService/"
OK, NOT_FOUND, UNIMPLEMENTED = 0, 5, 12


@dataclass(frozen=True)
class Call:
    path: str
    request: bytes = b""
    kind: str = "unary"
    deadline_ms: int = 10_000
    # For answers whose bytes containerd itself varies from call to call (Go map order):
    # compare them decoded as this message class instead of byte for byte.
    decoded_as: type | None = None

    def to_json(self) -> dict:
        return {"path": self.path, "request_b64": base64.b64encode(self.request).decode(),
                "kind": self.kind, "deadline_ms": self.deadline_ms}


@dataclass
class Result:
    code: int
    code_name: str
    details: str
    header_keys: list[str]
    trailer_keys: list[str]
    response: bytes | None = None
    messages: list[bytes] = field(default_factory=list)

    @classmethod
    def from_json(cls, raw: dict) -> Result:
        response = raw.get("response_b64")
        return cls(
            code=raw["code"], code_name=raw["code_name"], details=raw["details"],
            header_keys=raw["header_keys"], trailer_keys=raw["trailer_keys"],
            response=None if response is None else base64.b64decode(response),
            messages=[base64.b64decode(m) for m in raw.get("messages_b64", [])],
        )

    def decode(self, cls):
        assert self.code == OK, f"{self.code_name}: {self.details}"
        return cls.FromString(self.response)


def call(method: str, message=None, **kwargs) -> Call:
    return Call(method, b"" if message is None else message.SerializeToString(), **kwargs)


class ForeignClient:
    def __init__(self, node: str) -> None:
        self.node = node

    def run(self, address: str, calls: list[Call]) -> list[Result]:
        target = address if address.startswith("unix:") else f"unix://{address}"
        budget_s = sum(c.deadline_ms for c in calls) / 1000 + 30
        done = subprocess.run(
            [self.node, str(CLIENT_SCRIPT), target],
            input=json.dumps([c.to_json() for c in calls]).encode(),
            capture_output=True, timeout=budget_s, cwd=JS_DIR,
        )
        assert done.returncode == 0, f"cri_client.js exited {done.returncode}: {done.stderr.decode(errors='replace')}"
        results = [Result.from_json(r) for r in json.loads(done.stdout)]
        assert len(results) == len(calls)
        return results

    def one(self, address: str, c: Call) -> Result:
        return self.run(address, [c])[0]


@pytest.fixture(scope="module")
def js() -> ForeignClient:
    node = shutil.which("node")
    problem = None
    if node is None:
        problem = "`node` is not on PATH"
    elif not (JS_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        problem = f"grpc-js is not installed (run: npm ci --prefix {JS_DIR})"
    if problem:
        skip_or_fail_in_ci(f"foreign CRI client unavailable: {problem}")
    return ForeignClient(node)


def assert_same(calls: list[Call], direct: list[Result], proxied: list[Result]) -> None:
    for c, d, p in zip(calls, direct, proxied, strict=True):
        if c.decoded_as is not None and d.code == OK:
            assert p.decode(c.decoded_as) == d.decode(c.decoded_as), f"{c.path}: koordnode answered differently"
            p, d = dataclasses.replace(p, response=None), dataclasses.replace(d, response=None)
        assert p == d, f"{c.path}: koordnode answered differently from containerd"


def remove_pod_if_left(cri_direct, sandbox_id: str) -> None:
    if sandbox_id in [p.id for p in cri_direct.rt.ListPodSandbox(pb.ListPodSandboxRequest()).items]:
        cri_direct.rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=60)
        cri_direct.rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=60)


def test_stable_answers_are_identical_byte_for_byte(js, containerd_bed, koordnode):
    bed = containerd_bed
    calls = [
        call(RT + "Version", pb.VersionRequest(version="v1")),
        call(RT + "Status", pb.StatusRequest()),
        # Its info map is marshalled in Go map order.
        call(RT + "Status", pb.StatusRequest(verbose=True), decoded_as=pb.StatusResponse),
        call(IMG + "ImageStatus", pb.ImageStatusRequest(image=pb.ImageSpec(image=bed.busybox_image), verbose=True)),
        call(IMG + "ImageStatus", pb.ImageStatusRequest(image=pb.ImageSpec(image="no/such:image"))),
        # Errors, on intercepted methods (StartContainer, StopPodSandbox) and relayed ones.
        call(RT + "ContainerStatus", pb.ContainerStatusRequest(container_id="does-not-exist")),
        call(RT + "StartContainer", pb.StartContainerRequest(container_id="does-not-exist")),
        call(RT + "StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id="does-not-exist")),
        call(RT + "PodSandboxStatus", pb.PodSandboxStatusRequest(pod_sandbox_id="does-not-exist")),
        call(IMG + "PullImage", pb.PullImageRequest(image=pb.ImageSpec(image="in:valid::ref"))),
        # Bytes that are no protobuf at all: an intercepted method must fail exactly as containerd fails it.
        Call(RT + "RunPodSandbox", b"\xff\xff\xff"),
        Call(RT + "Version", b"\x0a\x10short"),
        # Not implemented by containerd 1.6: UNIMPLEMENTED must come back as it is, stream included.
        call(RT + "GetContainerEvents", pb.GetEventsRequest(), kind="server_stream", deadline_ms=5_000),
        call(RT + "RuntimeConfig", pb.RuntimeConfigRequest()),
        # Methods and services nobody has heard of, and the older API.
        Call(RT + "NoSuchMethod", b""),
        Call("/foo.Bar/Baz", b""),
        Call("/runtime.v1alpha2.RuntimeService/Version", b""),
    ]
    direct = js.run(bed.address, calls)
    proxied = js.run(koordnode.listen, calls)
    assert_same(calls, direct, proxied)

    # And what came back is what a CRI client expects, not two equal failures.
    version, status, status_verbose, image, no_image, *rest = proxied
    assert version.decode(pb.VersionResponse).runtime_name == "containerd"
    conditions = {c.type: c.status for c in status.decode(pb.StatusResponse).status.conditions}
    assert conditions == {"RuntimeReady": True, "NetworkReady": True}
    assert status_verbose.decode(pb.StatusResponse).info
    assert bed.busybox_image in image.decode(pb.ImageStatusResponse).image.repo_tags
    assert not no_image.decode(pb.ImageStatusResponse).HasField("image")
    by_path = dict(zip((c.path for c in calls[5:]), rest, strict=True))
    assert by_path[RT + "ContainerStatus"].code == NOT_FOUND
    assert "does-not-exist" in by_path[RT + "ContainerStatus"].details
    assert by_path[RT + "StartContainer"].code == NOT_FOUND
    assert by_path[RT + "RunPodSandbox"].code not in (OK, UNIMPLEMENTED)
    events = by_path[RT + "GetContainerEvents"]
    assert (events.code, events.messages) == (UNIMPLEMENTED, [])
    assert by_path[RT + "NoSuchMethod"].code == UNIMPLEMENTED
    assert by_path["/foo.Bar/Baz"].code == UNIMPLEMENTED
    old = by_path["/runtime.v1alpha2.RuntimeService/Version"]
    assert old.code == OK and b"v1alpha2" in old.response


def test_list_images_same_set(js, containerd_bed, koordnode):
    # containerd lists images in Go map order, which changes from call to call: compare as sets.
    c = call(IMG + "ListImages", pb.ListImagesRequest())
    direct, proxied = js.one(containerd_bed.address, c), js.one(koordnode.listen, c)

    def images(r: Result) -> list[bytes]:
        return sorted(i.SerializeToString(deterministic=True) for i in r.decode(pb.ListImagesResponse).images)

    assert images(proxied) == images(direct)
    assert (proxied.code, proxied.header_keys, proxied.trailer_keys) == (direct.code, direct.header_keys, direct.trailer_keys)
    tags = {t for i in proxied.decode(pb.ListImagesResponse).images for t in i.repo_tags}
    assert {containerd_bed.busybox_image, containerd_bed.pause_image} <= tags


def test_pod_lifecycle_by_the_foreign_client_through_koordnode(js, containerd_bed, koordnode, cri_direct):
    bed, via = containerd_bed, koordnode.listen
    sb_cfg = sandbox_config(bed, "foreign-" + uuid.uuid4().hex[:6], annotations={"note": "from-node"})
    run = js.one(via, call(RT + "RunPodSandbox", pb.RunPodSandboxRequest(config=sb_cfg), deadline_ms=60_000))
    sandbox_id = run.decode(pb.RunPodSandboxResponse).pod_sandbox_id
    try:
        cfg = container_config(bed, "app", ["sleep", "3600"], resources={"cpu_shares": 256})
        create = js.one(via, call(RT + "CreateContainer",
                                  pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=cfg, sandbox_config=sb_cfg),
                                  deadline_ms=60_000))
        cid = create.decode(pb.CreateContainerResponse).container_id
        start, status, exec_sync = js.run(via, [
            call(RT + "StartContainer", pb.StartContainerRequest(container_id=cid), deadline_ms=60_000),
            call(RT + "ContainerStatus", pb.ContainerStatusRequest(container_id=cid)),
            call(RT + "ExecSync", pb.ExecSyncRequest(
                container_id=cid, cmd=["sh", "-c", "echo out-$((6*7)); echo err >&2; exit 3"], timeout=10),
                deadline_ms=30_000),
        ])
        assert start.decode(pb.StartContainerResponse) == pb.StartContainerResponse()
        assert status.decode(pb.ContainerStatusResponse).status.state == pb.CONTAINER_RUNNING
        executed = exec_sync.decode(pb.ExecSyncResponse)
        assert (executed.stdout, executed.stderr, executed.exit_code) == (b"out-42\n", b"err\n", 3)

        # While it runs, containerd and koordnode give the foreign client the same bytes. (Byte
        # equality holds because every map here has at most one key: containerd marshals maps
        # in Go map order, see Status above.)
        observe = [
            call(RT + "ContainerStatus", pb.ContainerStatusRequest(container_id=cid, verbose=True)),
            call(RT + "PodSandboxStatus", pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id)),
            call(RT + "ListContainers", pb.ListContainersRequest(
                filter=pb.ContainerFilter(pod_sandbox_id=sandbox_id))),
            call(RT + "ListPodSandbox", pb.ListPodSandboxRequest(filter=pb.PodSandboxFilter(id=sandbox_id))),
        ]
        direct = js.run(bed.address, observe)
        proxied = js.run(via, observe)
        assert_same(observe, direct, proxied)
        container_status, sandbox_status, containers, sandboxes = proxied
        assert container_status.decode(pb.ContainerStatusResponse).status.id == cid
        assert sandbox_status.decode(pb.PodSandboxStatusResponse).status.annotations["note"] == "from-node"
        assert [c.id for c in containers.decode(pb.ListContainersResponse).containers] == [cid]
        assert [p.id for p in sandboxes.decode(pb.ListPodSandboxResponse).items] == [sandbox_id]

        teardown = js.run(via, [
            call(RT + "StopContainer", pb.StopContainerRequest(container_id=cid, timeout=5), deadline_ms=30_000),
            call(RT + "ContainerStatus", pb.ContainerStatusRequest(container_id=cid)),
            call(RT + "RemoveContainer", pb.RemoveContainerRequest(container_id=cid), deadline_ms=30_000),
            call(RT + "StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), deadline_ms=60_000),
            call(RT + "RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), deadline_ms=60_000),
        ])
        assert [r.code_name for r in teardown] == ["OK"] * 5, [(r.code_name, r.details) for r in teardown]
        assert teardown[1].decode(pb.ContainerStatusResponse).status.state == pb.CONTAINER_EXITED
    finally:
        # Only matters when the foreign client failed half-way: containerd must not keep the pod.
        remove_pod_if_left(cri_direct, sandbox_id)

    # Gone, and both ways agree on how gone it is.
    after = [
        call(RT + "ContainerStatus", pb.ContainerStatusRequest(container_id=cid)),
        call(RT + "PodSandboxStatus", pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id)),
        call(RT + "ListPodSandbox", pb.ListPodSandboxRequest(filter=pb.PodSandboxFilter(id=sandbox_id))),
    ]
    direct, proxied = js.run(bed.address, after), js.run(via, after)
    assert_same(after, direct, proxied)
    assert [r.code for r in proxied[:2]] == [NOT_FOUND, NOT_FOUND]
    assert list(proxied[2].decode(pb.ListPodSandboxResponse).items) == []


# Beyond the 65,535-byte default HTTP/2 flow-control window, in several DATA frames: the sender
# stalls unless the receiver returns window credit for what it has taken so far.
BIG = "x" * 150_000


def test_messages_larger_than_an_http2_window_relayed(js, containerd_bed, koordnode, cri_direct):
    bed, via = containerd_bed, koordnode.listen
    # A big request: containerd parses the huge image name and answers (no such image).
    big_request = call(IMG + "ImageStatus", pb.ImageStatusRequest(image=pb.ImageSpec(image=BIG)), deadline_ms=20_000)
    direct, proxied = js.one(bed.address, big_request), js.one(via, big_request)
    assert_same([big_request], [direct], [proxied])
    assert proxied.code == OK

    # A big response: a pod made directly with a big annotation, whose status carries it back.
    sb_cfg = sandbox_config(bed, "foreign-bigresp-" + uuid.uuid4().hex[:6], annotations={"big-note": BIG})
    sandbox_id = cri_direct.rt.RunPodSandbox(pb.RunPodSandboxRequest(config=sb_cfg), timeout=60).pod_sandbox_id
    try:
        status = call(RT + "PodSandboxStatus", pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id))
        direct, proxied = js.one(bed.address, status), js.one(via, status)
        assert_same([status], [direct], [proxied])
        assert proxied.decode(pb.PodSandboxStatusResponse).status.annotations["big-note"] == BIG
    finally:
        remove_pod_if_left(cri_direct, sandbox_id)


def test_intercepted_request_larger_than_an_http2_window(js, containerd_bed, koordnode, cri_direct):
    """koordnode holds an intercepted request body back for the hooks until it is complete, so it
    must give the client the window credit the backend cannot give for bytes it has not seen."""
    bed, via = containerd_bed, koordnode.listen
    sb_cfg = sandbox_config(bed, "foreign-bigreq-" + uuid.uuid4().hex[:6], annotations={"big-note": BIG})
    run = js.one(via, call(RT + "RunPodSandbox", pb.RunPodSandboxRequest(config=sb_cfg), deadline_ms=20_000))
    sandbox_id = run.decode(pb.RunPodSandboxResponse).pod_sandbox_id if run.code == OK else ""
    try:
        assert run.code == OK, f"RunPodSandbox of {len(BIG)} bytes through koordnode: {run.code_name}: {run.details}"
        status = js.one(via, call(RT + "PodSandboxStatus", pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id)))
        assert status.decode(pb.PodSandboxStatusResponse).status.annotations["big-note"] == BIG
    finally:
        if sandbox_id:
            remove_pod_if_left(cri_direct, sandbox_id)
