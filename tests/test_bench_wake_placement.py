"""bench/wake_placement.py: the cgroup layouts it builds, how it reads the scheduler's trace, and
one short real run on this host's cgroup v1 cpu controller."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from bench import wake_placement
from bench.wake_placement import make_layout, parse_args, summarize_wakeups, wakeups

# Lines as tracefs prints them (kernel 6.18): the client (pid 300) on CPU 0 wakes the server
# (pid 200) on its own CPU, then on CPU 1, where the reschedule IPI is taken 7 ms late.
TRACE = """\
# tracer: nop
        ls_probe-300     [000] d.s5. 100.000010: sched_wakeup: comm=ls_probe pid=200 prio=120 target_cpu=000
        ls_probe-300     [000] d..2. 100.000030: sched_switch: prev_comm=ls_probe prev_pid=300 prev_prio=120 prev_state=S ==> next_comm=ls_probe next_pid=200 next_prio=120
        ls_probe-300     [000] d.s6. 100.001000: sched_wakeup: comm=ls_probe pid=200 prio=120 target_cpu=001
        ls_probe-400     [001] dnh.. 100.008000: reschedule_entry: vector=253
        ls_probe-400     [001] d..2. 100.008040: sched_switch: prev_comm=ls_probe prev_pid=400 prev_prio=120 prev_state=R ==> next_comm=ls_probe next_pid=200 next_prio=120
        ls_probe-300     [000] d.s6. 100.009000: sched_wakeup: comm=ls_probe pid=2000 prio=120 target_cpu=001
"""


def test_wakeups_are_split_by_placement_and_the_late_ipi_is_found():
    found = wakeups(TRACE, 200)
    assert found["waits"]["local"] == [pytest.approx(20)]
    assert found["waits"]["remote"] == [pytest.approx(7040)]
    assert found["ipi"] == [(pytest.approx(7040), pytest.approx(7000))]
    summary = summarize_wakeups(found)
    assert summary["local"]["n"] == 1 and summary["remote"]["max_us"] == pytest.approx(7040)
    assert summary["slowest_remote"] == [{"waited_us": 7040, "ipi_after_us": 7000}]
    assert wakeups(TRACE, 20)["waits"] == {"local": [], "remote": []}  # pid 2000 is not pid 20


@pytest.mark.parametrize("mode", wake_placement.MODES)
def test_each_mode_puts_be_where_it_says(tmp_path: Path, mode: str):
    groups = make_layout(tmp_path, mode, quota_us=170_000)
    be_group = groups["be"].parent
    assert be_group.name == ("besteffort" if mode == "tier" else "be-group")
    assert be_group.parent == groups["server"].parent.parent  # a sibling of the burstable tier
    if mode == "idle":
        assert (be_group / "cpu.idle").read_text() == "1"
        assert not (be_group / "cpu.shares").exists()
    else:
        assert (be_group / "cpu.shares").read_text() == "2"
        assert not (be_group / "cpu.idle").exists()
    assert (be_group / "cpu.cfs_quota_us").read_text() == "170000"
    assert (groups["server"] / "cpu.shares").read_text() == "1024"


def test_arguments_are_checked():
    args = parse_args(["--modes", "idle,tier", "--variants", "rr", "--quota-cpus", "1.5"])
    assert args.modes == ["idle", "tier"] and args.variants == ["rr"] and args.quota_cpus == 1.5
    for bad in (["--modes", "cpuset"], ["--variants", "udp"], ["--quota-cpus", "-1"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
    with pytest.raises(ValueError, match="unknown mode"):
        make_layout(Path("/nonexistent"), "cpuset", None)


@pytest.mark.skipif(os.geteuid() != 0 or not (wake_placement.CPU_V1 / "cpu.shares").exists()
                    or not shutil.which("gcc"), reason="needs root, gcc and cgroup v1's cpu controller")
def test_a_short_real_run_counts_every_server_wake_up(tmp_path: Path):
    probe = wake_placement.build_probe(tmp_path)
    result = wake_placement.run_once(probe, "tier", "rr", 300, None, tmp_path / "trace.txt")
    assert result["n"] == 300
    placed = result["wakeups"]["local"]["n"] + result["wakeups"]["remote"]["n"]
    # one per request, plus the accept, the close and the odd request read in two parts
    assert 300 <= placed <= 310
    assert not wake_placement.BENCH_ROOT.exists()
