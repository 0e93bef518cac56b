"""The architecture, enforced: imports point down the layers, and only executor/ writes to the kernel.

Both checks read the source (AST), so an import inside a function counts like one at the top,
and nothing is imported to check it. The table below is the one of docs/architecture.md's layers
section; a change of the structure changes both.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "koordnode"

# Layers, lowest first: a module may import its own layer and the ones below, never above.
LAYERS: dict[str, int] = {
    "koordnode.model": 0,
    "koordnode.config": 1,
    "koordnode.policy": 2,
    "koordnode.executor": 3,
    "koordnode.cri": 4,
    "koordnode.kube": 4,
    "koordnode.metrics": 5,
    "koordnode.observe": 5,
    "koordnode.hooks": 6,
    "koordnode.qos": 7,
    "koordnode.proxy": 8,
    "koordnode.nri": 8,
    "koordnode.admin": 9,
    "koordnode.doctor": 9,
    "koordnode.daemon": 9,
    "koordnode.cli": 9,
    "koordnode.__main__": 9,
}
# Modules whose place is not their folder's (exact names; they win over LAYERS).
PLACED: dict[str, int] = {}
# Leaves: anyone may import them; they import nothing of koordnode but generated protobuf code.
LEAVES = frozenset({"koordnode", "koordnode.logsetup", "koordnode.sdnotify", "koordnode.nodelock"})
# proxy/ is an adapter over CRI: besides itself and the leaves it may use cri/ only (its
# interceptor protocol is its own: proxy/interceptor.py), never hooks, qos or the model's state.
PROXY_MAY_IMPORT = ("koordnode.proxy", "koordnode.cri")

# Kernel writes outside executor/: each allowed one with why. (module, function) -> reason.
WRITE_ALLOWED: dict[tuple[str, str], str] = {
    ("koordnode.admin.server", "AdminServer.start"): "the admin socket's mode (koordnode's own runtime file)",
    ("koordnode.proxy.server", "prepare_socket_path"): "the CRI socket's directory (koordnode's own runtime file)",
    ("koordnode.proxy.server", "ProxyServer.start"): "the CRI socket's mode (koordnode's own runtime file)",
    ("koordnode.nodelock", "NodeLock.acquire"): "the node lock file (koordnode's own runtime file)",
    ("koordnode.nodelock", "NodeLock.release"): "the node lock file (koordnode's own runtime file)",
    ("koordnode.hooks.resized", "ResizedResources._save"): "kubelet-resized.json (koordnode's own state file)",
    ("koordnode.qos.psi", "PsiTrigger.__init__"):
        "PSI trigger registration: a poll(2) subscription written to a pressure file, the one "
        "documented exception (arch.md; arch-manager may move it behind the executor) -- the "
        "open fd is the trigger, it changes no setting",
}
# Pending until the other #10 branches are merged (each names who removes it). A pending entry
# that is not needed any more fails test_pending_entries_are_still_needed: delete it then.
PENDING_IMPORTS: dict[tuple[str, str], str] = {}
PENDING_WRITES: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> int | None:
    if module in PLACED:
        return PLACED[module]
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYERS:
            return LAYERS[prefix]
    return None


def is_generated(module: str) -> bool:
    last = module.rsplit(".", 1)[-1]
    return last.endswith("_pb2") or last.endswith("_pb2_grpc")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def _is_module(dotted: str) -> bool:
    path = REPO.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int


def imports_of(path: Path, source: str | None = None) -> Iterator[Import]:
    """Every koordnode module a file imports, wherever the import statement is."""
    importer = module_name(path)
    tree = ast.parse(source if source is not None else path.read_text())
    package = importer if path.name == "__init__.py" else importer.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "koordnode" or alias.name.startswith("koordnode."):
                    yield Import(importer, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not (target == "koordnode" or target.startswith("koordnode.")):
                continue
            for alias in node.names:  # `from koordnode.x import y`: y may be a module itself
                sub = f"{target}.{alias.name}"
                yield Import(importer, sub if _is_module(sub) else target, node.lineno)


def import_problem(importer: str, imported: str) -> str | None:
    """Why this import breaks the layering, or None."""
    if is_generated(imported) or imported == importer:
        return None
    if importer in LEAVES or is_generated(importer):
        return f"{importer} is a leaf: it may import generated protobuf code only"
    if imported in LEAVES:
        return None
    if importer.startswith("koordnode.proxy"):
        if not any(imported == p or imported.startswith(p + ".") for p in PROXY_MAY_IMPORT) \
                and layer_of(imported) != 4:
            return f"proxy/ may import cri/ and itself only (an interceptor protocol of its own), not {imported}"
        return None
    mine, theirs = layer_of(importer), layer_of(imported)
    if mine is None:
        return f"{importer} has no layer in tests/test_layers.py: add it to the table (and docs/architecture.md's)"
    if theirs is None:
        return f"{imported} has no layer in tests/test_layers.py: add it to the table (and docs/architecture.md's)"
    if theirs > mine:
        return f"layer {mine} ({importer}) imports layer {theirs} ({imported}): dependencies point down"
    return None


def source_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


@functools.cache
def layering_violations() -> tuple[list[str], set[tuple[str, str]]]:
    problems, pending_used = [], set()
    for path in source_files():
        for imp in imports_of(path):
            problem = import_problem(imp.importer, imp.imported)
            if problem is None:
                continue
            key = (imp.importer, imp.imported)
            if key in PENDING_IMPORTS:
                pending_used.add(key)
                continue
            problems.append(f"{path.relative_to(REPO)}:{imp.line}: {problem}")
    return problems, pending_used


# --- kernel writes ------------------------------------------------------------------------------

_WRITE_METHODS = {"write_text", "write_bytes", "mkdir", "rmdir", "touch", "symlink_to", "chmod", "unlink"}
_OS_WRITES = {"write", "pwrite", "writev", "mkdir", "makedirs", "rmdir", "removedirs", "chmod", "symlink",
              "truncate", "ftruncate"}
_WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC")


def _writing_mode(mode: ast.expr | None) -> bool:
    if mode is None:
        return False
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return bool(set(mode.value) - set("rbt"))
    return True  # computed: assume it may write


def write_calls(path: Path, source: str | None = None) -> Iterator[tuple[str, int, str]]:
    """(function qualname, line, what) of every call that may write a file."""
    tree = ast.parse(source if source is not None else path.read_text())

    def visit(node: ast.AST, scope: str) -> Iterator[tuple[str, int, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from visit(child, f"{scope}.{child.name}" if scope else child.name)
                continue
            if isinstance(child, ast.Call):
                what = _write_of(child)
                if what:
                    yield scope or "<module>", child.lineno, what
            yield from visit(child, scope)

    yield from visit(tree, "")


def _write_of(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name) and func.id == "open":
        mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
        return f"open(mode={ast.unparse(mode)})" if _writing_mode(mode) else None
    if not isinstance(func, ast.Attribute):
        return None
    base = ast.unparse(func.value)
    if base == "os":
        if func.attr == "open":
            flags = ast.unparse(call.args[1]) if len(call.args) > 1 else ""
            return f"os.open({flags})" if any(f in flags for f in _WRITE_FLAGS) or "O_RDONLY" not in flags else None
        return f"os.{func.attr}" if func.attr in _OS_WRITES else None
    if func.attr in _WRITE_METHODS:
        return f"{base}.{func.attr}()"
    if func.attr == "open":  # Path.open(mode): a literal mode, or mode= (other .open()s are not files)
        mode = next((k.value for k in call.keywords if k.arg == "mode"), None)
        if mode is None and call.args and isinstance(call.args[0], ast.Constant) \
                and isinstance(call.args[0].value, str):
            mode = call.args[0]
        return f"{base}.open({ast.unparse(mode)})" if _writing_mode(mode) else None
    return None


@functools.cache
def write_violations() -> tuple[list[str], set[tuple[str, str]]]:
    problems, allowed_used = [], set()
    for path in source_files():
        module = module_name(path)
        if module == "koordnode.executor" or module.startswith("koordnode.executor."):
            continue
        for scope, line, what in write_calls(path):
            for key in ((module, scope), (module, "*")):
                if key in WRITE_ALLOWED or key in PENDING_WRITES:
                    allowed_used.add(key)
                    break
            else:
                problems.append(f"{path.relative_to(REPO)}:{line}: {what} in {scope}: kernel writes belong in "
                                "executor/ (or add it to WRITE_ALLOWED with the reason)")
    return problems, allowed_used


# --- re-exports ---------------------------------------------------------------------------------
# One source per name: a module does not hand on a name it imports from another koordnode module,
# and nobody imports a name from a module that only imported it. A package's __init__ may list
# its own sub-modules' names (the package's surface, e.g. koordnode.config).


def _target(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = (module if is_package else module.rsplit(".", 1)[0]).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@dataclass(frozen=True)
class Binding:
    source: str | None  # the koordnode module it is imported from; None: defined here
    same_alias: bool = False  # `import x as x`: the typing convention for "re-exported"


def module_bindings(path: Path, source: str | None = None) -> tuple[dict[str, Binding], list[str] | None]:
    """Top-level names of a module (conditional blocks included) and its `__all__`."""
    module, is_package = module_name(path), path.name == "__init__.py"
    names: dict[str, Binding] = {}
    exported: list[str] | None = None

    def visit(body: list[ast.stmt]) -> None:
        nonlocal exported
        for node in body:
            if isinstance(node, ast.ImportFrom):
                target = _target(module, is_package, node)
                ours = target == "koordnode" or target.startswith("koordnode.")
                for alias in node.names:
                    names[alias.asname or alias.name] = Binding(
                        target if ours else None, ours and alias.asname == alias.name)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = Binding(None)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            names[name.id] = Binding(None)
                            if name.id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)):
                                exported = [e.value for e in node.value.elts
                                            if isinstance(e, ast.Constant) and isinstance(e.value, str)]

    visit(ast.parse(source if source is not None else path.read_text()).body)
    return names, exported


def _own_submodule(path: Path, source_module: str) -> bool:
    return path.name == "__init__.py" and source_module.startswith(module_name(path) + ".")


def reexports(path: Path, source: str | None = None) -> Iterator[str]:
    """Why each name this module hands on from another koordnode module is one."""
    names, exported = module_bindings(path, source)
    for name in exported or []:
        binding = names.get(name)
        if binding is None:
            yield f"__all__ names {name}, which is not defined here"
        elif binding.source is not None and not _own_submodule(path, binding.source):
            yield f"__all__ names {name}, imported from {binding.source}: import it from there"
    for name, binding in names.items():
        if binding.same_alias and binding.source is not None and not _own_submodule(path, binding.source):
            yield f"`import {name} as {name}` re-exports it from {binding.source}: import it from there"


@functools.cache
def _bindings_of(module: str) -> tuple[dict[str, Binding], Path] | None:
    base = REPO.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return module_bindings(path)[0], path
    return None


def imports_through_another_module(path: Path, source: str | None = None) -> Iterator[tuple[int, str]]:
    """`from koordnode.a import n` where a only imported n from elsewhere."""
    tree = ast.parse(source if source is not None else path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith("koordnode"):
            continue
        found = _bindings_of(node.module or "")
        if found is None:
            continue
        names, module_path = found
        for alias in node.names:
            binding = names.get(alias.name)
            if _is_module(f"{node.module}.{alias.name}") or binding is None or binding.source is None:
                continue
            if not _own_submodule(module_path, binding.source):
                yield node.lineno, f"{alias.name} is {binding.source}'s, not {node.module}'s: import it from there"


def reexport_violations() -> list[str]:
    problems = [f"{path.relative_to(REPO)}: {why}" for path in source_files()
                if not is_generated(module_name(path)) for why in reexports(path)]
    for folder in ("koordnode", "tests", "bench", "scripts", "packaging"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if "__pycache__" in path.parts or is_generated(path.stem):
                continue
            problems += [f"{path.relative_to(REPO)}:{line}: {why}"
                         for line, why in imports_through_another_module(path)]
    return problems


# --- the tests ----------------------------------------------------------------------------------


def test_every_module_has_a_layer() -> None:
    missing = [module_name(p) for p in source_files()
               if layer_of(module_name(p)) is None and module_name(p) not in LEAVES
               and not is_generated(module_name(p))]
    assert not missing, f"modules without a layer (tests/test_layers.py and docs/architecture.md's table): {missing}"


def test_imports_point_down_the_layers() -> None:
    problems, _ = layering_violations()
    assert not problems, "\n".join(problems)


def test_kernel_writes_only_in_the_executor() -> None:
    problems, _ = write_violations()
    assert not problems, "\n".join(problems)


def test_pending_entries_are_still_needed() -> None:
    """Entries for work of other branches go once that work is merged: a stale one is removed."""
    _, imports_used = layering_violations()
    _, writes_used = write_violations()
    stale = [f"PENDING_IMPORTS {k}" for k in PENDING_IMPORTS if k not in imports_used]
    stale += [f"WRITE_ALLOWED {k}" for k in WRITE_ALLOWED if k not in writes_used]
    stale += [f"PENDING_WRITES {k}" for k in PENDING_WRITES if k not in writes_used]
    assert not stale, "no longer needed, delete from tests/test_layers.py:\n" + "\n".join(stale)


# The checks themselves: each catches what it is for (injected sources, nothing on disk changes).

@pytest.mark.parametrize(("importer", "source", "expected"), [
    ("koordnode/model/state.py", "from koordnode.hooks.chain import CallContext\n", "dependencies point down"),
    ("koordnode/policy/class_policy.py", "def f():\n    from koordnode.executor import cgroup\n",
     "dependencies point down"),
    ("koordnode/executor/cgroup.py", "import koordnode.qos.manager\n", "dependencies point down"),
    ("koordnode/proxy/handler.py", "from koordnode.hooks.chain import HookChain\n", "proxy/ may import"),
    ("koordnode/proxy/handler.py", "from koordnode.model.state import NodeState\n", "proxy/ may import"),
    ("koordnode/hooks/qos_hook.py", "from koordnode.proxy.relay import Relay\n", "dependencies point down"),
    ("koordnode/logsetup.py", "from koordnode.model import qos_class\n", "is a leaf"),
    ("koordnode/executor/resctrl.py", "from ..qos import resctrl_control\n", "dependencies point down"),
])
def test_a_bad_import_is_caught(importer: str, source: str, expected: str) -> None:
    found = [import_problem(i.importer, i.imported) for i in imports_of(REPO / importer, source)]
    assert any(p and expected in p for p in found), found


@pytest.mark.parametrize("source", [
    "from koordnode.model.qos_class import QoSClass\n",
    "from koordnode.cri import api_pb2 as pb\n",
    "from koordnode import logsetup\n",
])
def test_a_good_import_passes(source: str) -> None:
    found = [import_problem(i.importer, i.imported) for i in imports_of(PACKAGE / "hooks" / "chain.py", source)]
    assert found and not any(found), found


@pytest.mark.parametrize("source", [
    "def f(p):\n    with open(p, 'w') as f:\n        f.write('1')\n",
    "def f(p, m):\n    open(p, m)\n",
    "def f(p):\n    p.write_text('1')\n",
    "import os\ndef f(p):\n    fd = os.open(p, os.O_WRONLY)\n    os.write(fd, b'1')\n",
    "def f(p):\n    p.open('a').write('1')\n",
    "def f(p):\n    p.mkdir()\n",
])
def test_a_kernel_write_outside_the_executor_is_caught(source: str) -> None:
    assert list(write_calls(PACKAGE / "hooks" / "chain.py", source))


def test_reads_are_not_writes() -> None:
    source = "import os\ndef f(p):\n    open(p).read()\n    open(p, 'rb')\n    os.open(p, os.O_RDONLY)\n"
    assert not list(write_calls(PACKAGE / "hooks" / "chain.py", source))


def test_no_module_re_exports_another_ones_names() -> None:
    problems = reexport_violations()
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("module", "source"), [
    ("koordnode/metrics.py", "from koordnode.config.metrics import MetricsConfig\n__all__ = ['MetricsConfig']\n"),
    ("koordnode/executor/resources.py", "from koordnode.model.kernel import CPU_SHARES_MAX as CPU_SHARES_MAX\n"),
    ("koordnode/qos/__init__.py", "def __getattr__(name):\n    return 1\n__all__ = ['QoSManager']\n"),
    ("koordnode/executor/__init__.py", "from koordnode.policy.plan import CgroupWrite\n__all__ = ['CgroupWrite']\n"),
])
def test_a_re_export_is_caught(module: str, source: str) -> None:
    assert list(reexports(REPO / module, source))


@pytest.mark.parametrize(("module", "source"), [
    ("koordnode/metrics.py", "from koordnode.config.metrics import MetricsConfig\n__all__ = ['f']\n"
                             "def f(c: MetricsConfig) -> None: ...\n"),
    ("koordnode/config/__init__.py", "from koordnode.config.root import Config\n__all__ = ['Config']\n"),
])
def test_using_an_import_or_a_package_surface_is_no_re_export(module: str, source: str) -> None:
    assert not list(reexports(REPO / module, source))


def test_an_import_through_another_module_is_caught() -> None:
    # qos_engine.py uses CPU_OWNING_CLASSES, but it is model.qos_class's.
    source = "from koordnode.hooks.qos_engine import CPU_OWNING_CLASSES, QoSEngine\n"
    found = list(imports_through_another_module(PACKAGE / "daemon.py", source))
    assert [why for _, why in found] == [
        "CPU_OWNING_CLASSES is koordnode.model.qos_class's, not koordnode.hooks.qos_engine's: import it from there"]
    assert not list(imports_through_another_module(PACKAGE / "daemon.py", "from koordnode.config import Config\n"))
