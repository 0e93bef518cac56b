"""Write koordnode(8) from the CLI parser and the config schema, so the page never goes stale.

    python3 packaging/man/gen-manpage.py [OUTPUT]      (default: stdout)

Run with the koordnode package importable (build.sh runs it with the staged virtualenv).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Iterator

from koordnode import __version__
from koordnode.cli import build_parser
from koordnode.config import DEFAULT_CONFIG_PATH, describe_settings


def roff(text: str) -> str:
    """Escape running text for roff: backslashes, hyphens, and control characters at line start."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line
                     for line in text.split("\n"))


def _option_usage(action: argparse.Action) -> str:
    names = ", ".join(f"\\fB{roff(name)}\\fR" for name in action.option_strings)
    if action.nargs == 0:
        return names
    if action.choices:
        arg = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        arg = str(action.metavar or action.dest.upper())
    return f"{names} \\fI{roff(arg)}\\fR"


def _options(parser: argparse.ArgumentParser) -> Iterator[str]:
    for action in parser._actions:  # argparse keeps no public list of a parser's options
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        yield ".TP"
        yield _option_usage(action)
        yield roff(action.help or "")


def _subcommands(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name) or "", sub


def _toml(value: object) -> str:
    """A default as it would be written in the TOML file."""
    if value is None:
        return "(not set)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value) if isinstance(value, str) else str(value)


def _date() -> str:
    # SOURCE_DATE_EPOCH keeps the page reproducible between builds.
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%d")


def manpage() -> str:
    parser = build_parser()
    description = (parser.description or "").strip().split("\n\n")
    lines = [
        f'.TH KOORDNODE 8 "{_date()}" "koordnode {__version__}" "System Administration"',
        ".SH NAME",
        "koordnode \\- node\\-local QoS daemon for Kubernetes colocation (CRI proxy)",
        ".SH SYNOPSIS",
        "\\fBkoordnode\\fR [\\fB\\-\\-version\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR]",
        ".SH DESCRIPTION",
    ]
    for paragraph in description[1:] or description:
        lines += [roff(" ".join(paragraph.split())), ".PP"]
    lines += [
        "Under systemd, \\fBkoordnode.service\\fR runs \\fBkoordnode run\\fR with "
        f"\\fB\\-\\-config {roff(DEFAULT_CONFIG_PATH)}\\fR and is enabled, not started, when "
        "the package is installed. Point kubelet at the proxy socket with "
        "\\fB\\-\\-container\\-runtime\\-endpoint\\fR and start it:",
        ".PP",
        ".RS",
        ".nf",
        "systemctl start koordnode",
        "kubelet \\-\\-container\\-runtime\\-endpoint=unix:///var/run/koordnode/koordnode.sock",
        ".fi",
        ".RE",
        ".SH COMMANDS",
    ]
    for name, summary, sub in _subcommands(parser):
        text = " ".join((sub.description or summary).split())
        lines += [".SS " + roff(f"koordnode {name}"), roff(text)]
        options = list(_options(sub))
        if options:
            lines += [".PP", "Options:", *options]
    lines += [".SH OPTIONS", *_options(parser), ".TP", "\\fB\\-h\\fR, \\fB\\-\\-help\\fR",
              "Show the help of koordnode or of a command and exit."]

    lines += [
        ".SH CONFIGURATION",
        f"koordnode reads TOML from \\fI{roff(DEFAULT_CONFIG_PATH)}\\fR (or \\fB\\-\\-config\\fR). "
        "Keys left out keep their defaults; unknown keys, wrong types and out\\-of\\-range values "
        "are errors, all reported with their key path by \\fBkoordnode check\\-config\\fR. "
        "Every key, by section:",
    ]
    section = None
    for item in describe_settings():
        head, _, _ = item.key.partition(".")
        if head != section:
            section = head
            lines += [".SS " + roff(f"[{head}]")]
        doc = f"{item.doc.rstrip('.')}. " if item.doc else ""
        lines += [".TP", f"\\fB{roff(item.key)}\\fR = {roff(_toml(item.default))}",
                  roff(f"{doc}Expected: {item.expected}.")]

    lines += [
        ".SH SIGNALS",
        ".TP", "\\fBSIGTERM\\fR, \\fBSIGINT\\fR",
        "Stop accepting connections, finish the calls in flight, exit.",
        ".TP", "\\fBSIGHUP\\fR",
        "Re\\-read the configuration file (\\fBsystemctl reload koordnode\\fR). A valid file is "
        "applied at once; an invalid one is rejected, its errors are logged and the running "
        "configuration is kept.",
        ".SH EXIT STATUS",
        "0 success, 1 runtime failure, 2 usage or configuration error.",
        ".SH FILES",
        ".TP", f"\\fI{roff(DEFAULT_CONFIG_PATH)}\\fR",
        "The configuration (a conffile: upgrades keep local edits).",
        ".TP", "\\fI/var/run/koordnode/\\fR",
        "CRI proxy socket and admin socket (created by systemd as RuntimeDirectory).",
        ".TP", "\\fI/var/lib/koordnode/originals.json\\fR",
        "The originals of the node-level values koordnode changed, kept before its first write "
        "([daemon] state_dir); \\fBkoordnode restore\\fR puts them back.",
        ".TP", "\\fI/opt/koordnode/\\fR",
        "The application and its private Python environment.",
        ".TP", "\\fI/lib/systemd/system/koordnode.service\\fR",
        "The systemd unit (\\fI/usr/lib/systemd/system/\\fR on RPM systems).",
        ".SH SEE ALSO",
        "\\fBsystemctl\\fR(1), \\fBjournalctl\\fR(1), \\fBkubelet\\fR(8), \\fBcontainerd\\fR(8)",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    page = manpage()
    if len(argv) > 1:
        with open(argv[1], "w", encoding="utf-8") as out:
            out.write(page)
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
