"""CgroupExecutor and ProcfsExecutor on fake v1 / v2 / Anolis trees."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import koordnode.executor.cgroup_executor as cgroup_executor_module
import koordnode.executor.converge as converge_module
from faketree import (
    add_cgroup,
    cgroup_file,
    make_cgroup_tree,
    make_procfs_tree,
    read_cgroup_file,
    remove_cgroup_file,
    write_cgroup_file,
)
from koordnode.executor.cgroup import CgroupFS
from koordnode.executor.cgroup import write_file as real_write_file
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.executor.procfs_executor import ProcfsExecutor
from koordnode.executor.write_result import WriteStatus
from koordnode.policy.plan import SysctlWrite
from koordnode.executor.paths import UnsafePathError, container_cgroup_path, pod_cgroup_path
from koordnode.policy.plan import CgroupWrite
from koordnode.executor.resources import parse_cpu_list

POD = "/kubepods/besteffort/pod1"
CTR = POD + "/c1"


def patch_write_path(monkeypatch: pytest.MonkeyPatch, name: str, replacement: Any) -> None:
    """Replace `name` (a file or path function) in every module of the write path that calls it:
    converge.py (write, read back) and cgroup_executor.py (lookup, v1 cpuset widening)."""
    for module in (converge_module, cgroup_executor_module):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, replacement)


class RecordingLogger:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def _record(self, level: str, event: str, **fields: Any) -> None:
        self.events.append((level, event, fields))

    def debug(self, event: str, **fields: Any) -> None:
        self._record("debug", event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._record("info", event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._record("warning", event, **fields)

    def named(self, event: str) -> list[dict[str, Any]]:
        return [fields for _, name, fields in self.events if name == event]


def W(cgroup: str, resource: str, value: str | int, reason: str = "test") -> CgroupWrite:
    return CgroupWrite(cgroup, resource, value, reason)


@pytest.fixture
def log() -> RecordingLogger:
    return RecordingLogger()


def tree(tmp_path: Path, version: str, anolis: bool = False, **kwargs: Any) -> Path:
    return make_cgroup_tree(tmp_path, version, anolis, [CTR], **kwargs)


# ----------------------------------------------------------------------------- mapping


@pytest.mark.parametrize("combined", [False, True])
def test_v1_writes_land_in_controller_files(tmp_path: Path, log: RecordingLogger, combined: bool) -> None:
    root = tree(tmp_path, "v1", combined_cpu_cpuacct=combined)
    ex = CgroupExecutor(root, logger=log)
    results = ex.apply([
        W(POD, "cpu.shares", 2, "BE pod"),
        W(POD, "cpu.cfs_quota_us", 50_000),
        W(POD, "cpu.cfs_period_us", 20_000),
        W(POD, "cpu.cfs_burst_us", 10_000),
        W(CTR, "cpu.idle", 1),
        W(POD, "memory.limit_in_bytes", 1 << 30),
        W(POD, "blkio.weight", 100),
        W(POD, "blkio.throttle.read_bps_device", "254:0 524288000"),
        W(POD, "blkio.throttle.write_bps_device", "254:0 209715200"),
    ])
    assert [r.status for r in results] == [
        WriteStatus.WRITTEN] * 6 + [WriteStatus.UNCHANGED] + [WriteStatus.WRITTEN] * 2
    assert read_cgroup_file(root, POD, "cpu.shares") == "2"
    assert read_cgroup_file(root, POD, "cpu.cfs_quota_us") == "50000"
    assert read_cgroup_file(root, POD, "cpu.cfs_period_us") == "20000"
    assert read_cgroup_file(root, POD, "cpu.cfs_burst_us") == "10000"
    assert read_cgroup_file(root, CTR, "cpu.idle") == "1"
    assert read_cgroup_file(root, POD, "memory.limit_in_bytes") == str(1 << 30)
    assert read_cgroup_file(root, POD, "blkio.bfq.weight") == "100"  # no CFQ file here: BFQ's
    assert read_cgroup_file(root, POD, "blkio.throttle.read_bps_device") == "254:0 524288000"
    assert read_cgroup_file(root, POD, "blkio.throttle.write_bps_device") == "254:0 209715200"
    first = results[0]
    assert (first.old, first.new, first.reason) == ("1024", "2", "BE pod")
    assert first.path == str(cgroup_file(root, POD, "cpu.shares").resolve())
    written = log.named("cgroup_write")
    assert len(written) == 8
    shares_event = next(event for event in written if event["resource"] == "cpu.shares")
    assert shares_event == {
        "path": first.path, "old": "1024", "new": "2", "reason": "BE pod",
        "cgroup": POD, "resource": "cpu.shares",
    }


def test_v2_conversions(tmp_path: Path, log: RecordingLogger) -> None:
    root = tree(tmp_path, "v2")
    ex = CgroupExecutor(root, logger=log)
    results = ex.apply([
        W(POD, "cpu.shares", 1024),
        W(POD, "cpu.cfs_burst_us", 5000),
        W(CTR, "cpu.idle", 1),
        W(POD, "memory.limit_in_bytes", 1 << 30),
        W(POD, "memory.min", 1 << 20),
        W(POD, "memory.low", 2 << 20),
        W(POD, "memory.high", 3 << 20),
        W(POD, "blkio.weight", 800),
        W(POD, "cpuset.cpus", "0,1,2"),
        W(POD, "cpuset.mems", "0"),
    ])
    assert all(r.status is WriteStatus.WRITTEN for r in results), results
    assert read_cgroup_file(root, POD, "cpu.weight") == "39"
    assert read_cgroup_file(root, POD, "cpu.max.burst") == "5000"
    assert read_cgroup_file(root, CTR, "cpu.idle") == "1"
    assert read_cgroup_file(root, POD, "memory.max") == str(1 << 30)
    assert read_cgroup_file(root, POD, "memory.min") == str(1 << 20)
    assert read_cgroup_file(root, POD, "memory.low") == str(2 << 20)
    assert read_cgroup_file(root, POD, "memory.high") == str(3 << 20)
    assert read_cgroup_file(root, POD, "io.weight") == "default 800"
    assert read_cgroup_file(root, POD, "cpuset.cpus") == "0-2"
    # back to unlimited spells "max" on v2
    assert ex.apply([W(POD, "memory.limit_in_bytes", -1)])[0].status is WriteStatus.WRITTEN
    assert read_cgroup_file(root, POD, "memory.max") == "max"


def test_v2_cpu_max_keeps_the_other_field(tmp_path: Path) -> None:
    root = tree(tmp_path, "v2")
    ex = CgroupExecutor(root)
    ex.apply([W(POD, "cpu.cfs_period_us", 50_000)])
    assert read_cgroup_file(root, POD, "cpu.max") == "max 50000"
    ex.apply([W(POD, "cpu.cfs_quota_us", 20_000)])
    assert read_cgroup_file(root, POD, "cpu.max") == "20000 50000"
    ex.apply([W(POD, "cpu.cfs_period_us", 100_000)])
    assert read_cgroup_file(root, POD, "cpu.max") == "20000 100000"
    ex.apply([W(POD, "cpu.cfs_quota_us", -1)])
    assert read_cgroup_file(root, POD, "cpu.max") == "max 100000"


def test_v2_cpu_max_unreadable_fails_cleanly(tmp_path: Path) -> None:
    root = tree(tmp_path, "v2")
    write_cgroup_file(root, POD, "cpu.max", "garbage")
    result = CgroupExecutor(root).apply([W(POD, "cpu.cfs_quota_us", 20_000)])[0]
    assert result.status is WriteStatus.FAILED
    assert "cpu.max" in result.detail
    assert read_cgroup_file(root, POD, "cpu.max") == "garbage"


def test_v2_io_max_keeps_other_keys(tmp_path: Path) -> None:
    root = tree(tmp_path, "v2")
    write_cgroup_file(root, POD, "io.max", "254:0 rbps=max wbps=1000 riops=max wiops=max\n")
    ex = CgroupExecutor(root)
    result = ex.apply([W(POD, "blkio.throttle.read_bps_device", "254:0 524288000")])[0]
    assert result.status is WriteStatus.WRITTEN
    assert read_cgroup_file(root, POD, "io.max") == "254:0 rbps=524288000 wbps=1000 riops=max wiops=max"
    ex.apply([W(POD, "blkio.throttle.write_bps_device", "254:0 0")])  # 0 = no limit
    assert read_cgroup_file(root, POD, "io.max") == "254:0 rbps=524288000 wbps=max riops=max wiops=max"
    again = ex.apply([W(POD, "blkio.throttle.read_bps_device", "254:0 524288000")])[0]
    assert again.status is WriteStatus.UNCHANGED


# ----------------------------------------------------------------------------- Anolis & support


def test_anolis_v1_memory_qos_and_group_identity(tmp_path: Path) -> None:
    root = tree(tmp_path, "v1", anolis=True)
    results = CgroupExecutor(root).apply([
        W(POD, "memory.min", 1 << 20),
        W(POD, "memory.low", 2 << 20),
        W(POD, "memory.high", -1),
        W(POD, "memory.high", 3 << 20),
        W(POD, "memory.wmark_ratio", 95),
        W(POD, "memory.wmark_scale_factor", 20),
        W(POD, "memory.wmark_min_adj", -25),
        W(POD, "cpu.bvt_warp_ns", -1),
    ])
    assert [r.status for r in results] == [
        WriteStatus.WRITTEN, WriteStatus.WRITTEN, WriteStatus.UNCHANGED] + [WriteStatus.WRITTEN] * 5
    assert read_cgroup_file(root, POD, "memory.high") == str(3 << 20)
    assert read_cgroup_file(root, POD, "memory.wmark_min_adj") == "-25"
    assert read_cgroup_file(root, POD, "cpu.bvt_warp_ns") == "-1"


def test_anolis_v2_files(tmp_path: Path) -> None:
    root = tree(tmp_path, "v2", anolis=True)
    results = CgroupExecutor(root).apply([W(POD, "cpu.bvt_warp_ns", 2), W(POD, "memory.wmark_ratio", 90)])
    assert all(r.status is WriteStatus.WRITTEN for r in results)
    assert read_cgroup_file(root, POD, "cpu.bvt_warp_ns") == "2"


def test_unsupported_is_skipped_once_and_cached(tmp_path: Path, log: RecordingLogger) -> None:
    root = tree(tmp_path, "v1")  # upstream v1: no memory.high, no wmark, no bvt
    ex = CgroupExecutor(root, logger=log)
    plan = [W(POD, "memory.high", 1 << 20), W(CTR, "memory.wmark_ratio", 95), W(POD, "cpu.bvt_warp_ns", -1)]
    first = ex.apply(plan)
    assert [r.status for r in first] == [WriteStatus.SKIPPED] * 3
    assert "memory.high not present" in first[0].detail
    assert "Anolis" in first[1].detail
    assert len(log.named("cgroup_resource_unsupported")) == 3
    # The file appearing later does not matter until the cache is cleared: not re-probed.
    write_cgroup_file(root, POD, "memory.high", "max")
    for _ in range(3):
        again = ex.apply(plan)
        assert [r.status for r in again] == [WriteStatus.SKIPPED] * 3
        assert again[0].detail == first[0].detail
    assert len(log.named("cgroup_resource_unsupported")) == 3
    assert set(ex.unsupported) == {"memory.high", "memory.wmark_ratio", "cpu.bvt_warp_ns"}
    ex.forget_unsupported()
    assert ex.apply(plan[:1])[0].status is WriteStatus.WRITTEN


def test_v2_only_file_removed_is_unsupported(tmp_path: Path) -> None:
    root = tree(tmp_path, "v2")
    remove_cgroup_file(root, POD, "cpu.idle")  # kernel < 5.15
    result = CgroupExecutor(root).apply([W(POD, "cpu.idle", 1)])[0]
    assert result.status is WriteStatus.SKIPPED
    assert "5.15" in result.detail


def test_root_cgroup_support_is_cached_separately(tmp_path: Path) -> None:
    root = tree(tmp_path, "v1")  # blkio.bfq.weight exists only below the root
    ex = CgroupExecutor(root)
    assert ex.apply([W("/", "blkio.weight", 500)])[0].status is WriteStatus.SKIPPED
    assert ex.apply([W(POD, "blkio.weight", 500)])[0].status is WriteStatus.WRITTEN


def test_controller_not_mounted(tmp_path: Path, log: RecordingLogger) -> None:
    root = tree(tmp_path, "v1")
    os.rename(root / "blkio", tmp_path / "blkio-unmounted")
    ex = CgroupExecutor(root, logger=log)
    for _ in range(2):
        result = ex.apply([W(POD, "blkio.weight", 500)])[0]
        assert result.status is WriteStatus.SKIPPED
        assert "not mounted" in result.detail
    assert len(log.named("cgroup_resource_unsupported")) == 1


def test_cfq_weight_preferred_and_clamped(tmp_path: Path) -> None:
    root = tree(tmp_path, "v1")
    write_cgroup_file(root, POD, "blkio.weight", "500")
    result = CgroupExecutor(root).apply([W(POD, "blkio.weight", 5)])[0]
    assert result.status is WriteStatus.WRITTEN
    assert read_cgroup_file(root, POD, "blkio.weight") == "10"  # CFQ's minimum
    assert read_cgroup_file(root, POD, "blkio.bfq.weight") == "100"


# ----------------------------------------------------------------------------- convergence


@pytest.mark.parametrize(
    ("version", "filename", "content", "resource", "value"),
    [
        ("v1", "cpuset.cpus", "0,1,2,3", "cpuset.cpus", "0-3"),
        ("v1", "cpu.cfs_quota_us", "-1", "cpu.cfs_quota_us", -1),
        ("v1", "memory.limit_in_bytes", "9223372036854771712", "memory.limit_in_bytes", -1),
        ("v1", "memory.limit_in_bytes", "999997440", "memory.limit_in_bytes", 1_000_000_001),
        ("v1", "cpu.shares", "2\n", "cpu.shares", 1),
        ("v2", "cpu.max", "max 100000\n", "cpu.cfs_quota_us", -1),
        ("v2", "cpu.max", "max 100000", "cpu.cfs_period_us", 100_000),
        ("v2", "cpu.weight", "39", "cpu.shares", 1024),
        ("v2", "memory.max", "max", "memory.limit_in_bytes", "-1"),
        ("v2", "io.weight", "default 100\n8:0 300", "blkio.weight", 100),
        ("v2", "io.max", "254:0 rbps=500 wbps=max riops=max wiops=max", "blkio.throttle.read_bps_device", "254:0 500"),
        ("v2", "io.max", "", "blkio.throttle.write_bps_device", "254:0 0"),
    ],
)
def test_equal_values_are_not_rewritten(
    tmp_path: Path, log: RecordingLogger, version: str, filename: str, content: str, resource: str, value: object
) -> None:
    root = tree(tmp_path, version)
    write_cgroup_file(root, POD, filename, content)
    result = CgroupExecutor(root, logger=log).apply([W(POD, resource, value)])[0]
    assert result.status is WriteStatus.UNCHANGED, result
    assert cgroup_file(root, POD, filename).read_text() == content  # untouched
    assert log.named("cgroup_write") == []


def test_force_rewrites_equal_values(tmp_path: Path, log: RecordingLogger) -> None:
    root = tree(tmp_path, "v1")
    write_cgroup_file(root, POD, "cpuset.cpus", "0,1,2,3")
    result = CgroupExecutor(root, logger=log).apply([W(POD, "cpuset.cpus", "0-3")], force=True)[0]
    assert result.status is WriteStatus.WRITTEN
    assert result.detail == "forced rewrite"
    assert read_cgroup_file(root, POD, "cpuset.cpus") == "0-3"
    assert len(log.named("cgroup_write_forced")) == 1


def test_kubelet_overwrite_is_reconciled(tmp_path: Path) -> None:
    root = tree(tmp_path, "v1")
    ex = CgroupExecutor(root)
    plan = [W(POD, "cpu.shares", 2)]
    assert ex.apply(plan)[0].status is WriteStatus.WRITTEN
    assert ex.apply(plan)[0].status is WriteStatus.UNCHANGED
    write_cgroup_file(root, POD, "cpu.shares", "1024")  # someone else wrote it
    result = ex.apply(plan)[0]
    assert (result.status, result.old, result.new) == (WriteStatus.WRITTEN, "1024", "2")


def test_overwrite_by_another_writer_is_noticed_counted_and_restored(tmp_path: Path, log: RecordingLogger) -> None:
    root = tree(tmp_path, "v2")
    ex = CgroupExecutor(root, logger=log)
    plan = [W(POD, "cpu.cfs_quota_us", 50000), W(POD, "cpu.shares", 7)]
    assert all(r.status is WriteStatus.WRITTEN and not r.overwritten for r in ex.apply(plan))
    assert not any(r.overwritten for r in ex.apply(plan, force=True)), "koordnode's own rewrite is no overwrite"
    write_cgroup_file(root, POD, "cpu.max", "max 100000")  # e.g. systemd re-applying CPUQuota=
    results = ex.apply(plan, force=True)
    assert [r.overwritten for r in results] == [True, False]
    assert results[0].status is WriteStatus.WRITTEN and results[0].detail == "restored after an overwrite"
    assert read_cgroup_file(root, POD, "cpu.max") == "50000 100000"
    assert ex.overwrites == {"cpu.cfs_quota_us": 1}
    assert list(ex.last_overwrites.values())[0]["found"] == "max 100000"
    assert len(log.named("cgroup_write_overwritten")) == 1
    # Non-forced passes notice it too; a changed plan of koordnode's own is not an overwrite.
    write_cgroup_file(root, POD, "cpu.weight", "100")
    assert [r.overwritten for r in ex.apply(plan)] == [False, True]
    assert not any(r.overwritten for r in ex.apply([W(POD, "cpu.shares", 9)]))
    assert sum(ex.overwrites.values()) == 2


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_kernel_resetting_the_weight_of_a_group_leaving_idle_is_not_an_overwrite(
        tmp_path: Path, version: str) -> None:
    root = tree(tmp_path, version)
    weight_file, default, other = ("cpu.shares", "1024", "512") if version == "v1" else ("cpu.weight", "100", "50")
    ex = CgroupExecutor(root)
    assert ex.apply([W(POD, "cpu.shares", 2)])[0].status is WriteStatus.WRITTEN
    ex.apply([W(POD, "cpu.idle", 1)])
    ex.apply([W(POD, "cpu.idle", 0)])
    # What the kernel does on cpu.idle 1 -> 0: the group is back at the default weight.
    write_cgroup_file(root, POD, weight_file, default)
    result = ex.apply([W(POD, "cpu.shares", 2)])[0]
    assert (result.status, result.overwritten) == (WriteStatus.WRITTEN, False)
    assert ex.overwrites == {}
    # Once koordnode owns the weight again, another writer changing it is noticed.
    write_cgroup_file(root, POD, weight_file, other)
    assert ex.apply([W(POD, "cpu.shares", 2)])[0].overwritten
    assert ex.overwrites == {"cpu.shares": 1}


def test_recreated_cgroup_is_not_an_overwrite(tmp_path: Path) -> None:
    root = tree(tmp_path, "v2")
    ex = CgroupExecutor(root)
    ex.apply([W(POD, "cpu.shares", 7)])
    directory = cgroup_file(root, POD, "cpu.weight").parent
    moved = directory.with_name("old")
    directory.rename(moved)
    directory.mkdir()  # a new cgroup at the same path (a new inode), with default values
    for f in moved.iterdir():
        if f.is_file():
            (directory / f.name).write_text("100" if f.name == "cpu.weight" else f.read_text())
    result = ex.apply([W(POD, "cpu.shares", 7)])[0]
    assert result.status is WriteStatus.WRITTEN and not result.overwritten
    assert ex.overwrites == {}


def test_read_back_mismatch_fails_with_both_values(
    tmp_path: Path, log: RecordingLogger, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tree(tmp_path, "v1")
    sticky = cgroup_file(root, POD, "cpu.cfs_quota_us").resolve()

    def kernel_that_ignores_writes(path: Path, text: str) -> None:
        if Path(path) == sticky:
            return  # the file "sticks" at its old value
        real_write_file(path, text)

    patch_write_path(monkeypatch, "write_file", kernel_that_ignores_writes)
    result = CgroupExecutor(root, logger=log).apply([W(POD, "cpu.cfs_quota_us", 50_000)])[0]
    assert result.status is WriteStatus.FAILED
    assert (result.old, result.new, result.read_back) == ("-1", "50000", "-1")
    assert "'-1'" in result.detail and "'50000'" in result.detail
    assert log.named("cgroup_write_failed")[0]["new"] == "50000"


def test_kernel_rejection_is_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tree(tmp_path, "v1")

    def einval(path: Path, text: str) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")

    patch_write_path(monkeypatch, "write_file", einval)
    result = CgroupExecutor(root).apply([W(POD, "cpu.cfs_burst_us", 90_000)])[0]
    assert result.status is WriteStatus.FAILED
    assert "EINVAL" in result.detail


def test_missing_cgroup_is_distinct_and_not_cached(tmp_path: Path) -> None:
    root = tree(tmp_path, "v1")
    ex = CgroupExecutor(root)
    later = "/kubepods/besteffort/pod2"
    for _ in range(2):
        result = ex.apply([W(later, "cpu.shares", 2)])[0]
        assert result.status is WriteStatus.MISSING
    assert ex.unsupported == {}
    add_cgroup(root, later)
    assert ex.apply([W(later, "cpu.shares", 2)])[0].status is WriteStatus.WRITTEN


def test_cgroup_vanishing_mid_write_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tree(tmp_path, "v1")

    def gone(path: Path, text: str) -> None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory")

    patch_write_path(monkeypatch, "write_file", gone)
    assert CgroupExecutor(root).apply([W(POD, "cpu.shares", 2)])[0].status is WriteStatus.MISSING


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_idle_group_skips_shares_without_caching(tmp_path: Path, log: RecordingLogger, version: str) -> None:
    root = tree(tmp_path, version)
    ex = CgroupExecutor(root, logger=log)
    weight_file = "cpu.shares" if version == "v1" else "cpu.weight"
    before = read_cgroup_file(root, POD, weight_file)
    results = ex.apply([W(POD, "cpu.shares", 2), W(POD, "cpu.idle", 1)])
    assert [r.status for r in results] == [WriteStatus.SKIPPED, WriteStatus.WRITTEN]
    assert "cpu.idle=1" in results[0].detail
    assert read_cgroup_file(root, POD, weight_file) == before
    assert ex.unsupported == {}
    assert log.named("cgroup_resource_unsupported") == []
    back = ex.apply([W(POD, "cpu.shares", 2), W(POD, "cpu.idle", 0)])
    assert [r.status for r in back] == [WriteStatus.WRITTEN, WriteStatus.WRITTEN]


def test_refusals(tmp_path: Path) -> None:
    root = tree(tmp_path, "v1")
    results = CgroupExecutor(root).apply([
        W(POD, "cpu.idle", 2),
        W(POD, "tasks", "1"),
        W(POD, "cpu.nope", 1),
        W(POD, "cpu.shares", "2\n1024"),
    ])
    assert [r.status for r in results] == [WriteStatus.REFUSED] * 4
    assert read_cgroup_file(root, POD, "cpu.idle") == "0"
    assert read_cgroup_file(root, POD, "cpu.shares") == "1024"


def test_results_keep_plan_order(tmp_path: Path) -> None:
    root = tree(tmp_path, "v1")
    plan = [W(CTR, "cpuset.cpus", "1"), W(POD, "cpu.shares", 2), W(POD, "cpuset.cpus", "1-2"), W(CTR, "cpu.idle", 1)]
    results = CgroupExecutor(root).apply(plan)
    assert [r.write for r in results] == plan
    assert all(r.status is WriteStatus.WRITTEN for r in results)


def test_read_and_pids(tmp_path: Path) -> None:
    root = tree(tmp_path, "v2")
    write_cgroup_file(root, POD, "cgroup.procs", "12\n34\n")
    write_cgroup_file(root, POD, "cgroup.threads", "12\n13\n34\n")
    ex = CgroupExecutor(root)
    assert ex.read(POD, "cpu.cfs_quota_us") == "max 100000"
    assert ex.read(POD, "cpu.shares") == "100"  # raw cpu.weight on v2
    assert ex.read("/kubepods/none", "cpu.shares") is None
    assert ex.read_pids(POD) == [12, 34]
    assert ex.read_pids(POD, threads=True) == [12, 13, 34]
    assert ex.read_pids("/kubepods/none") is None
    assert ex.cgroup_exists(POD) and not ex.cgroup_exists("/kubepods/none")
    with pytest.raises(UnsafePathError):
        ex.read("/../../etc", "cpu.shares")


def test_systemd_paths_end_to_end(tmp_path: Path) -> None:
    parent = "kubepods-besteffort-podabc.slice"
    pod = pod_cgroup_path(parent)
    ctr = container_cgroup_path(parent, "f" * 64)
    root = make_cgroup_tree(tmp_path, "v1", cgroups=[ctr])
    results = CgroupExecutor(root).apply([W(pod, "cpu.shares", 2), W(ctr, "cpu.cfs_quota_us", 20_000)])
    assert all(r.status is WriteStatus.WRITTEN for r in results)
    assert (root / "cpu/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podabc.slice"
            / f"cri-containerd-{'f' * 64}.scope/cpu.cfs_quota_us").read_text() == "20000"


# ----------------------------------------------------------------------------- cpuset ordering


class SubsetEnforcingKernel:
    """Emulates v1's cpuset rule on a fake tree: a child's set must be within its parent's,
    and a parent may not drop CPUs a child still uses."""

    def __init__(self) -> None:
        self.order: list[tuple[str, str]] = []

    def __call__(self, path: Path, text: str) -> None:
        path = Path(path)
        if path.name == "cpuset.cpus":
            new = parse_cpu_list(text)
            parent = path.parent.parent / "cpuset.cpus"
            if parent.exists() and not new <= parse_cpu_list(parent.read_text()):
                raise OSError(errno.EACCES, "Permission denied")
            for child in path.parent.iterdir():
                if child.is_dir() and not parse_cpu_list((child / "cpuset.cpus").read_text()) <= new:
                    raise OSError(errno.EBUSY, "Device or resource busy")
            self.order.append((path.parent.name, text))
        real_write_file(path, text)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (("0-1", "0-1"), ("0-3", "0-3")),  # widen both: parent first
        (("0-3", "0-3"), ("1", "1")),  # narrow both: child first
        (("0-1", "0-1"), ("2-3", "2-3")),  # disjoint move: widen to 0-3, then narrow
        (("0-3", "0-1"), ("2-5", "4-5")),  # mixed
        (("0-7", "0-1"), ("0-3", "2-3")),  # parent narrows, child moves
    ],
)
@pytest.mark.parametrize("child_first_in_plan", [False, True])
def test_v1_cpuset_ordering(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    before: tuple[str, str],
    after: tuple[str, str],
    child_first_in_plan: bool,
) -> None:
    root = make_cgroup_tree(tmp_path, "v1", cgroups=[CTR], cpus="0-7")
    write_cgroup_file(root, POD, "cpuset.cpus", before[0])
    write_cgroup_file(root, CTR, "cpuset.cpus", before[1])
    kernel = SubsetEnforcingKernel()
    patch_write_path(monkeypatch, "write_file", kernel)
    plan = [W(POD, "cpuset.cpus", after[0]), W(CTR, "cpuset.cpus", after[1])]
    if child_first_in_plan:
        plan.reverse()
    results = CgroupExecutor(root).apply(plan)
    assert all(r.status is WriteStatus.WRITTEN for r in results), results
    assert read_cgroup_file(root, POD, "cpuset.cpus") == after[0]
    assert read_cgroup_file(root, CTR, "cpuset.cpus") == after[1]
    by_cgroup = {r.write.cgroup: r for r in results}
    assert by_cgroup[POD].old == before[0]  # the original value, not an intermediate one
    assert by_cgroup[CTR].old == before[1]


def test_v1_naive_order_would_fail(tmp_path: Path) -> None:
    """Sanity check of the emulation: narrowing the parent first is refused."""
    root = make_cgroup_tree(tmp_path, "v1", cgroups=[CTR], cpus="0-7")
    kernel = SubsetEnforcingKernel()
    with pytest.raises(OSError):
        kernel(cgroup_file(root, POD, "cpuset.cpus"), "1")


def test_v2_cpuset_written_directly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tree(tmp_path, "v2")
    write_cgroup_file(root, POD, "cpuset.cpus", "0-1")
    write_cgroup_file(root, CTR, "cpuset.cpus", "0-1")
    writes: list[str] = []
    patch_write_path(monkeypatch, "write_file", lambda p, t: (writes.append(t), real_write_file(p, t)))
    results = CgroupExecutor(root).apply([W(POD, "cpuset.cpus", "2-3"), W(CTR, "cpuset.cpus", "2-3")])
    assert all(r.status is WriteStatus.WRITTEN for r in results)
    assert writes == ["2-3", "2-3"]  # no intermediate union on v2


# ----------------------------------------------------------------------------- hostile paths


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside the root that looks like a cgroup, with sentinel content."""
    directory = tmp_path / "outside"
    directory.mkdir()
    for name in ("cpu.shares", "cpu.cfs_quota_us", "cpuset.cpus", "memory.limit_in_bytes"):
        (directory / name).write_text("SENTINEL")
    return directory


