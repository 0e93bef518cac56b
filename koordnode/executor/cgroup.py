"""Confined file access under a root (a cgroup hierarchy or a procfs mount).

Every path is built from a root plus a normalised relative path, resolved (symlinks
followed) and checked to still lie beneath its base before it is opened; files are opened
with O_NOFOLLOW and never created. This is the only place that opens kernel files.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from koordnode.executor.paths import (
    CgroupRootError,
    CgroupVersion,
    UnsafePathError,
    detect_cgroup_version,
    normalize_cgroup_path,
    v1_controller_dir,
)


def _within(path: Path, base: Path) -> bool:
    # Both are absolute and normalised (resolved): a string prefix is a parents check.
    inner, outer = str(path), str(base)
    return inner == outer or inner.startswith(outer if outer.endswith("/") else outer + "/")


def _realpath(path: Path) -> str:
    """os.path.realpath, with the kernel resolving the path when it exists.

    An O_PATH descriptor and the link /proc/self/fd/N name the file as the kernel reached it,
    every symlink followed: three system calls instead of an lstat per path component (the
    reconcile pass resolves a few hundred cgroup files). A missing path, a path removed in
    between or no /proc: os.path.realpath, as before.
    """
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return os.path.realpath(path)
    try:
        resolved = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)
    finally:
        os.close(fd)
    if not resolved.startswith("/") or resolved.endswith(" (deleted)"):
        return os.path.realpath(path)
    return resolved


def resolve_beneath(base: Path, relative: str) -> Path:
    """`base / relative`, symlinks resolved, refused unless it stays beneath `base`.

    `base` must already be resolved. `relative` is normalised first (no "..", no control
    characters; a leading "/" is relative to `base`, never the host root).
    """
    normalized = normalize_cgroup_path(relative)
    candidate = base / normalized.lstrip("/")
    resolved = Path(_realpath(candidate))
    if not _within(resolved, base):
        raise UnsafePathError(f"{candidate} resolves to {resolved}, outside {base}")
    return resolved


def read_file(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("ascii", errors="replace")


def read_file_if_same(path: Path, file_id: tuple[int, int] | None) -> tuple[str, tuple[int, int]] | None:
    """read_file, but only from the very file (device, inode) seen before; None when the path
    now leads elsewhere (the cgroup was recreated, or a directory on the way was swapped).
    `file_id` None: any file; its id comes back with the text, to be given next time. The
    identity is taken from the open descriptor, before anything is read: one fstat instead of
    a stat of the directory by path. O_NONBLOCK: a swapped path never blocks the open."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        found = (st.st_dev, st.st_ino)
        if file_id is not None and found != file_id:
            return None
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("ascii", errors="replace"), found


def write_file(path: Path, text: str) -> None:
    """One write(2) of `text` (kernel files take one value per write). Never creates.

    O_TRUNC is harmless on cgroupfs/procfs and keeps plain files of a fake tree exact.
    """
    try:
        data = text.encode("ascii")
    except UnicodeEncodeError:
        raise OSError(errno.EINVAL, f"non-ASCII value for {path}: {text!r}") from None
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        written = os.write(fd, data)
    finally:
        os.close(fd)
    if written != len(data):
        raise OSError(errno.EIO, f"short write to {path}: {written} of {len(data)} bytes")


class ConfinedRoot:
    """A resolved root directory and confined access beneath it."""

    def __init__(self, root: Path | str) -> None:
        resolved = Path(os.path.realpath(root))
        if not resolved.is_dir():
            raise CgroupRootError(f"root {root} is not a directory")
        self.root = resolved

    def file(self, relative: str) -> Path:
        return resolve_beneath(self.root, relative)


class CgroupFS:
    """Safe path construction for a cgroup v1 or v2 root (e.g. /sys/fs/cgroup)."""

    def __init__(self, root: Path | str, version: CgroupVersion | str | None = None) -> None:
        self._root = ConfinedRoot(root)
        self.version = CgroupVersion(version) if version else detect_cgroup_version(self.root)
        self._hierarchies: dict[str, Path | None] = {}

    @property
    def root(self) -> Path:
        return self._root.root

    @property
    def is_v2(self) -> bool:
        return self.version is CgroupVersion.V2

    def hierarchy(self, controller: str | None) -> Path | None:
        """Resolved directory of the hierarchy holding `controller` (None: not mounted).

        v2 has one hierarchy, the root. On v1 a combined mount reached through a symlink
        (cpu -> cpu,cpuacct) is fine as long as it stays beneath the root.
        """
        if self.is_v2:
            return self.root
        if not controller:
            return None
        if controller not in self._hierarchies:
            found = v1_controller_dir(self.root, controller)
            resolved = Path(os.path.realpath(found)) if found is not None else None
            if resolved is not None and not _within(resolved, self.root):
                raise UnsafePathError(f"controller {controller} at {found} resolves outside {self.root}")
            self._hierarchies[controller] = resolved
        return self._hierarchies[controller]

    def cgroup_dir(self, hierarchy: Path, cgroup: str) -> Path:
        """Resolved directory of `cgroup` in `hierarchy`; refused if it leaves the hierarchy."""
        return resolve_beneath(hierarchy, cgroup)

    def cgroup_file(self, hierarchy: Path, cgroup_dir: Path, filename: str) -> Path:
        """Resolved path of a file in a cgroup directory (resolved already, by cgroup_dir); a
        symlinked file pointing out is refused."""
        return self._file(hierarchy, cgroup_dir, filename)[0]

    def existing_file(self, hierarchy: Path, cgroup_dir: Path, filename: str) -> Path | None:
        """cgroup_file when it is a regular file (a symlink to one counts), else None."""
        path, regular = self._file(hierarchy, cgroup_dir, filename)
        if regular is None:
            regular = path.is_file()
        return path if regular else None

    def _file(self, hierarchy: Path, cgroup_dir: Path, filename: str) -> tuple[Path, bool | None]:
        """The resolved path, and whether it is a regular file when that is known already."""
        if "/" in filename or filename in ("", ".", ".."):
            raise UnsafePathError(f"bad cgroup file name {filename!r}")
        candidate = cgroup_dir / filename
        try:
            mode: int | None = os.lstat(candidate).st_mode
        except FileNotFoundError:
            mode = 0
        except OSError:
            mode = None
        if mode is not None and not stat.S_ISLNK(mode) and _within(candidate, hierarchy):
            # Nothing to follow after a resolved directory: one lstat instead of an open and a
            # readlink, and it says whether the file is there (new pods' files are looked up).
            return candidate, stat.S_ISREG(mode)
        resolved = Path(_realpath(candidate))
        if not _within(resolved, hierarchy):
            raise UnsafePathError(f"{candidate} resolves to {resolved}, outside {hierarchy}")
        return resolved, None
