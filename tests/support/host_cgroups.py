"""Test cgroups on this machine's real v1 hierarchies: made with their missing parents, and
removed (children first) once their processes are gone."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def make_cgroups(cgroups: Iterable[str], hierarchies: Iterable[str]) -> list[Path]:
    """Each cgroup (and its missing parents) in each hierarchy; the directories made, in order."""
    created: list[Path] = []
    for cgroup in cgroups:
        parts = cgroup.strip("/").split("/")
        for hierarchy in hierarchies:
            for depth in range(1, len(parts) + 1):
                directory = CGROUP / hierarchy / "/".join(parts[:depth])
                if not directory.is_dir():
                    directory.mkdir()
                    created.append(directory)
    return created


def remove_cgroups(created: list[Path], timeout_s: float = 5.0) -> None:
    """The directories make_cgroups made, children first; the kernel may take a moment after the
    last process left before a cgroup can go."""
    deadline = time.monotonic() + timeout_s
    for directory in reversed(created):
        while directory.exists():
            try:
                directory.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
