"""The packages the VM lane's guest installs, and what the guest needs to build them itself
(tests/vm_guest/test_package_systemd.py).

``stage_packages(directory)`` builds, with packaging/build.sh on the host (Debian 12), the .deb
of ``<version>+upgradetest`` into ``directory``; the lane puts it in the results share, where
the guest finds it as /results/packages: the guest installs its own build of ``<version>+debian13``
and upgrades to this one.

``stage_wheelhouse(directory)`` puts there what packaging/build.sh downloads with pip (the
pinned dependencies of packaging/requirements.txt, the build backend of pyproject.toml, and the
source archives build.sh builds as pure Python with their build requirements), so
the guest, which has no network, runs build.sh with ``PIP_NO_INDEX=1 PIP_FIND_LINKS=<dir>``:
the offline build an operator without PyPI access would do.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 600
DOWNLOAD_TIMEOUT_S = 300
# Part of the wheelhouse's cache key: bump when what wheelhouse() downloads changes.
WHEELHOUSE_RECIPE = "2: source archives and their build requirements"


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
    key = hashlib.sha256("\n".join([WHEELHOUSE_RECIPE, requirements, _min_python(), *_build_requires()])
                         .encode()).hexdigest()[:12]
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
        # What build.sh builds from source as pure Python: the source archive, and its build
        # requirements as pure-Python wheels (Cython has one), for any guest CPython.
        sources = _pure_from_source()
        if sources:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                            "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
                            "--dest", str(staging), *sources],
                           check=True, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
            subprocess.run([*pip, "--implementation", "py", "--platform", "any", "--abi", "none",
                            *_sdist_build_requires(staging)],
                           check=True, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        (staging / ".complete").write_text("\n".join(sorted(p.name for p in _archives(staging))) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    return target


def _pure_from_source() -> list[str]:
    """The requirements build.sh builds from source (its ``# pure-python-from-source:`` lines)."""
    marker = "# pure-python-from-source:"
    lines = (REPO / "packaging" / "requirements.txt").read_text().splitlines()
    return [word for line in lines if line.startswith(marker) for word in line[len(marker):].split()]


def _sdist_build_requires(directory: Path) -> list[str]:
    """Every ``[build-system] requires`` of the source archives in ``directory``, markers dropped
    (the guest's CPython is not this one: take each requirement for any version)."""
    wanted: list[str] = []
    for archive in sorted(directory.glob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            member = next(m for m in tar.getmembers() if m.name.count("/") == 1
                          and m.name.endswith("/pyproject.toml"))
            handle = tar.extractfile(member)
            assert handle is not None
            for requirement in tomllib.loads(handle.read().decode())["build-system"]["requires"]:
                name = requirement.split(";", 1)[0].strip()
                if name not in wanted:
                    wanted.append(name)
    return wanted


def _archives(directory: Path) -> list[Path]:
    return sorted([*directory.glob("*.whl"), *directory.glob("*.tar.gz")])


def stage_wheelhouse(directory: Path, cache: Path) -> list[Path]:
    """A copy of :func:`wheelhouse` in ``directory`` (the guest's /results/wheelhouse)."""
    source = wheelhouse(cache)
    directory.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy(archive, directory)) for archive in _archives(source)]


def stage_for_guest(directory: Path, cache: Path, log: Callable[[str], None]) -> None:
    """The .deb tests/vm_guest/test_package_systemd.py upgrades to, and in ``wheelhouse/`` beside
    them what packaging/build.sh downloads, for the guest's own (offline) build. A failure is
    left as ERROR.txt in that directory for the guest test to report (the others run regardless)."""
    began = time.monotonic()
    try:
        built = stage_packages(directory)
        log(f"packages for the guest: {', '.join(p.name for p in built)} ({time.monotonic() - began:.0f} s)")
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "ERROR.txt").write_text(f"{err}\n")
        log(f"packages for the guest not built: {err}")
    wheels = directory.parent / "wheelhouse"
    try:
        staged = stage_wheelhouse(wheels, cache)
        log(f"wheelhouse for the guest's packaging/build.sh: {len(staged)} wheels")
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        wheels.mkdir(parents=True, exist_ok=True)
        detail = getattr(err, "stderr", "") or ""
        (wheels / "ERROR.txt").write_text(f"{err}\n{detail[-3000:]}\n")
        log(f"wheelhouse for the guest not made: {err}")
