"""A VM lane guest whose kernel crashed is booted once more on the tests that had not finished
(tests/vm/reboot.py), on the host: the guest's own pytest, progress plugin and supervisor, with
a test that dies the way a kernel crash ends them (no junit, no exit code), and the lane's boot
step with the boot itself replaced."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from support.junit import outcomes

from vm import lane, reboot

GUEST = Path(__file__).resolve().parent / "vm" / "guest"
sys.path.insert(0, str(GUEST))

import supervise  # noqa: E402

# SIGKILL of pytest itself: nothing after it is written, as when the guest's kernel panics.
FAKE_TESTS = '''
import os, signal
import pytest

def test_a_passes():
    print("a ran")

@pytest.mark.skip(reason="not here")
def test_b_skipped():
    pass

@pytest.mark.parametrize("release", ["1.7", "2.1"])
def test_c_crashes_the_first_boot(release):
    if os.environ.get("FIRST_BOOT") == "1" and release == "2.1":
        os.kill(os.getpid(), signal.SIGKILL)

def test_d_fails():
    assert 1 == 2
'''
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "progress_plugin", "-v"]


def _suite(tmp_path: Path) -> Path:
    tests = tmp_path / "project"
    tests.mkdir()
    (tests / "test_fake.py").write_text(FAKE_TESTS)
    return tests


def _first_boot(tests: Path, results: Path) -> None:
    """pytest as the guest runs it, killed in the middle: progress and collection, nothing else."""
    results.mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(GUEST), "KOORDNODE_GUEST_RESULTS": str(results),
           "FIRST_BOOT": "1"}
    proc = subprocess.run([*PYTEST, "--rootdir", str(tests), str(tests)], cwd=tests, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stdout + proc.stderr


def _second_boot(tests: Path, results: Path, nodeids: list[str]) -> None:
    """The guest's supervisor on the node ids, as tests/vm/guest/run.py passes them."""
    results.mkdir(parents=True)
    with open(results / "guest.log", "w") as log:
        supervise.supervise([*PYTEST, "--rootdir", str(tests)], [str(tests / n) for n in nodeids], results,
                            cwd=tests, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(GUEST)}, bound_s=60,
                            log=log, diagnose=lambda pid, _log: None)


