"""Koordinator pod annotations the policy reads, parsed without ever raising.

Each parser returns (value or None, problems). A problem names the annotation and what was
wrong; the policy then uses the class defaults for whatever could not be read.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from koordnode.model.cpulist import CpuListError, format_cpu_list, parse_cpu_list
from koordnode.model.kernel import MEMORY_HIGH_PERCENT_MAX

EXTENDED_RESOURCE_SPEC = "node.koordinator.sh/extended-resource-spec"
MEMORY_QOS = "koordinator.sh/memoryQOS"
RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"

BATCH_CPU = "kubernetes.io/batch-cpu"  # milli-cores: "1000" is one CPU
BATCH_MEMORY = "kubernetes.io/batch-memory"  # bytes

# Annotations are user input: bound what we are willing to parse.
MAX_ANNOTATION_CHARS = 64 * 1024
MAX_QUANTITY_CHARS = 64
MAX_PROBLEMS = 10  # problems reported per pod (the rest are counted)
MAX_SPEC_CONTAINERS = 64  # containers an extended-resource-spec may describe
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class ParseProblem:
    annotation: str
    message: str

    def __str__(self) -> str:
        return f"{self.annotation}: {self.message}"


# --- Kubernetes resource quantities -----------------------------------------------------


class QuantityError(ValueError):
    pass


_BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_SUFFIXES = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(.*)$")
_EXPONENT = re.compile(r"^[eE]([+-]?\d{1,3})$")
_MAX_EXPONENT = 30


def parse_quantity(text: str) -> Fraction:
    """Exact value of a Kubernetes quantity: "1Gi", "512Mi", "1000", "1e3", "500m", "1.5"."""
    if not isinstance(text, str):
        raise QuantityError(f"quantity must be a string, got {type(text).__name__}")
    stripped = text.strip()
    if not stripped or len(stripped) > MAX_QUANTITY_CHARS:
        raise QuantityError(f"{text!r} is not a quantity")
    match = _QUANTITY.match(stripped)
    if not match:
        raise QuantityError(f"{text!r} is not a quantity (expected a number with an optional suffix)")
    sign, number, suffix = match.groups()
    value = Fraction(number if not number.endswith(".") else number[:-1])
    if suffix in _BINARY_SUFFIXES:
        value *= _BINARY_SUFFIXES[suffix]
    elif suffix in _DECIMAL_SUFFIXES:
        value *= _DECIMAL_SUFFIXES[suffix]
    else:
        exponent = _EXPONENT.match(suffix)
        if not exponent:
            raise QuantityError(f"{text!r} has an unknown suffix {suffix!r}")
        power = int(exponent.group(1))
        if abs(power) > _MAX_EXPONENT:
            raise QuantityError(f"{text!r}: exponent {power} is out of range")
        value *= Fraction(10) ** power
    return -value if sign == "-" else value


def quantity_to_int(text: str) -> int:
    """Quantity rounded up to an integer (as Kubernetes does); must be in [0, 2^63-1]."""
    value = parse_quantity(text)
    if value < 0:
        raise QuantityError(f"{text!r} is negative")
    rounded = math.ceil(value)
    if rounded > _INT64_MAX:
        raise QuantityError(f"{text!r} is too large")
    return rounded


# --- node.koordinator.sh/extended-resource-spec -----------------------------------------


@dataclass(frozen=True)
class BatchResources:
    """One container's batch resources; None = not given (a limit then means unlimited)."""

    cpu_request_milli: int | None = None
    cpu_limit_milli: int | None = None
    memory_request_bytes: int | None = None
    memory_limit_bytes: int | None = None


@dataclass(frozen=True)
class ExtendedResourceSpec:
    containers: Mapping[str, BatchResources] = field(default_factory=dict)


def _load_json_object(annotation: str, text: Any) -> tuple[dict[str, Any] | None, list[ParseProblem]]:
    if not isinstance(text, str):
        return None, [ParseProblem(annotation, f"value must be a string, got {type(text).__name__}")]
    if len(text) > MAX_ANNOTATION_CHARS:
        return None, [ParseProblem(annotation, f"value longer than {MAX_ANNOTATION_CHARS} characters")]
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as error:
        return None, [ParseProblem(annotation, f"malformed JSON ({error})")]
    if not isinstance(document, dict):
        return None, [ParseProblem(annotation, f"expected a JSON object, got {type(document).__name__}")]
    return document, []


def _resource_quantity(
    annotation: str, where: str, resources: Mapping[str, Any], name: str, problems: list[ParseProblem]
) -> int | None:
    raw = resources.get(name)
    if raw is None:
        return None
    if isinstance(raw, bool):
        problems.append(ParseProblem(annotation, f"{where}[{name!r}] = {raw!r} is not a quantity"))
        return None
    if isinstance(raw, (int, float)):
        raw = repr(raw) if isinstance(raw, float) else str(raw)
    try:
        return quantity_to_int(raw)
    except QuantityError as error:
        problems.append(ParseProblem(annotation, f"{where}[{name!r}]: {error}"))
        return None