def assert_untouched(directory: Path) -> None:
    for path in directory.iterdir():
        assert path.read_text() == "SENTINEL", path


@pytest.mark.parametrize("cgroup", [
    "../../outside",
    "/../../outside",
    "/kubepods/../../../outside",
    "kubepods/besteffort/pod1/../../../../outside",
    "/kubepods\x00/x",
    "/kubepods\n/x",
])
def test_traversal_is_refused(tmp_path: Path, outside: Path, log: RecordingLogger, cgroup: str) -> None:
    root = tree(tmp_path, "v1")
    results = CgroupExecutor(root, logger=log).apply([W(cgroup, "cpu.shares", 2), W(cgroup, "cpuset.cpus", "0")])
    assert [r.status for r in results] == [WriteStatus.REFUSED] * 2
    assert len(log.named("cgroup_write_refused")) == 2
    assert_untouched(outside)


def test_absolute_path_is_relative_to_root(tmp_path: Path, outside: Path) -> None:
    root = tree(tmp_path, "v1")
    result = CgroupExecutor(root).apply([W(str(outside), "cpu.shares", 2)])[0]
    assert result.status is WriteStatus.MISSING  # <root>/cpu/<tmp>/outside, not the real one
    assert_untouched(outside)


def test_symlinked_cgroup_dir_pointing_out_is_refused(tmp_path: Path, outside: Path) -> None:
    root = tree(tmp_path, "v1")
    (root / "cpu/kubepods/evil").symlink_to(outside)
    (root / "cpuset/kubepods/evil").symlink_to("../../../outside")
    results = CgroupExecutor(root).apply([
        W("/kubepods/evil", "cpu.shares", 2),
        W("/kubepods/evil", "cpuset.cpus", "0"),
    ])
    assert [r.status for r in results] == [WriteStatus.REFUSED] * 2
    assert "outside" in results[0].detail
    assert_untouched(outside)


