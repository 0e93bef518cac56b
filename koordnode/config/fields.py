"""Declaring config keys, and the value checks several sections share.

`setting()` declares a key, `section()` a ``[table]``; the loader (koordnode.config.loader)
reads their field metadata: ``doc`` (one line: meaning and unit), ``min`` / ``max``
(inclusive), ``normalize`` (value -> value, raising ValueError with a message) and ``check``
(value -> error message or None).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any

__all__ = ["internal", "section", "setting", "show_value", "unix_socket_path"]


def setting(
    default: Any = dataclasses.MISSING,
    *,
    doc: str,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    min: float | None = None,  # noqa: A002 - reads best at the call site
    max: float | None = None,  # noqa: A002
    normalize: Callable[[Any], Any] | None = None,
    check: Callable[[Any], str | None] | None = None,
) -> Any:
    """A config key: its default, a one-line doc (meaning and unit) and its constraints."""
    metadata = {"doc": doc, "min": min, "max": max, "normalize": normalize, "check": check}
    return field(default=default, default_factory=default_factory, metadata=metadata)


def section(cls: type, *, doc: str) -> Any:
    """A ``[section]`` of the file, defaulting to the section dataclass's own defaults."""
    return field(default_factory=cls, metadata={"doc": doc})


def internal(default: Any) -> Any:
    """Not a TOML key: bookkeeping the loader fills in; ignored by ==."""
    return field(default=default, compare=False, repr=False, metadata={"internal": True})


def show_value(value: Any) -> str:
    """A value as TOML would spell it, shortened for error messages."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
    elif isinstance(value, (int, float)):
        text = repr(value)
    elif isinstance(value, (datetime.date, datetime.time)):
        text = value.isoformat()
    elif isinstance(value, (list, tuple)):
        text = "[" + ", ".join(show_value(v) for v in value) + "]"
    elif isinstance(value, Mapping):
        return "a table"
    elif value is None:
        return "nothing"
    else:
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# sun_path is 108 bytes including the terminating NUL.
_MAX_UNIX_SOCKET_PATH = 107


def unix_socket_path(value: str) -> str:
    """Normalise ``/path``, ``unix:///path`` or ``unix:/path`` to an absolute path."""
    path = value
    if path.startswith("unix://"):
        path = path[len("unix://"):]
    elif path.startswith("unix:"):
        path = path[len("unix:"):]
    elif "://" in path:
        raise ValueError(f"only unix sockets are supported, got {show_value(value)}")
    if not path:
        raise ValueError("expected a unix socket path, got an empty string")
    if "\0" in path:
        raise ValueError("a socket path cannot contain a NUL character")
    if not path.startswith("/"):
        raise ValueError(f"expected an absolute path, got {show_value(value)}")
    path = os.path.normpath(path)
    size = len(path.encode())
    if size > _MAX_UNIX_SOCKET_PATH:
        raise ValueError(
            f"socket path is {size} bytes long; the kernel limit is {_MAX_UNIX_SOCKET_PATH}"
        )
    return path
