"""Cgroup versions, drivers and path naming.

Everything here either is pure string work or only *looks* at the filesystem (existence
checks for version detection); nothing writes. The strings produced are cgroup paths
relative to a hierarchy root ("/kubepods/burstable/pod<uid>"), always starting with "/",
never containing "." or ".." components.
"""

from __future__ import annotations

import enum
import functools
import re
from pathlib import Path


class UnsafePathError(ValueError):
    """A cgroup path (or the file it leads to) would leave its root, or is malformed."""


class CgroupRootError(ValueError):
    """The configured root does not look like a cgroup v1 or v2 hierarchy."""


class CgroupVersion(str, enum.Enum):
    V1 = "v1"
    V2 = "v2"


class CgroupDriver(str, enum.Enum):
    AUTO = "auto"
    CGROUPFS = "cgroupfs"
    SYSTEMD = "systemd"


# Controllers whose v1 hierarchy we look for when telling v1 from "nothing here".
_V1_PROBE_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "blkio", "pids")

# Bytes that never belong in a cgroup path: NUL, newlines and other C0 controls, DEL.
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")

# systemd unit names: ASCII letters, digits, ":", "_", ".", "\" and "-".
_UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\\-]+\Z")

# containerd container ids are 64 hex chars; accept any conservative token.
_CONTAINER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}\Z")

SYSTEMD_CONTAINER_PREFIX = "cri-containerd"


def detect_cgroup_version(root: Path | str) -> CgroupVersion:
    """v2 when the root itself is a unified hierarchy, v1 when it holds per-controller dirs.

    A hybrid host (v1 controllers plus a cgroup2 mount at <root>/unified for PSI) is v1:
    the controllers we write live in the v1 hierarchies.
    """
    root = Path(root)
    if (root / "cgroup.controllers").is_file():
        return CgroupVersion.V2
    for controller in _V1_PROBE_CONTROLLERS:
        if v1_controller_dir(root, controller) is not None:
            return CgroupVersion.V1
    raise CgroupRootError(
        f"{root} is not a cgroup root: no cgroup.controllers (v2) and no per-controller "
        f"directories such as {root}/cpu or {root}/memory (v1)"
    )


def v1_controller_dir(root: Path | str, controller: str) -> Path | None:
    """Directory of a v1 controller's hierarchy, or None when it is not mounted.

    Handles both `<root>/cpu` as its own mount and co-mounted hierarchies such as
    `<root>/cpu,cpuacct` (with or without the usual `cpu -> cpu,cpuacct` symlink).
    """
    root = Path(root)
    direct = root / controller
    if direct.is_dir():
        return direct
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return None
    for entry in entries:
        if "," in entry.name and controller in entry.name.split(",") and entry.is_dir():
            return entry
    return None


def normalize_cgroup_path(cgroup: str) -> str:
    """Canonical "/a/b" form of a cgroup path relative to a hierarchy root.

    Leading "/" is the conventional spelling of "relative to the root", so "/etc" means
    <root>/etc, never the host's /etc. ".." components are refused outright: no legitimate
    cgroup path needs them and they are the classic way out of the root.
    """
    if not isinstance(cgroup, str):
        raise UnsafePathError(f"cgroup path must be a string, got {type(cgroup).__name__}")
    return _normalize(cgroup)


# Every write, read and tick normalises the same few paths again; refusals are not cached.
@functools.lru_cache(maxsize=1024)
def _normalize(cgroup: str) -> str:
    if _CONTROL_CHARS.search(cgroup):
        raise UnsafePathError(f"cgroup path contains control characters: {cgroup!r}")
    parts = []
    for part in cgroup.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            raise UnsafePathError(f"cgroup path contains '..': {cgroup!r}")
        parts.append(part)
    return "/" + "/".join(parts)


def cgroup_depth(cgroup: str) -> int:
    """Number of components below the root ("/" is 0)."""
    normalized = normalize_cgroup_path(cgroup)
    return 0 if normalized == "/" else normalized.count("/")


