"""The architecture, enforced: each package imports only what its row of the matrix allows,
and only executor/ changes the kernel.

Both checks read the source (AST), so an import inside a function counts like one at the top,
and nothing is imported to check it. docs/architecture.md's layers section describes the same structure;
a change of the structure changes both.
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

# Who may import whom, per package (or top-level module): an explicit row each, no order to
# infer from, so a sibling import (qos -> hooks, cri -> kube) is as visible as an upward one.
# Every unit may import itself and the leaves. Generated protobuf code belongs to its package
# (cri/api_pb2 is cri's): importing it is importing that package. "*": the composition root.
MAY_IMPORT: dict[str, frozenset[str] | str] = {
    "koordnode.model": frozenset(),
    "koordnode.config": frozenset({"koordnode.model"}),
    "koordnode.policy": frozenset({"koordnode.model", "koordnode.config"}),
    "koordnode.executor": frozenset({"koordnode.model", "koordnode.policy"}),
    # policy: koordnode's own annotations (cri/koordnode_annotations.py) encode its plans' types.
    "koordnode.cri": frozenset({"koordnode.model", "koordnode.policy"}),
    "koordnode.kube": frozenset({"koordnode.model", "koordnode.config"}),
    "koordnode.metrics": frozenset({"koordnode.model", "koordnode.config", "koordnode.cri"}),
    "koordnode.hooks": frozenset({"koordnode.model", "koordnode.config", "koordnode.policy", "koordnode.executor",
                                  "koordnode.cri", "koordnode.metrics"}),
    "koordnode.qos": frozenset({"koordnode.model", "koordnode.config", "koordnode.policy", "koordnode.executor",
                                "koordnode.kube"}),
    # An adapter over CRI with an interceptor protocol of its own (proxy/interceptor.py):
    # never hooks, qos or the model's state.
    "koordnode.proxy": frozenset({"koordnode.cri"}),
    "koordnode.nri": frozenset({"koordnode.model", "koordnode.cri", "koordnode.executor", "koordnode.hooks"}),
    "koordnode.admin": frozenset({"koordnode.model", "koordnode.proxy", "koordnode.qos"}),
    "koordnode.doctor": frozenset({"koordnode.model", "koordnode.cri", "koordnode.executor", "koordnode.kube",
                                   "koordnode.qos"}),
    "koordnode.cli": frozenset({"koordnode.config", "koordnode.executor", "koordnode.admin", "koordnode.doctor"}),
    # The daemon's parts that are not construction: its periodic work, the running config and
    # its reload, and the status table.
    "koordnode.periodic": frozenset({"koordnode.model", "koordnode.policy", "koordnode.hooks", "koordnode.metrics",
                                     "koordnode.qos", "koordnode.kube"}),
    "koordnode.reload": frozenset({"koordnode.config", "koordnode.cri", "koordnode.hooks", "koordnode.metrics",
                                   "koordnode.proxy"}),
    "koordnode.daemon_status": frozenset({"koordnode.model", "koordnode.config", "koordnode.cri", "koordnode.hooks",
                                          "koordnode.metrics", "koordnode.qos", "koordnode.proxy", "koordnode.kube",
                                          "koordnode.nri", "koordnode.reload"}),
    "koordnode.daemon": "*",
    "koordnode.__main__": frozenset({"koordnode.cli"}),
}
# Leaves: anyone may import them; they import nothing of koordnode.
LEAVES = frozenset({"koordnode", "koordnode.logsetup", "koordnode.sdnotify", "koordnode.nodelock",
                    "koordnode.tls_modules"})

# Kernel changes outside executor/: each allowed one with why. (module, function) -> reason.
WRITE_ALLOWED: dict[tuple[str, str], str] = {
    ("koordnode.cli", "main"): "opens /dev/null for stdout once its reader went away (no kernel state)",
    ("koordnode.admin.server", "AdminServer.start"): "the admin socket's mode (koordnode's own runtime file)",
    ("koordnode.admin.server", "AdminServer.stop"): "removes the admin socket (koordnode's own runtime file)",
    ("koordnode.proxy.server", "prepare_socket_path"):
        "the CRI socket's directory, and a stale socket of a previous run (koordnode's own runtime file)",
    ("koordnode.proxy.server", "ProxyServer.start"): "the CRI socket's mode (koordnode's own runtime file)",
    ("koordnode.proxy.server", "ProxyServer.stop"): "removes the CRI socket (koordnode's own runtime file)",
    ("koordnode.nodelock", "NodeLock.acquire"): "the node lock file (koordnode's own runtime file)",
    ("koordnode.nodelock", "NodeLock.release"): "the node lock file (koordnode's own runtime file)",
    ("koordnode.hooks.resized", "ResizedResources._save"):
        "kubelet-resized.json, written to a temporary file and renamed (koordnode's own state file)",
    ("koordnode.qos.psi", "PsiTrigger.__init__"):
        "PSI trigger registration: a poll(2) subscription written to a pressure file, the one "
        "documented exception (arch.md; arch-manager may move it behind the executor) -- the "
        "open fd is the trigger, it changes no setting",
    ("koordnode.periodic", "_malloc_trim"):
        "malloc_trim(3) through ctypes: gives koordnode's own freed heap back, no kernel setting",
    ("koordnode.doctor.kernel", "check_nftables"): "runs `nft list tables`, a read (doctor writes nothing)",
    ("koordnode.kube.credentials", "_load_client_pair"):
        "a client certificate and key into koordnode's own memory files (memfd) for OpenSSL to read",
    ("koordnode.kube.exec_credential", "ExecPlugin.refresh"):
        "runs the kubeconfig's exec credential plugin, and ends its session when it overruns its time",
}
# Pending until other branches are merged (each names who removes it). A pending entry
# that is not needed any more fails test_pending_entries_are_still_needed: delete it then.
PENDING_IMPORTS: dict[tuple[str, str], str] = {}
PENDING_WRITES: dict[tuple[str, str], str] = {}


def unit_of(module: str) -> str | None:
    """The row of MAY_IMPORT a module belongs to (its package, or itself at the top)."""
    if module in LEAVES:  # leaves are single modules ("koordnode" is the package's __init__)
        return module
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        prefix = ".".join(parts[:n])
        if prefix in MAY_IMPORT:
            return prefix
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
    """Why this import breaks the matrix, or None."""
    mine, theirs = unit_of(importer), unit_of(imported)
    if mine is None:
        return f"{importer} has no row in tests/test_layers.py's MAY_IMPORT: add one (and to docs/architecture.md's table)"
    if theirs is None:
        return f"{imported} has no row in tests/test_layers.py's MAY_IMPORT: add one (and to docs/architecture.md's table)"
    if theirs == mine:
        return None
    if mine in LEAVES:
        return f"{importer} is a leaf: it imports nothing of koordnode"
    if theirs in LEAVES:
        return None
    allowed = MAY_IMPORT[mine]
    if allowed == "*" or theirs in allowed:
        return None
    return f"{mine} may not import {theirs} ({importer} imports {imported}): not in its MAY_IMPORT row"


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
# Anything that may change kernel state: files written, created, removed or renamed; ioctls;
# shared mappings; raw system calls through ctypes; other programs run; signals and
# scheduling changes of other processes.

# Methods of path objects (pathlib) that change the file system.
_PATH_WRITES = {"write_text", "write_bytes", "mkdir", "rmdir", "touch", "symlink_to", "hardlink_to", "chmod",
                "lchmod", "chown", "unlink", "rename"}
# Functions of modules, by module: calling any of them changes something.
_MODULE_CALLS: dict[str, set[str]] = {
    "os": {"write", "pwrite", "writev", "pwritev", "mkdir", "makedirs", "rmdir", "removedirs", "chmod", "fchmod",
           "lchmod", "chown", "fchown", "lchown", "symlink", "link", "unlink", "remove", "rename", "renames",
           "replace", "truncate", "ftruncate", "mknod", "mkfifo", "utime", "setxattr", "removexattr",
           "posix_fallocate", "sendfile", "copy_file_range", "splice",
           "system", "popen", "fork", "forkpty", "execv", "execve", "execl", "execle", "execlp", "execlpe",
           "execvp", "execvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp",
           "spawnvpe", "posix_spawn", "posix_spawnp",
           "kill", "killpg", "setpriority", "sched_setaffinity", "sched_setscheduler", "sched_setparam"},
    "shutil": {"copy", "copy2", "copyfile", "copyfileobj", "copymode", "copystat", "copytree", "move", "rmtree",
               "chown", "make_archive", "unpack_archive"},
    "subprocess": {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell"},
    "fcntl": {"ioctl"},
    "mmap": {"mmap"},
    "ctypes": {"CDLL", "PyDLL", "LibraryLoader"},
    "ctypes.cdll": {"LoadLibrary"},
    "signal": {"pidfd_send_signal", "pthread_kill"},
    "pty": {"spawn", "fork"},
}
_WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC")


def _writing_mode(mode: ast.expr | None) -> bool:
    if mode is None:
        return False
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return bool(set(mode.value) - set("rbt"))
    return True  # computed: assume it may write


def _aliases(tree: ast.Module) -> tuple[dict[str, str], dict[str, str]]:
    """Names bound by imports anywhere in the file: {local module name: module} (`import os as o`)
    and {local name: "module.function"} (`from subprocess import run as r`)."""
    modules: dict[str, str] = {}
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    modules[alias.asname] = alias.name
                else:
                    modules[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for alias in node.names:
                qualified = f"{node.module}.{alias.name}"
                if qualified in _MODULE_CALLS:
                    modules[alias.asname or alias.name] = qualified
                else:
                    names[alias.asname or alias.name] = qualified
    return modules, names


def write_calls(path: Path, source: str | None = None) -> Iterator[tuple[str, int, str]]:
    """(function qualname, line, what) of every call that may change kernel state."""
    tree = ast.parse(source if source is not None else path.read_text())
    modules, names = _aliases(tree)

    def visit(node: ast.AST, scope: str) -> Iterator[tuple[str, int, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from visit(child, f"{scope}.{child.name}" if scope else child.name)
                continue
            if isinstance(child, ast.Call):
                what = _write_of(child, modules, names)
                if what:
                    yield scope or "<module>", child.lineno, what
            yield from visit(child, scope)

    yield from visit(tree, "")


def _dotted(expr: ast.expr, modules: dict[str, str]) -> str | None:
    """`os.path` -> "os.path", with import aliases resolved; None for anything but names."""
    if isinstance(expr, ast.Name):
        return modules.get(expr.id)
    if isinstance(expr, ast.Attribute):
        base = _dotted(expr.value, modules)
        return f"{base}.{expr.attr}" if base else None
    return None


def _open_mode(call: ast.Call, position: int) -> ast.expr | None:
    if len(call.args) > position:
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == "mode"), None)


def _write_of(call: ast.Call, modules: dict[str, str], names: dict[str, str]) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        if func.id == "open" and func.id not in names:
            mode = _open_mode(call, 1)
            return f"open(mode={ast.unparse(mode)})" if _writing_mode(mode) else None
        qualified = names.get(func.id)
        if qualified is not None:
            module, _, name = qualified.rpartition(".")
            if name in _MODULE_CALLS.get(module, ()):
                return qualified
            if qualified == "os.open":
                return _os_open(call)
        return None
    if not isinstance(func, ast.Attribute):
        return None
    module = _dotted(func.value, modules)
    if module is not None:
        if module == "os" and func.attr == "open":
            return _os_open(call)
        if func.attr in _MODULE_CALLS.get(module, ()):
            return f"{module}.{func.attr}"
        if module in _MODULE_CALLS or module in ("os.path", "ctypes.util"):
            return None  # a module's other functions (os.stat, shutil.which, ...) read
    base = ast.unparse(func.value)
    if func.attr == "syscall":  # libc.syscall(...): a raw system call through ctypes
        return f"{base}.syscall()"
    if func.attr in _PATH_WRITES:
        return f"{base}.{func.attr}()"
    # Path.replace(target): one argument (str.replace takes two, dataclasses.replace keywords).
    if func.attr == "replace" and len(call.args) == 1 and not call.keywords and base != "dataclasses":
        return f"{base}.replace()"
    if func.attr == "open":  # Path.open(mode): a literal mode, or mode= (other .open()s are not files)
        mode = next((k.value for k in call.keywords if k.arg == "mode"), None)
        if mode is None and call.args and isinstance(call.args[0], ast.Constant) \
                and isinstance(call.args[0].value, str):
            mode = call.args[0]
        return f"{base}.open({ast.unparse(mode)})" if _writing_mode(mode) else None
    return None


def _os_open(call: ast.Call) -> str | None:
    flags = ast.unparse(call.args[1]) if len(call.args) > 1 else ""
    return f"os.open({flags})" if any(f in flags for f in _WRITE_FLAGS) or "O_RDONLY" not in flags else None


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


def test_every_module_has_a_row() -> None:
    missing = [module_name(p) for p in source_files() if unit_of(module_name(p)) is None]
    assert not missing, f"modules without a row in MAY_IMPORT (tests/test_layers.py and docs/architecture.md's table): {missing}"


def test_imports_follow_the_matrix() -> None:
    problems, _ = layering_violations()
    assert not problems, "\n".join(problems)


def test_the_matrix_has_no_stale_entries() -> None:
    """Every row names a package or module that exists, and every allowed import is made:
    an edge nobody uses any more is removed, so the table says what the code does."""
    stale = [f"row {unit}: no such package or module" for unit in (*MAY_IMPORT, *LEAVES) if not _is_module(unit)]
    used: set[tuple[str, str]] = set()
    for path in source_files():
        for imp in imports_of(path):
            mine, theirs = unit_of(imp.importer), unit_of(imp.imported)
            if mine and theirs:
                used.add((mine, theirs))
    for unit, allowed in MAY_IMPORT.items():
        if allowed != "*":
            stale += [f"{unit} -> {other}: allowed, but nothing imports it" for other in sorted(allowed)
                      if (unit, other) not in used]
    assert not stale, "stale entries in MAY_IMPORT, delete them:\n" + "\n".join(stale)


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
    ("koordnode/model/state.py", "from koordnode.hooks.chain import CallContext\n", "may not import koordnode.hooks"),
    # The cycle this matrix removed: generated code is its package's like any other module.
    ("koordnode/model/state.py", "from koordnode.cri import api_pb2 as pb\n", "may not import koordnode.cri"),
    ("koordnode/policy/container_policy.py", "def f():\n    from koordnode.executor import cgroup\n",
     "may not import koordnode.executor"),
    ("koordnode/executor/cgroup.py", "import koordnode.qos.manager\n", "may not import koordnode.qos"),
    ("koordnode/proxy/handler.py", "from koordnode.hooks.chain import HookChain\n", "may not import koordnode.hooks"),
    ("koordnode/proxy/handler.py", "from koordnode.model.state import NodeState\n", "may not import koordnode.model"),
    ("koordnode/hooks/qos_hook.py", "from koordnode.proxy.relay import Relay\n", "may not import koordnode.proxy"),
    ("koordnode/logsetup.py", "from koordnode.model import qos_class\n", "is a leaf"),
    ("koordnode/executor/resctrl.py", "from ..qos import resctrl_control\n", "may not import koordnode.qos"),
    # Siblings: a total order of layers let these pass.
    ("koordnode/qos/manager.py", "from koordnode.hooks.qos_engine import QoSEngine\n", "may not import koordnode.hooks"),
    ("koordnode/cri/client.py", "from koordnode.kube.client import KubeClient\n", "may not import koordnode.kube"),
    ("koordnode/nri/plugin.py", "from koordnode.proxy.relay import Relay\n", "may not import koordnode.proxy"),
    ("koordnode/kube/agent.py", "import koordnode.cri.client\n", "may not import koordnode.cri"),
    ("koordnode/hooks/chain.py", "from koordnode.nri import api_pb2\n", "may not import koordnode.nri"),
    ("koordnode/metrics/recorder.py", "from koordnode.kube import pods\n", "may not import koordnode.kube"),
    ("koordnode/model/state.py", "from koordnode.observe import x\n", "has no row"),
])
def test_a_bad_import_is_caught(importer: str, source: str, expected: str) -> None:
    found = [import_problem(i.importer, i.imported) for i in imports_of(REPO / importer, source)]
    assert any(p and expected in p for p in found), found


@pytest.mark.parametrize("source", [
    "from koordnode.model.qos_class import QoSClass\n",
    "from koordnode.cri import api_pb2 as pb\n",
    "from koordnode import logsetup\n",
    "from koordnode.hooks import qos_hook\n",
])
def test_a_good_import_passes(source: str) -> None:
    found = [import_problem(i.importer, i.imported) for i in imports_of(PACKAGE / "hooks" / "chain.py", source)]
    assert found and not any(found), found


@pytest.mark.parametrize(("source", "what"), [
    ("def f(p):\n    with open(p, 'w') as f:\n        f.write('1')\n", "open(mode='w')"),
    ("def f(p, m):\n    open(p, m)\n", "open(mode=m)"),
    ("def f(p):\n    p.write_text('1')\n", "p.write_text()"),
    ("import os\ndef f(p):\n    fd = os.open(p, os.O_WRONLY)\n    os.write(fd, b'1')\n", "os.open(os.O_WRONLY)"),
    ("def f(p):\n    p.open('a').write('1')\n", "p.open('a')"),
    ("def f(p):\n    p.mkdir()\n", "p.mkdir()"),
    # unlink, rename, rmdir
    ("import os\ndef f(p):\n    os.unlink(p)\n", "os.unlink"),
    ("import os\ndef f(p):\n    os.remove(p)\n", "os.remove"),
    ("import os\ndef f(a, b):\n    os.rename(a, b)\n", "os.rename"),
    ("import os\ndef f(a, b):\n    os.replace(a, b)\n", "os.replace"),
    ("import os\ndef f(p):\n    os.rmdir(p)\n", "os.rmdir"),
    ("def f(p):\n    p.unlink(missing_ok=True)\n", "p.unlink()"),
    ("def f(p, q):\n    p.rename(q)\n", "p.rename()"),
    ("def f(p, q):\n    p.replace(q)\n", "p.replace()"),
    ("def f(p):\n    p.rmdir()\n", "p.rmdir()"),
    ("import shutil\ndef f(p):\n    shutil.rmtree(p)\n", "shutil.rmtree"),
    ("from os import unlink as gone\ndef f(p):\n    gone(p)\n", "os.unlink"),
    # ioctl, mmap
    ("import fcntl\ndef f(fd):\n    fcntl.ioctl(fd, 0x2400, 0)\n", "fcntl.ioctl"),
    ("from fcntl import ioctl\ndef f(fd):\n    ioctl(fd, 0x2400)\n", "fcntl.ioctl"),
    ("import mmap\ndef f(fd):\n    return mmap.mmap(fd, 4096)\n", "mmap.mmap"),
    # ctypes and raw system calls
    ("import ctypes\nlibc = ctypes.CDLL(None)\n", "ctypes.CDLL"),
    ("import ctypes as c\nlibc = c.CDLL('libc.so.6')\n", "ctypes.CDLL"),
    ("from ctypes import CDLL\nlibc = CDLL(None)\n", "ctypes.CDLL"),
    ("import ctypes\nlibc = ctypes.cdll.LoadLibrary('libc.so.6')\n", "ctypes.cdll.LoadLibrary"),
    ("def f(libc):\n    libc.syscall(298, 0)\n", "libc.syscall()"),
    # other programs, signals, scheduling
    ("import subprocess\ndef f():\n    subprocess.run(['tc', 'qdisc'])\n", "subprocess.run"),
    ("import subprocess as sp\ndef f():\n    sp.Popen(['nft'])\n", "subprocess.Popen"),
    ("from subprocess import check_output\ndef f():\n    check_output(['nft'])\n", "subprocess.check_output"),
    ("import os\ndef f():\n    os.system('sysctl -w vm.min_free_kbytes=1')\n", "os.system"),
    ("import asyncio\nasync def f():\n    await asyncio.create_subprocess_exec('tc')\n",
     "asyncio.create_subprocess_exec"),
    ("import os\ndef f(pid):\n    os.kill(pid, 9)\n", "os.kill"),
    ("import os\ndef f(pid):\n    os.sched_setaffinity(pid, {0})\n", "os.sched_setaffinity"),
])
def test_a_kernel_write_outside_the_executor_is_caught(source: str, what: str) -> None:
    found = [w for _, _, w in write_calls(PACKAGE / "hooks" / "chain.py", source)]
    assert what in found, found


def test_an_injected_violation_fails_the_module_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole check, not only the detector: a write in a real module's source is reported
    with its place, and the allow-list lets only its own (module, function) through."""
    target = PACKAGE / "qos" / "usage_watch.py"
    injected = target.read_text() + "\n\ndef _sneaky(fd):\n    import fcntl\n    fcntl.ioctl(fd, 1)\n"
    real_read = Path.read_text

    def read_text(self: Path, *args: object, **kwargs: object) -> str:
        return injected if self == target else real_read(self, *args, **kwargs)

    write_violations.cache_clear()
    monkeypatch.setattr(Path, "read_text", read_text)
    try:
        problems, _ = write_violations()
    finally:
        write_violations.cache_clear()
    assert [p for p in problems if "qos/usage_watch.py" in p and "fcntl.ioctl in _sneaky" in p], problems


