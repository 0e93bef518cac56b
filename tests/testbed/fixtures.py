"""pytest fixture for the shared containerd test bed.

Wire it in ``tests/conftest.py`` with::

    from testbed.fixtures import containerd_bed  # noqa: F401  (re-exported fixture)

The bed is started once per test session. Where it cannot run (not root,
binaries missing) tests using it are skipped, except under ``CI=true`` where
a missing bed is a failure: CI must really exercise containerd. A bed that
has its prerequisites but fails to start is always an error.

One bed is shared per process even if the fixture gets registered twice
(e.g. imported by both conftest and a test module).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator, NoReturn

import pytest

from .containerd_bed import ContainerdBed, missing_prerequisites
from .containerd_dist import DistError, containerd_bin_dir


def running_in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def skip_or_fail_in_ci(message: str) -> NoReturn:
    """Skip a test whose tools or privileges are missing; under CI that is a failure instead,
    so a CI run can never pass by skipping what it exists to run."""
    if running_in_ci():
        pytest.fail(message + " (CI=true, so this is an error, not a skip)", pytrace=False)
    pytest.skip(message)


def _unavailable(reason: str) -> None:
    skip_or_fail_in_ci(f"containerd test bed unavailable: {reason}")


class _SharedBed:
    """Reference-counted single bed per process."""

    def __init__(self) -> None:
        self.bed: ContainerdBed | None = None
        self.users = 0

    def acquire(self, workdir: Path) -> ContainerdBed:
        if self.bed is None:
            bed = ContainerdBed(workdir)
            bed.start()
            self.bed = bed
        self.users += 1
        return self.bed

    def release(self) -> None:
        self.users -= 1
        if self.users <= 0 and self.bed is not None:
            bed, self.bed = self.bed, None
            bed.stop()


_shared = _SharedBed()


@pytest.fixture(scope="session")
def containerd_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerdBed]:
    """A started ``ContainerdBed`` for the whole session; stopped (and cleaned) at the end."""
    problems = missing_prerequisites()
    if problems:
        _unavailable("; ".join(problems))
    # Prerequisites present but start fails: a real error, never a skip.
    bed = _shared.acquire(tmp_path_factory.mktemp("containerd-bed"))
    try:
        yield bed
    finally:
        _shared.release()


@contextlib.contextmanager
def dist_bed(suite: str, workdir: Path, **bed_options) -> Iterator[ContainerdBed]:
    """A started bed running ``suite``'s containerd (``containerd_dist``), stopped on exit.

    The release cannot be fetched here (no mirror, not root): skipped, or failed under CI=true.
    """
    problems = missing_prerequisites()
    if problems:
        _unavailable("; ".join(problems))
    try:
        bin_dir = containerd_bin_dir(suite)
    except DistError as err:
        _unavailable(f"containerd of Debian {suite}: {err}")
    bed = ContainerdBed(workdir, bin_dir=bin_dir, **bed_options)
    bed.start()
    try:
        yield bed
    finally:
        bed.stop()
