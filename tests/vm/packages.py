"""The packages the VM lane's guest installs, and what the guest needs to build them itself
(tests/vm_guest/test_package_systemd.py).

``stage_packages(directory)`` builds, with packaging/build.sh on the host (Debian 12), the .deb
of ``<version>+upgradetest`` into ``directory``; the lane puts it in the results share, where
the guest finds it as /results/packages: the guest installs its own build of ``<version>+debian13``
and upgrades to this one.

``stage_wheelhouse(directory)`` puts there what packaging/build.sh downloads with pip (the
pinned dependencies of packaging/requirements.txt and the build backend of pyproject.toml), so
the guest, which has no network, runs build.sh with ``PIP_NO_INDEX=1 PIP_FIND_LINKS=<dir>``:
the offline build an operator without PyPI access would do.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 600
DOWNLOAD_TIMEOUT_S = 300


def package_version() -> str:
    for line in (REPO / "koordnode" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__ = "):
            return line.split('"')[1]
    raise RuntimeError("no __version__ in koordnode/__init__.py")


def stage_packages(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    version = package_version()
    built = []
    for v in (f"{version}+upgradetest",):
        done = subprocess.run(["bash", str(REPO / "packaging" / "build.sh"), "--version", v,
                               "--formats", "deb", "--out", str(directory)],
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"packaging/build.sh --version {v} failed:\n{done.stderr[-3000:]}")
        built.append(Path(done.stdout.strip().splitlines()[-1]))
    return built


def _min_python() -> str:
    for line in (REPO / "packaging" / "build.sh").read_text().splitlines():
        if line.startswith("MIN_PY="):
            return line.split("=", 1)[1].strip()
    raise RuntimeError("no MIN_PY= in packaging/build.sh")


def _build_requires() -> list[str]:
    return list(tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"])


def wheelhouse(cache: Path) -> Path:
    """The wheels packaging/build.sh needs, downloaded once per requirements (cached in ``cache``)."""
    requirements = (REPO / "packaging" / "requirements.txt").read_text()
    key = hashlib.sha256("\n".join([requirements, _min_python(), *_build_requires()]).encode()).hexdigest()[:12]
    target = cache / f"wheelhouse-{key}"
    if (target / ".complete").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wheelhouse-", dir=cache) as scratch:
        staging = Path(scratch) / "wheels"
        pip = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary=:all:",
               "--dest", str(staging)]
        arch = os.uname().machine
        # Exactly what build.sh asks pip for: the oldest supported CPython, abi3 or pure Python.
        subprocess.run([*pip, "--no-deps", "--implementation", "cp", "--python-version", _min_python(),
                        "--abi", "abi3", "--abi", "none", "--platform", f"manylinux2014_{arch}",
                        "-r", str(REPO / "packaging" / "requirements.txt")],
                       check=True, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        # The build backend pip installs into build.sh's isolated wheel build (pure Python).
        subprocess.run([*pip, "--implementation", "py", "--platform", "any", "--abi", "none",
                        *_build_requires()],
                       check=True, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        (staging / ".complete").write_text("\n".join(sorted(p.name for p in staging.glob("*.whl"))) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    return target


def stage_wheelhouse(directory: Path, cache: Path) -> list[Path]:
    """A copy of :func:`wheelhouse` in ``directory`` (the guest's /results/wheelhouse)."""
    source = wheelhouse(cache)
    directory.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy(wheel, directory)) for wheel in sorted(source.glob("*.whl"))]
