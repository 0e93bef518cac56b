"""pytest plugin of the VM lane's guest (``-p progress_plugin``): what tests/vm/guest/supervise.py
watches. Into ``$KOORDNODE_GUEST_RESULTS``: ``collected.json`` (the test ids in run order) and
``progress.jsonl``, one line per event, written and synced as it happens so a pytest that dies or
is killed still leaves them: each test's start (with its timeout), its failed or skipped setup,
its call, and its teardown (every one: the end of the test). SIGUSR1 writes every thread's Python
stack to ``stacks.log`` (sent only right before the process is killed: faulthandler walks other
threads' frames unsafely, so never on a timer in a process that goes on)."""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import time
from pathlib import Path

import pytest

_RESULTS = os.environ.get("KOORDNODE_GUEST_RESULTS", "")
_RUN = int(os.environ.get("KOORDNODE_GUEST_RUN", "1"))  # which of the supervisor's pytest runs
_stacks = None
_TIMEOUTS: dict[str, float] = {}  # test id -> its pytest-timeout bound, from collection


def _results() -> Path | None:
    return Path(_RESULTS) if _RESULTS and os.path.isdir(_RESULTS) else None


def _write(entry: dict) -> None:
    results = _results()
    if results is None:
        return
    with open(results / "progress.jsonl", "a") as handle:
        handle.write(json.dumps({**entry, "run": _RUN}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def pytest_configure(config: pytest.Config) -> None:
    global _stacks
    results = _results()
    if results is not None and _stacks is None:
        _stacks = open(results / "stacks.log", "a")  # noqa: SIM115 - for the process's life
        faulthandler.register(signal.SIGUSR1, file=_stacks, all_threads=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    results = _results()
    if results is not None and _RUN == 1:
        (results / "collected.json").write_text(json.dumps([item.nodeid for item in session.items]))


def _timeout_s(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    try:
        return float(item.config.getini("timeout") or 0)
    except (ValueError, KeyError):
        return 0.0


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _write({"nodeid": nodeid, "when": "start", "at": time.time(), "timeout_s": _TIMEOUTS.get(nodeid, 0.0)})


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    _TIMEOUTS.update({item.nodeid: _timeout_s(item) for item in items})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "setup" and report.passed:
        return
    entry = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
             "seconds": round(report.duration, 1)}
    if report.failed or report.skipped:
        entry["message"] = str(report.longrepr)[-4000:]
    if report.capstdout and report.when == "call":
        entry["stdout"] = report.capstdout[-2000:]
    _write(entry)
