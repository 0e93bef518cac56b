"""The resource table: value validation, canonical forms and v1 -> v2 conversions (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordnode.model.kernel import PAGE_SIZE
from koordnode.executor.resources import (
    RESOURCES,
    UNLIMITED,
    CpuMaxField,
    DeviceLimit,
    FileFormatError,
    InvalidValueError,
    IoMaxField,
    MemoryBytes,
    UnknownResourceError,
    Weight,
    get_resource,
    parse_cpu_list,
)
from koordnode.model.cpulist import format_cpu_list
from koordnode.model.kernel import shares_to_weight


@pytest.mark.parametrize(
    ("shares", "weight"),
    [(2, 1), (1024, 39), (262144, 10000), (0, 1), (10**9, 10000), (512, 20), (4096, 157)],
)
def test_shares_to_weight_matches_kernel_formula(shares: int, weight: int) -> None:
    assert shares_to_weight(shares) == weight


@pytest.mark.parametrize(("value", "expected"), [(1, 2), (2, 2), ("1024", 1024), (999_999, 262144)])
def test_cpu_shares_are_clamped_to_kernel_range(value: object, expected: int) -> None:
    assert get_resource("cpu.shares").validate(value) == expected


@pytest.mark.parametrize(
    ("resource", "value"),
    [
        ("cpu.idle", 2),
        ("cpu.idle", -1),
        ("cpu.cfs_quota_us", 500),
        ("cpu.cfs_quota_us", -2),
        ("cpu.cfs_period_us", 999),
        ("cpu.cfs_period_us", 1_000_001),
        ("cpu.bvt_warp_ns", 3),
        ("memory.wmark_ratio", 101),
        ("memory.wmark_scale_factor", 0),
        ("memory.wmark_min_adj", -26),
        ("memory.wmark_min_adj", 51),
        ("memory.limit_in_bytes", -5),
        ("memory.min", "1G"),
        ("blkio.weight", 0),
        ("blkio.weight", 1001),
        ("cpuset.cpus", "3-1"),
        ("cpuset.cpus", "0-3\n4"),
        ("cpuset.cpus", "a"),
        ("cpu.shares", "1024\n1"),
        ("cpu.shares", "10\x00"),
        ("cpu.shares", True),
        ("cpu.shares", 1.5),
        ("blkio.throttle.read_bps_device", "8:0"),
        ("blkio.throttle.read_bps_device", "8:0 100\n8:16 1"),
        ("blkio.throttle.read_bps_device", "sda 100"),
        ("tasks", "1"),
        ("cgroup.procs", 1),
    ],
)
def test_invalid_values_are_rejected(resource: str, value: object) -> None:
    with pytest.raises(InvalidValueError):
        get_resource(resource).validate(value)


def test_valid_edge_values() -> None:
    assert get_resource("cpu.cfs_quota_us").validate(-1) == UNLIMITED
    assert get_resource("cpu.cfs_quota_us").validate(1000) == 1000
    assert get_resource("cpu.bvt_warp_ns").validate(-1) == -1
    assert get_resource("memory.limit_in_bytes").validate("max") == UNLIMITED
    assert get_resource("memory.limit_in_bytes").validate("9223372036854771712") == UNLIMITED
    assert get_resource("memory.high").validate(0) == 0
    assert get_resource("cpuset.cpus").validate("") == frozenset()
    assert get_resource("cpuset.cpus").validate("0-3\n") == frozenset({0, 1, 2, 3})
    assert get_resource("blkio.throttle.write_bps_device").validate("8:16 209715200") == DeviceLimit(8, 16, 209715200)


def test_unknown_resource() -> None:
    with pytest.raises(UnknownResourceError):
        get_resource("cpu.nonsense")


def test_cpu_list_round_trip() -> None:
    assert parse_cpu_list("0,1,2,3") == parse_cpu_list("0-3")
    assert format_cpu_list(parse_cpu_list("5,0,1,2,7-8,3")) == "0-3,5,7-8"
    assert format_cpu_list(frozenset()) == ""


def test_cpu_max_preserves_the_other_field() -> None:
    quota, period = CpuMaxField("quota"), CpuMaxField("period")
    assert quota.render(50_000, "max 100000\n") == "50000 100000"
    assert quota.render(UNLIMITED, "50000 20000") == "max 20000"
    assert period.render(20_000, "max 100000") == "max 20000"
    assert period.render(20_000, "7000 100000") == "7000 20000"
    assert quota.extract("max 100000\n", UNLIMITED) == UNLIMITED
    assert period.extract("max 100000", 100_000) == 100_000
    with pytest.raises(FileFormatError):
        quota.render(50_000, "garbage")


def test_io_max_preserves_other_keys_of_the_device() -> None:
    rbps = IoMaxField("rbps")
    current = "8:0 rbps=max wbps=1000 riops=max wiops=7\n8:16 rbps=5 wbps=max riops=max wiops=max\n"
    limit = DeviceLimit(8, 0, 500)
    assert rbps.render(limit, current) == "8:0 rbps=500 wbps=1000 riops=max wiops=7"
    assert rbps.render(DeviceLimit(8, 0, 0), current) == "8:0 rbps=max wbps=1000 riops=max wiops=7"
    assert rbps.render(DeviceLimit(9, 0, 1), "") == "9:0 rbps=1"
    assert rbps.extract(current, DeviceLimit(8, 16, 5)) == 5
    assert rbps.extract(current, limit) == 0  # "max" means no limit
    assert IoMaxField("wbps").extract(current, limit) == 1000


def test_memory_bytes_compare_at_page_granularity() -> None:
    v1 = MemoryBytes("memory.limit_in_bytes", unlimited_text="-1")
    assert v1.render(UNLIMITED, "") == "-1"
    assert MemoryBytes("memory.max").render(UNLIMITED, "") == "max"
    assert v1.extract("9223372036854771712\n", UNLIMITED) == v1.expected(UNLIMITED)
    rounded = (10**9 // PAGE_SIZE) * PAGE_SIZE
    assert v1.extract(str(rounded), 10**9) == v1.expected(10**9 + 1)


def test_weight_formats() -> None:
    cfq = Weight("blkio.weight", 10, 1000, False)
    io_weight = Weight("io.weight", 1, 10000, True)
    assert cfq.render(5, "") == "10"
    assert io_weight.render(800, "default 100\n8:0 50") == "default 800"
    assert io_weight.extract("default 100\n8:0 50", 100) == 100
    assert cfq.extract("500", 500) == 500


def test_every_resource_has_files_and_support_text() -> None:
    for name, resource in RESOURCES.items():
        assert resource.name == name
        assert resource.v1_files or resource.v2_files
        assert resource.support


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(sorted(RESOURCES)),
    value=st.one_of(st.text(max_size=60), st.integers(), st.sampled_from(["max", "-1", "8:0 1", "0-3", " 7 "])),
)
def test_validation_never_crashes(name: str, value: object) -> None:
    """Any input is either accepted into a canonical value or refused with InvalidValueError."""
    resource = RESOURCES[name]
    try:
        canonical = resource.validate(value)
    except InvalidValueError:
        return
    for fmt in resource.files(False) + resource.files(True):
        current = "max 100000" if fmt.filename == "cpu.max" else ""
        text = fmt.render(canonical, current)
        assert text.isascii() and "\n" not in text and "\x00" not in text
