"""Declaring config keys: `setting()` for a key, `section()` for a [table].

Its own module so that section dataclasses living next to their feature can declare keys
without importing koordnode.config, which imports them to build the root Config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import field
from typing import Any


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
