"""Koordinator's node reservation: the `node.koordinator.sh/reservation` annotation of this
node's Node object, as config values applied with the NodeSLO's (below the local file).

Its meaning in Koordinator v1.8.0's code (apis/extension/node_reservation.go, koordlet's
statesinformer and qosmanager helpers):
- `reservedCPUs` (a CPU list) are kept from every pod's CPU pool: koordnode's
  `[node] reserved_cpus`, which the budgets count as reserved too;
- without it, `resources.cpu` reserves ceil(cores) CPUs taken by topology: a count in
  `[node] reserved_cpus` (whole cores, lowest-numbered first);
- `resources.memory`: koordlet reserves max(kubelet's reservation (capacity - allocatable), this)
  for the system: `[strategy.be_memory] reserved_mib`;
- `applyPolicy` ("Default", "ReservedCPUsOnly") changes only what the scheduler counts.
An annotation that is not a JSON object is named and nothing of it applied; a field that does
not parse is named and left out, the rest applied.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from koordnode.kube.pods import parse_quantity
from koordnode.model.cpulist import CpuListError, format_cpu_list, parse_cpu_list

__all__ = ["NodeReservation", "RESERVATION_ANNOTATION", "reservation_of"]

RESERVATION_ANNOTATION = "node.koordinator.sh/reservation"
APPLY_POLICIES = ("", "Default", "ReservedCPUsOnly")
MAX_ANNOTATION_CHARS = 4096
MIB = 1 << 20


@dataclass(frozen=True)
class NodeReservation:
    """What the Node says: the config values (TOML keys) and the problems found."""

    values: Mapping[str, Any] = field(default_factory=dict)  # TOML key -> value
    problems: tuple[str, ...] = ()
    annotation: str | None = None  # as found (None: the Node has none)


def _object(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _memory(resources: Mapping[str, Any], key: str) -> int | None:
    if key not in resources:
        return None
    return math.ceil(parse_quantity(resources[key]))


def _reserved_mib(node: Mapping[str, Any], annotated: int) -> int:
    """max(kubelet's memory reservation, the annotation's), MiB rounded up, as koordlet takes it."""
    status = _object(node.get("status"))
    kubelet = 0
    try:
        capacity = _memory(_object(status.get("capacity")), "memory")
        allocatable = _memory(_object(status.get("allocatable")), "memory")
        if capacity is not None and allocatable is not None:
            kubelet = max(capacity - allocatable, 0)
    except ValueError:
        kubelet = 0
    return math.ceil(max(kubelet, annotated) / MIB)


def reservation_of(node: Mapping[str, Any]) -> NodeReservation:
    """The reservation a Node object carries, as config values."""
    raw = _object(_object(node.get("metadata")).get("annotations")).get(RESERVATION_ANNOTATION)
    if raw is None or raw == "":
        return NodeReservation()
    where = f"annotation {RESERVATION_ANNOTATION}"
    if not isinstance(raw, str) or len(raw) > MAX_ANNOTATION_CHARS:
        return NodeReservation(problems=(f"{where}: not a string of at most {MAX_ANNOTATION_CHARS} characters",))
    try:
        spec = json.loads(raw)
    except ValueError as exc:
        return NodeReservation(problems=(f"{where}: not JSON ({exc})",), annotation=raw)
    if not isinstance(spec, Mapping):
        return NodeReservation(problems=(f"{where}: expected a JSON object",), annotation=raw)
    problems: list[str] = []
    values: dict[str, Any] = {}
    resources = spec.get("resources") or {}
    if not isinstance(resources, Mapping):
        problems.append(f"{where}: resources: expected an object")
        resources = {}
    policy = spec.get("applyPolicy") or ""
    if policy not in APPLY_POLICIES:
        problems.append(f"{where}: applyPolicy: expected \"Default\" or \"ReservedCPUsOnly\", got {policy!r:.40}")
    cpus = spec.get("reservedCPUs") or ""
    try:
        if not isinstance(cpus, str):
            raise CpuListError(f"expected a CPU list string, got {cpus!r:.40}")
        if cpus:
            values["node.reserved_cpus"] = format_cpu_list(parse_cpu_list(cpus))
        elif "cpu" in resources:
            count = math.ceil(parse_quantity(resources["cpu"]))
            if count < 0:
                raise ValueError(f"resources.cpu: {resources['cpu']!r:.40} is negative")
            if count:
                values["node.reserved_cpus"] = count
    except (CpuListError, ValueError) as exc:
        problems.append(f"{where}: {'reservedCPUs' if cpus else 'resources.cpu'}: {exc}")
    try:
        memory = _memory(resources, "memory")
        if memory is not None and memory < 0:
            raise ValueError(f"{resources['memory']!r:.40} is negative")
        if memory:
            values["strategy.be_memory.reserved_mib"] = _reserved_mib(node, memory)
    except ValueError as exc:
        problems.append(f"{where}: resources.memory: {exc}")
    return NodeReservation(values=values, problems=tuple(problems), annotation=raw)