def test_an_injected_import_fails_the_module_check(monkeypatch: pytest.MonkeyPatch) -> None:
    target = PACKAGE / "model" / "state.py"
    injected = target.read_text() + "\nfrom koordnode.cri import api_pb2 as pb\n"
    real_read = Path.read_text

    def read_text(self: Path, *args: object, **kwargs: object) -> str:
        return injected if self == target else real_read(self, *args, **kwargs)

    layering_violations.cache_clear()
    monkeypatch.setattr(Path, "read_text", read_text)
    try:
        problems, _ = layering_violations()
    finally:
        layering_violations.cache_clear()
    assert [p for p in problems if "model/state.py" in p and "may not import koordnode.cri" in p], problems


@pytest.mark.parametrize("source", [
    "import os\ndef f(p):\n    open(p).read()\n    open(p, 'rb')\n    os.open(p, os.O_RDONLY)\n",
    "import os, shutil\ndef f(p):\n    os.stat(p)\n    os.path.exists(p)\n    shutil.which('nft')\n    os.close(3)\n",
    "import dataclasses\ndef f(x, s):\n    dataclasses.replace(x, a=1)\n    s.replace('a', 'b')\n",
    "import ctypes\ndef f():\n    return ctypes.create_string_buffer(8), ctypes.get_errno()\n",
])
def test_reads_are_not_writes(source: str) -> None:
    assert not list(write_calls(PACKAGE / "hooks" / "chain.py", source))


