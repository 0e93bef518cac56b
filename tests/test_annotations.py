"""Kubernetes quantities and the Koordinator annotations: parsed with clear problems, never raising."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordnode.model.annotations import (
    BATCH_CPU,
    BATCH_MEMORY,
    EXTENDED_RESOURCE_SPEC,
    MEMORY_QOS,
    RESOURCE_STATUS,
    BatchResources,
    MemoryQoSOverride,
    QuantityError,
    parse_extended_resource_spec,
    parse_memory_qos,
    parse_pod_annotations,
    parse_quantity,
    parse_resource_status,
    quantity_to_int,
)

# --- quantities ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", 2**30),
        ("512Mi", 512 * 2**20),
        ("1Ki", 1024),
        ("2Ti", 2 * 2**40),
        ("1000", 1000),
        ("1e3", 1000),
        ("1E3", 1000),
        ("1e-3", Fraction(1, 1000)),
        ("1.5e+2", 150),
        ("500m", Fraction(1, 2)),
        ("1.5k", 1500),
        ("1M", 10**6),
        ("1G", 10**9),
        ("1E", 10**18),
        ("100n", Fraction(1, 10**7)),
        ("5u", Fraction(5, 10**6)),
        (".5", Fraction(1, 2)),
        ("5.", 5),
        ("+7", 7),
        ("-7", -7),
        (" 1Gi ", 2**30),
        ("0", 0),
    ],
)
def test_parse_quantity(text: str, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "Gi",
        "1Qi",
        "1gi",
        "1.2.3",
        "1 Gi",
        "abc",
        "1e",
        "1e999",
        "e3",
        "1e3.5",
        "--1",
        "1" * 100,
        "0x10",
    ],
)
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_quantity_to_int_rounds_up_and_bounds() -> None:
    assert quantity_to_int("500m") == 1
    assert quantity_to_int("1.5") == 2
    assert quantity_to_int("1Gi") == 2**30
    with pytest.raises(QuantityError, match="negative"):
        quantity_to_int("-1")
    with pytest.raises(QuantityError, match="too large"):
        quantity_to_int("16Ei")
    with pytest.raises(QuantityError):
        quantity_to_int(5)  # type: ignore[arg-type]


# --- extended-resource-spec --------------------------------------------------------------


def _spec(containers: dict) -> str:
    return json.dumps({"containers": containers})


def test_extended_resource_spec() -> None:
    text = _spec(
        {
            "main": {
                "requests": {BATCH_CPU: "1000", BATCH_MEMORY: "1Gi"},
                "limits": {BATCH_CPU: "2k", BATCH_MEMORY: "2Gi"},
            },
            "sidecar": {"requests": {BATCH_CPU: 500}},
        }
    )
    spec, problems = parse_extended_resource_spec(text)
    assert problems == []
    assert spec is not None
    assert spec.containers["main"] == BatchResources(1000, 2000, 2**30, 2 * 2**30)
    # JSON numbers are accepted, missing values stay None (a missing limit = unlimited).
    assert spec.containers["sidecar"] == BatchResources(cpu_request_milli=500)


def test_extended_resource_spec_bad_quantity_drops_only_that_value() -> None:
    text = _spec(
        {"main": {"requests": {BATCH_CPU: "lots", BATCH_MEMORY: "1Gi"}, "limits": {BATCH_CPU: True}}}
    )
    spec, problems = parse_extended_resource_spec(text)
    assert spec is not None
    assert spec.containers["main"] == BatchResources(memory_request_bytes=2**30)
    assert len(problems) == 2
    assert all(p.annotation == EXTENDED_RESOURCE_SPEC for p in problems)
    assert "'lots'" in str(problems[0])


@pytest.mark.parametrize(
    "text",
    ["{", "[]", '"x"', "null", '{"containers": []}', '{"containers": {"main": 3}}', 42],
)
def test_extended_resource_spec_malformed(text) -> None:
    spec, problems = parse_extended_resource_spec(text)
    assert problems, text
    if spec is not None:
        assert spec.containers == {}


def test_extended_resource_spec_sections_must_be_objects() -> None:
    spec, problems = parse_extended_resource_spec(_spec({"main": {"requests": [1], "limits": None}}))
    assert spec is not None and spec.containers["main"] == BatchResources()
    assert len(problems) == 1 and "requests" in problems[0].message


# --- memoryQOS -----------------------------------------------------------------------------


def test_memory_qos_full() -> None:
    text = json.dumps(
        {
            "policy": "auto",
            "minLimitPercent": 60,
            "lowLimitPercent": 90,
            "throttlingPercent": 85,
            "wmarkRatio": 90,
            "wmarkScalePermill": 30,
            "wmarkMinAdj": -10,
            "somethingNew": 1,
        }
    )
    override, problems = parse_memory_qos(text)
    assert problems == []
    assert override == MemoryQoSOverride("auto", 60, 90, 85, 90, 30, -10)


def test_memory_qos_bad_fields_are_dropped_alone() -> None:
    override, problems = parse_memory_qos(
        json.dumps(
            {"minLimitPercent": 150, "lowLimitPercent": "50", "throttlingPercent": 80.0, "wmarkMinAdj": True}
        )
    )
    assert override == MemoryQoSOverride(throttling_percent=80)
    messages = " ".join(p.message for p in problems)
    assert "minLimitPercent = 150 is out of range" in messages
    assert "lowLimitPercent" in messages and "wmarkMinAdj" in messages


def test_memory_qos_policy() -> None:
    assert parse_memory_qos('{"policy": "none"}')[0] == MemoryQoSOverride(policy="none")
    override, problems = parse_memory_qos('{"policy": "sometimes"}')
    assert override == MemoryQoSOverride(policy="auto")
    assert "sometimes" in problems[0].message


@pytest.mark.parametrize("text", ["{", "", "[1]", "nan", None])
def test_memory_qos_malformed(text) -> None:
    override, problems = parse_memory_qos(text)
    assert override is None
    assert problems and problems[0].annotation == MEMORY_QOS


# --- resource-status ------------------------------------------------------------------------


def test_resource_status() -> None:
    status, problems = parse_resource_status('{"cpuset": "2-3", "numaNodeResources": []}')
    assert problems == [] and status is not None
    assert status.cpuset == {2, 3}
    assert parse_resource_status("{}")[0].cpuset is None
    assert parse_resource_status('{"cpuset": ""}')[0].cpuset is None


@pytest.mark.parametrize("text", ['{"cpuset": "2-"}', '{"cpuset": 2}', "{", '{"cpuset": "0-99999999"}'])
def test_resource_status_malformed(text: str) -> None:
    status, problems = parse_resource_status(text)
    assert status is None
    assert problems[0].annotation == RESOURCE_STATUS


def test_oversized_annotation_rejected() -> None:
    status, problems = parse_resource_status('{"cpuset": "1"' + " " * 70000 + "}")
    assert status is None and "longer" in problems[0].message


# --- all together ---------------------------------------------------------------------------


def test_parse_pod_annotations_collects_everything() -> None:
    annotations = {
        EXTENDED_RESOURCE_SPEC: _spec({"main": {"requests": {BATCH_CPU: "500"}}}),
        MEMORY_QOS: "{broken",
        RESOURCE_STATUS: '{"cpuset": "4-5"}',
        "unrelated": "x",
    }
    parsed = parse_pod_annotations(annotations)
    assert parsed.batch_resources("main") == BatchResources(cpu_request_milli=500)
    assert parsed.batch_resources("other") is None
    assert parsed.memory_qos is None
    assert parsed.scheduler_cpuset == {4, 5}
    assert [p.annotation for p in parsed.problems] == [MEMORY_QOS]


def test_parse_pod_annotations_absent() -> None:
    parsed = parse_pod_annotations(None)
    assert parsed.extended_resources is None and parsed.memory_qos is None
    assert parsed.scheduler_cpuset is None and parsed.problems == ()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


# No deadline: parsed annotations are cached, so a replayed example runs faster than its first
# run, which Hypothesis would report as unreliable timing on a loaded machine.
@settings(deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([EXTENDED_RESOURCE_SPEC, MEMORY_QOS, RESOURCE_STATUS, "other"]),
        st.one_of(st.text(max_size=60), json_values.map(json.dumps)),
    )
)
def test_parse_pod_annotations_never_raises(annotations: dict[str, str]) -> None:
    parsed = parse_pod_annotations(annotations)
    for problem in parsed.problems:
        assert problem.annotation in annotations and problem.message


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=3), json_values)
def test_structured_garbage_never_raises(containers: dict, section) -> None:
    text = json.dumps(
        {"containers": {**containers, "main": {"requests": section, "limits": {BATCH_CPU: section}}}}
    )
    parse_extended_resource_spec(text)
    parse_memory_qos(json.dumps({"policy": section, "minLimitPercent": section}))
    parse_resource_status(json.dumps({"cpuset": section}))


# --- reliability: hostile annotations cost a bounded amount -------------------------------

# The annotation of the reliability issue: 64 KiB of "0-65535" ranges. Before the bound,
# one parse built 8,000 sets of 65,536 CPUs (7-27 s of CPU), several times per plan.
HOSTILE_RESOURCE_STATUS = json.dumps({"cpuset": ",".join(["0-65535"] * ((64 * 1024 - 20) // 8))})


def test_hostile_resource_status_is_refused_with_a_reason() -> None:
    status, problems = parse_resource_status(HOSTILE_RESOURCE_STATUS)
    assert status is None
    assert "longer than" in str(problems[0]) or "exceeds" in str(problems[0])


def test_repeated_in_bounds_ranges_are_merged() -> None:
    from koordnode.model.cpulist import MAX_CPU_ID, parse_cpu_list

    text = ",".join([f"0-{MAX_CPU_ID}"] * 6000 + ["5", "3-4"])
    assert parse_cpu_list(text) == frozenset(range(MAX_CPU_ID + 1))
    assert parse_cpu_list("8-9,0-3,2-5,9,1") == frozenset({0, 1, 2, 3, 4, 5, 8, 9})


def test_pod_annotations_are_parsed_once_per_distinct_text(monkeypatch) -> None:
    import koordnode.model.annotations as annotations_module

    calls = []
    real = annotations_module._parse_pod_annotations

    def counting(annotations):
        calls.append(1)
        return real(annotations)

    monkeypatch.setattr(annotations_module, "_parse_pod_annotations", counting)
    pod = {RESOURCE_STATUS: json.dumps({"cpuset": "2-3"}), "other": "x"}
    first = parse_pod_annotations(pod)
    for _ in range(5):
        assert parse_pod_annotations(dict(pod)) is first
    assert len(calls) == 1
    assert parse_pod_annotations({RESOURCE_STATUS: json.dumps({"cpuset": "4"})}).scheduler_cpuset == {4}
    assert len(calls) == 2


def test_cached_scheduler_cpuset_is_kept_as_canonical_text() -> None:
    # A cache entry holds at most the merged text, never a set of thousands of CPUs.
    parsed = parse_pod_annotations({RESOURCE_STATUS: json.dumps({"cpuset": ",".join(["0-8191"] * 100)})})
    assert parsed.resource_status.cpuset_text == "0-8191"
    assert parsed.has_scheduler_cpuset and len(parsed.scheduler_cpuset) == 8192


def test_problems_of_a_pod_are_capped() -> None:
    spec = {"containers": {f"c{i}": {"requests": {BATCH_CPU: "fast"}} for i in range(60)}}
    parsed = parse_pod_annotations({EXTENDED_RESOURCE_SPEC: json.dumps(spec)})
    assert len(parsed.problems) == 11
    assert "50 more problems" in str(parsed.problems[-1])
