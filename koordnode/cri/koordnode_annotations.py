"""koordnode's own `koordnode.io/*` container annotations, and the CRI resources they carry.

koordnode writes them into the CreateContainer request the runtime stores, so that after a
restart it starts again from what kubelet asked (not from what koordnode made of it) and
rebuilds CPU ownership from its own records only. Everything read back is checked: the runtime
may return an annotation someone else wrote.
"""

from __future__ import annotations

import json
from typing import Any

from koordnode.cri import api_pb2 as pb
from koordnode.model.annotations import MAX_ANNOTATION_CHARS
from koordnode.model.cpulist import format_cpu_list, parse_cpu_list
from koordnode.model.qos_class import CPU_OWNING_CLASSES, QoSClass
from koordnode.model.state import RecordedResources
from koordnode.policy.class_inputs import ContainerResources
from koordnode.policy.container_policy import ContainerPlan

# Container annotation carrying kubelet's own resources, so that after a koordnode restart the
# policy starts again from what kubelet asked, not from what koordnode made of it.
KUBELET_RESOURCES_ANNOTATION = "koordnode.io/kubelet-resources"
# Container annotation carrying the allocator's own record of an exclusive allocation
# ({"owner", "class", "cpus"}), written into the CreateContainer request the runtime stores.
# After a restart ownership is rebuilt from these records only: a cpuset found on a container
# (e.g. a fallback container's share-pool set) is never taken for an allocation.
CPU_ALLOCATION_ANNOTATION = "koordnode.io/cpu-allocation"
_MAX_ALLOCATION_RECORD_CHARS = 64 * 1024

RESOURCE_FIELDS = ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes", "oom_score_adj",
                   "cpuset_cpus", "cpuset_mems", "memory_swap_limit_in_bytes")


def allocation_to_annotation(owner: str, qos_class: QoSClass, cpus: frozenset[int]) -> str:
    return json.dumps({"owner": owner, "class": qos_class.value, "cpus": format_cpu_list(cpus)},
                      sort_keys=True, separators=(",", ":"))


def fallback_to_annotation(reason: str) -> str:
    """The record of an LSE/LSR container that got no CPUs: why, for status after restarts."""
    return json.dumps({"fallback": reason[:1000]}, separators=(",", ":"))


def _allocation_doc(text: str | None) -> dict[str, Any] | None:
    if not text or not isinstance(text, str) or len(text) > _MAX_ALLOCATION_RECORD_CHARS:
        return None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def fallback_from_annotation(text: str | None) -> str | None:
    doc = _allocation_doc(text)
    reason = doc.get("fallback") if doc is not None else None
    return reason if isinstance(reason, str) else None


def allocation_from_annotation(text: str | None) -> tuple[str, QoSClass, frozenset[int]] | None:
    """(owner, class, CPUs) of our allocation record; None when absent or not what we write."""
    doc = _allocation_doc(text)
    if doc is None:
        return None
    try:
        owner, cls, cpus = doc["owner"], QoSClass(doc["class"]), parse_cpu_list(doc["cpus"])
    except (ValueError, TypeError, KeyError, RecursionError):
        return None
    if not isinstance(owner, str) or not owner or cls not in CPU_OWNING_CLASSES or not cpus:
        return None
    return owner, cls, cpus


def resources_from_pb(res: RecordedResources) -> ContainerResources:
    return ContainerResources(
        **{f: getattr(res, f) for f in RESOURCE_FIELDS}, unified=dict(res.unified)
    )


def resources_to_pb(res: ContainerResources) -> pb.LinuxContainerResources:
    return pb.LinuxContainerResources(**{f: getattr(res, f) for f in RESOURCE_FIELDS}, unified=dict(res.unified))


def resources_to_annotation(res: ContainerResources) -> str:
    doc = {f: getattr(res, f) for f in RESOURCE_FIELDS if getattr(res, f)}
    if res.unified:
        doc["unified"] = dict(sorted(res.unified.items()))
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def resources_from_annotation(text: str | None) -> ContainerResources | None:
    """kubelet's resources from our annotation; None when absent or not what we wrote."""
    if not text or not isinstance(text, str) or len(text) > MAX_ANNOTATION_CHARS:
        return None
    try:
        doc = json.loads(text)
        unified = {str(k): str(v) for k, v in (doc.pop("unified", None) or {}).items()}
        values = {k: v for k, v in doc.items() if k in RESOURCE_FIELDS}
        # The annotation can come back from the runtime written by someone else: a wrong type
        # here would only fail later, inside the policy.
        for k, v in values.items():
            wanted = str if k in ("cpuset_cpus", "cpuset_mems") else int
            if isinstance(v, bool) or not isinstance(v, wanted):
                return None
        return ContainerResources(**values, unified=unified)
    except (ValueError, TypeError, AttributeError, RecursionError):
        return None


def apply_overrides(target: pb.LinuxContainerResources, plan: ContainerPlan) -> None:
    """The class's CRI values over kubelet's in a request's resources."""
    cri = plan.cri
    for f in ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes", "oom_score_adj",
              "cpuset_cpus", "cpuset_mems"):
        value = getattr(cri, f)
        if value is not None:
            setattr(target, f, value)
    for key, value in cri.unified.items():
        target.unified[key] = value
