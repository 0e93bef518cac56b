"""Which QoS class a pod belongs to, and why.

The Koordinator label wins; without a (valid) label the class follows the Kubernetes QoS
that kubelet encoded in the pod's cgroup parent, through a configurable mapping.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from koordnode.model.be_group import BE_GROUP

QOS_CLASS_LABEL = "koordinator.sh/qosClass"


class QoSClass(str, Enum):
    SYSTEM = "SYSTEM"
    LSE = "LSE"
    LSR = "LSR"
    LS = "LS"
    BE = "BE"

    def __str__(self) -> str:
        return self.value


# The class names as users write them (labels, config keys), highest priority first.
CLASS_NAMES: tuple[str, ...] = tuple(c.value for c in QoSClass)


class KubeQoS(str, Enum):
    GUARANTEED = "Guaranteed"
    BURSTABLE = "Burstable"
    BEST_EFFORT = "BestEffort"

    def __str__(self) -> str:
        return self.value


# Classes that own CPUs in the allocator (everything else runs on a shared pool).
CPU_OWNING_CLASSES = frozenset({QoSClass.LSE, QoSClass.LSR})


def parse_qos_class(value: str) -> QoSClass | None:
    """The class for an exact label value ("LSE"), or None if it is not one."""
    try:
        return QoSClass(value)
    except ValueError:
        return None


# Default Kubernetes QoS -> class mapping; qos_config.KubeQoSMapping makes it configurable.
DEFAULT_KUBE_QOS_MAPPING: Mapping[KubeQoS, QoSClass] = MappingProxyType(
    {
        KubeQoS.GUARANTEED: QoSClass.LSR,
        KubeQoS.BURSTABLE: QoSClass.LS,
        KubeQoS.BEST_EFFORT: QoSClass.BE,
    }
)

# systemd driver: "kubepods-besteffort.slice", "kubepods-burstable-pod<uid>.slice",
# "kubepods-pod<uid>.slice" (Guaranteed pods sit directly under kubepods).
# koordnode's own BE group (model/be_group.py) holds BestEffort pods moved out of the tier.
_SYSTEMD_TIER = re.compile(r"^kubepods-(besteffort|burstable|" + BE_GROUP + r")(?:-pod[^/]*)?\.slice$")
_SYSTEMD_POD = re.compile(r"^kubepods(?:-besteffort|-burstable|-" + BE_GROUP + r")?-pod([^/.]+)\.slice$")
_CGROUPFS_POD = re.compile(r"^pod([0-9a-fA-F_-]+)$")


def kube_qos_from_cgroup_parent(cgroup_parent: str) -> tuple[KubeQoS, str]:
    """Kubernetes QoS encoded in a cgroup parent (either driver), with the evidence.

    Anything not under a besteffort/burstable tier is Guaranteed, as kubelet lays it out.
    """
    segments = [segment for segment in cgroup_parent.split("/") if segment]
    for segment in segments:
        if segment == "besteffort":
            return KubeQoS.BEST_EFFORT, f"cgroup parent {cgroup_parent!r} is under the besteffort tier"
        if segment == BE_GROUP:
            return KubeQoS.BEST_EFFORT, (f"cgroup parent {cgroup_parent!r} is in koordnode's BE group "
                                         "(moved there from the besteffort tier)")
        if segment == "burstable":
            return KubeQoS.BURSTABLE, f"cgroup parent {cgroup_parent!r} is under the burstable tier"
        match = _SYSTEMD_TIER.match(segment)
        if match:
            tier = match.group(1)
            kube_qos = KubeQoS.BURSTABLE if tier == "burstable" else KubeQoS.BEST_EFFORT
            return kube_qos, f"cgroup parent {cgroup_parent!r} is in the kubepods-{tier} slice"
    if not segments:
        return KubeQoS.GUARANTEED, "empty cgroup parent: assumed Guaranteed"
    if not any(segment.startswith("kubepods") for segment in segments):
        return (
            KubeQoS.GUARANTEED,
            f"cgroup parent {cgroup_parent!r} is not a kubepods cgroup: assumed Guaranteed",
        )
    return KubeQoS.GUARANTEED, f"cgroup parent {cgroup_parent!r} is directly under kubepods (Guaranteed)"


def pod_uid_from_cgroup_parent(cgroup_parent: str) -> str | None:
    """The pod UID kubelet put in the cgroup parent ("pod<uid>" or "...-pod<uid>.slice")."""
    for segment in reversed([s for s in cgroup_parent.split("/") if s]):
        match = _SYSTEMD_POD.match(segment)
        if match:
            # systemd escapes "-" in unit names; kubelet writes the UID with "_" instead.
            return match.group(1).replace("_", "-")
        match = _CGROUPFS_POD.match(segment)
        if match:
            return match.group(1)
    return None


@dataclass(frozen=True)
class ClassDecision:
    qos_class: QoSClass
    # Human-readable explanation for `koordnode status`.
    why: str
    # "label" or "cgroup_parent".
    source: str
    # Kubernetes QoS from the cgroup parent (always computed: memory policy needs Guaranteed).
    kube_qos: KubeQoS
    # Set when the label was present but invalid (it is then ignored).
    label_problem: str | None = None


def resolve_qos_class(
    labels: Mapping[str, str] | None,
    cgroup_parent: str,
    mapping: Mapping[KubeQoS, QoSClass] = DEFAULT_KUBE_QOS_MAPPING,
) -> ClassDecision:
    """Decide the class of a pod from its sandbox labels and cgroup parent. Never raises."""
    kube_qos, kube_evidence = kube_qos_from_cgroup_parent(cgroup_parent or "")
    label_problem: str | None = None
    raw = (labels or {}).get(QOS_CLASS_LABEL)
    if raw is not None:
        label_class = parse_qos_class(raw) if isinstance(raw, str) else None
        if label_class is not None:
            return ClassDecision(
                qos_class=label_class,
                why=f"label {QOS_CLASS_LABEL}={raw}",
                source="label",
                kube_qos=kube_qos,
            )
        allowed = ", ".join(c.value for c in QoSClass)
        # Label values are pod input: quote a bounded prefix (status, logs, every reconcile).
        shown = repr(raw[:40]) + (f"... ({len(raw)} characters)" if len(raw) > 40 else "") \
            if isinstance(raw, str) else repr(type(raw).__name__)
        label_problem = f"invalid label {QOS_CLASS_LABEL}={shown} ignored (expected one of {allowed})"
    mapped = mapping.get(kube_qos, DEFAULT_KUBE_QOS_MAPPING[kube_qos])
    why = f"{kube_evidence}; Kubernetes QoS {kube_qos.value} maps to {mapped.value}"
    if label_problem:
        why = f"{label_problem}; {why}"
    return ClassDecision(
        qos_class=mapped,
        why=why,
        source="cgroup_parent",
        kube_qos=kube_qos,
        label_problem=label_problem,
    )


def pod_qos_class(
    recorded: str | None,
    labels: Mapping[str, str] | None,
    cgroup_parent: str,
    mapping: Mapping[KubeQoS, QoSClass] = DEFAULT_KUBE_QOS_MAPPING,
) -> QoSClass:
    """The class of a known pod: the one the QoS engine recorded on it, else resolved from its
    labels and cgroup parent (resolve_qos_class: the one resolver). Never raises."""
    if recorded:
        known = parse_qos_class(recorded)
        if known is not None:
            return known
    return resolve_qos_class(labels, cgroup_parent, mapping).qos_class
