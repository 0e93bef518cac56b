"""Operations on the cgroup tree itself, beside the value writes: raw reads, creating and
removing cgroup directories, listing children, enabling v2 subtree controllers.

A mixin of CgroupExecutor (kept apart from its write path): it shares the executor's lock,
logger, dry-run flag, originals journal and cgroup filesystem.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterable, Set
from pathlib import Path
from typing import Any

from koordnode.executor.cgroup import CgroupFS, read_file, read_file_if_same, write_file
from koordnode.executor.converge import describe_os_error
from koordnode.executor.originals import OriginalsError, OriginalsJournal
from koordnode.executor.paths import UnsafePathError, normalize_cgroup_path
from koordnode.executor.resources import get_resource
from koordnode.model.cgroup_scope import outlives_pods


class CgroupTree:
    """Reads of a cgroup's files and changes of the tree's directories (not of its values)."""

    # Set up by CgroupExecutor and its Converger base.
    _fs: CgroupFS
    _lock: threading.RLock
    _log: Any
    dry_run: bool
    originals: OriginalsJournal | None
    # (cgroup, resource) -> the membership file found for it and its (device, inode): the
    # reconcile pass reads every running container's processes each period.
    _membership_files: dict[tuple[str, str], tuple[Path, tuple[int, int]]]
    _MAX_MEMBERSHIP_FILES = 16384  # cleared beyond it (only a lookup is lost)

    def read(self, cgroup: str, resource: str) -> str | None:
        """Raw content (stripped) of the file backing `resource` for `cgroup` on this kernel.

        None when the cgroup does not exist or the kernel has no such file. Raises
        UnsafePathError for a path leaving the root, UnknownResourceError for a bad name.
        """
        found = self._look_up_and_read(cgroup, resource)
        return None if found is None else found[1].strip()

    def _look_up_and_read(self, cgroup: str, resource: str) -> tuple[Path, str, tuple[int, int]] | None:
        """The file backing `resource` for `cgroup`, resolved and confined, with its content and
        its (device, inode); None when the hierarchy, the cgroup or the file is missing."""
        spec = get_resource(resource)
        hierarchy = self._fs.hierarchy(spec.v1_controller)
        if hierarchy is None:
            return None
        directory = self._fs.cgroup_dir(hierarchy, normalize_cgroup_path(cgroup))
        for fmt in spec.files(self._fs.is_v2):
            path = self._fs.cgroup_file(hierarchy, directory, fmt.filename)
            try:
                read = read_file_if_same(path, None)  # any file: None never comes back
            except FileNotFoundError:
                continue
            if read is not None:
                return path, read[0], read[1]
        return None

    def read_pids(self, cgroup: str, *, threads: bool = False) -> list[int] | None:
        """Process ids (cgroup.procs) or thread ids (tasks / cgroup.threads); None if missing.

        The file found for a cgroup is remembered with its identity: a later read opens that
        very file again (no symlink followed) and looks the path up, resolved and confined,
        only when another file (a recreated cgroup, a swapped directory) or none is there."""
        resource = "tasks" if threads else "cgroup.procs"
        key = (cgroup, resource)
        known = self._membership_files.get(key)
        if known is not None:
            try:
                read = read_file_if_same(*known)
            except OSError:
                read = None
            if read is not None:
                return _ids(read[0])
            self._membership_files.pop(key, None)
        found = self._look_up_and_read(cgroup, resource)
        if found is None:
            return None
        path, text, file_id = found
        if len(self._membership_files) >= self._MAX_MEMBERSHIP_FILES:
            self._membership_files.clear()
        self._membership_files[key] = (path, file_id)
        return _ids(text)

    def cgroup_exists(self, cgroup: str, controller: str = "cpu") -> bool:
        hierarchy = self._fs.hierarchy(controller)
        if hierarchy is None:
            return False
        return self._fs.cgroup_dir(hierarchy, cgroup).is_dir()

    def make_cgroup(self, cgroup: str, controller: str = "cpu") -> None:
        """Create a cgroup directory (and missing parents) in `controller`'s hierarchy.

        Raises UnsafePathError for a path leaving the root, OSError when the kernel refuses.
        """
        with self._lock:
            hierarchy = self._fs.hierarchy(controller)
            if hierarchy is None:
                raise OSError(errno.ENOENT, f"cgroup controller {controller} is not mounted under {self._fs.root}")
            directory = self._fs.cgroup_dir(hierarchy, cgroup)
            if not directory.is_dir() and self.dry_run:
                self._log.info("cgroup_create_dry_run", cgroup=normalize_cgroup_path(cgroup), path=str(directory))
            elif not directory.is_dir():
                self._keep_created(cgroup, hierarchy, directory)
                directory.mkdir(parents=True, exist_ok=True)
                self._log.info("cgroup_created", cgroup=normalize_cgroup_path(cgroup), path=str(directory))

    def _keep_created(self, cgroup: str, hierarchy: Path, directory: Path) -> None:
        """Before creating a node-level cgroup (and missing parents): keep "absent" as the
        original of each, so that restore removes them again."""
        if self.originals is None or not outlives_pods(cgroup):
            return
        missing = []
        while directory != hierarchy and not directory.is_dir():
            missing.append(directory)
            directory = directory.parent
        try:
            for path in reversed(missing):
                self.originals.keep("cgroup_dir", str(self._fs.root), str(path.relative_to(self._fs.root)), None)
        except OriginalsError as err:
            self._log.error("original_not_kept", path=str(path), error=str(err))
            raise OSError(errno.EIO, f"not created: its original (absent) could not be kept ({err})") from None

    def enable_subtree_controllers(self, cgroup: str, controllers: Iterable[str]) -> tuple[list[str], str | None]:
        """cgroup v2: enable for the children of `cgroup` those of `controllers` it has and has
        not enabled yet ("+cpuset" into cgroup.subtree_control, as kubelet's and runc's cgroup
        library does along a new cgroup's path). Returns (the controllers enabled, the problem)."""
        if not self._fs.is_v2:
            return [], "cgroup v1: no cgroup.subtree_control"
        with self._lock:
            try:
                directory = self._fs.cgroup_dir(self._fs.root, cgroup)
                available = read_file(self._fs.cgroup_file(self._fs.root, directory, "cgroup.controllers")).split()
                control = self._fs.cgroup_file(self._fs.root, directory, "cgroup.subtree_control")
                enabled = read_file(control).split()
            except (OSError, UnsafePathError) as exc:
                return [], f"{cgroup}: {exc}"
            missing = [c for c in controllers if c in available and c not in enabled]
            if not missing or self.dry_run:
                return [], None
            try:
                write_file(control, " ".join(f"+{c}" for c in missing))
            except OSError as exc:
                return [], f"{cgroup}/cgroup.subtree_control +{' +'.join(missing)}: {exc}"
        self._log.info("cgroup_subtree_controllers_enabled", cgroup=normalize_cgroup_path(cgroup), controllers=missing)
        return missing, None

    def child_cgroups(self, cgroup: str, controller: str = "cpu", *, skip: Set[str] = frozenset()) -> dict[str, float]:
        """{child cgroup path: seconds since it was created} of a cgroup in `controller`'s hierarchy;
        the children in `skip` are left out (and not looked at)."""
        import time

        hierarchy = self._fs.hierarchy(controller)
        if hierarchy is None:
            return {}
        directory = self._fs.cgroup_dir(hierarchy, cgroup)
        children: dict[str, float] = {}
        now = time.time()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return {}
        base = normalize_cgroup_path(cgroup).rstrip("/")
        for entry in entries:
            child = f"{base}/{entry.name}"
            if child in skip:
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    children[child] = now - entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
        return children

    def remove_cgroup(self, cgroup: str) -> list[str]:
        """rmdir an (empty) cgroup in every hierarchy that has it; never removes anything else.

        Returns the problems (a cgroup still holding processes or children stays)."""
        cgroup = normalize_cgroup_path(cgroup)
        if cgroup == "/":
            raise UnsafePathError("refusing to remove the root cgroup")
        if self.dry_run:
            self._log.info("cgroup_remove_dry_run", cgroup=cgroup)
            return []
        problems: list[str] = []
        with self._lock:
            if self._fs.is_v2:
                hierarchies = [self._fs.root]
            else:
                hierarchies = sorted({Path(os.path.realpath(e)) for e in self._fs.root.iterdir() if e.is_dir()})
            for hierarchy in hierarchies:
                try:
                    directory = self._fs.cgroup_dir(hierarchy, cgroup)
                except UnsafePathError as err:
                    problems.append(str(err))
                    continue
                if directory == hierarchy or not directory.is_dir():
                    continue
                try:
                    directory.rmdir()
                    self._log.info("cgroup_removed", cgroup=cgroup, path=str(directory))
                except OSError as err:
                    problems.append(f"{directory}: {describe_os_error(err)}")
        return problems


def _ids(text: str) -> list[int]:
    return [int(line) for line in text.split() if line.isdigit()]
