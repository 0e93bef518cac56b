"""ruff and mypy, configured in pyproject.toml, run as part of the test suite (and so in CI)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    # The checkout under test, not an installed koordnode, is what mypy must read.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MYPY_CACHE_DIR": os.devnull}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed: pip install -e '.[test]' (scripts/install-deps.sh does)")


def test_ruff() -> None:
    _require("ruff")
    result = _run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."])
    assert result.returncode == 0, f"ruff check reports:\n{result.stdout}{result.stderr}"


def test_mypy() -> None:
    _require("mypy")
    result = _run([sys.executable, "-m", "mypy", "--no-incremental"])
    assert result.returncode == 0, f"mypy reports:\n{result.stdout}{result.stderr}"
