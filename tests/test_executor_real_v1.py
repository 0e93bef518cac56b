"""The executor on this machine's real cgroup v1 hierarchies (root only).

Creates private cgroups /koordnode-test-<random> (with a child) in cpu, cpuset, memory and
blkio, applies values through CgroupExecutor(root=/sys/fs/cgroup), reads the kernel's files
back, and removes the cgroups at the end. No tasks are ever attached.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordnode.executor.cgroup_executor import CgroupExecutor

from koordnode.executor.write_result import WriteStatus
from koordnode.executor.paths import CgroupVersion, detect_cgroup_version
from koordnode.policy.plan import CgroupWrite
from koordnode.executor.resources import parse_cpu_list
from koordnode.model.kernel import PAGE_SIZE

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("cpu", "cpuset", "memory", "blkio")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0
    or not (ROOT / "cpu").is_dir()
    or not (ROOT / "cpuset").is_dir()
    or not (ROOT / "memory").is_dir()
    or detect_cgroup_version(ROOT) is not CgroupVersion.V1,
    reason="needs root and cgroup v1 hierarchies at /sys/fs/cgroup",
)


def _rmdir_tree(directory: Path) -> None:
    if not directory.is_dir():
        return
    for child in directory.iterdir():
        if child.is_dir():
            _rmdir_tree(child)
    directory.rmdir()


@pytest.fixture
def cgroups() -> Iterator[tuple[str, str]]:
    """(parent, child) cgroup paths, created in every tested controller, removed after."""
    parent = f"/koordnode-test-{secrets.token_hex(4)}"
    child = parent + "/ctr"
    created: list[Path] = []
    try:
        for controller in CONTROLLERS:
            base = ROOT / controller
            if not base.is_dir():
                continue
            for cgroup in (parent, child):
                directory = base / cgroup.lstrip("/")
                directory.mkdir()
                created.append(directory)
                if controller == "cpuset":
                    # A fresh v1 cpuset is empty; give it the parent's sets (no tasks needed).
                    for name in ("cpuset.mems", "cpuset.cpus"):
                        (directory / name).write_text((directory.parent / name).read_text().strip())
        yield parent, child
    finally:
        for directory in reversed(created):
            _rmdir_tree(directory)
        for controller in CONTROLLERS:
            assert not (ROOT / controller / parent.lstrip("/")).exists()


def _read(controller: str, cgroup: str, name: str) -> str:
    return (ROOT / controller / cgroup.lstrip("/") / name).read_text().strip()


def W(cgroup: str, resource: str, value: str | int) -> CgroupWrite:
    return CgroupWrite(cgroup, resource, value, "executor real-cgroup test")


def test_real_cpu_and_memory(cgroups: tuple[str, str]) -> None:
    parent, child = cgroups
    ex = CgroupExecutor(ROOT)
    assert ex.version is CgroupVersion.V1
    limit = 256 * 1024 * 1024 + 1  # the kernel rounds down to a page
    plan = [
        W(parent, "cpu.shares", 1),  # clamped to the kernel minimum
        W(parent, "cpu.cfs_quota_us", 50_000),
        W(parent, "cpu.cfs_period_us", 100_000),
        W(child, "cpu.shares", 262144),
        W(child, "cpu.cfs_quota_us", 20_000),
        W(parent, "memory.limit_in_bytes", limit),
    ]
    results = ex.apply(plan)
    statuses = {(r.write.cgroup, r.write.resource): r.status for r in results}
    assert statuses[(parent, "cpu.cfs_period_us")] is WriteStatus.UNCHANGED  # kernel default
    assert all(r.ok for r in results), [(r.write, r.status, r.detail) for r in results]
    assert _read("cpu", parent, "cpu.shares") == "2"
    assert _read("cpu", parent, "cpu.cfs_quota_us") == "50000"
    assert _read("cpu", child, "cpu.shares") == "262144"
    assert _read("cpu", child, "cpu.cfs_quota_us") == "20000"
    assert _read("memory", parent, "memory.limit_in_bytes") == str(limit - limit % PAGE_SIZE)

    # Second pass: the kernel's spelling (page-rounded, clamped) compares equal.
    assert all(r.status is WriteStatus.UNCHANGED for r in ex.apply(plan))
    # Forced pass re-writes and still verifies.
    assert all(r.status is WriteStatus.WRITTEN for r in ex.apply(plan, force=True))

    back = ex.apply([W(parent, "memory.limit_in_bytes", -1), W(child, "cpu.cfs_quota_us", -1)])
    assert all(r.status is WriteStatus.WRITTEN for r in back)
    assert int(_read("memory", parent, "memory.limit_in_bytes")) >= 1 << 62
    assert _read("cpu", child, "cpu.cfs_quota_us") == "-1"
    assert ex.read(parent, "cpu.shares") == "2"
    assert ex.read_pids(parent) == []


def test_real_cpu_idle_pins_shares(cgroups: tuple[str, str]) -> None:
    parent, _ = cgroups
    if not (ROOT / "cpu" / "cpu.idle").exists():
        pytest.skip("no cpu.idle on this kernel (< 5.15)")
    ex = CgroupExecutor(ROOT)
    # shares listed first: the executor still applies cpu.idle first, then skips shares.
    results = ex.apply([W(parent, "cpu.shares", 2), W(parent, "cpu.idle", 1)])
    assert results[1].status is WriteStatus.WRITTEN
    assert results[0].status is WriteStatus.SKIPPED
    assert "cpu.idle=1" in results[0].detail
    assert _read("cpu", parent, "cpu.idle") == "1"
    assert _read("cpu", parent, "cpu.shares") == "3"  # the kernel's idle weight
    again = ex.apply([W(parent, "cpu.shares", 2)])[0]
    assert again.status is WriteStatus.SKIPPED  # not a failure on every reconcile
    assert ex.unsupported == {}  # and not remembered as unsupported
    back = ex.apply([W(parent, "cpu.idle", 0), W(parent, "cpu.shares", 512)])
    assert [r.status for r in back] == [WriteStatus.WRITTEN, WriteStatus.WRITTEN]
    assert _read("cpu", parent, "cpu.shares") == "512"


def test_real_kernel_rejection_is_reported(cgroups: tuple[str, str]) -> None:
    parent, _ = cgroups
    if not (ROOT / "cpu" / "cpu.cfs_burst_us").exists():
        pytest.skip("no cpu.cfs_burst_us on this kernel")
    ex = CgroupExecutor(ROOT)
    assert ex.apply([W(parent, "cpu.cfs_quota_us", 50_000)])[0].ok
    result = ex.apply([W(parent, "cpu.cfs_burst_us", 60_000)])[0]  # burst > quota: EINVAL
    assert result.status is WriteStatus.FAILED
    assert "EINVAL" in result.detail
    assert _read("cpu", parent, "cpu.cfs_burst_us") == "0"


def test_real_cpuset_ordering(cgroups: tuple[str, str]) -> None:
    parent, child = cgroups
    all_cpus = parse_cpu_list(_read("cpuset", "/", "cpuset.cpus"))
    if len(all_cpus) < 2:
        pytest.skip("needs at least 2 CPUs")
    first, last = min(all_cpus), max(all_cpus)
    ex = CgroupExecutor(ROOT)
    # Narrow both, parent listed first: the executor must write the child first (EBUSY otherwise).
    narrow = ex.apply([W(parent, "cpuset.cpus", str(last)), W(child, "cpuset.cpus", str(last))])
    assert all(r.status is WriteStatus.WRITTEN for r in narrow), [r.detail for r in narrow]
    assert _read("cpuset", parent, "cpuset.cpus") == str(last)
    assert _read("cpuset", child, "cpuset.cpus") == str(last)
    # Move both to the other CPU, child listed first: widen parent first, then narrow.
    move = ex.apply([W(child, "cpuset.cpus", str(first)), W(parent, "cpuset.cpus", str(first))])
    assert all(r.status is WriteStatus.WRITTEN for r in move), [r.detail for r in move]
    assert _read("cpuset", parent, "cpuset.cpus") == str(first)
    assert _read("cpuset", child, "cpuset.cpus") == str(first)
    # Widen both, child listed first: parent must go first.
    everything = _read("cpuset", "/", "cpuset.cpus")
    widen = ex.apply([W(child, "cpuset.cpus", everything), W(parent, "cpuset.cpus", everything)])
    assert all(r.status is WriteStatus.WRITTEN for r in widen), [r.detail for r in widen]
    assert parse_cpu_list(_read("cpuset", child, "cpuset.cpus")) == all_cpus
    mems = ex.apply([W(child, "cpuset.mems", _read("cpuset", "/", "cpuset.mems"))])[0]
    assert mems.status is WriteStatus.UNCHANGED


def test_real_blkio(cgroups: tuple[str, str]) -> None:
    parent, _ = cgroups
    if not (ROOT / "blkio").is_dir():
        pytest.skip("no blkio hierarchy")
    devices = sorted(p for p in Path("/sys/block").iterdir() if (p / "dev").exists() and not p.name.startswith(("loop", "zram", "ram")))
    if not devices:
        pytest.skip("no block device")
    device = (devices[0] / "dev").read_text().strip()
    ex = CgroupExecutor(ROOT)
    results = ex.apply([
        W(parent, "blkio.throttle.read_bps_device", f"{device} 524288000"),
        W(parent, "blkio.throttle.write_bps_device", f"{device} 209715200"),
        W(parent, "blkio.weight", 100),
    ])
    assert results[0].status is WriteStatus.WRITTEN, results[0].detail
    assert results[1].status is WriteStatus.WRITTEN, results[1].detail
    assert _read("blkio", parent, "blkio.throttle.read_bps_device") == f"{device} 524288000"
    assert _read("blkio", parent, "blkio.throttle.write_bps_device") == f"{device} 209715200"
    # BFQ's weight file exists only with BFQ built in; either way, no crash and a clear status.
    assert results[2].status in (WriteStatus.WRITTEN, WriteStatus.UNCHANGED, WriteStatus.SKIPPED)
    removed = ex.apply([W(parent, "blkio.throttle.read_bps_device", f"{device} 0")])[0]
    assert removed.status is WriteStatus.WRITTEN
    assert _read("blkio", parent, "blkio.throttle.read_bps_device") == ""
