"""Runs the guest's pytest so that one test cannot take its shard down (VM lane guest side).

pytest writes each test's start and result to ``progress.jsonl`` as they happen
(progress_plugin.py, loaded with `-p progress_plugin`) and the collected test ids to ``collected.json``. This module
watches that log:

- a test still running `HANG_GRACE_S` after its own pytest-timeout bound (blocked where the
  timeout's signal cannot reach it, in the kernel or in C) is ended: its process states and
  kernel stacks, and its Python stacks (SIGUSR1, faulthandler) go to the log, pytest is killed;
- a pytest that died (a signal, or killed as above) leaves the test that was running failed
  with the cause, and pytest starts again on the tests that have no result yet.

Afterwards ``junit.xml`` holds every test's result: pytest's own junit of each run that ended
normally, and for a run that did not, the results it logged as it went plus the one it died in.
Runs on the host too (tests/test_vm_guest_supervisor.py), with any results directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

HANG_GRACE_S = 180.0  # past a test's timeout: pytest-timeout's own report and fixture teardown
POLL_S = 2.0


@dataclass
class Run:
    args: list[str]
    exit_code: int
    seconds: float
    junit: Path
    died_in: str | None = None  # the test that was running when pytest died or was killed
    cause: str = ""


@dataclass
class Outcome:
    exit_code: int  # 0 all passed, 1 a test failed or a run died, 124 the whole bound ran out
    runs: list[Run] = field(default_factory=list)


def read_progress(path: Path, *, run: int | None = None) -> list[dict]:
    """The progress log's entries (of one pytest run, or all)."""
    entries = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line cut by the kill
        if run is None or entry.get("run", 1) == run:
            entries.append(entry)
    return entries


def _append(path: Path, entry: dict) -> None:
    with open(path, "a") as handle:
        handle.write(json.dumps(entry) + "\n")


def running_test(entries: list[dict]) -> dict | None:
    """The start entry of the test running now: the last one started, when it has not reached
    its teardown report (progress_plugin logs every teardown, passed or not)."""
    starts = [e for e in entries if e.get("when") == "start"]
    if not starts:
        return None
    return None if starts[-1]["nodeid"] in ended(entries) else starts[-1]


def ended(entries: list[dict]) -> set[str]:
    """The tests that reached their teardown (progress_plugin logs every one, passed or not)."""
    return {e["nodeid"] for e in entries if e.get("when") == "teardown"}


def reported(entries: list[dict]) -> set[str]:
    """The tests that have a result: any report of theirs besides the start."""
    return {e["nodeid"] for e in entries if e.get("when") != "start"}


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _watch(proc: subprocess.Popen, progress: Path, run_number: int, deadline: float, log: TextIO,
           diagnose: Callable[[int, TextIO], None], hang_grace_s: float) -> tuple[int | None, str]:
    """Wait for pytest; kill it when a test overruns its bound by HANG_GRACE_S (code, cause), or
    return (None, "") when the whole deadline ran out first."""
    while True:
        try:
            return proc.wait(timeout=POLL_S), ""
        except subprocess.TimeoutExpired:
            pass
        now = time.time()
        if time.monotonic() > deadline:
            return None, ""
        current = running_test(read_progress(progress, run=run_number))
        if current is None:
            continue
        bound = float(current.get("timeout_s") or 0)
        if bound and now - float(current["at"]) > bound + hang_grace_s:
            cause = (f"still running {now - float(current['at']):.0f} s after it started (its timeout "
                     f"{bound:.0f} s did not end it): the guest's pytest was killed")
            print(f"supervisor: {current['nodeid']} {cause}", file=log, flush=True)
            diagnose(proc.pid, log)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGUSR1)  # faulthandler: the Python stacks (progress_plugin)
            time.sleep(3)
            proc.kill()
            proc.wait(timeout=60)
            return proc.returncode, cause


def _case(nodeid: str) -> ET.Element:
    path, _, name = nodeid.partition("::")
    classname = path.removesuffix(".py").replace("/", ".")
    return ET.Element("testcase", classname=classname, name=name)


def cases_from_progress(entries: list[dict], nodeids: set[str]) -> list[ET.Element]:
    """junit test cases for the tests of a run that wrote no junit, from what it logged."""
    cases = []
    in_order = dict.fromkeys(e["nodeid"] for e in entries if e["nodeid"] in nodeids)  # first seen first
    for nodeid in in_order:
        mine = [e for e in entries if e["nodeid"] == nodeid and e.get("when") != "start"]
        case = _case(nodeid)
        case.set("time", str(sum(float(e.get("seconds", 0)) for e in mine)))
        for entry in mine:
            if entry.get("outcome") == "failed":
                kind = "failure" if entry.get("when") == "call" else "error"
                ET.SubElement(case, kind, message=entry.get("message", "")[-300:]).text = entry.get("message", "")
            elif entry.get("outcome") == "skipped":
                ET.SubElement(case, "skipped", message=entry.get("message", "")[-500:])
        out = "".join(e.get("stdout", "") for e in mine)
        if out:
            ET.SubElement(case, "system-out").text = out
        cases.append(case)
    return cases