def test_no_module_re_exports_another_ones_names() -> None:
    problems = reexport_violations()
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("module", "source"), [
    ("koordnode/metrics/recorder.py", "from koordnode.config.metrics import MetricsConfig\n__all__ = ['MetricsConfig']\n"),
    ("koordnode/executor/resources.py", "from koordnode.model.kernel import CPU_SHARES_MAX as CPU_SHARES_MAX\n"),
    ("koordnode/qos/__init__.py", "def __getattr__(name):\n    return 1\n__all__ = ['QoSManager']\n"),
    ("koordnode/executor/__init__.py", "from koordnode.policy.plan import CgroupWrite\n__all__ = ['CgroupWrite']\n"),
])
def test_a_re_export_is_caught(module: str, source: str) -> None:
    assert list(reexports(REPO / module, source))


@pytest.mark.parametrize(("module", "source"), [
    ("koordnode/metrics/recorder.py", "from koordnode.config.metrics import MetricsConfig\n__all__ = ['f']\n"
                             "def f(c: MetricsConfig) -> None: ...\n"),
    ("koordnode/config/__init__.py", "from koordnode.config.root import Config\n__all__ = ['Config']\n"),
])
def test_using_an_import_or_a_package_surface_is_no_re_export(module: str, source: str) -> None:
    assert not list(reexports(REPO / module, source))


def test_an_import_through_another_module_is_caught() -> None:
    # qos_engine.py uses ClassDecision, but it is model.qos_class's.
    source = "from koordnode.hooks.qos_engine import ClassDecision, QoSEngine\n"
    found = list(imports_through_another_module(PACKAGE / "daemon.py", source))
    assert [why for _, why in found] == [
        "ClassDecision is koordnode.model.qos_class's, not koordnode.hooks.qos_engine's: import it from there"]
    assert not list(imports_through_another_module(PACKAGE / "daemon.py", "from koordnode.config import Config\n"))
