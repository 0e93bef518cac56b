"""The CRI method table: service paths, and the methods whose requests the proxy hands to the
runtime hooks (everything else is relayed as bytes without being parsed)."""

from __future__ import annotations

import dataclasses

from google.protobuf.message import Message

from koordnode.cri import api_pb2 as pb

# Method paths are these prefixes and the method name: RUNTIME_SERVICE + "Version".
RUNTIME_SERVICE = "/runtime.v1.RuntimeService/"
IMAGE_SERVICE = "/runtime.v1.ImageService/"
# CRI v1alpha2 (removed in containerd 2.0): relayed, never intercepted.
OLD_API_PREFIX = "/runtime.v1alpha2."


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    name: str
    path: str
    request_cls: type[Message]
    response_cls: type[Message]


def _spec(name: str) -> MethodSpec:
    return MethodSpec(
        name=name,
        path=RUNTIME_SERVICE + name,
        request_cls=getattr(pb, f"{name}Request"),
        response_cls=getattr(pb, f"{name}Response"),
    )


INTERCEPTED_METHODS = (
    "RunPodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "CreateContainer",
    "StartContainer",
    "UpdateContainerResources",
    "UpdatePodSandboxResources",  # CRI v1.33: in-place pod-level resize
    "StopContainer",
    "RemoveContainer",
)

SPECS_BY_PATH: dict[str, MethodSpec] = {s.path: s for s in map(_spec, INTERCEPTED_METHODS)}
