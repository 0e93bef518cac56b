"""Checks for koordnode's CRI protocol model (protos/koordnode/cri/api.proto).

The proxy relies on three properties tested here:
  * the checked-in generated code matches the .proto (no hand edits, no drift);
  * fields we do not model survive a parse/serialise cycle unchanged;
  * the field numbers and rpc shapes agree with upstream CRI v1.
"""

from __future__ import annotations

import filecmp
import importlib.util
import subprocess
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from koordnode.cri import api_pb2
from support import api_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parent.parent
# Where the generator writes each file, under the repository root (or its output directory).
GENERATED_FILES = ("koordnode/cri/api_pb2.py", "koordnode/cri/api_pb2.pyi", "tests/support/api_pb2_grpc.py")


# ---------------------------------------------------------------------------
# Minimal protobuf wire-format encoder, so test inputs do not depend on the
# message classes under test.
# ---------------------------------------------------------------------------

WIRE_VARINT, WIRE_FIXED64, WIRE_LEN, WIRE_START_GROUP, WIRE_END_GROUP, WIRE_FIXED32 = range(6)


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low7 = value & 0x7F
        value >>= 7
        if value:
            out.append(low7 | 0x80)
        else:
            out.append(low7)
            return bytes(out)


def tag(field_number: int, wire_type: int) -> bytes:
    return varint(field_number << 3 | wire_type)


def varint_field(field_number: int, value: int) -> bytes:
    return tag(field_number, WIRE_VARINT) + varint(value)


def len_field(field_number: int, payload: bytes) -> bytes:
    return tag(field_number, WIRE_LEN) + varint(len(payload)) + payload


def fixed64_field(field_number: int, payload: bytes) -> bytes:
    assert len(payload) == 8
    return tag(field_number, WIRE_FIXED64) + payload


def fixed32_field(field_number: int, payload: bytes) -> bytes:
    assert len(payload) == 4
    return tag(field_number, WIRE_FIXED32) + payload


def group_field(field_number: int, body: bytes) -> bytes:
    return tag(field_number, WIRE_START_GROUP) + body + tag(field_number, WIRE_END_GROUP)


def roundtrip(message_class: type[Message], wire: bytes) -> bytes:
    return message_class.FromString(wire).SerializeToString()


# ---------------------------------------------------------------------------
# Generated code is in sync with the .proto
# ---------------------------------------------------------------------------


def test_checked_in_generated_code_matches_fresh_generation(tmp_path: Path) -> None:
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools is not installed")
    subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "gen-protos.sh"), str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    for name in GENERATED_FILES:
        fresh, checked_in = tmp_path / name, REPO_ROOT / name
        assert fresh.is_file(), f"generator did not produce {name}"
        assert filecmp.cmp(fresh, checked_in, shallow=False), (
            f"{name} is stale: run scripts/gen-protos.sh"
        )
    assert not (tmp_path / "koordnode" / "cri" / "api_pb2_grpc.py").exists()


def test_generated_module_is_built_from_our_proto() -> None:
    assert api_pb2.DESCRIPTOR.name == "koordnode/cri/api.proto"
    assert api_pb2.DESCRIPTOR.package == "runtime.v1"


# ---------------------------------------------------------------------------
# Unknown-field preservation
# ---------------------------------------------------------------------------


def test_empty_declared_message_roundtrips_upstream_fields_verbatim() -> None:
    # ExecRequest upstream: container_id=1, cmd=2 (repeated), tty=3, stdin=4,
    # stdout=5, stderr=6, audit_request_id=7. We declare it empty.
    wire = (
        len_field(1, b"c0ffee")
        + len_field(2, b"sh")
        + len_field(2, b"-c")
        + varint_field(3, 1)
        + varint_field(5, 1)
        + len_field(7, b"audit-42")
    )
    parsed = api_pb2.ExecRequest.FromString(wire)
    assert parsed.ListFields() == [], "ExecRequest is expected to stay opaque"
    assert parsed.SerializeToString() == wire


