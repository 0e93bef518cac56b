"""The Prometheus text exposition format, version 0.0.4: what a scrape of /metrics returns.

Per family a ``# HELP`` and a ``# TYPE`` line, then one line per sample:
``name{label="value",...} value``. Label values escape backslash, double quote and newline;
HELP text escapes backslash and newline.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from koordnode.metrics.types import Family, LabelPairs

__all__ = ["CONTENT_TYPE", "format_value", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def render(families: Iterable[Family]) -> bytes:
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}\n")
        lines.append(f"# TYPE {family.name} {family.type}\n")
        lines.extend(f"{s.name}{_labels(s.labels)} {format_value(s.value)}\n" for s in family.samples)
    return "".join(lines).encode()


def format_value(value: float) -> str:
    """A sample value as Prometheus parses it (Go's float syntax): ``1.0``, ``+Inf``, ``NaN``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _labels(labels: LabelPairs) -> str:
    if not labels:
        return ""
    # Sorted by name: the same series always reads the same, whatever order it was built in.
    return "{" + ",".join(f'{name}="{_escape_label(value)}"' for name, value in sorted(labels)) + "}"


def _escape_label(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:  # rare: most values need no copy
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")
