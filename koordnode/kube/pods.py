"""Pod objects of the API -> PodFacts; resource quantities. Pure: no I/O.

A malformed pod (a field of the wrong type, an unparsable quantity) gives facts without the
part that is wrong and a reason, never an exception: one odd object must not stop the watch.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from koordnode.model.pod_facts import PodFacts

__all__ = ["parse_quantity", "pod_facts_of"]

_SUFFIX: dict[str, Decimal] = {
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
    "P": Decimal(10**15), "E": Decimal(10**18),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|)$")


def parse_quantity(text: Any) -> Decimal:
    """A Kubernetes resource quantity ("512Mi", "1.5", "100m", "1e3") as a number; ValueError otherwise."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise ValueError(f"expected a quantity, got {text!r:.40}")
    raw = str(text).strip()
    match = _QUANTITY.match(raw) if len(raw) <= 64 else None
    if match is None:
        raise ValueError(f"not a quantity: {raw[:40]!r}")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:
        raise ValueError(f"not a quantity: {raw[:40]!r}") from None
    if number.adjusted() > 30:  # no resource is that big; keeps int() of "1e999999" from costing seconds
        raise ValueError(f"quantity out of range: {raw[:40]!r}")
    return number * _SUFFIX[match.group(2)]


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _timestamp(text: Any) -> float | None:
    """An RFC 3339 time as the API server writes it ("2026-12-02T08:00:00Z"); None otherwise."""
    if not isinstance(text, str) or len(text) > 40:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def pod_facts_of(pod: Mapping[str, Any]) -> tuple[PodFacts | None, list[str]]:
    """The facts of one pod object and the problems found (a pod without a UID gives None)."""
    problems: list[str] = []
    meta, spec, status = _dict(pod.get("metadata")), _dict(pod.get("spec")), _dict(pod.get("status"))
    uid = meta.get("uid")
    if not isinstance(uid, str) or not uid:
        return None, ["pod without metadata.uid"]
    name, namespace = str(meta.get("name", "")), str(meta.get("namespace", ""))
    requests: dict[str, int] = {}
    cpu_milli: int | None = 0
    containers = spec.get("containers")
    for container in containers if isinstance(containers, list) else []:
        if not isinstance(container, Mapping) or not isinstance(container.get("name"), str):
            problems.append(f"{namespace}/{name}: a container without a name")
            continue
        container_requests = _dict(_dict(container.get("resources")).get("requests"))
        cpu = container_requests.get("cpu")
        if cpu is not None and cpu_milli is not None:
            try:
                cpu_milli += max(int(parse_quantity(cpu) * 1000), 0)
            except ValueError as exc:
                problems.append(f"{namespace}/{name} container {container['name']}: cpu request: {exc}")
                cpu_milli = None
        memory = container_requests.get("memory")
        if memory is None:
            continue
        try:
            value = int(parse_quantity(memory))
        except ValueError as exc:
            problems.append(f"{namespace}/{name} container {container['name']}: memory request: {exc}")
            continue
        if value > 0:
            requests[container["name"]] = value
    priority = spec.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        problems.append(f"{namespace}/{name}: spec.priority is not an integer")
        priority = None
    owners = tuple(f"{o.get('kind')}/{o.get('name')}" for o in meta.get("ownerReferences") or []
                   if isinstance(o, Mapping))[:8]
    labels = _dict(meta.get("labels"))
    facts = PodFacts(
        uid=uid, namespace=namespace, name=name, memory_requests=requests, priority=priority,
        priority_class=str(spec.get("priorityClassName") or ""), owners=owners,
        kube_qos=str(status.get("qosClass") or ""), koord_qos=str(labels.get("koordinator.sh/qosClass") or ""),
        terminating=meta.get("deletionTimestamp") is not None, phase=str(status.get("phase") or ""),
        cpu_request_milli=cpu_milli, created_at=_timestamp(meta.get("creationTimestamp")),
    )
    return facts, problems