def test_symlinked_file_pointing_out_is_refused(tmp_path: Path, outside: Path) -> None:
    root = tree(tmp_path, "v2")
    quota = cgroup_file(root, POD, "memory.max")
    quota.unlink()
    quota.symlink_to(outside / "memory.limit_in_bytes")
    result = CgroupExecutor(root).apply([W(POD, "memory.limit_in_bytes", 1 << 20)])[0]
    assert result.status is WriteStatus.REFUSED
    assert_untouched(outside)


def test_a_file_in_a_resolved_cgroup_is_known_from_one_lstat_and_a_link_is_still_resolved(
        tmp_path: Path, outside: Path) -> None:
    """A plain file (or its absence) in a directory cgroup_dir resolved needs no resolution of its
    own; a file that is a link is resolved and confined as before, also when it is missing."""
    fs = CgroupFS(tree(tmp_path, "v2"))
    pod = fs.cgroup_dir(fs.root, POD)
    assert fs.existing_file(fs.root, pod, "memory.max") == pod / "memory.max"
    assert fs.existing_file(fs.root, pod, "memory.bogus") is None
    (pod / "not-a-file").mkdir()
    assert fs.existing_file(fs.root, pod, "not-a-file") is None
    (pod / "inside").symlink_to(pod / "memory.max")
    assert fs.existing_file(fs.root, pod, "inside") == pod / "memory.max"
    (pod / "dangling").symlink_to(pod / "gone")
    assert fs.existing_file(fs.root, pod, "dangling") is None
    (pod / "out").symlink_to(outside / "memory.limit_in_bytes")
    with pytest.raises(UnsafePathError):
        fs.existing_file(fs.root, pod, "out")
    with pytest.raises(UnsafePathError):
        fs.cgroup_file(fs.root, pod, "out")
    assert_untouched(outside)


