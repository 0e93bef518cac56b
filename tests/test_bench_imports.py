"""The benchmarks and the demo reach koordnode and the test harness without editing sys.path.

They run from the repository root as modules (``python3 -m bench.qos_tick``,
``python3 -m scripts.demo``); this imports every one of them that way in a fresh interpreter,
so a moved module or a renamed helper breaks here rather than in the next benchmark run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(REPO.glob("bench/*.py")) + [REPO / "scripts" / "demo.py"]


def _module(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def test_no_script_edits_sys_path() -> None:
    edit = re.compile(r"sys\.path\s*(\[|\.(insert|append|extend)|\+?=)")
    offenders = [str(p.relative_to(REPO)) for p in SCRIPTS if edit.search(p.read_text())]
    assert offenders == []


def test_every_script_imports_as_a_module_from_the_repository_root() -> None:
    modules = [_module(p) for p in SCRIPTS if p.name != "__init__.py"]
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "import koordnode, tests.support\n"
            "print(koordnode.__file__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # The checkout's koordnode, not an installed copy.
    assert done.stdout.strip() == str(REPO / "koordnode" / "__init__.py")