def test_empty_declared_message_nested_in_modeled_message_survives() -> None:
    # PullImageRequest.auth is an AuthConfig, which we keep opaque.
    auth = len_field(1, b"user") + len_field(2, b"s3cret") + len_field(6, b"tok")
    wire = len_field(1, len_field(1, b"busybox:latest")) + len_field(2, auth)
    parsed = api_pb2.PullImageRequest.FromString(wire)
    assert parsed.image.image == "busybox:latest"
    assert parsed.HasField("auth")
    assert b"s3cret" not in str(parsed).encode(), "credentials must not be decoded"
    assert parsed.SerializeToString() == wire


def test_modeled_message_keeps_unknown_fields_of_every_wire_type() -> None:
    # Known fields first, in field-number order (as Go and upb emit them),
    # then fields our model lacks, covering every wire type.
    wire = (
        varint_field(1, 100_000)  # cpu_period
        + varint_field(2, 50_000)  # cpu_quota
        + varint_field(3, 512)  # cpu_shares
        + len_field(6, b"0-3")  # cpuset_cpus
        + len_field(8, len_field(1, b"2MB") + varint_field(2, 1 << 21))  # hugepage_limits
        + len_field(9, len_field(1, b"memory.high") + len_field(2, b"max"))  # unified
        + varint_field(10, 1 << 30)  # memory_swap_limit_in_bytes
        + varint_field(11, 7)
        + fixed64_field(12, b"\x01\x02\x03\x04\x05\x06\x07\x08")
        + len_field(13, b"future")
        + fixed32_field(14, b"\x0a\x0b\x0c\x0d")
        + group_field(15, varint_field(1, 3))
        + varint_field(536_870_911, 1)  # largest legal field number
    )
    parsed = api_pb2.LinuxContainerResources.FromString(wire)
    assert parsed.cpu_shares == 512
    assert parsed.unified == {"memory.high": "max"}
    assert parsed.hugepage_limits[0].limit == 1 << 21
    assert parsed.memory_swap_limit_in_bytes == 1 << 30
    assert parsed.SerializeToString() == wire


def test_container_config_keeps_unknown_fields_at_every_level() -> None:
    resources = varint_field(3, 2) + varint_field(4, 64 << 20) + varint_field(42, 9)
    linux = len_field(1, resources) + len_field(2, varint_field(2, 1) + len_field(99, b"sec"))
    wire = (
        len_field(1, len_field(1, b"app") + varint_field(2, 3))  # metadata
        + len_field(2, len_field(1, b"docker.io/library/busybox:1.36"))  # image
        + len_field(3, b"/bin/sleep")  # command
        + len_field(4, b"infinity")  # args
        + len_field(6, len_field(1, b"K") + len_field(2, b"V") + len_field(3, b"x"))  # envs
        + len_field(11, b"app/3.log")  # log_path
        + len_field(15, linux)  # linux
        + len_field(17, len_field(1, b"vendor.com/gpu=0"))  # CDI_devices
        + varint_field(18, 23)  # stop_signal = SIGTERM
        + len_field(60, b"a field from a future kubelet")
    )
    parsed = api_pb2.ContainerConfig.FromString(wire)
    assert parsed.metadata.name == "app"
    assert parsed.metadata.attempt == 3
    assert parsed.linux.resources.memory_limit_in_bytes == 64 << 20
    assert parsed.linux.security_context.privileged
    assert parsed.stop_signal == api_pb2.SIGTERM
    assert parsed.SerializeToString() == wire


def _future_pool() -> descriptor_pool.DescriptorPool:
    """A throwaway schema: our proto plus fields a newer CRI might carry."""
    file_proto = descriptor_pb2.FileDescriptorProto()
    api_pb2.DESCRIPTOR.CopyToProto(file_proto)
    file_proto.name = "future/api.proto"
    messages = {m.name: m for m in file_proto.message_type}
    T = descriptor_pb2.FieldDescriptorProto
    additions = {
        "LinuxContainerResources": [("future_knob", 11, T.TYPE_INT64, T.LABEL_OPTIONAL)],
        "ContainerConfig": [("future_note", 40, T.TYPE_STRING, T.LABEL_OPTIONAL)],
        "ExecRequest": [
            ("container_id", 1, T.TYPE_STRING, T.LABEL_OPTIONAL),
            ("cmd", 2, T.TYPE_STRING, T.LABEL_REPEATED),
            ("tty", 3, T.TYPE_BOOL, T.LABEL_OPTIONAL),
        ],
    }
    for message_name, fields in additions.items():
        for name, number, field_type, label in fields:
            messages[message_name].field.add(name=name, number=number, type=field_type, label=label)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    return pool