def test_symlinked_controller_pointing_out_is_refused(tmp_path: Path, outside: Path) -> None:
    root = tree(tmp_path, "v1")
    os.rename(root / "cpu", tmp_path / "cpu-real")
    (root / "cpu").symlink_to(outside)
    result = CgroupExecutor(root).apply([W("/", "cpu.shares", 2)])[0]
    assert result.status is WriteStatus.REFUSED
    assert_untouched(outside)


def test_a_cgroup_dir_swapped_for_a_link_out_after_a_write_is_refused(tmp_path: Path, outside: Path) -> None:
    """Located files are remembered between writes; the directory is checked each time."""
    root = tree(tmp_path, "v1")
    ex = CgroupExecutor(root)
    plan = [W(CTR, "cpu.shares", 2), W(CTR, "cpuset.cpus", "0")]
    assert [r.status for r in ex.apply(plan)] == [WriteStatus.WRITTEN] * 2
    for controller in ("cpu", "cpuset"):
        real = root / controller / CTR.lstrip("/")
        real.rename(real.with_name("c1-moved"))
        real.symlink_to(outside)
    results = ex.apply(plan)
    assert [r.status for r in results] == [WriteStatus.REFUSED] * 2, results
    assert_untouched(outside)


def test_pids_are_read_again_from_a_recreated_cgroup_and_never_through_a_swapped_link(
        tmp_path: Path, outside: Path) -> None:
    """The membership file found for a cgroup is remembered with its identity, and read again
    only while the same file is there."""
    root = tree(tmp_path, "v1")
    write_cgroup_file(root, CTR, "cgroup.procs", "12\n")
    (outside / "cgroup.procs").write_text("666\n")
    ex = CgroupExecutor(root)
    assert ex.read_pids(CTR) == [12]
    write_cgroup_file(root, CTR, "cgroup.procs", "12\n13\n")  # the same file, new members
    assert ex.read_pids(CTR) == [12, 13]
    real = root / "cpu" / CTR.lstrip("/")
    real.rename(real.with_name("c1-moved"))
    real.symlink_to(outside)  # swapped for a link out: the path is looked up again, and refused
    with pytest.raises(UnsafePathError):
        ex.read_pids(CTR)
    real.unlink()
    real.mkdir()  # recreated: another file at the same path
    (real / "cgroup.procs").write_text("14\n")
    assert ex.read_pids(CTR) == [14]
    shutil.rmtree(real)
    assert ex.read_pids(CTR) is None  # gone


