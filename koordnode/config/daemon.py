"""``[daemon]`` (dry run), ``[log]`` and ``[admin]``: how the daemon itself runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from koordnode.config.fields import setting, unix_socket_path

__all__ = ["AdminConfig", "DaemonConfig", "LogConfig", "LogFormat", "LogLevel"]

LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["json", "console"]


@dataclass(frozen=True)
class DaemonConfig:
    dry_run: bool = setting(
        False,
        doc="decide, log, count and report everything, but write nothing to the kernel "
        "(cgroups, sysctls, resctrl, tc/nftables, PSI triggers), evict nothing, and forward "
        "every CRI request unchanged",
    )


@dataclass(frozen=True)
class LogConfig:
    level: LogLevel = setting("info", doc="lowest level logged")
    format: LogFormat = setting(
        "json", doc='"json": one JSON object per line; "console": human-readable'
    )


@dataclass(frozen=True)
class AdminConfig:
    socket: str = setting(
        "/var/run/koordnode/admin.sock",
        doc="root-only unix socket answering `koordnode status`",
        normalize=unix_socket_path,
    )
