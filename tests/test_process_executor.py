"""The executor's per-process values: oom_score_adj on a fake procfs, core-scheduling cookies on a
fake PR_SCHED_CORE (and the probe on this kernel)."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest

from support.fake_core_sched import FakeCoreKernel
from koordnode.executor.executor import WriteStatus
from koordnode.executor.process import (
    PR_SCHED_CORE_GET,
    CoreSchedResult,
    CoreScheduling,
    ProcessExecutor,
    oom_score_adj_wanted,
)


def proc(root: Path, pid: int, value: str) -> Path:
    (root / str(pid)).mkdir()
    path = root / str(pid) / "oom_score_adj"
    path.write_text(value + "\n")
    return path


def test_the_floor_keeps_values_this_process_cannot_set():
    assert oom_score_adj_wanted(-300, 900, None) == -300  # CAP_SYS_RESOURCE: the class value
    assert oom_score_adj_wanted(-300, 900, 0) == 0  # not below koordnode's own
    assert oom_score_adj_wanted(-300, -500, 0) == -300  # lower already: the class value, not raised to 0
    assert oom_score_adj_wanted(-300, -200, 0) == -200  # cannot lower it further: left
    assert oom_score_adj_wanted(1000, 0, 0) == 1000


def test_only_a_different_value_is_written_and_counted(tmp_path):
    first, second = proc(tmp_path, 10, "1000"), proc(tmp_path, 11, "0")
    executor = ProcessExecutor(tmp_path)
    results = executor.keep_oom_score_adj([10, 11, 12, 1], 1000, "BE")
    assert [(r.write.pid, r.status) for r in results] == [
        (10, WriteStatus.UNCHANGED), (11, WriteStatus.WRITTEN), (12, WriteStatus.MISSING)]
    assert results[1].overwritten and results[1].old == "0"
    assert (first.read_text().strip(), second.read_text().strip()) == ("1000", "1000")
    assert executor.overwrites == {"oom_score_adj": 1}
    assert executor.last_overwrites["oom_score_adj"]["found"] == "0"
    executor.dry_run = True
    second.write_text("5\n")
    assert executor.keep_oom_score_adj([11], 1000, "BE")[0].status is WriteStatus.WOULD_WRITE
    assert second.read_text().strip() == "5" and executor.overwrites == {"oom_score_adj": 1}


def test_a_pods_processes_get_one_cookie_and_keep_it():
    kernel = FakeCoreKernel()
    core = CoreScheduling(kernel)
    assert core.unavailable is None
    result = core.share([10, 11, 12])
    assert result == CoreSchedResult(3, 2, ())
    assert len({kernel.cookies[pid] for pid in (10, 11, 12)}) == 1 and kernel.cookies[10]
    # koordnode's own threads keep no pod's cookie: the sharing thread has ended.
    assert kernel.threads.get(threading.get_native_id(), 0) == 0
    # Nothing new: nothing written. A process started later (an exec) joins the majority's cookie.
    kernel.calls.clear()
    assert core.share([10, 11, 12]).shared == 0
    assert {cmd for cmd, _ in kernel.calls} == {PR_SCHED_CORE_GET}
    cookie = kernel.cookies[10]
    assert core.share([10, 11, 12, 13]) == CoreSchedResult(4, 1, ())
    assert kernel.cookies[13] == cookie
    # A process that exits meanwhile is no failure.
    kernel.exited = frozenset({14})
    assert core.share([10, 14]) == CoreSchedResult(2, 0, ())


def test_a_dry_run_creates_and_shares_nothing():
    kernel = FakeCoreKernel()
    core = CoreScheduling(kernel, dry_run=True)
    assert core.share([10, 11]).shared == 0 and kernel.cookies == {}


@pytest.mark.parametrize(("error", "says"), [(errno.ENODEV, "without SMT"), (errno.EINVAL, "CONFIG_SCHED_CORE")])
def test_the_kernel_refusing_core_scheduling_is_said_once_and_nothing_is_tried(error, says):
    kernel = FakeCoreKernel(error=error)
    core = CoreScheduling(kernel)
    assert says in (core.unavailable or "")
    assert core.share([10, 11]) == CoreSchedResult(2, 0, ())


def test_this_kernel_answers_the_probe():
    """On a real kernel: either cookies work here, or the reason is one of the known ones."""
    unavailable = CoreScheduling().unavailable
    assert unavailable is None or "SMT" in unavailable or "CONFIG_SCHED_CORE" in unavailable, unavailable
