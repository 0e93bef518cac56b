"""The hook contract (hooks/chain.py): every hook states its conformance where it is defined
(mypy checks the line), its stages say where they run, and the chain's table answers "what
runs at <method> <phase>" in hook order."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from koordnode.cri import api_pb2 as pb
from koordnode.hooks.chain import CallContext, HookChain, Phase, RunsOn, Stage

HOOKS = Path(__file__).resolve().parent.parent / "koordnode" / "hooks"


def _hook_classes(tree: ast.Module) -> list[str]:
    return [node.name for node in tree.body if isinstance(node, ast.ClassDef)
            and not any(ast.unparse(base) == "Protocol" for base in node.bases)  # the contract itself
            and any(isinstance(f, ast.FunctionDef) and f.name == "stages" for f in node.body)]


def _conformance_lines(tree: ast.Module) -> set[str]:
    """Classes named in `_: type[RuntimeHook] = X` at module level."""
    named = set()
    for node in tree.body:
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "_"
                and "RuntimeHook" in ast.unparse(node.annotation) and isinstance(node.value, ast.Name)):
            named.add(node.value.id)
    return named


@pytest.mark.parametrize("module", sorted(p.name for p in HOOKS.glob("*.py")))
def test_every_hook_states_its_conformance_for_mypy(module):
    tree = ast.parse((HOOKS / module).read_text())
    missing = set(_hook_classes(tree)) - _conformance_lines(tree)
    assert not missing, f"{module}: add `_: type[RuntimeHook] = <class>` for {sorted(missing)}"


def test_stages_say_where_they_run():
    def plain(call: CallContext) -> None:
        pass

    async def awaited(call: CallContext) -> None:
        pass

    assert Stage.in_thread("StartContainer", Phase.POST, plain).runs_on is RunsOn.THREAD
    assert Stage.on_loop("StartContainer", Phase.POST, awaited).runs_on is RunsOn.LOOP
    inline = Stage.inline("CreateContainer", plain)
    assert (inline.phase, inline.runs_on) == (Phase.PRE_INLINE, RunsOn.LOOP)
    with pytest.raises(ValueError):
        Stage.in_thread("CreateContainer", Phase.PRE_INLINE, plain)


class _Named:
    def __init__(self, name: str, seen: list[str], runs_on: RunsOn) -> None:
        self.name, self._seen, self._runs_on = name, seen, runs_on

    def stages(self):
        if self._runs_on is RunsOn.LOOP:
            return [Stage.on_loop("StopContainer", Phase.POST, self.on_loop)]
        return [Stage.in_thread("StopContainer", Phase.POST, self.in_thread)]

    async def on_loop(self, call: CallContext) -> None:
        self._seen.append(self.name)

    def in_thread(self, call: CallContext) -> None:
        self._seen.append(self.name)


def test_the_table_keeps_hook_order_across_loop_and_thread_stages_and_added_hooks():
    seen: list[str] = []
    chain = HookChain([_Named("a", seen, RunsOn.THREAD), _Named("b", seen, RunsOn.LOOP)])
    chain.add(_Named("c", seen, RunsOn.THREAD))
    try:
        assert [r.hook for r in chain.at("StopContainer", Phase.POST)] == ["a", "b", "c"]
        assert chain.at("StopContainer", Phase.PRE) == () and not chain.wants("StartContainer")
        call = CallContext(method="StopContainer", request=pb.StopContainerRequest(container_id="c1"))
        call.grpc_status = 0
        asyncio.run(chain.run_post_now(call))
    finally:
        chain.close()
    assert seen == ["a", "b", "c"]
    assert chain.failure_counts() == {}
