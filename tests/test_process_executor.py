"""The executor's per-process values: oom_score_adj on a fake procfs."""

from __future__ import annotations

from pathlib import Path


from koordnode.executor.write_result import WriteStatus
from koordnode.executor.process import ProcessExecutor, oom_score_adj_wanted, set_oom_score_adj


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


def test_a_symlink_in_the_procfs_tree_never_leads_a_write_outside_it(tmp_path):
    root, outside = tmp_path / "proc", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "oom_score_adj").write_text("0\n")
    (root / "20").symlink_to(outside)  # the pid's directory leads out
    proc(root, 21, "0").unlink()
    (root / "21" / "oom_score_adj").symlink_to(outside / "oom_score_adj")  # the file leads out
    executor = ProcessExecutor(root)
    results = executor.keep_oom_score_adj([20, 21], 1000, "BE")
    assert [r.status for r in results] == [WriteStatus.FAILED, WriteStatus.FAILED]
    assert "Not a directory" in results[0].detail and "symbolic links" in results[1].detail
    assert set_oom_score_adj(root, 20, 1000, "BE") is not None
    assert (outside / "oom_score_adj").read_text() == "0\n"
    assert executor.overwrites == {}