def merge_junit(runs: list[Run], entries_by_run: list[list[dict]], target: Path) -> None:
    cases: list[ET.Element] = []
    for run, entries in zip(runs, entries_by_run, strict=True):
        if run.died_in is None and run.junit.is_file():
            cases += ET.parse(run.junit).getroot().iter("testcase")
        else:
            cases += cases_from_progress(entries, reported(entries))
    write_junit(cases, target)


def write_junit(cases: list[ET.Element], target: Path) -> None:
    """One junit suite of `cases`, with its counts."""
    suite = ET.Element("testsuite", name="pytest")
    suite.extend(cases)
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
    suite.set("errors", str(sum(1 for c in cases if c.find("error") is not None)))
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(target, encoding="unicode")


def supervise(pytest_cmd: list[str], paths: list[str], results: Path, *, cwd: Path, env: dict[str, str],
              bound_s: float, log: TextIO, diagnose: Callable[[int, TextIO], None],
              basetemp: Path | None = None, hang_grace_s: float = HANG_GRACE_S) -> Outcome:
    """pytest_cmd + paths, again on the tests without a result after a run that died, within
    bound_s. pytest_cmd names neither a junit file nor a basetemp: each run gets its own (pytest
    empties its basetemp at start, and the logs of a run that died are wanted)."""
    progress, collected_file = results / "progress.jsonl", results / "collected.json"
    deadline = time.monotonic() + bound_s
    outcome = Outcome(exit_code=0)
    entries_by_run: list[list[dict]] = []
    args = list(paths)
    collected: list[str] | None = None
    while True:
        number = len(outcome.runs) + 1
        junit = results / f"junit-run{number}.xml"
        cmd = [*pytest_cmd, f"--junitxml={junit}"]
        if basetemp is not None:
            basetemp.mkdir(parents=True, exist_ok=True)
            cmd.append(f"--basetemp={basetemp / f'run{number}'}")
        cmd += args
        print(f"+ {' '.join(cmd)}", file=log, flush=True)
        began = time.monotonic()
        run_env = {**env, "KOORDNODE_GUEST_RESULTS": str(results), "KOORDNODE_GUEST_RUN": str(number)}
        proc = subprocess.Popen(cmd, cwd=cwd, env=run_env, stdout=log, stderr=subprocess.STDOUT)
        code, cause = _watch(proc, progress, number, deadline, log, diagnose, hang_grace_s)
        entries = read_progress(progress, run=number)
        if code is None:  # the whole bound: the caller diagnoses and reports it as before
            print(f"guest pytest not done within the bound ({bound_s:.0f} s): stopped", file=log, flush=True)
            diagnose(proc.pid, log)
            proc.kill()
            proc.wait(timeout=60)
            outcome.runs.append(Run(args, 124, time.monotonic() - began, junit))
            entries_by_run.append(entries)
            outcome.exit_code = 124
            break
        if collected is None and collected_file.is_file():
            collected = json.loads(collected_file.read_text())
        run = Run(args, code, time.monotonic() - began, junit)
        outcome.runs.append(run)
        entries_by_run.append(entries)
        print(f"guest pytest run {number} exit {code} after {run.seconds:.0f} s", file=log, flush=True)
        if code in (0, 5) and not cause:
            break
        if code in (1, 2, 3, 4) and not cause and junit.is_file():
            outcome.exit_code = 1
            break
        # Died (a signal, or killed by _watch): the running test fails with the cause, the
        # tests after it run in a new pytest.
        outcome.exit_code = 1
        current = running_test(entries)
        run.died_in = current["nodeid"] if current else None
        run.cause = cause or (f"the guest's pytest died with {_signal_name(code)} while this test ran"
                              if code < 0 else f"the guest's pytest exited {code} without a report")
        print(f"supervisor: {run.died_in or '(no test running)'}: {run.cause}", file=log, flush=True)
        stacks = results / "stacks.log"
        if stacks.is_file() and stacks.stat().st_size:
            print(f"--- Python stacks (SIGUSR1):\n{stacks.read_text(errors='replace')[-20000:]}", file=log, flush=True)
            stacks.write_text("")
        if run.died_in is not None:
            failure = {"nodeid": run.died_in, "when": "call", "outcome": "failed", "seconds": 0, "run": number,
                       "message": f"{run.cause}; see guest.log for its output and stacks"}
            entries.append(failure)
            _append(progress, failure)
        done = {n for earlier in entries_by_run for n in reported(earlier)}
        remaining = [n for n in (collected or []) if n not in done]
        if not remaining or run.died_in is None or time.monotonic() > deadline - 60:
            break
        args = remaining
    merge_junit(outcome.runs, entries_by_run, results / "junit.xml")
    (results / "runs.json").write_text(json.dumps(
        [{"exit_code": r.exit_code, "seconds": round(r.seconds), "tests": len(r.args), "died_in": r.died_in,
          "cause": r.cause} for r in outcome.runs], indent=1))
    return outcome