def _future_class(pool: descriptor_pool.DescriptorPool, name: str) -> type[Message]:
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"runtime.v1.{name}"))


def test_unknown_fields_survive_when_the_proxy_rewrites_known_fields() -> None:
    pool = _future_pool()
    FutureConfig = _future_class(pool, "ContainerConfig")
    sent = FutureConfig()
    sent.metadata.name = "app"
    sent.linux.resources.cpu_shares = 1024
    sent.linux.resources.future_knob = -5
    sent.future_note = "kept"

    ours = api_pb2.ContainerConfig.FromString(sent.SerializeToString())
    ours.linux.resources.cpu_shares = 2  # what a BE hook would do
    ours.linux.resources.unified["cpu.idle"] = "1"

    received = FutureConfig.FromString(ours.SerializeToString())
    assert received.linux.resources.cpu_shares == 2
    assert received.linux.resources.unified == {"cpu.idle": "1"}
    assert received.linux.resources.future_knob == -5
    assert received.future_note == "kept"


def test_empty_declared_message_roundtrips_through_a_real_schema() -> None:
    FutureExec = _future_class(_future_pool(), "ExecRequest")
    wire = FutureExec(container_id="abc", cmd=["ls", "-l"], tty=True).SerializeToString()
    assert roundtrip(api_pb2.ExecRequest, wire) == wire
    assert FutureExec.FromString(roundtrip(api_pb2.ExecRequest, wire)).cmd == ["ls", "-l"]