def test_a_recreated_cgroup_is_found_again(tmp_path: Path) -> None:
    root = tree(tmp_path, "v1")
    ex = CgroupExecutor(root)
    plan = [W(CTR, "cpu.shares", 2)]
    assert ex.apply(plan)[0].status is WriteStatus.WRITTEN
    for controller in ("cpu", "cpuset", "cpuacct", "memory", "blkio", "pids"):
        directory = root / controller / CTR.lstrip("/")
        for child in directory.iterdir():
            child.unlink()
        directory.rmdir()
    assert ex.apply(plan)[0].status is WriteStatus.MISSING
    add_cgroup(root, CTR)  # kubelet recreated it: fresh defaults
    assert ex.apply(plan)[0].status is WriteStatus.WRITTEN
    assert read_cgroup_file(root, CTR, "cpu.shares") == "2"


def test_a_file_gone_under_a_remembered_location_is_looked_up_again(tmp_path: Path) -> None:
    """v2: cpu.max goes away when the parent stops delegating the cpu controller; the write is
    then what a first write would be (unsupported), not a stale "missing"."""
    root = tree(tmp_path, "v2")
    ex = CgroupExecutor(root)
    assert ex.apply([W(CTR, "cpu.cfs_quota_us", 50000)])[0].status is WriteStatus.WRITTEN
    remove_cgroup_file(root, CTR, "cpu.max")
    again = ex.apply([W(CTR, "cpu.cfs_quota_us", 60000)])[0]
    fresh = CgroupExecutor(root).apply([W(CTR, "cpu.cfs_quota_us", 60000)])[0]
    assert (again.status, again.detail) == (fresh.status, fresh.detail) == (WriteStatus.SKIPPED, fresh.detail)


