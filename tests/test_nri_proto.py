"""koordnode's NRI protocol model (protos/koordnode/nri/): generated code in sync, upstream
field numbers and service names, unknown fields kept."""

from __future__ import annotations

import filecmp
import importlib.util
import subprocess
from pathlib import Path

import pytest

from koordnode.nri import api_pb2, ttrpc_pb2

REPO_ROOT = Path(__file__).resolve().parent.parent
GENERATED = ("api_pb2.py", "api_pb2.pyi", "ttrpc_pb2.py", "ttrpc_pb2.pyi")

# Facts from containerd/nri pkg/api/api.proto and containerd/ttrpc request.proto.
UPSTREAM_FIELDS = {
    "RegisterPluginRequest": {"plugin_name": 1, "plugin_idx": 2},
    "ConfigureRequest": {"config": 1, "runtime_name": 2, "runtime_version": 3, "registration_timeout": 4,
                         "request_timeout": 5},
    "ConfigureResponse": {"events": 2},
    "SynchronizeRequest": {"pods": 1, "containers": 2, "more": 3},
    "SynchronizeResponse": {"update": 1, "more": 2},
    "CreateContainerRequest": {"pod": 1, "container": 2},
    "CreateContainerResponse": {"adjust": 1, "update": 2, "evict": 3},
    "UpdateContainerRequest": {"pod": 1, "container": 2, "linux_resources": 3},
    "UpdateContainerResponse": {"update": 1, "evict": 2},
    "StopContainerResponse": {"update": 1},
    "StateChangeEvent": {"event": 1, "pod": 2, "container": 3},
    "UpdateContainersRequest": {"update": 1, "evict": 2},
    "UpdateContainersResponse": {"failed": 1},
    "PodSandbox": {"id": 1, "name": 2, "uid": 3, "namespace": 4, "labels": 5, "annotations": 6,
                   "runtime_handler": 7, "linux": 8, "pid": 9, "ips": 10},
    "LinuxPodSandbox": {"pod_overhead": 1, "pod_resources": 2, "cgroup_parent": 3, "cgroups_path": 4},
    "Container": {"id": 1, "pod_sandbox_id": 2, "name": 3, "state": 4, "labels": 5, "annotations": 6,
                  "linux": 11, "pid": 12},
    "LinuxContainer": {"resources": 3, "oom_score_adj": 4, "cgroups_path": 5},
    "LinuxResources": {"memory": 1, "cpu": 2, "blockio_class": 4, "rdt_class": 5, "unified": 6},
    "LinuxMemory": {"limit": 1, "reservation": 2, "swap": 3},
    "LinuxCPU": {"shares": 1, "quota": 2, "period": 3, "cpus": 6, "mems": 7},
    "ContainerAdjustment": {"annotations": 2, "linux": 6},
    "LinuxContainerAdjustment": {"resources": 2, "oom_score_adj": 4},
    "ContainerUpdate": {"container_id": 1, "linux": 2, "ignore_failure": 3},
    "LinuxContainerUpdate": {"resources": 1},
}
UPSTREAM_EVENTS = {"RUN_POD_SANDBOX": 1, "STOP_POD_SANDBOX": 2, "REMOVE_POD_SANDBOX": 3, "CREATE_CONTAINER": 4,
                   "POST_CREATE_CONTAINER": 5, "START_CONTAINER": 6, "POST_START_CONTAINER": 7,
                   "UPDATE_CONTAINER": 8, "POST_UPDATE_CONTAINER": 9, "STOP_CONTAINER": 10,
                   "REMOVE_CONTAINER": 11, "UPDATE_POD_SANDBOX": 12}


def test_checked_in_generated_code_matches_fresh_generation(tmp_path: Path) -> None:
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools is not installed")
    subprocess.run(["bash", str(REPO_ROOT / "scripts" / "gen-protos.sh"), str(tmp_path)],
                   check=True, capture_output=True, timeout=60)
    for name in GENERATED:
        fresh, checked_in = tmp_path / "koordnode" / "nri" / name, REPO_ROOT / "koordnode" / "nri" / name
        assert fresh.is_file(), f"generator did not produce {name}"
        assert filecmp.cmp(fresh, checked_in, shallow=False), f"koordnode/nri/{name} is stale: run scripts/gen-protos.sh"


def test_services_have_the_upstream_names() -> None:
    services = api_pb2.DESCRIPTOR.services_by_name
    assert services["Plugin"].full_name == "nri.pkg.api.v1alpha1.Plugin"
    assert services["Runtime"].full_name == "nri.pkg.api.v1alpha1.Runtime"
    assert {"Configure", "Synchronize", "CreateContainer", "UpdateContainer", "StopContainer", "StateChange"} <= set(
        services["Plugin"].methods_by_name)


@pytest.mark.parametrize("message", sorted(UPSTREAM_FIELDS))
def test_field_numbers_are_upstreams(message: str) -> None:
    fields = api_pb2.DESCRIPTOR.message_types_by_name[message].fields_by_name
    assert {name: fields[name].number for name in UPSTREAM_FIELDS[message]} == UPSTREAM_FIELDS[message]


def test_event_numbers_are_upstreams() -> None:
    assert {name: api_pb2.Event.Value(name) for name in UPSTREAM_EVENTS} == UPSTREAM_EVENTS


def test_ttrpc_envelope_numbers() -> None:
    req = ttrpc_pb2.Request.DESCRIPTOR.fields_by_name
    assert {n: req[n].number for n in ("service", "method", "payload", "timeout_nano", "metadata")} == {
        "service": 1, "method": 2, "payload": 3, "timeout_nano": 4, "metadata": 5}
    resp = ttrpc_pb2.Response.DESCRIPTOR.fields_by_name
    assert (resp["status"].number, resp["payload"].number) == (1, 2)


def test_fields_we_do_not_model_survive_a_round_trip() -> None:
    # Container.args (7), env (8), mounts (9): not in our model.
    wire = api_pb2.Container(id="c").SerializeToString() + b"\x3a\x02sh\x42\x03A=1\x4a\x03\x0a\x01/"
    parsed = api_pb2.Container.FromString(wire)
    assert parsed.id == "c"
    assert parsed.SerializeToString() == wire
