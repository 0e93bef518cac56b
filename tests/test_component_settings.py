"""The QoS engine and the QoS manager are handed exactly their typed sections (issue #10),
at start and on reload: `EngineSettings` / `ManagerSettings`, never the whole `Config`.

The first tests read the signatures and the imports (a constructor taking `Config` or `Any`
again, or a section `of()` forgets, fails them); the last one reloads an in-process daemon on
a fake cgroup v2 tree and checks both components act on the new sections.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import inspect
import typing
from pathlib import Path

import pytest
from faketree import make_cgroup_tree

from koordnode.config import Config, EngineSettings, ManagerSettings, from_dict, load_config
from koordnode.daemon import Daemon
from koordnode.hooks.qos_engine import QoSEngine
from koordnode.qos.manager import QoSManager
from support.fakeproc import make_procfs

ROOT = Path(__file__).resolve().parent.parent
COMPONENTS = [(QoSEngine, EngineSettings), (QoSManager, ManagerSettings)]
# The modules of the two components: none of them may see the whole Config.
COMPONENT_MODULES = ["koordnode/hooks/qos_engine.py", "koordnode/qos/manager.py", "koordnode/qos/measure.py",
                     "koordnode/qos/tick.py", "koordnode/qos/status.py"]


def _mentions(hint: object, target: type) -> bool:
    return hint is target or any(_mentions(arg, target) for arg in typing.get_args(hint))


@pytest.mark.parametrize("component, settings_type", COMPONENTS, ids=lambda c: c.__name__)
def test_constructor_and_reload_take_the_component_settings(component, settings_type):
    for method in (component.__init__, component.reconfigure):
        hints = typing.get_type_hints(method)
        first = list(inspect.signature(method).parameters)[1]
        assert hints[first] is settings_type, f"{component.__name__}.{method.__name__}({first}: {hints[first]})"
        for name, hint in hints.items():
            assert hint is not typing.Any, f"{component.__name__}.{method.__name__}: {name} is Any"
            assert not _mentions(hint, Config), f"{component.__name__}.{method.__name__}: {name} takes a Config"


@pytest.mark.parametrize("settings_type", [EngineSettings, ManagerSettings], ids=lambda c: c.__name__)
def test_settings_hold_sections_of_the_config_and_of_hands_them_over(settings_type):
    config_sections = typing.get_type_hints(Config)
    hints = typing.get_type_hints(settings_type)
    for f in dataclasses.fields(settings_type):
        assert hints[f.name] == config_sections.get(f.name), f"{f.name} is not the Config's [{f.name}] section"
    config = from_dict(Config, {f.name: _changed(config_sections[f.name]) for f in dataclasses.fields(settings_type)
                                if _changed(config_sections[f.name]) is not None})
    settings = settings_type.of(config)
    for f in dataclasses.fields(settings_type):
        assert getattr(settings, f.name) is getattr(config, f.name), f"of() does not hand over [{f.name}]"


def _changed(section: type) -> dict[str, object] | None:
    """A non-default value for one key of a section, so a section left at its default by
    of() is told from the Config's."""
    return {
        "CgroupConfig": {"driver": "systemd"}, "SysfsConfig": {"root": "/elsewhere"},
        "NodeConfig": {"reserved_cpus": "0"}, "QoSConfig": {"LS": {"cpu_shares_per_cpu": 2048}},
        "KubeQoSMapping": {"burstable": "BE"}, "ProxyConfig": {"hook_timeout_ms": 1234},
        "QoSManagerConfig": {"tick_ms": 500}, "StrategyConfig": {"cpu_burst": {"enable": True}},
    }.get(section.__name__)


@pytest.mark.parametrize("path", COMPONENT_MODULES)
def test_component_modules_do_not_import_the_whole_config(path):
    tree = ast.parse((ROOT / path).read_text(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("koordnode.config"):
            names = {alias.name for alias in node.names}
            assert "Config" not in names and node.module != "koordnode.config.root", \
                f"{path}:{node.lineno} imports the whole Config"


def _write_config(path: Path, tmp_path: Path, root: Path, proc: Path, extra: str = "") -> None:
    path.write_text(f"""
[cgroup]
root = "{root}"
driver = "cgroupfs"
reconcile_interval_s = 0
[procfs]
root = "{proc}"
[admin]
socket = "{tmp_path / 'run' / 'admin.sock'}"
[metrics]
listen = ""
{extra}""")


class _Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, object]]] = []

    def __getattr__(self, level: str):
        return lambda event, **fields: self.events.append((event, fields))


def test_reload_hands_both_components_their_new_sections(tmp_path, monkeypatch):
    root = make_cgroup_tree(tmp_path, "v2", cgroups=["/kubepods/burstable", "/kubepods/besteffort"])
    proc = make_procfs(tmp_path, cpus=2)
    path = tmp_path / "koordnode.toml"
    _write_config(path, tmp_path, root, proc)
    daemon = Daemon(load_config(str(path)))
    engine, manager = daemon.qos, daemon.qos_manager
    assert engine is not None and manager is not None, daemon.qos_error
    burstable_pod = "/kubepods/burstable/pod1"
    assert engine.classify({}, burstable_pod).qos_class.value == "LS"
    assert engine.reserved_cpus() == frozenset()
    assert manager.kubepods == "/kubepods"
    assert manager.status()["strategies"]["cpu_suppress"]["enabled"] is True
    assert manager.status()["ticks"]["period_ms"] == 1000

    _write_config(path, tmp_path, root, proc, f"""
[node]
reserved_cpus = "0"
[qos_mapping]
burstable = "BE"
[qos_manager]
tick_ms = 500
kubepods_cgroup = "/custom/kubepods"
[strategy.cpu_suppress]
enable = false
[sysfs]
root = "{tmp_path / 'sys'}"
""")
    log = _Log()
    monkeypatch.setattr("koordnode.reload.log", log)
    try:
        asyncio.run(daemon.running_config.reload())
    finally:
        daemon.chain.close()
    assert daemon.running_config.last_reload["result"] == "applied", daemon.running_config.last_reload
    # the engine: [qos_mapping], [node]
    assert engine.classify({}, burstable_pod).qos_class.value == "BE"
    assert engine.reserved_cpus() == frozenset({0})
    # the manager: [qos_manager], [strategy.*], [qos_mapping]
    assert manager.kubepods == "/custom/kubepods"
    # one KubeletLayout, the daemon's: the engine and the manager see the same one
    assert engine.layout is daemon.layout and daemon.layout.paths().kubepods == "/custom/kubepods"
    assert manager.status()["strategies"]["cpu_suppress"]["enabled"] is False
    assert manager.status()["ticks"]["period_ms"] == 500
    assert manager._inventory.mapping == engine.planner.mapping
    # what stays until the restart says so
    assert ("filesystem_roots_change_needs_restart",
            {"detail": "[cgroup], [procfs] and [sysfs] root take effect at the next restart",
             "cgroup": str(root), "procfs": str(proc), "sysfs": "/sys"}) in log.events
