"""ruff and mypy, configured in pyproject.toml, run as part of the test suite (and so in CI)."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
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


_LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "msg"}
_EVENT_NAME = re.compile(r"[a-z][a-z0-9_]*")


def test_log_event_names_are_snake_case() -> None:
    # One style for event names (operators grep and alert on them): `config_reloaded`, not
    # "config reloaded". Explanations go into a field (detail=...), not into the event name.
    offenders = []
    for path in sorted((ROOT / "koordnode").rglob("*.py")):
        if "_pb2" in path.name:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _LOG_METHODS and node.args):
                continue
            receiver = ast.unparse(node.func.value)
            event = node.args[0]
            if ("log" in receiver.lower() and isinstance(event, ast.Constant) and isinstance(event.value, str)
                    and not _EVENT_NAME.fullmatch(event.value)):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {receiver}.{node.func.attr}({event.value!r})")
    assert not offenders, "log event names must be snake_case:\n" + "\n".join(offenders)