@pytest.mark.timeout(120)
def test_the_second_boot_runs_what_had_not_finished_and_the_results_merge(tmp_path: Path) -> None:
    tests = _suite(tmp_path)
    first, second = tmp_path / "boot-1" / "results", tmp_path / "results"
    _first_boot(tests, first)
    assert not (first / "junit.xml").exists()
    nodeids = reboot.unfinished(first)
    # the test that was running when the kernel died runs again, and everything after it
    assert nodeids == ["test_fake.py::test_c_crashes_the_first_boot[2.1]", "test_fake.py::test_d_fails"]
    _second_boot(tests, second, nodeids)
    assert reboot.merge(first, second) == second / "junit.xml"
    assert outcomes(second / "junit.xml") == {
        "test_a_passes": "passed", "test_b_skipped": "skipped", "test_c_crashes_the_first_boot[1.7]": "passed",
        "test_c_crashes_the_first_boot[2.1]": "passed", "test_d_fails": "failure"}
    suite = ET.parse(second / "junit.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("5", "1")
    cases = {c.get("name"): c for c in ET.parse(second / "junit.xml").getroot().iter("testcase")}
    assert "a ran" in (cases["test_a_passes"].find("system-out").text or "")  # the first boot's output kept
    assert (second / "junit-second-boot.xml").is_file()


def test_a_guest_that_died_before_collecting_runs_everything_again(tmp_path: Path) -> None:
    (tmp_path / "progress.jsonl").write_text("")
    assert reboot.unfinished(tmp_path) is None


def test_only_the_oops_lines_of_the_console_are_the_crash(tmp_path: Path) -> None:
    console = tmp_path / "console.log"
    console.write_text("booting\n[  458.07] Oops: double fault: 0000 [#1] PREEMPT SMP NOPTI\n"
                       "[  458.07] RIP: 0010:rep_movs_alternative+0x0/0x90\n[  458.08] Code: 90 90\n"
                       "[  458.08] Kernel panic - not syncing: Fatal exception in interrupt\n")
    assert reboot.kernel_panic(console).splitlines() == [
        "[  458.07] Oops: double fault: 0000 [#1] PREEMPT SMP NOPTI", "[  458.07] RIP: 0010:rep_movs_alternative+0x0/0x90",
        "[  458.08] Kernel panic - not syncing: Fatal exception in interrupt"]
    assert reboot.kernel_panic(tmp_path / "absent.log") == ""
    assert reboot.crash_report(console).splitlines()[2] == "[  458.08] Code: 90 90"  # the trace, for the CI log


class _FakeBoots:
    """lane._boot_once replaced: the first boot crashes after one test, each later one `then`s."""

    def __init__(self, then: str) -> None:
        self.then = then
        self.requests: list[list[str] | None] = []

    def __call__(self, directory: Path, files, nodeids, *_args, timeout_s: float = 0, began: float = 0,
                 **_kw) -> lane.LaneResult:
        self.requests.append(nodeids)
        results = directory / "results"
        results.mkdir(parents=True)
        console = directory / "console.log"
        crashed = len(self.requests) == 1 or self.then == "crashes"
        if len(self.requests) == 1:
            (results / "collected.json").write_text(json.dumps(["t.py::test_one", "t.py::test_two"]))
            (results / "progress.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [
                {"nodeid": "t.py::test_one", "when": "start"}, {"nodeid": "t.py::test_one", "when": "call",
                                                                "outcome": "passed"},
                {"nodeid": "t.py::test_one", "when": "teardown", "outcome": "passed"},
                {"nodeid": "t.py::test_two", "when": "start"}]))
        elif not crashed:
            supervise.write_junit([ET.Element("testcase", classname="t", name="test_two")], results / "junit.xml")
            (results / "exit_code").write_text("0\n")
        console.write_text("[ 1.0] Oops: double fault\n[ 1.1] Kernel panic - not syncing\n" if crashed else "ok\n")
        exit_file = results / "exit_code"
        return lane.LaneResult(
            accel="tcg", exit_code=int(exit_file.read_text()) if exit_file.is_file() else None,
            junit=results / "junit.xml" if (results / "junit.xml").is_file() else None, guest_log="",
            console_log=console, results_dir=results, image=None, seconds=1.0, files=files)  # type: ignore[arg-type]


def _boot(tmp_path: Path, boots: _FakeBoots, monkeypatch: pytest.MonkeyPatch, timeout_s: float = 3000):
    monkeypatch.setattr(lane, "_boot_once", boots)
    return lane._boot_guest(tmp_path / "shard-1", ("t.py",), None, None, "tcg", tmp_path, {}, tmp_path, 2048, "2",
                            timeout_s, 0.0)


def test_the_lane_boots_a_crashed_guest_once_more_and_reports_the_crash(tmp_path, monkeypatch) -> None:
    boots = _FakeBoots(then="passes")
    result = _boot(tmp_path, boots, monkeypatch)
    assert boots.requests == [None, ["t.py::test_two"]]
    assert result.exit_code == 0 and not result.kernel_panic
    assert result.crashes and "double fault" in result.crashes[0]
    assert outcomes(result.junit) == {"test_one": "passed", "test_two": "passed"}
    kept = tmp_path / "shard-1" / reboot.FIRST_BOOT
    assert "double fault" in (kept / "console.log").read_text() and (kept / "results" / "progress.jsonl").is_file()


def test_a_second_crash_fails_the_lane_as_before(tmp_path, monkeypatch) -> None:
    boots = _FakeBoots(then="crashes")
    result = _boot(tmp_path, boots, monkeypatch)
    assert len(boots.requests) == 2  # no third boot
    assert result.kernel_panic and result.exit_code is None and result.junit is None


def test_no_second_boot_without_the_time_for_one(tmp_path, monkeypatch) -> None:
    boots = _FakeBoots(then="passes")
    result = _boot(tmp_path, boots, monkeypatch, timeout_s=reboot.MIN_REBOOT_S - 1)
    assert boots.requests == [None] and result.kernel_panic
