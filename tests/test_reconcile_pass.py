"""Reconciler.reconcile_once (koordnode/periodic.py): what the event loop prepares for the periodic pass (the pass itself is
tested in test_qos_engine.py and end to end in test_e2e_qos.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import koordnode.qos.resctrl_control as resctrl_control
from faketree import make_cgroup_tree
from koordnode.config import parse_config
from koordnode.daemon import Daemon


def _daemon(tmp_path: Path, toml: str = "") -> Daemon:
    root = make_cgroup_tree(tmp_path / "tree", "v1", False)
    sock = tmp_path / "s"
    sock.mkdir()
    return Daemon(parse_config(
        f'[proxy]\nlisten = "{sock}/k.sock"\n[admin]\nsocket = "{sock}/a.sock"\n'
        f'[cgroup]\nroot = "{root}"\n[procfs]\nroot = "{tmp_path}"\n' + toml))


@pytest.mark.parametrize("enabled", [False, True])
def test_disabled_resctrl_and_net_get_nothing_prepared_on_the_loop(tmp_path, monkeypatch, enabled):
    daemon = _daemon(tmp_path, "[resctrl]\nenable = true\n[net]\nenable = true\n" if enabled else "")
    calls = {"groups": 0, "networks": 0, "resctrl": [], "net": []}

    def groups(*args, **kwargs):
        calls["groups"] += 1
        return {}

    def networks():
        calls["networks"] += 1
        return []

    monkeypatch.setattr(resctrl_control, "containers_by_group", groups)
    monkeypatch.setattr(daemon.pod_networks, "ready_pods", networks)
    monkeypatch.setattr(daemon.resctrl, "reconcile", lambda g: calls["resctrl"].append(g))
    monkeypatch.setattr(daemon.netqos, "reconcile", lambda n: calls["net"].append(n))
    asyncio.run(daemon.reconciler.reconcile_once())
    asyncio.run(daemon.reconciler.reconcile_once())
    expected = 2 if enabled else 0
    assert (calls["groups"], calls["networks"]) == (expected, expected)
    # Both are still called every pass: a disabled feature removes what is left of koordnode's.
    assert calls["resctrl"] == [{}, {}] and calls["net"] == [[], []]
