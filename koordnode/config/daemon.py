"""``[daemon]`` (dry run), ``[log]`` and ``[admin]``: how the daemon itself runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from koordnode.config.fields import setting, unix_socket_path

__all__ = ["AdminConfig", "DaemonConfig", "LogConfig", "LogFormat", "LogLevel"]

LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["json", "console"]


def _absolute_dir(value: str) -> str | None:
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value or ".." in value.split("/"):
        return f"expected an absolute directory path without '..', got {value!r}"
    return None


@dataclass(frozen=True)
class DaemonConfig:
    dry_run: bool = setting(
        False,
        doc="decide, log, count and report everything, but write nothing to the kernel "
        "(cgroups, sysctls, resctrl, tc/nftables, PSI triggers), evict nothing, and forward "
        "every CRI request unchanged",
    )
    state_dir: str = setting(
        "/var/lib/koordnode",
        doc="where koordnode keeps the originals of the node-level values it changes (sysctls, "
        "the BE tier's and group's files, created cgroups, resctrl groups, root qdiscs, the nft "
        "table), recorded before its first write, for `koordnode restore`; read at start",
        check=_absolute_dir,
    )
    restore_on_stop: bool = setting(
        False,
        doc="on a clean stop (SIGTERM, SIGINT), run `koordnode restore`: the node-level values go "
        "back to their originals (off: they keep koordnode's last values until the next start)",
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