def test_a_remembered_location_is_not_resolved_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reconcile pass checks the same files every period: after the first write each one
    costs a stat of its directory and a read, not a path resolution."""
    import koordnode.executor.cgroup as cgroup_module

    root = tree(tmp_path, "v1")
    ex = CgroupExecutor(root)
    plan = [W(CTR, "cpu.shares", 2), W(CTR, "cpu.cfs_quota_us", 50000), W(CTR, "cpuset.cpus", "0")]
    ex.apply(plan)
    resolved: list[Path] = []
    real = cgroup_module._realpath
    monkeypatch.setattr(cgroup_module, "_realpath", lambda path: resolved.append(path) or real(path))
    assert [r.status for r in ex.apply(plan)] == [WriteStatus.UNCHANGED] * 3
    assert resolved == []
    ex.forget_unsupported()  # a config reload looks everything up again
    ex.apply(plan)
    assert resolved


def test_symlink_inside_the_root_is_followed(tmp_path: Path) -> None:
    """The co-mounted v1 layout relies on in-root symlinks (cpu -> cpu,cpuacct)."""
    root = tree(tmp_path, "v1", combined_cpu_cpuacct=True)
    assert (root / "cpu").is_symlink()
    result = CgroupExecutor(root).apply([W(POD, "cpu.shares", 4)])[0]
    assert result.status is WriteStatus.WRITTEN
    assert (root / "cpu,cpuacct" / POD.lstrip("/") / "cpu.shares").read_text() == "4"


def test_hostile_slice_name_never_reaches_a_write(tmp_path: Path, outside: Path) -> None:
    with pytest.raises(UnsafePathError):
        pod_cgroup_path("kubepods-..-outside.slice")
    with pytest.raises(UnsafePathError):
        container_cgroup_path("../../outside", "abc")
    assert_untouched(outside)


def test_bad_root(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        CgroupExecutor(tmp_path / "does-not-exist")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError):
        CgroupExecutor(tmp_path / "empty")


# ----------------------------------------------------------------------------- procfs


def test_procfs_writes(tmp_path: Path, log: RecordingLogger) -> None:
    root = make_procfs_tree(tmp_path, min_free_kbytes=67584, watermark_scale_factor=10)
    ex = ProcfsExecutor(root, logger=log)
    results = ex.apply([
        SysctlWrite("vm.min_free_kbytes", 135168, "memory QoS"),
        SysctlWrite("vm.watermark_scale_factor", 10),
        SysctlWrite("vm.watermark_scale_factor", 0),
        SysctlWrite("vm.nope", 1),
        SysctlWrite("vm.min_free_kbytes", "1\n2"),
    ])
    assert [r.status for r in results] == [
        WriteStatus.WRITTEN, WriteStatus.UNCHANGED, WriteStatus.REFUSED, WriteStatus.REFUSED, WriteStatus.REFUSED]
    assert (root / "sys/vm/min_free_kbytes").read_text() == "135168"
    assert ex.read("vm.min_free_kbytes") == "135168"
    assert log.named("sysctl_write")[0]["old"] == "67584"
    assert log.named("sysctl_write")[0]["sysctl"] == "vm.min_free_kbytes"
    forced = ex.write("vm.watermark_scale_factor", 10, force=True)
    assert (forced.status, forced.detail) == (WriteStatus.WRITTEN, "forced rewrite")


def test_procfs_unsupported_and_escape(tmp_path: Path, outside: Path, log: RecordingLogger) -> None:
    root = make_procfs_tree(tmp_path)
    (root / "sys/vm/watermark_scale_factor").unlink()
    (root / "sys/vm/min_free_kbytes").unlink()
    (root / "sys/vm/min_free_kbytes").symlink_to(outside / "cpu.shares")
    ex = ProcfsExecutor(root, logger=log)
    for _ in range(2):
        assert ex.write("vm.watermark_scale_factor", 100).status is WriteStatus.SKIPPED
    assert len(log.named("sysctl_unsupported")) == 1
    assert ex.write("vm.min_free_kbytes", 1000).status is WriteStatus.REFUSED
    assert_untouched(outside)


# --- repeated writes (the reconcile pass applies the same plans every period) ----------------


def test_a_repeated_write_is_not_looked_up_again_and_an_unsupported_one_reads_nothing(
        tmp_path: Path, monkeypatch) -> None:
    root = tree(tmp_path, "v1")
    ex = CgroupExecutor(root)
    plan = [W(POD, "cpu.shares", 2), W(CTR, "cpuset.cpus", "0-1"), W(CTR, "memory.min", 1 << 20)]
    first = ex.apply(plan)
    assert [r.status for r in first] == [WriteStatus.WRITTEN, WriteStatus.WRITTEN, WriteStatus.SKIPPED]
    ex.apply(plan)
    counts = {"normalize": 0, "resolve": 0, "reads": 0}

    def spy(name, key):
        real = getattr(cgroup_executor_module, name)

        def wrapper(*args, **kwargs):
            counts[key] += 1
            return real(*args, **kwargs)

        patch_write_path(monkeypatch, name, wrapper)

    spy("normalize_cgroup_path", "normalize")
    spy("read_file", "reads")
    spy("read_file_if_same", "reads")
    monkeypatch.setattr(ex._fs, "cgroup_dir", lambda *a: pytest.fail("looked up again"))
    again = ex.apply(plan)
    assert [r.status for r in again] == [WriteStatus.UNCHANGED, WriteStatus.UNCHANGED, WriteStatus.SKIPPED]
    assert counts["normalize"] == 0
    # One read each for cpu.shares and the cpuset (no widening read); none for memory.min.
    assert counts["reads"] == 2, counts


def test_repeated_checks_still_tell_the_same_value_from_an_overwrite(tmp_path: Path, log: RecordingLogger) -> None:
    root = tree(tmp_path, "v1")
    ex = CgroupExecutor(root, logger=log)
    plan = [W(CTR, "cpuset.cpus", "0-3"), W(POD, "cpu.cfs_quota_us", 50000)]
    for _ in range(3):
        ex.apply(plan)
    write_cgroup_file(root, CTR, "cpuset.cpus", "0,1,2,3")  # the same set, spelt otherwise
    assert [r.status for r in ex.apply(plan)] == [WriteStatus.UNCHANGED] * 2
    assert ex.overwrites == {}
    write_cgroup_file(root, CTR, "cpuset.cpus", "0-1")  # another writer narrowed it
    write_cgroup_file(root, POD, "cpu.cfs_quota_us", "-1")
    results = ex.apply(plan)
    assert [(r.status, r.overwritten) for r in results] == [(WriteStatus.WRITTEN, True)] * 2
    assert read_cgroup_file(root, CTR, "cpuset.cpus") == "0-3"
    assert read_cgroup_file(root, POD, "cpu.cfs_quota_us") == "50000"
    assert ex.overwrites == {"cpuset.cpus": 1, "cpu.cfs_quota_us": 1}
    assert [r.status for r in ex.apply(plan)] == [WriteStatus.UNCHANGED] * 2
    # A cgroup recreated with the very text koordnode last saw is no overwrite and is checked.
    directory = cgroup_file(root, POD, "cpu.cfs_quota_us").parent
    directory.rename(directory.with_name("pod1-old"))
    add_cgroup(root, POD)
    write_cgroup_file(root, POD, "cpu.cfs_quota_us", "50000")
    assert [(r.status, r.overwritten) for r in ex.apply(plan)][1] == (WriteStatus.UNCHANGED, False)
    assert ex.overwrites == {"cpuset.cpus": 1, "cpu.cfs_quota_us": 1}


def test_a_repeated_check_of_a_weight_still_never_writes_an_idle_groups_weight(tmp_path: Path) -> None:
    root = tree(tmp_path, "v1")
    ex = CgroupExecutor(root)
    plan = [W(CTR, "cpu.shares", 2)]
    ex.apply(plan)
    assert ex.apply(plan)[0].status is WriteStatus.UNCHANGED
    write_cgroup_file(root, CTR, "cpu.idle", "1")
    # Holding koordnode's value: nothing to write, whether the group is idle or not.
    assert ex.apply(plan)[0].status is WriteStatus.UNCHANGED
    write_cgroup_file(root, CTR, "cpu.shares", "1024")  # the kernel's (or another writer's) weight
    result = ex.apply(plan)[0]
    assert result.status is WriteStatus.SKIPPED and "cpu.idle=1" in result.detail
    assert read_cgroup_file(root, CTR, "cpu.shares") == "1024"


def test_a_cgroup_dir_swapped_for_a_link_out_after_quiet_checks_is_refused(tmp_path: Path, outside: Path) -> None:
    """Repeated checks compare the identity of the file they open; the swapped path leads to
    another file, so the full lookup runs and refuses it."""
    (outside / "cpu.shares").write_text("2")  # even the value koordnode wants
    root = tree(tmp_path, "v1")
    ex = CgroupExecutor(root)
    plan = [W(CTR, "cpu.shares", 2)]
    for _ in range(3):
        ex.apply(plan)
    assert ex.apply(plan)[0].status is WriteStatus.UNCHANGED
    real = root / "cpu" / CTR.lstrip("/")
    real.rename(real.with_name("c1-moved"))
    real.symlink_to(outside)
    assert ex.apply(plan)[0].status is WriteStatus.REFUSED
    assert (outside / "cpu.shares").read_text() == "2"


def test_v2_enable_subtree_controllers_writes_only_the_missing_ones_it_has(tmp_path: Path) -> None:
    """What kubelet's cgroup library does along a new cgroup's path: "+c" for each controller the
    cgroup has (cgroup.controllers) and has not enabled for its children (cgroup.subtree_control)."""
    root = tree(tmp_path, "v2")
    tier = "/kubepods.slice/kubepods-besteffort.slice"
    add_cgroup(root, tier + "/kubepods-besteffort-pod1.slice")
    write_cgroup_file(root, tier, "cgroup.controllers", "cpuset cpu io memory pids")
    write_cgroup_file(root, tier, "cgroup.subtree_control", "cpu io memory pids")
    ex = CgroupExecutor(root)
    assert ex.enable_subtree_controllers(tier, ("cpu", "cpuset", "memory", "hugetlb", "pids")) == (["cpuset"], None)
    assert read_cgroup_file(root, tier, "cgroup.subtree_control") == "+cpuset"  # the kernel adds it to the rest
    write_cgroup_file(root, tier, "cgroup.subtree_control", "cpuset cpu io memory pids")
    assert ex.enable_subtree_controllers(tier, ("cpu", "cpuset")) == ([], None)
    enabled, problem = ex.enable_subtree_controllers("/no/such", ("cpuset",))
    assert enabled == [] and problem and "/no/such" in problem
    assert ex.enable_subtree_controllers("/../../etc", ("cpuset",))[1] is not None  # confined to the root
    dry = CgroupExecutor(root, dry_run=True)
    write_cgroup_file(root, tier, "cgroup.subtree_control", "cpu")
    assert dry.enable_subtree_controllers(tier, ("cpuset",)) == ([], None)
    assert read_cgroup_file(root, tier, "cgroup.subtree_control") == "cpu"
    v1 = CgroupExecutor(tree(tmp_path / "v1", "v1"))
    assert v1.enable_subtree_controllers("/kubepods", ("cpuset",))[1] == "cgroup v1: no cgroup.subtree_control"
