"""A reader of the Prometheus text format (0.0.4) for the tests: what a scraper sees of
koordnode's /metrics, without a client library (the daemon bundles none)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_UNESCAPE = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Family:
    name: str  # as the HELP and TYPE lines name it
    type: str = "untyped"
    help: str = ""
    samples: list[Sample] = field(default_factory=list)


def _unescape(text: str) -> str:
    return re.sub(r'\\[\\n"]', lambda m: _UNESCAPE[m.group(0)], text)


def _labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        match = _LABEL.match(text, pos)
        if match is None:
            raise ValueError(f"bad labels: {text!r}")
        labels[match.group(1)] = _unescape(match.group(2))
        pos = match.end()
    return labels


def parse(text: str) -> list[Family]:
    """The families of an exposition, in order; a malformed line raises ValueError."""
    families: list[Family] = []
    by_name: dict[str, Family] = {}

    def family(name: str) -> Family:
        if name not in by_name:
            by_name[name] = Family(name)
            families.append(by_name[name])
        return by_name[name]

    current: Family | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            current = family(name)
            current.help = help_text.replace("\\n", "\n").replace("\\\\", "\\")
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            current = family(name)
            current.type = kind.strip()
        elif line.startswith("#"):
            continue
        else:
            match = _SAMPLE.match(line)
            if match is None:
                raise ValueError(f"bad sample line: {line!r}")
            name, labels, value = match.groups()
            owner = current if current is not None and name.startswith(current.name.removesuffix("_total")) else family(name)
            owner.samples.append(Sample(name, _labels(labels or ""), float(value)))
    return families


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """{(sample name, labels): value} of an exposition."""
    return {(s.name, frozenset(s.labels.items())): s.value for f in parse(text) for s in f.samples}