def parse_extended_resource_spec(text: Any) -> tuple[ExtendedResourceSpec | None, list[ParseProblem]]:
    """`{"containers": {"<name>": {"requests": {...}, "limits": {...}}}}`; bad parts are skipped."""
    annotation = EXTENDED_RESOURCE_SPEC
    document, problems = _load_json_object(annotation, text)
    if document is None:
        return None, problems
    containers = document.get("containers", {})
    if not isinstance(containers, dict):
        return None, [ParseProblem(annotation, '"containers" must be an object')]
    parsed: dict[str, BatchResources] = {}
    if len(containers) > MAX_SPEC_CONTAINERS:
        return None, [ParseProblem(annotation, f"{len(containers)} containers; at most {MAX_SPEC_CONTAINERS}")]
    for name, spec in containers.items():
        if not isinstance(spec, dict):
            problems.append(ParseProblem(annotation, f"container {name!r}: expected an object"))
            continue
        values: dict[str, int | None] = {}
        for section in ("requests", "limits"):
            resources = spec.get(section, {})
            if resources is None:
                resources = {}
            if not isinstance(resources, dict):
                problems.append(
                    ParseProblem(annotation, f"container {name!r}: {section!r} must be an object")
                )
                resources = {}
            where = f"containers[{name!r}].{section}"
            values[f"cpu_{section}"] = _resource_quantity(annotation, where, resources, BATCH_CPU, problems)
            values[f"memory_{section}"] = _resource_quantity(
                annotation, where, resources, BATCH_MEMORY, problems
            )
        parsed[name] = BatchResources(
            cpu_request_milli=values["cpu_requests"],
            cpu_limit_milli=values["cpu_limits"],
            memory_request_bytes=values["memory_requests"],
            memory_limit_bytes=values["memory_limits"],
        )
    return ExtendedResourceSpec(containers=parsed), problems


# --- koordinator.sh/memoryQOS ------------------------------------------------------------

MEMORY_QOS_POLICIES = ("auto", "none")

# JSON key -> (attribute, min, max)
_MEMORY_QOS_FIELDS: dict[str, tuple[str, int, int]] = {
    "minLimitPercent": ("min_limit_percent", 0, 100),
    "lowLimitPercent": ("low_limit_percent", 0, 200),
    "throttlingPercent": ("throttling_percent", 0, MEMORY_HIGH_PERCENT_MAX),
    "wmarkRatio": ("wmark_ratio", 0, 100),
    "wmarkScalePermill": ("wmark_scale_permill", 1, 1000),
    "wmarkMinAdj": ("wmark_min_adj", -25, 50),
}


@dataclass(frozen=True)
class MemoryQoSOverride:
    """Pod overrides of the class's memory numbers; None = keep the class default."""

    # "auto": class defaults with the overrides below; "none": no memory QoS for the pod.
    policy: str = "auto"
    min_limit_percent: int | None = None
    low_limit_percent: int | None = None
    throttling_percent: int | None = None
    wmark_ratio: int | None = None
    wmark_scale_permill: int | None = None
    wmark_min_adj: int | None = None


def parse_memory_qos(text: Any) -> tuple[MemoryQoSOverride | None, list[ParseProblem]]:
    """Malformed JSON -> None; a bad field is dropped alone, the valid ones are kept."""
    annotation = MEMORY_QOS
    document, problems = _load_json_object(annotation, text)
    if document is None:
        return None, problems
    values: dict[str, Any] = {}
    policy = document.get("policy", "auto")
    if policy in MEMORY_QOS_POLICIES:
        values["policy"] = policy
    else:
        problems.append(
            ParseProblem(
                annotation, f"policy {policy!r} is not one of {', '.join(MEMORY_QOS_POLICIES)}; using auto"
            )
        )
    for key, (attribute, low, high) in _MEMORY_QOS_FIELDS.items():
        if key not in document:
            continue
        raw = document[key]
        number = _json_integer(raw)
        if number is None:
            problems.append(
                ParseProblem(annotation, f"{key} = {raw!r} is not an integer; class default used")
            )
        elif not low <= number <= high:
            problems.append(
                ParseProblem(
                    annotation, f"{key} = {number} is out of range [{low}, {high}]; class default used"
                )
            )
        else:
            values[attribute] = number
    return MemoryQoSOverride(**values), problems


def _json_integer(raw: Any) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    return None


# --- scheduling.koordinator.sh/resource-status -------------------------------------------


