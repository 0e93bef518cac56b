"""Parsers and collectors: fake files in the kernel's formats, and this machine's real ones."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
from faketree import make_cgroup_tree, write_cgroup_file

from koordnode.qos.collect import Collector, StatReader
from support.fakeproc import format_meminfo, format_pressure, format_proc_stat, make_procfs
from koordnode.qos.parse import (
    ParseError,
    parse_cpu_max,
    parse_cpu_stat,
    parse_cpuacct_usage,
    parse_memory_stat,
    parse_meminfo,
    parse_pressure,
    parse_proc_stat,
    pressure_total_some,
)

# ------------------------------------------------------------------------ parsers, fixed texts

PROC_STAT = """\
cpu  10442 7 3647 134535 609 3 166 43 11 0
cpu0 4264 3 1545 68629 184 1 75 19 5 0
cpu1 6178 4 2102 65906 425 2 91 24 6 0
cpu3 1 0 0 1 0 0 0 0 0 0
intr 1796356 0 9 0 0 0 0 0 0 0 0
ctxt 3291829
btime 1763777468
processes 10592
procs_running 3
procs_blocked 0
softirq 711536 2 163215 4 41283 0 0 226 282393 0 224413
"""

V1_CPU_STAT = "nr_periods 52\nnr_throttled 7\nthrottled_time 123456789\nnr_bursts 2\nburst_time 5000\n"
V2_CPU_STAT = """\
usage_usec 250000
user_usec 200000
system_usec 50000
core_sched.force_idle_usec 0
nr_periods 40
nr_throttled 3
throttled_usec 12000
nr_bursts 0
burst_usec 0
"""
V1_MEMORY_STAT = """\
cache 9650176
rss 6176768
rss_huge 0
shmem 9109504
mapped_file 7004160
inactive_file 12288
active_file 528384
hierarchical_memory_limit 9223372036854771712
total_cache 768376832
total_rss 202272768
total_inactive_file 313372672
total_active_file 445890560
"""
V2_MEMORY_STAT = """\
anon 104857600
file 52428800
kernel 1048576
kernel_stack 16384
shmem 0
active_anon 100000000
inactive_anon 4857600
active_file 2428800
inactive_file 50000000
workingset_refault_anon 0
pgfault 1234
"""


def test_proc_stat():
    times = parse_proc_stat(PROC_STAT)
    # busy = user + nice + system + irq + softirq + steal (guest is inside user)
    assert times.busy == 10442 + 7 + 3647 + 3 + 166 + 43
    assert times.total == times.busy + 134535 + 609
    assert times.cpus == frozenset({0, 1, 3})  # offline cpu2 has no line


def test_proc_stat_round_trip_and_errors():
    text = format_proc_stat([[10, 0, 5, 100, 1], [20, 0, 5, 90, 0]])
    times = parse_proc_stat(text)
    assert (times.busy, times.total, times.cpus) == (40, 231, frozenset({0, 1}))
    with pytest.raises(ParseError):
        parse_proc_stat("intr 1 2 3\n")
    with pytest.raises(ParseError):
        parse_proc_stat("cpu  a b c d\n")


def test_meminfo():
    info = parse_meminfo(format_meminfo(total_kb=1000, available_kb=250, free_kb=100))
    assert (info.total_bytes, info.available_bytes, info.free_bytes) == (1024000, 256000, 102400)
    assert info.used_percent == pytest.approx(75.0)
    # kernels before 3.14 have no MemAvailable
    old = parse_meminfo("MemTotal:       1000 kB\nMemFree:         400 kB\n")
    assert old.available_bytes == 400 * 1024
    with pytest.raises(ParseError):
        parse_meminfo("MemFree: 12 kB\n")


def test_pressure_with_and_without_full():
    text = "some avg10=4.16 avg60=3.78 avg300=1.74 total=11263032\nfull avg10=0.10 avg60=0.20 avg300=0.30 total=99\n"
    pressure = parse_pressure(text)
    assert pressure.some.avg10 == 4.16 and pressure.some.avg300 == 1.74
    assert pressure.some.total_us == 11263032
    assert pressure.full is not None and pressure.full.total_us == 99
    old_cpu = parse_pressure(format_pressure(500, full_total_us=None))
    assert old_cpu.full is None and old_cpu.some.total_us == 500
    assert pressure_total_some(text) == 11263032
    for bad in ("", "full avg10=1 avg60=1 avg300=1 total=1\n", "some avg10=x avg60=1 avg300=1 total=1\n"):
        with pytest.raises(ParseError):
            parse_pressure(bad)
    with pytest.raises(ParseError):
        pressure_total_some("garbage")


def test_cpu_stat_v1_and_v2():
    v1 = parse_cpu_stat(V1_CPU_STAT)
    assert (v1.usage_ns, v1.nr_periods, v1.nr_throttled, v1.throttled_ns) == (None, 52, 7, 123456789)
    v2 = parse_cpu_stat(V2_CPU_STAT)
    assert (v2.usage_ns, v2.nr_periods, v2.nr_throttled, v2.throttled_ns) == (250_000_000, 40, 3, 12_000_000)
    assert parse_cpuacct_usage("144785610225\n") == 144785610225
    with pytest.raises(ParseError):
        parse_cpu_stat("nr_periods\n")
    with pytest.raises(ParseError):
        parse_cpuacct_usage("lots")


def test_memory_stat_v1_and_v2():
    v1 = parse_memory_stat(V1_MEMORY_STAT)
    assert (v1.anon, v1.file, v1.inactive_file) == (202272768, 768376832, 313372672)  # hierarchical totals
    v2 = parse_memory_stat(V2_MEMORY_STAT)
    assert (v2.anon, v2.file, v2.inactive_file) == (104857600, 52428800, 50000000)
    assert v2.working_set(160_000_000) == 110_000_000
    assert v2.working_set(1) == 0
    with pytest.raises(ParseError):
        parse_memory_stat("pgfault 3\n")
    with pytest.raises(ParseError, match="total_rss"):  # a line that is used must be a number
        parse_memory_stat("cache 1\ntotal_rss 12k\n")
    # Only whole keys count: "total_rss" is not "rss", nor "xanon" "anon".
    assert parse_memory_stat("xanon 5\nanon 7\n").anon == 7
    assert parse_memory_stat("total_rss 3\nrss 9\n").anon == 3


def test_cpu_max():
    assert parse_cpu_max("max 100000\n") == (-1, 100000)
    assert parse_cpu_max("50000 100000\n") == (50000, 100000)
    with pytest.raises(ParseError):
        parse_cpu_max("50000\n")


# ------------------------------------------------------------------------ parsers, real files

REAL_PROC = Path("/proc")


def test_real_proc_files_parse():
    times = parse_proc_stat((REAL_PROC / "stat").read_text())
    assert len(times.cpus) == os.cpu_count()
    assert 0 < times.busy < times.total
    info = parse_meminfo((REAL_PROC / "meminfo").read_text())
    assert 0 < info.available_bytes <= info.total_bytes
    for resource in ("cpu", "memory", "io"):
        path = REAL_PROC / "pressure" / resource
        if path.exists():
            assert parse_pressure(path.read_text()).some.total_us >= 0


@pytest.mark.skipif(not Path("/sys/fs/cgroup/cpu/cpu.stat").exists(), reason="no v1 cpu controller")
def test_real_cgroup_files_parse():
    v1 = parse_cpu_stat(Path("/sys/fs/cgroup/cpu/cpu.stat").read_text())
    assert v1.nr_periods >= 0 and v1.usage_ns is None
    assert parse_cpuacct_usage(Path("/sys/fs/cgroup/cpuacct/cpuacct.usage").read_text()) > 0
    stat = parse_memory_stat(Path("/sys/fs/cgroup/memory/memory.stat").read_text())
    assert stat.anon > 0
    unified = Path("/sys/fs/cgroup/unified/cpu.pressure")
    if unified.exists():
        assert parse_pressure(unified.read_text()).some.total_us > 0


# ------------------------------------------------------------------------ collector, fake trees

POD = "/kubepods/burstable/pod1"


@pytest.fixture
def procfs(tmp_path):
    return make_procfs(tmp_path, cpus=4)


def test_collector_v1_fake_tree(tmp_path, procfs):
    root = make_cgroup_tree(tmp_path, "v1", cgroups=[POD])
    write_cgroup_file(root, POD, "cpuacct.usage", "5000000000")
    write_cgroup_file(root, POD, "cpu.stat", V1_CPU_STAT)
    write_cgroup_file(root, POD, "memory.stat", V1_MEMORY_STAT)
    write_cgroup_file(root, POD, "memory.usage_in_bytes", "400000000")
    write_cgroup_file(root, POD, "cpu.cfs_quota_us", "150000")
    write_cgroup_file(root, POD, "cpuset.cpus", "1-2")
    unified = root / "unified" / POD.strip("/")
    unified.mkdir(parents=True)
    (unified / "cpu.pressure").write_text(format_pressure(777))

    collector = Collector(procfs, root)
    assert not collector.is_v2 and collector.has_cgroup_psi
    assert collector.cpu_usage_ns(POD) == 5_000_000_000
    assert collector.cpu_stat(POD).nr_throttled == 7
    assert collector.memory_usage(POD) == 400_000_000
    assert collector.memory_stat(POD).inactive_file == 313372672
    assert collector.cfs_quota(POD) == (150000, 100000)
    assert collector.cpuset_cpus(POD) == frozenset({1, 2})
    assert collector.pressure(POD, "cpu").some.total_us == 777
    assert collector.pressure_path(POD, "memory") == str(unified / "memory.pressure")
    node = collector.node()
    assert node.cpu.cpus == frozenset(range(4))
    assert node.memory.total_bytes == 16 * 1024 ** 3
    assert set(node.pressure) == {"cpu", "memory", "io"}
    # absent cgroups and files are None, not errors
    assert collector.cpu_usage_ns("/kubepods/burstable/gone") is None
    assert collector.pressure("/kubepods/besteffort", "io") is None
    assert collector.errors == 0


def test_collector_v2_fake_tree(tmp_path, procfs):
    root = make_cgroup_tree(tmp_path, "v2", cgroups=[POD])
    write_cgroup_file(root, POD, "cpu.stat", V2_CPU_STAT)
    write_cgroup_file(root, POD, "memory.stat", V2_MEMORY_STAT)
    write_cgroup_file(root, POD, "memory.current", "160000000")
    write_cgroup_file(root, POD, "cpu.max", "50000 100000")
    write_cgroup_file(root, POD, "cpu.pressure", format_pressure(1234, full_total_us=12))
    collector = Collector(procfs, root)
    assert collector.is_v2
    assert collector.cpu_usage_ns(POD) == 250_000_000
    assert collector.cpu_stat(POD).throttled_ns == 12_000_000
    assert collector.memory_usage(POD) == 160_000_000
    assert collector.memory_stat(POD).working_set(160_000_000) == 110_000_000
    assert collector.cfs_quota(POD) == (50000, 100000)
    assert collector.cpuset_cpus(POD) == frozenset(range(4))  # cpuset.cpus.effective
    assert collector.pressure(POD).some.total_us == 1234


def test_collector_combined_cpu_cpuacct(tmp_path, procfs):
    root = make_cgroup_tree(tmp_path, "v1", cgroups=[POD], combined_cpu_cpuacct=True)
    write_cgroup_file(root, POD, "cpuacct.usage", "42")
    assert Collector(procfs, root).cpu_usage_ns(POD) == 42


def test_malformed_files_are_counted_not_raised(tmp_path, procfs):
    root = make_cgroup_tree(tmp_path, "v1", cgroups=[POD])
    write_cgroup_file(root, POD, "cpuacct.usage", "not a number")
    write_cgroup_file(root, POD, "memory.stat", "odd count\nx\n")
    (procfs / "pressure" / "cpu").write_text("garbage\n")
    collector = Collector(procfs, root)
    assert collector.cpu_usage_ns(POD) is None
    assert collector.memory_stat(POD) is None
    assert collector.node().pressure["cpu"] is None
    assert collector.errors == 3
    assert "pressure/cpu" in collector.last_error


# ------------------------------------------------------------------------ the descriptor cache


def test_stat_reader_rereads_fresh_content_and_sweeps(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.write_text("1")
    two.write_text("2")
    reader = StatReader()
    assert reader.read(str(one)) == "1"
    assert reader.read(str(two)) == "2"
    assert reader.open_count == 2
    with open(one, "r+") as handle:  # rewrite in place, as the kernel regenerates a seq file
        handle.write("9")
    assert reader.read(str(one)) == "9"
    reader.sweep()
    assert reader.open_count == 2  # both read since the last sweep
    reader.read(str(one))
    reader.sweep()
    assert reader.open_count == 1  # two was not read: released
    assert reader.read(str(tmp_path / "missing")) is None
    reader.close()
    assert reader.open_count == 0


def test_stat_reader_respects_max_open(tmp_path):
    reader = StatReader(max_open=1)
    for name in "abc":
        (tmp_path / name).write_text(name)
        assert reader.read(str(tmp_path / name)) == name
    assert reader.open_count == 1


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/sys/fs/cgroup/cpuacct").is_dir(), reason="needs root and v1 cpuacct")
def test_stat_reader_on_a_real_cgroup_that_goes_away():
    path = Path("/sys/fs/cgroup/cpuacct") / f"koordnode-test-collect-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    reader = StatReader()
    try:
        first = reader.read(str(path / "cpuacct.usage"))
        assert first is not None and int(first) == 0
        root_usage = [int(reader.read("/sys/fs/cgroup/cpuacct/cpuacct.usage")) for _ in range(2)]
        end = time.monotonic() + 0.05
        while time.monotonic() < end:
            pass
        assert int(reader.read("/sys/fs/cgroup/cpuacct/cpuacct.usage")) > root_usage[0]  # fresh via pread
    finally:
        path.rmdir()
    assert reader.read(str(path / "cpuacct.usage")) is None  # cached fd on a removed cgroup
    reader.close()


def test_collector_on_this_machine():
    collector = Collector("/proc", "/sys/fs/cgroup")
    node = collector.node()
    assert node.cpu is not None and len(node.cpu.cpus) == os.cpu_count()
    assert node.memory is not None and node.memory.total_bytes > 0
    assert collector.cpu_usage_ns("/") > 0
    if collector.has_cgroup_psi:
        assert collector.pressure("/", "cpu") is not None
    assert collector.errors == 0
    collector.close()