_unknown_field = st.one_of(
    st.tuples(st.integers(11, 10_000), st.integers(0, 2**64 - 1)).map(lambda t: varint_field(*t)),
    st.tuples(st.integers(11, 10_000), st.binary(min_size=8, max_size=8)).map(
        lambda t: fixed64_field(*t)
    ),
    st.tuples(st.integers(11, 10_000), st.binary(max_size=40)).map(lambda t: len_field(*t)),
    st.tuples(st.integers(11, 10_000), st.binary(min_size=4, max_size=4)).map(
        lambda t: fixed32_field(*t)
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    cpu_quota=st.integers(-(2**63), 2**63 - 1),
    cpuset=st.text(max_size=12),
    unknown=st.lists(_unknown_field, max_size=6),
)
def test_any_trailing_unknown_fields_roundtrip(cpu_quota: int, cpuset: str, unknown: list[bytes]) -> None:
    known = api_pb2.LinuxContainerResources(cpu_quota=cpu_quota, cpuset_cpus=cpuset).SerializeToString()
    wire = known + b"".join(unknown)
    assert roundtrip(api_pb2.LinuxContainerResources, wire) == wire


# ---------------------------------------------------------------------------
# Field numbers and service shapes agree with upstream CRI v1
# ---------------------------------------------------------------------------


def field_numbers(message_class: type[Message]) -> dict[str, int]:
    return {f.name: f.number for f in message_class.DESCRIPTOR.fields}


def test_linux_container_resources_is_fully_modeled() -> None:
    assert field_numbers(api_pb2.LinuxContainerResources) == {
        "cpu_period": 1,
        "cpu_quota": 2,
        "cpu_shares": 3,
        "memory_limit_in_bytes": 4,
        "oom_score_adj": 5,
        "cpuset_cpus": 6,
        "cpuset_mems": 7,
        "hugepage_limits": 8,
        "unified": 9,
        "memory_swap_limit_in_bytes": 10,
    }
    unified = api_pb2.LinuxContainerResources.DESCRIPTOR.fields_by_name["unified"]
    assert unified.message_type.GetOptions().map_entry


@pytest.mark.parametrize(
    ("message_class", "expected"),
    [
        (api_pb2.PodSandboxConfig, {"metadata": 1, "labels": 6, "annotations": 7, "linux": 8}),
        (api_pb2.LinuxPodSandboxConfig, {"cgroup_parent": 1, "sysctls": 3, "overhead": 4, "resources": 5}),
        (api_pb2.PodSandboxMetadata, {"name": 1, "uid": 2, "namespace": 3, "attempt": 4}),
        (api_pb2.RunPodSandboxRequest, {"config": 1, "runtime_handler": 2}),
        (api_pb2.PodSandboxNetworkStatus, {"ip": 1, "additional_ips": 2}),
        (api_pb2.PodSandboxStatusResponse, {"status": 1, "info": 2}),
        (api_pb2.ContainerConfig, {"labels": 9, "annotations": 10, "log_path": 11, "linux": 15}),
        (api_pb2.LinuxContainerConfig, {"resources": 1, "security_context": 2}),
        (api_pb2.CreateContainerRequest, {"pod_sandbox_id": 1, "config": 2, "sandbox_config": 3}),
        (api_pb2.ContainerStatus, {"state": 3, "labels": 12, "annotations": 13, "resources": 16}),
        (api_pb2.ContainerStatusResponse, {"status": 1, "info": 2}),
        (api_pb2.ContainerResources, {"linux": 1}),
        (api_pb2.UpdateContainerResourcesRequest, {"container_id": 1, "linux": 2, "annotations": 4}),
        (api_pb2.UpdatePodSandboxResourcesRequest, {"pod_sandbox_id": 1, "overhead": 2, "resources": 3}),
        (api_pb2.ImageSpec, {"image": 1, "annotations": 2, "user_specified_image": 18}),
        (
            api_pb2.ContainerEventResponse,
            {"container_id": 1, "container_event_type": 2, "created_at": 3, "pod_sandbox_status": 4},
        ),
        (api_pb2.StatusResponse, {"status": 1, "info": 2}),
    ],
)
def test_known_field_numbers(message_class: type[Message], expected: dict[str, int]) -> None:
    actual = field_numbers(message_class)
    assert {name: actual.get(name) for name in expected} == expected


def test_enum_values_match_upstream() -> None:
    assert api_pb2.ContainerState.Value("CONTAINER_RUNNING") == 1
    assert api_pb2.ContainerState.Value("CONTAINER_EXITED") == 2
    assert api_pb2.PodSandboxState.Value("SANDBOX_NOTREADY") == 1
    assert api_pb2.ContainerEventType.Value("CONTAINER_DELETED_EVENT") == 3
    assert api_pb2.NamespaceMode.Value("NODE") == 2


def test_messages_the_proxy_reads_are_modeled_not_opaque() -> None:
    for name in (
        "PodSandboxConfig",
        "LinuxPodSandboxConfig",
        "ContainerConfig",
        "LinuxContainerConfig",
        "LinuxContainerResources",
        "ContainerStatus",
        "PodSandboxStatus",
        "ListPodSandboxResponse",
        "ListContainersResponse",
        "ContainerEventResponse",
        "StatusResponse",
        "ListImagesResponse",
    ):
        assert getattr(api_pb2, name).DESCRIPTOR.fields, f"{name} must be modeled"


# (request, response, server_streaming); no CRI rpc streams from the client.
RUNTIME_METHODS = {
    "Version": ("VersionRequest", "VersionResponse", False),
    "RunPodSandbox": ("RunPodSandboxRequest", "RunPodSandboxResponse", False),
    "StopPodSandbox": ("StopPodSandboxRequest", "StopPodSandboxResponse", False),
    "RemovePodSandbox": ("RemovePodSandboxRequest", "RemovePodSandboxResponse", False),
    "PodSandboxStatus": ("PodSandboxStatusRequest", "PodSandboxStatusResponse", False),
    "ListPodSandbox": ("ListPodSandboxRequest", "ListPodSandboxResponse", False),
    "StreamPodSandboxes": ("StreamPodSandboxesRequest", "StreamPodSandboxesResponse", True),
    "CreateContainer": ("CreateContainerRequest", "CreateContainerResponse", False),
    "StartContainer": ("StartContainerRequest", "StartContainerResponse", False),
    "StopContainer": ("StopContainerRequest", "StopContainerResponse", False),
    "RemoveContainer": ("RemoveContainerRequest", "RemoveContainerResponse", False),
    "ListContainers": ("ListContainersRequest", "ListContainersResponse", False),
    "StreamContainers": ("StreamContainersRequest", "StreamContainersResponse", True),
    "ContainerStatus": ("ContainerStatusRequest", "ContainerStatusResponse", False),
    "UpdateContainerResources": ("UpdateContainerResourcesRequest", "UpdateContainerResourcesResponse", False),
    "ReopenContainerLog": ("ReopenContainerLogRequest", "ReopenContainerLogResponse", False),
    "ExecSync": ("ExecSyncRequest", "ExecSyncResponse", False),
    "Exec": ("ExecRequest", "ExecResponse", False),
    "Attach": ("AttachRequest", "AttachResponse", False),
    "PortForward": ("PortForwardRequest", "PortForwardResponse", False),
    "ContainerStats": ("ContainerStatsRequest", "ContainerStatsResponse", False),
    "ListContainerStats": ("ListContainerStatsRequest", "ListContainerStatsResponse", False),
    "StreamContainerStats": ("StreamContainerStatsRequest", "StreamContainerStatsResponse", True),
    "PodSandboxStats": ("PodSandboxStatsRequest", "PodSandboxStatsResponse", False),
    "ListPodSandboxStats": ("ListPodSandboxStatsRequest", "ListPodSandboxStatsResponse", False),
    "StreamPodSandboxStats": ("StreamPodSandboxStatsRequest", "StreamPodSandboxStatsResponse", True),
    "UpdateRuntimeConfig": ("UpdateRuntimeConfigRequest", "UpdateRuntimeConfigResponse", False),
    "Status": ("StatusRequest", "StatusResponse", False),
    "CheckpointContainer": ("CheckpointContainerRequest", "CheckpointContainerResponse", False),
    "GetContainerEvents": ("GetEventsRequest", "ContainerEventResponse", True),
    "ListMetricDescriptors": ("ListMetricDescriptorsRequest", "ListMetricDescriptorsResponse", False),
    "ListPodSandboxMetrics": ("ListPodSandboxMetricsRequest", "ListPodSandboxMetricsResponse", False),
    "StreamPodSandboxMetrics": ("StreamPodSandboxMetricsRequest", "StreamPodSandboxMetricsResponse", True),
    "RuntimeConfig": ("RuntimeConfigRequest", "RuntimeConfigResponse", False),
    "UpdatePodSandboxResources": (
        "UpdatePodSandboxResourcesRequest",
        "UpdatePodSandboxResourcesResponse",
        False,
    ),
}

IMAGE_METHODS = {
    "ListImages": ("ListImagesRequest", "ListImagesResponse", False),
    "StreamImages": ("StreamImagesRequest", "StreamImagesResponse", True),
    "ImageStatus": ("ImageStatusRequest", "ImageStatusResponse", False),
    "PullImage": ("PullImageRequest", "PullImageResponse", False),
    "RemoveImage": ("RemoveImageRequest", "RemoveImageResponse", False),
    "ImageFsInfo": ("ImageFsInfoRequest", "ImageFsInfoResponse", False),
}


@pytest.mark.parametrize(
    ("service_name", "expected"),
    [("RuntimeService", RUNTIME_METHODS), ("ImageService", IMAGE_METHODS)],
)
def test_service_lists_every_method_with_its_shape(
    service_name: str, expected: dict[str, tuple[str, str, bool]]
) -> None:
    service = api_pb2.DESCRIPTOR.services_by_name[service_name]
    assert service.full_name == f"runtime.v1.{service_name}"
    actual = {
        m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in service.methods
    }
    assert actual == expected
    assert not any(m.client_streaming for m in service.methods)


class _RecordingChannel:
    """Stands in for grpc.Channel and records which paths a stub binds."""

    def __init__(self) -> None:
        self.bound: dict[str, str] = {}

    def _bind(self, kind: str):
        def bind(path: str, *args: object, **kwargs: object) -> str:
            self.bound[path] = kind
            return path

        return bind

    def __getattr__(self, kind: str):
        if kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            return self._bind(kind)
        raise AttributeError(kind)


@pytest.mark.parametrize(
    ("stub_class", "service_name", "expected"),
    [
        (api_pb2_grpc.RuntimeServiceStub, "RuntimeService", RUNTIME_METHODS),
        (api_pb2_grpc.ImageServiceStub, "ImageService", IMAGE_METHODS),
    ],
)
def test_stubs_use_upstream_grpc_paths(
    stub_class: type, service_name: str, expected: dict[str, tuple[str, str, bool]]
) -> None:
    channel = _RecordingChannel()
    stub_class(channel)
    assert channel.bound == {
        f"/runtime.v1.{service_name}/{method}": "unary_stream" if streams else "unary_unary"
        for method, (_, _, streams) in expected.items()
    }