@dataclass(frozen=True)
class ResourceStatus:
    """The scheduler's placement; no cpuset when it chose none.

    Kept as the canonical CPU-list text (validated, merged): parsed annotations are cached,
    and a text is far smaller than the set of up to 8192 CPUs a hostile list can name. The
    set is built when asked for (once per allocation)."""

    cpuset_text: str | None = None

    @property
    def cpuset(self) -> frozenset[int] | None:
        return parse_cpu_list(self.cpuset_text) if self.cpuset_text else None


def parse_resource_status(text: Any) -> tuple[ResourceStatus | None, list[ParseProblem]]:
    annotation = RESOURCE_STATUS
    document, problems = _load_json_object(annotation, text)
    if document is None:
        return None, problems
    raw = document.get("cpuset")
    if raw is None or raw == "":
        return ResourceStatus(), problems
    if not isinstance(raw, str):
        return None, [ParseProblem(annotation, f"cpuset must be a string, got {raw!r}")]
    try:
        cpus = parse_cpu_list(raw)
    except CpuListError as error:
        return None, [ParseProblem(annotation, f"cpuset: {error}")]
    return ResourceStatus(cpuset_text=format_cpu_list(cpus) or None), problems


# --- all of them --------------------------------------------------------------------------


@dataclass(frozen=True)
class PodAnnotations:
    extended_resources: ExtendedResourceSpec | None = None
    memory_qos: MemoryQoSOverride | None = None
    resource_status: ResourceStatus | None = None
    problems: tuple[ParseProblem, ...] = ()

    def batch_resources(self, container_name: str) -> BatchResources | None:
        if self.extended_resources is None:
            return None
        return self.extended_resources.containers.get(container_name)

    @property
    def scheduler_cpuset(self) -> frozenset[int] | None:
        return self.resource_status.cpuset if self.resource_status else None

    @property
    def has_scheduler_cpuset(self) -> bool:
        return self.resource_status is not None and self.resource_status.cpuset_text is not None


_KNOWN = (EXTENDED_RESOURCE_SPEC, MEMORY_QOS, RESOURCE_STATUS)
_EMPTY = PodAnnotations()
# Parsed annotations by a digest of their text: a plan, a reconcile pass and the QoS manager
# ask again and again for the same pod, and a hostile value must cost its parse once, not
# once per question. Keyed by digest so the cache never holds the (up to 64 KiB) texts.
_CACHE_SIZE = 128
_cache: OrderedDict[bytes, PodAnnotations] = OrderedDict()
_cache_lock = threading.Lock()


def _cache_key(values: tuple[Any, ...]) -> bytes | None:
    digest = hashlib.blake2b(digest_size=16)
    for value in values:
        if value is None:
            digest.update(b"\x00")
        elif isinstance(value, str):
            encoded = value.encode("utf-8", "surrogatepass")
            digest.update(b"\x01" + len(encoded).to_bytes(8, "big") + encoded)
        else:
            return None  # not what CRI carries; parsed every time (and refused)
    return digest.digest()


def parse_pod_annotations(annotations: Mapping[str, Any] | None) -> PodAnnotations:
    """Parse every annotation koordnode understands; absent ones stay None. Never raises.

    Bounded: each value is refused above MAX_ANNOTATION_CHARS, CPU lists above
    MAX_CPU_LIST_CHARS, and the result is cached, so the same text is parsed once.
    """
    annotations = annotations or {}
    values = tuple(annotations.get(name) for name in _KNOWN)
    if all(value is None for value in values):
        return _EMPTY
    key = _cache_key(values)
    if key is not None:
        with _cache_lock:
            cached = _cache.get(key)
            if cached is not None:
                _cache.move_to_end(key)
                return cached
    parsed = _parse_pod_annotations(annotations)
    if key is not None:
        with _cache_lock:
            _cache[key] = parsed
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
    return parsed


def _parse_pod_annotations(annotations: Mapping[str, Any]) -> PodAnnotations:
    problems: list[ParseProblem] = []
    extended = memory_qos = resource_status = None
    if EXTENDED_RESOURCE_SPEC in annotations:
        extended, found = parse_extended_resource_spec(annotations[EXTENDED_RESOURCE_SPEC])
        problems += found
    if MEMORY_QOS in annotations:
        memory_qos, found = parse_memory_qos(annotations[MEMORY_QOS])
        problems += found
    if RESOURCE_STATUS in annotations:
        resource_status, found = parse_resource_status(annotations[RESOURCE_STATUS])
        problems += found
    if len(problems) > MAX_PROBLEMS:
        # Each problem becomes a status note on every container of the pod: keep them few.
        problems = problems[:MAX_PROBLEMS] + [
            ParseProblem(problems[MAX_PROBLEMS].annotation, f"... and {len(problems) - MAX_PROBLEMS} more problems")]
    return PodAnnotations(
        extended_resources=extended,
        memory_qos=memory_qos,
        resource_status=resource_status,
        problems=tuple(problems),
    )
