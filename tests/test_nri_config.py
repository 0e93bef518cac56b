"""[runtime] mode, [nri] keys, and the one-koordnode-per-node lock."""

from __future__ import annotations

import pytest

from koordnode.config import ConfigError, parse_config
from koordnode.nodelock import NodeLock, NodeLockError


def test_defaults() -> None:
    cfg = parse_config("")
    assert cfg.runtime.mode == "proxy"
    assert (cfg.nri.socket, cfg.nri.plugin_name, cfg.nri.plugin_index) == ("/var/run/nri/nri.sock", "koordnode", "00")


def test_nri_keys_are_read_and_normalised() -> None:
    cfg = parse_config('[runtime]\nmode = "nri"\n[nri]\nsocket = "unix:///run/x/nri.sock"\n'
                       'plugin_name = "qos-koord"\nplugin_index = "42"\n')
    assert (cfg.runtime.mode, cfg.nri.socket, cfg.nri.plugin_name, cfg.nri.plugin_index) == (
        "nri", "/run/x/nri.sock", "qos-koord", "42")


@pytest.mark.parametrize("text, message", [
    ('[runtime]\nmode = "both"\n', "runtime.mode"),
    ('[nri]\nplugin_index = "7"\n', 'nri.plugin_index: expected two digits'),
    ('[nri]\nplugin_index = 7\n', "nri.plugin_index"),
    ('[nri]\nplugin_name = "a b"\n', "nri.plugin_name"),
    ('[nri]\nsocket = "relative.sock"\n', "nri.socket: expected an absolute path"),
    ('[runtime]\nmode = "nri"\n[nri]\nsocket = "/var/run/koordnode/admin.sock"\n', "nri.socket: must differ"),
])
def test_bad_values_are_refused_with_their_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    assert any(message in e for e in err.value.errors), err.value.errors


def test_a_second_instance_is_refused_and_told_who_runs(tmp_path) -> None:
    first = NodeLock(tmp_path / "koordnode.lock")
    first.acquire("proxy", "/var/run/koordnode/koordnode.sock")
    second = NodeLock(tmp_path / "koordnode.lock")
    with pytest.raises(NodeLockError) as err:
        second.acquire("nri", "/var/run/nri/nri.sock")
    text = str(err.value)
    assert "proxy mode on /var/run/koordnode/koordnode.sock" in text and "refusing to start in nri mode" in text
    first.release()
    second.acquire("nri", "/var/run/nri/nri.sock")  # free again once the first one stopped
    second.release()
