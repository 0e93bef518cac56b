"""The benchmarks and the demo reach koordnode and the test harness without editing sys.path.

They run from the repository root as modules (``python3 -m bench.qos_tick``,
``python3 -m scripts.demo``); this imports every one of them that way in a fresh interpreter,
and also every name they import inside functions, so a moved module or a renamed helper breaks
here rather than in the next benchmark run.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(REPO.glob("bench/*.py")) + [REPO / "scripts" / "demo.py"]


def _module(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def _project_imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) of every koordnode/tests import in the file, at any depth."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in ("koordnode", "tests"):
                found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names
                      if alias.name.split(".")[0] in ("koordnode", "tests")]
    return found


def test_no_script_edits_sys_path() -> None:
    edit = re.compile(r"sys\.path\s*(\[|\.(insert|append|extend)|\+?=)")
    offenders = [str(p.relative_to(REPO)) for p in SCRIPTS if edit.search(p.read_text())]
    assert offenders == []


def test_every_script_and_its_imports_resolve_from_the_repository_root() -> None:
    modules = [_module(p) for p in SCRIPTS if p.name != "__init__.py"]
    imports = sorted({item for p in SCRIPTS for item in _project_imports(p)}, key=str)
    assert any(module.startswith("tests.support") for module, _ in imports)
    code = ("import importlib\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            f"for module, name in {imports!r}:\n"
            "    mod = importlib.import_module(module)\n"
            "    if name is not None and not hasattr(mod, name):\n"
            "        importlib.import_module(module + '.' + name)\n"
            "import koordnode\n"
            "print(koordnode.__file__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # The checkout's koordnode, not an installed copy.
    assert done.stdout.strip() == str(REPO / "koordnode" / "__init__.py")
