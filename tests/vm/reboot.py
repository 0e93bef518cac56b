"""A VM lane guest whose kernel crashed, booted once more on the tests that had not finished.

Under TCG the guest kernel has died of the emulator, not of a test: once (CI, 2026-12-02) an
"Oops: double fault" in rep_movs_alternative while a test started pods that passed on every
other run; and before one TCG thread per guest, "Oops: int3" while the kernel patched its own
code. A crash took the whole shard's results with it. Now tests/vm/lane.py keeps the first
boot's console and results under ``boot-1/``, boots a fresh guest on the tests without a result
(the one that was running included), and merges both boots' results into one junit file. The
crash stays in the report (``LaneResult.crashes``); a second crash fails the lane as before.
"""

from __future__ import annotations

import json
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "guest"))
from supervise import cases_from_progress, ended, read_progress, write_junit  # noqa: E402

FIRST_BOOT = "boot-1"
# A second boot needs its own boot and set-up (~4 min under TCG) and time to run something.
MIN_REBOOT_S = 600.0


def kernel_panic(console: Path) -> str:
    """The guest kernel's Oops/panic lines from its serial console, '' when none."""
    try:
        lines = console.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(line for line in lines if "Oops" in line or "Kernel panic" in line or "RIP:" in line)[:2000]


def crash_report(console: Path, lines: int = 80) -> str:
    """The console from the crash's first line on (its call trace, for the CI log), '' when none."""
    try:
        text = console.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    start = next((n for n, line in enumerate(text) if "Oops" in line or "Kernel panic" in line
                  or "BUG:" in line), None)
    return "" if start is None else "\n".join(text[start:start + lines])


def finished(results: Path) -> set[str]:
    """The tests of a boot that ran to their teardown."""
    return ended(read_progress(results / "progress.jsonl"))


def unfinished(results: Path) -> list[str] | None:
    """The collected tests (guest node ids, in run order) without a teardown; None when the
    guest's pytest never finished collecting (then everything runs again)."""
    try:
        collected = json.loads((results / "collected.json").read_text())
    except (OSError, ValueError):
        return None
    done = finished(results)
    return [nodeid for nodeid in collected if nodeid not in done]


def set_aside(directory: Path) -> Path:
    """Move the crashed boot's results and console to ``directory/boot-1``; return that."""
    kept = directory / FIRST_BOOT
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True)
    for name in ("results", "console.log", "qemu.stderr", "qemu-cmd.txt"):
        if (directory / name).exists():
            shutil.move(str(directory / name), str(kept / name))
    return kept


def merge(first_results: Path, results: Path) -> Path | None:
    """One junit file in `results`: the first boot's finished tests (from its progress log) and
    the second boot's own junit. None when the second boot wrote none (it crashed too)."""
    junit = results / "junit.xml"
    if not junit.is_file():
        return None
    first = cases_from_progress(read_progress(first_results / "progress.jsonl"), finished(first_results))
    second = list(ET.parse(junit).getroot().iter("testcase"))
    shutil.copy(junit, results / "junit-second-boot.xml")
    write_junit(first + second, junit)
    return junit
