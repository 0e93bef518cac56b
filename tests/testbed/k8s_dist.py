"""Where the real-node test bed's binaries are: built by ``scripts/k8s-bed.sh`` from Go modules.

``component_bin("kubernetes")`` is the directory holding ``kubelet`` and ``kube-apiserver``;
``"containerd"`` holds ``containerd``, ``ctr`` and ``containerd-shim-runc-v2`` (hand it to
``ContainerdBed(bin_dir=...)``); ``"etcd"`` holds ``etcd``; ``"cri-tools"`` ``critest`` and
``crictl``; ``"koordinator"`` ``koord-manager``, with Koordinator's CRDs in ``../crd`` and
koord-manager's ClusterRole in ``../rbac``. The script is the one authority on the cache layout (``--print``), so this module
asks it rather than recomputing the paths; the versions are in ``k8s-versions.env``.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from .background_build import BackgroundBuildError, require

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "k8s-bed.sh"
VERSIONS_FILE = Path(__file__).with_name("k8s-versions.env")
_BINARIES = {
    "kubernetes": ("kubelet", "kube-apiserver"),
    "containerd": ("containerd", "ctr", "containerd-shim-runc-v2"),
    "etcd": ("etcd",),
    "cri-tools": ("critest", "crictl"),
    "koordinator": ("koord-manager", "koord-scheduler"),  # and crd/, rbac/ beside bin/
    "koordlet": ("koordlet", "koord-runtime-proxy"),  # built only when named (the koordlet benchmark)
    "helm": ("helm",),  # the chart's tests
}
# The background build step (scripts/test.sh) that makes each component.
_STEPS = {"koordinator": "koord", "helm": "helm"}


class K8sDistError(RuntimeError):
    """A component of the real-node bed is not built (run scripts/k8s-bed.sh)."""


def versions() -> dict[str, str]:
    """``KUBERNETES_VERSION`` and friends, as pinned in ``k8s-versions.env``."""
    pinned: dict[str, str] = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            pinned[key.strip()] = value.strip()
    return pinned


_VERSION_KEYS = {"kubernetes": "KUBERNETES_VERSION", "containerd": "CONTAINERD_VERSION", "etcd": "ETCD_VERSION",
                 "cri-tools": "CRI_TOOLS_VERSION", "koordinator": "KOORDINATOR_VERSION",
                 "koordlet": "KOORDINATOR_VERSION", "helm": "HELM_VERSION"}


def _built_without_go() -> dict[str, Path]:
    """Where a machine without Go finds the binaries another one built (the VM lane's guest:
    the host's cache shared read-only): ``<cache>/<name>-<version>-go*`` that is complete,
    the newest Go first. The script's layout, read back; used only when ``go`` is missing."""
    cache = Path(os.environ.get("KOORDNODE_TESTBED_CACHE") or "/var/cache/koordnode-testbed")
    pinned = versions()
    dirs = {}
    for name, key in _VERSION_KEYS.items():
        found = sorted((d for d in cache.glob(f"{name}-{pinned.get(key, '?')}-go*") if (d / ".complete").is_file()),
                       key=lambda d: d.stat().st_mtime, reverse=True)
        dirs[name] = found[0] if found else cache / f"{name}-{pinned.get(key, '?')}-go(none built)"
    return dirs


@functools.cache
def _component_dirs() -> dict[str, Path]:
    if shutil.which("go", path=os.environ.get("PATH", "") + ":/usr/local/go/bin") is None:
        return _built_without_go()
    result = subprocess.run(["bash", str(BUILD_SCRIPT), "--print"], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise K8sDistError(f"{BUILD_SCRIPT} --print failed: {result.stderr.strip()}")
    dirs = {}
    for line in result.stdout.splitlines():
        name, _, directory = line.partition("=")
        dirs[name] = Path(directory)
    return dirs


def component_bin(name: str) -> Path:
    """The ``bin`` directory of a built component; ``K8sDistError`` saying what to run if it is not built."""
    if name not in _BINARIES:
        raise ValueError(f"unknown component {name!r}; expected one of {sorted(_BINARIES)}")
    try:
        require(_STEPS.get(name, "k8s"), "k8s_dist")  # scripts/test.sh builds in the background: wait for it
    except BackgroundBuildError as err:
        raise K8sDistError(str(err)) from err
    top = _component_dirs()[name]
    bin_dir = top / "bin"
    missing = [b for b in _BINARIES[name] if not (bin_dir / b).is_file()]
    if not (top / ".complete").is_file() or missing:
        raise K8sDistError(f"{name} is not built in {top} (missing: {', '.join(missing) or '.complete'}); "
                           f"run scripts/k8s-bed.sh")
    return bin_dir
