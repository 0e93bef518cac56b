"""Strategies are plug-ins: a made-up one, registered by listing it (the manager untouched), is
decided, restored when disabled and shown in status; the manager names no strategy."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from faketree import read_cgroup_file
from test_qos_manager import BESTEFFORT, FakeNode, make_manager, node, settings  # noqa: F401 - fixture

from koordnode.config.fields import section, setting
from koordnode.policy.strategies.base import TickSnapshot
from koordnode.policy.strategies.common import Explanation, StrategyResult
from koordnode.policy.strategies.registry import STRATEGIES
from koordnode.config.components import ManagerSettings
from koordnode.config.strategies import StrategyConfig
from koordnode.policy.plan import CgroupWrite


@dataclasses.dataclass(frozen=True)
class BeSharesConfig:
    enable: bool = setting(True, doc="pin the BE tier's cpu.shares")
    shares: int = setting(64, min=2, max=262144, doc="the value")


@dataclasses.dataclass(frozen=True)
class WithBeShares(StrategyConfig):
    be_shares: BeSharesConfig = section(BeSharesConfig, doc="made up for the test")


class BeShares:
    """Pins the BE tier's cpu.shares; counts its decisions in its state."""

    name = "be_shares"
    early = False
    precheck = True
    evicts = False

    def initial_state(self) -> int:
        return 0

    def decide(self, snap: TickSnapshot, cfg: BeSharesConfig, state: int,
               earlier: Mapping[str, StrategyResult]) -> StrategyResult:
        write = CgroupWrite(snap.be_tier, "cpu.shares", cfg.shares, "be_shares: pinned")
        # Earlier strategies' results of this tick are visible (cpu_suppress decides first).
        inputs = {"after": sorted(earlier)}
        return StrategyResult(Explanation(self.name, inputs, f"shares {cfg.shares}", "pinned"),
                              writes=(write,), state=state + 1)

    def restore_config(self, old: BeSharesConfig | None, new: BeSharesConfig) -> BeSharesConfig | None:
        return old if old is not None and old.enable and not new.enable else None

    def restore(self, snap: TickSnapshot, cfg: BeSharesConfig, state: int) -> StrategyResult:
        write = CgroupWrite(snap.be_tier, "cpu.shares", 2, "be_shares disabled")
        return StrategyResult(Explanation(self.name, {}, "restore shares 2", "disabled"), writes=(write,), state=0)

    def status(self, cfg: BeSharesConfig, state: int) -> dict[str, Any]:
        return {"shares": cfg.shares, "decisions": state}

    def confines_be_cpuset(self, cfg: BeSharesConfig) -> bool:
        return False


def _config(enable: bool, **changes: Any) -> ManagerSettings:
    base = settings(**changes)
    fields = {f.name: getattr(base.strategy, f.name) for f in dataclasses.fields(StrategyConfig)}
    return ManagerSettings(WithBeShares(**fields, be_shares=BeSharesConfig(enable=enable, shares=77)), base.qos_manager)


def _shares(fake: FakeNode) -> int:
    """The BE tier's cpu.shares (v1) or cpu.weight (v2, converted by the executor)."""
    if fake.version == "v1":
        return int(read_cgroup_file(fake.root, BESTEFFORT, "cpu.shares"))
    return int(read_cgroup_file(fake.root, BESTEFFORT, "cpu.weight"))


def test_a_registered_strategy_is_decided_restored_and_in_status(node):  # noqa: F811 - the fixture
    manager = make_manager(node, _config(True, cpu_burst=dataclasses.replace(StrategyConfig().cpu_burst, enable=True)),
                           strategies=(*STRATEGIES, BeShares()))
    before = _shares(node)
    report = manager.tick()
    assert report.results["be_shares"].explanation.decision == "shares 77"
    assert report.results["be_shares"].explanation.inputs["after"] == ["be_memory", "cpu_burst", "cpu_suppress", "memory_qos"]
    assert _shares(node) != before
    status = manager.status()["strategies"]["be_shares"]
    assert status["enabled"] and status["shares"] == 77 and status["decisions"] == 1
    assert status["decision"]["decision"] == "shares 77"
    assert status["last_write"]["value"] == 77 and status["writes"] == {"written": 1}

    # Disabled by a reload: its own restore runs (not cpu_burst's), once.
    manager.reconfigure(_config(False, cpu_burst=dataclasses.replace(StrategyConfig().cpu_burst, enable=True)))
    node.advance(1.0, {node.ls: 0.5, node.be: 0.5})
    report = manager.tick()
    assert "be_shares" not in report.results
    assert report.results["be_shares.restore"].explanation.decision == "restore shares 2"
    assert "cpu_burst.restore" not in report.results
    assert "cpu_burst" in report.results  # still enabled, still deciding
    status = manager.status()["strategies"]["be_shares"]
    assert not status["enabled"] and status["decisions"] == 0
    assert status["last_write"]["value"] == 2 and status["last_write"]["reason"] == "be_shares disabled"
    node.advance(1.0, {node.ls: 0.5, node.be: 0.5})
    assert "be_shares.restore" not in manager.tick().results


def test_the_manager_names_no_strategy():
    """Adding a strategy must not touch the manager: its modules never name one."""
    qos = Path(__file__).resolve().parent.parent / "koordnode" / "qos"
    names = [s.name for s in STRATEGIES]
    for module in ("manager.py", "tick.py", "status.py", "measure.py"):
        text = (qos / module).read_text()
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        code = re.sub(r'"""(.|\n)*?"""', "", code)  # docstrings may explain, code may not branch
        for name in names:
            assert name not in code, f"qos/{module} names the strategy {name}"
