"""The real-node bed's builds, started in the background by ``scripts/test.sh`` so that a fresh
machine's first run (Go builds ~12 min, the core-scheduling kernel ~5 min, measured on a quiet
2-core machine) overlaps the tests that need neither; the tests that need them run last
(tests/conftest.py) and wait here.

``$KOORDNODE_BED_BUILD_DIR`` holds ``build.log`` and, as each step ends, its exit code:
``k8s.rc`` (scripts/k8s-bed.sh), then ``helm.rc`` (``scripts/k8s-bed.sh helm``), then ``koord.rc``
(``scripts/k8s-bed.sh koordinator``: koord-manager),
then ``kernel.rc`` (scripts/core-sched-kernel.sh). Without the
variable (pytest run by hand) nothing is waited for: the builds are whatever the cache holds.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

DIR_ENV = "KOORDNODE_BED_BUILD_DIR"
WAIT_S = 3600.0  # the whole build on a loaded machine, with room


class BackgroundBuildError(RuntimeError):
    """The background build failed, or did not end in time."""


# Steps already waited for in vain: every later caller gets the same error at once instead of
# waiting the whole bound again.
_GAVE_UP: dict[str, str] = {}


def _tail(log: Path, lines: int = 25) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as err:
        return f"(no log: {err})"


def wait_for(step: str, who: str, *, wait_s: float | None = None) -> int | None:
    """Wait until the background build's `step` ("k8s", "helm", "koord", "kernel", ...) ended; its exit code, or
    None when no background build was started. Raises BackgroundBuildError after `wait_s`
    (default WAIT_S, the whole build's bound: once that ran out, later calls raise at once)."""
    bound = WAIT_S if wait_s is None else wait_s
    directory = os.environ.get(DIR_ENV)
    if not directory:
        return None
    rc, log = Path(directory) / f"{step}.rc", Path(directory) / "build.log"
    if step in _GAVE_UP and not rc.is_file():
        raise BackgroundBuildError(_GAVE_UP[step])
    started = time.monotonic()
    announced = False
    while not rc.is_file():
        waited = time.monotonic() - started
        if waited > bound:
            message = (f"the background build's {step} step has not ended after {bound:.0f} s; "
                       f"the end of {log}:\n{_tail(log)}")
            if wait_s is None:
                _GAVE_UP[step] = message
            raise BackgroundBuildError(message)
        if not announced:
            print(f"{who}: waiting for the background build ({step}; log {log})", file=sys.stderr, flush=True)
            announced = True
        time.sleep(2)
    if announced:
        print(f"{who}: background build's {step} step ended after {time.monotonic() - started:.0f} s of waiting",
              file=sys.stderr, flush=True)
    return int(rc.read_text().strip() or "1")


def require(step: str, who: str) -> None:
    """wait_for, then BackgroundBuildError with the log's end if the step failed."""
    code = wait_for(step, who)
    if code not in (None, 0):
        log = Path(os.environ[DIR_ENV]) / "build.log"
        raise BackgroundBuildError(f"the background build's {step} step failed (exit {code}); the end of {log}:\n"
                                   f"{_tail(log)}")


def await_outside_tests(steps: tuple[str, ...], who: str) -> None:
    """Wait for `steps` before a test that needs them starts, so that no test's timeout counts
    the build (tests/conftest.py calls this outside pytest-timeout's bound). A failed or
    overdue build is not raised here: each test that needs it fails with the build's own error
    when its fixture calls `require`, which then answers at once."""
    for step in steps:
        try:
            wait_for(step, who)
        except BackgroundBuildError as err:
            print(f"{who}: {err}", file=sys.stderr, flush=True)
