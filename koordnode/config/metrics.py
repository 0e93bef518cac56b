"""``[metrics]``: the Prometheus endpoint's listen address."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from koordnode.config.fields import setting

__all__ = ["DEFAULT_LISTEN", "MetricsConfig", "normalize_listen", "parse_listen"]

DEFAULT_LISTEN = "127.0.0.1:9316"


def normalize_listen(value: str) -> str:
    """Check a ``host:port`` listen address; ``""`` (off) stays ``""``.

    Accepted: ``127.0.0.1:9316``, ``[::1]:9316``, ``localhost:9316``, ``:9316`` (all IPv4
    interfaces, normalised to ``0.0.0.0:9316``). Port 0 binds a free port.
    """
    if value == "":
        return ""
    if value.startswith(":"):
        value = "0.0.0.0" + value
    host, port = _split_host_port(value)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_listen(value: str) -> tuple[str, int] | None:
    """``(host, port)`` of a listen address, or None when the endpoint is off (``""``)."""
    normalized = normalize_listen(value)
    if not normalized:
        return None
    return _split_host_port(normalized)


_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


def _split_host_port(value: str) -> tuple[str, int]:
    expected = 'expected "host:port" (e.g. "127.0.0.1:9316" or "[::1]:9316"), or "" for off'
    if value.startswith("["):
        host, sep, port_text = value[1:].partition("]:")
        if not sep:
            raise ValueError(f"{expected}; got {value!r}")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address") from None
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep or not host:
            raise ValueError(f"{expected}; got {value!r}")
        if ":" in host:
            raise ValueError(f"an IPv6 address needs brackets, e.g. \"[{host}]:{port_text}\"")
        if not _HOSTNAME.match(host):
            raise ValueError(f"{host!r} is neither an IP address nor a host name")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"port must be a number in [0, 65535], got {port_text!r}")
    return host, int(port_text)


@dataclass(frozen=True)
class MetricsConfig:
    listen: str = setting(
        DEFAULT_LISTEN,
        doc='host:port serving Prometheus metrics at /metrics ("[::1]:9316" for IPv6); '
        '"" turns the endpoint off',
        normalize=normalize_listen,
    )