def is_systemd_slice(cgroup_parent: str) -> bool:
    return cgroup_parent.rstrip("/").endswith(".slice")


def expand_systemd_slice(slice_name: str) -> str:
    """"a-b-c.slice" -> "/a.slice/a-b.slice/a-b-c.slice" (systemd's slice nesting by dashes)."""
    if _CONTROL_CHARS.search(slice_name):
        raise UnsafePathError(f"slice name contains control characters: {slice_name!r}")
    if not slice_name.endswith(".slice"):
        raise UnsafePathError(f"not a systemd slice name: {slice_name!r}")
    if not _UNIT_NAME.match(slice_name):
        raise UnsafePathError(f"invalid characters in slice name: {slice_name!r}")
    stem = slice_name[: -len(".slice")]
    if stem == "-":  # "-.slice" is the root slice
        return "/"
    if not stem or stem.startswith("-") or stem.endswith("-") or "--" in stem:
        raise UnsafePathError(f"malformed slice name: {slice_name!r}")
    parts = stem.split("-")
    if any(part in (".", "..") for part in parts):
        raise UnsafePathError(f"slice name contains '.' or '..' components: {slice_name!r}")
    return "/" + "/".join("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))


def _resolve_driver(cgroup_parent: str, driver: CgroupDriver | str) -> CgroupDriver:
    driver = CgroupDriver(driver)
    if driver is CgroupDriver.AUTO:
        return CgroupDriver.SYSTEMD if is_systemd_slice(cgroup_parent) else CgroupDriver.CGROUPFS
    return driver


def pod_cgroup_path(cgroup_parent: str, driver: CgroupDriver | str = CgroupDriver.AUTO) -> str:
    """The pod's cgroup path relative to a hierarchy root, from the CRI cgroup_parent.

    cgroupfs: "/kubepods/burstable/pod<uid>" is used as is (normalised).
    systemd: kubelet passes the slice expanded into its path ("/kubepods.slice/kubepods-
    besteffort.slice/kubepods-besteffort-pod<uid>.slice"), which is kept; a bare slice name
    ("kubepods-besteffort-pod<uid>.slice", as crictl or a test bed may send) is nested by its dashes.
    """
    if not isinstance(cgroup_parent, str) or not cgroup_parent.strip("/"):
        raise UnsafePathError(f"empty or invalid cgroup_parent: {cgroup_parent!r}")
    if _resolve_driver(cgroup_parent, driver) is CgroupDriver.SYSTEMD:
        if "/" in cgroup_parent.strip("/"):
            normalized = normalize_cgroup_path(cgroup_parent)
            for component in normalized.strip("/").split("/"):
                expand_systemd_slice(component)  # validates each component
            return normalized
        return expand_systemd_slice(cgroup_parent.strip("/"))
    return normalize_cgroup_path(cgroup_parent)


def container_cgroup_path(
    cgroup_parent: str,
    container_id: str,
    driver: CgroupDriver | str = CgroupDriver.AUTO,
) -> str:
    """A containerd container's cgroup path: `<parent>/<id>` (cgroupfs) or
    `<expanded parent>/cri-containerd-<id>.scope` (systemd)."""
    if not isinstance(container_id, str) or not _CONTAINER_ID.match(container_id):
        raise UnsafePathError(f"invalid container id: {container_id!r}")
    pod = pod_cgroup_path(cgroup_parent, driver)
    if _resolve_driver(cgroup_parent, driver) is CgroupDriver.SYSTEMD:
        leaf = f"{SYSTEMD_CONTAINER_PREFIX}-{container_id}.scope"
    else:
        leaf = container_id
    return pod.rstrip("/") + "/" + leaf


def parent_cgroup_path(cgroup: str) -> str | None:
    """Parent of a normalised cgroup path; None for the root."""
    normalized = normalize_cgroup_path(cgroup)
    if normalized == "/":
        return None
    return normalized.rsplit("/", 1)[0] or "/"
