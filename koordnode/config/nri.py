"""``[nri]``: NRI mode, the runtime's NRI socket and the plugin's registration."""

from __future__ import annotations

import re
from dataclasses import dataclass

from koordnode.config.fields import setting, show_value, unix_socket_path

__all__ = ["NriConfig"]


def _plugin_index(value: str) -> str:
    if not re.fullmatch(r"[0-9]{2}", value):
        raise ValueError(f"expected two digits (\"00\" to \"99\"), got {show_value(value)}")
    return value


def _plugin_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", value):
        raise ValueError(f"expected letters, digits, '.', '_' or '-' (at most 63), got {show_value(value)}")
    return value


@dataclass(frozen=True)
class NriConfig:
    socket: str = setting(
        "/var/run/nri/nri.sock",
        doc="the runtime's NRI socket koordnode connects to in NRI mode",
        normalize=unix_socket_path,
    )
    plugin_name: str = setting(
        "koordnode", doc="name koordnode registers under as an NRI plugin", normalize=_plugin_name
    )
    plugin_index: str = setting(
        "00",
        doc='two-digit NRI plugin index: plugins are called in ascending order ("00" first)',
        normalize=_plugin_index,
    )
