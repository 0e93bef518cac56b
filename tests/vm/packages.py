"""The packages the VM lane's guest installs (tests/vm_guest/test_package_systemd.py).

``stage_packages(directory)`` builds, with packaging/build.sh on the host, the .deb of this
tree's version and of ``<version>+upgradetest`` into ``directory``; the lane puts them in the
results share, where the guest finds them as /results/packages.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 600


def package_version() -> str:
    for line in (REPO / "koordnode" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__ = "):
            return line.split('"')[1]
    raise RuntimeError("no __version__ in koordnode/__init__.py")


def stage_packages(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    version = package_version()
    built = []
    for v in (version, f"{version}+upgradetest"):
        done = subprocess.run(["bash", str(REPO / "packaging" / "build.sh"), "--version", v,
                               "--formats", "deb", "--out", str(directory)],
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"packaging/build.sh --version {v} failed:\n{done.stderr[-3000:]}")
        built.append(Path(done.stdout.strip().splitlines()[-1]))
    return built
