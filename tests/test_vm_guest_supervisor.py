"""The VM lane guest's pytest supervisor (tests/vm/guest/supervise.py), on the host: a test that
kills its pytest or hangs where pytest-timeout cannot reach it fails with its own name and
cause, and every other test still runs and reports."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from support.junit import outcomes

GUEST = Path(__file__).resolve().parent / "vm" / "guest"
sys.path.insert(0, str(GUEST))

import supervise  # noqa: E402

FAKE_TESTS = '''
import os, signal, time
import pytest

def test_a_passes(tmp_path):
    print("a ran")

def test_b_crashes():
    os.kill(os.getpid(), signal.SIGSEGV)

def test_c_passes(tmp_path):
    pass

@pytest.mark.timeout(1)
def test_d_hangs_where_the_timeout_cannot_reach():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(120)

def test_e_fails(tmp_path):
    assert 1 == 2

@pytest.mark.skip(reason="not here")
def test_f_skipped():
    pass
'''


@pytest.mark.timeout(120)
def test_a_crash_and_a_hang_fail_alone_and_the_other_tests_still_run(tmp_path: Path) -> None:
    tests = tmp_path / "suite"
    tests.mkdir()
    (tests / "test_fake.py").write_text(FAKE_TESTS)
    (tests / "pytest.ini").write_text("[pytest]\ntimeout = 60\n")
    results = tmp_path / "results"
    results.mkdir()
    diagnosed: list[int] = []
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(GUEST)}
    with open(tmp_path / "guest.log", "w") as log:
        outcome = supervise.supervise(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "progress_plugin", "-v",
             "--rootdir", str(tests)],
            [str(tests)], results, cwd=tests, env=env, bound_s=100, log=log,
            diagnose=lambda pid, _log: diagnosed.append(pid), basetemp=tmp_path / "basetemp", hang_grace_s=2)
    text = (tmp_path / "guest.log").read_text()
    assert outcome.exit_code == 1, text
    assert [r.died_in.split("::")[1] if r.died_in else None for r in outcome.runs] == [
        "test_b_crashes", "test_d_hangs_where_the_timeout_cannot_reach", None], text
    assert "SIGSEGV" in outcome.runs[0].cause and "killed" in outcome.runs[1].cause
    assert len(diagnosed) == 1  # the hang: process states and kernel stacks before the kill
    assert "test_d_hangs_where_the_timeout_cannot_reach" in text and "Python stacks (SIGUSR1)" in text, text
    assert outcomes(results / "junit.xml") == {
        "test_a_passes": "passed", "test_b_crashes": "failure", "test_c_passes": "passed",
        "test_d_hangs_where_the_timeout_cannot_reach": "failure", "test_e_fails": "failure",
        "test_f_skipped": "skipped"}
    cases = {c.get("name"): c for c in ET.parse(results / "junit.xml").getroot().iter("testcase")}
    assert "died with SIGSEGV while this test ran" in cases["test_b_crashes"].find("failure").get("message")
    assert "a ran" in (cases["test_a_passes"].find("system-out").text or "")  # from the run that died
    assert [r["exit_code"] for r in json.loads((results / "runs.json").read_text())] == [-11, -9, 1]
    # every run's logs kept apart: pytest empties its basetemp when it starts
    assert sorted(p.name for p in (tmp_path / "basetemp").iterdir()) == ["run1", "run2", "run3"]


def test_a_run_that_ends_normally_is_its_own_junit(tmp_path: Path) -> None:
    tests = tmp_path / "suite"
    tests.mkdir()
    (tests / "test_ok.py").write_text("def test_one():\n    pass\n")
    results = tmp_path / "results"
    results.mkdir()
    with open(tmp_path / "guest.log", "w") as log:
        outcome = supervise.supervise(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "progress_plugin", "--rootdir", str(tests)],
            [str(tests)], results, cwd=tests, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(GUEST)}, bound_s=60,
            log=log, diagnose=lambda pid, _log: None)
    assert outcome.exit_code == 0 and len(outcome.runs) == 1
    assert outcomes(results / "junit.xml") == {"test_one": "passed"}
