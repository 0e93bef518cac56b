"""The executor: the only code that writes to the kernel.

It takes plans of logical writes (CgroupWrite / SysctlWrite), maps them onto the right file
for this kernel and cgroup version, and converges each file: write only when the value
differs (or when forced), read back and compare, log every write. Unsupported files are
skipped once and remembered; unsafe paths and invalid values are refused.
"""

from __future__ import annotations

import dataclasses
import enum
import errno
import os
import stat
import threading
from collections.abc import Hashable, Iterable, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from koordnode.executor.cgroup import CgroupFS, ConfinedRoot, read_file, read_file_if_same, write_file
from koordnode.executor.originals import OriginalsError, OriginalsJournal
from koordnode.executor.paths import (
    CgroupVersion,
    UnsafePathError,
    cgroup_depth,
    normalize_cgroup_path,
)
from koordnode.model.cgroup_scope import outlives_pods
from koordnode.model.cpulist import format_cpu_list
from koordnode.policy.plan import CgroupWrite, SysctlWrite
from koordnode.executor.resources import (
    RESOURCES,
    FileFormat,
    FileFormatError,
    InvalidValueError,
    Resource,
    UnknownResourceError,
    get_resource,
    get_sysctl,
)


# Files that list a cgroup's processes: writing them moves a process, it sets no value.
MEMBERSHIP_FILES = frozenset({"cgroup.procs", "cgroup.threads", "tasks"})

# What the kernel changes by itself when a cgroup's cpu.idle changes.
_WEIGHT_FILES = ("cpu.shares", "cpu.weight", "cpu.weight.nice")

class WriteStatus(str, enum.Enum):
    WRITTEN = "written"  # the file now holds the value (changed, or re-written when forced)
    UNCHANGED = "unchanged"  # the file already held the value; nothing written
    SKIPPED = "skipped"  # the kernel has no file for this resource (unsupported), remembered
    MISSING = "missing"  # the cgroup directory does not exist (not created yet, or gone)
    FAILED = "failed"  # the kernel refused the write, or read back something else
    REFUSED = "refused"  # unsafe path, invalid value or unknown resource: nothing touched
    WOULD_WRITE = "would_write"  # dry run: the file differs and would have been written


@dataclass(frozen=True)
class WriteResult:
    write: CgroupWrite | SysctlWrite
    status: WriteStatus
    path: str | None = None  # the kernel file (resolved), when known
    old: str | None = None  # its content before
    new: str | None = None  # the text written (or that would have been written)
    detail: str = ""  # why skipped / refused / failed, or "forced rewrite"
    read_back: str | None = None  # content read after writing
    # The file no longer held what koordnode last wrote there: another writer (systemd,
    # kubelet, a script) changed it since. This write restored it (when ok).
    overwritten: bool = False

    @property
    def cgroup_write(self) -> CgroupWrite:
        """The write of a CgroupExecutor result (which is always a CgroupWrite)."""
        if not isinstance(self.write, CgroupWrite):
            raise TypeError(f"not a cgroup write: {self.write!r}")
        return self.write

    @property
    def ok(self) -> bool:
        """Nothing went wrong (in a dry run: the write would have been made)."""
        return self.status in (WriteStatus.WRITTEN, WriteStatus.UNCHANGED, WriteStatus.WOULD_WRITE)

    @property
    def reason(self) -> str:
        return self.write.reason


@dataclass(frozen=True)
class _Target:
    """A validated write located on its file, ready to converge."""

    write: CgroupWrite | SysctlWrite
    path: Path
    fmt: FileFormat
    value: Any
    expected: Hashable
    # Inode of the file's directory when already known (saves a stat per check).
    dir_inode: int | None = None
    # Found in the executor's cache of located files (looked up again if the file is gone).
    cached: bool = False
    # Where it was found ((resource, cgroup) and the location), for a repeat of the same write.
    key: tuple[str, str] | None = None
    located: _Located | None = dataclasses.field(default=None, compare=False)


@dataclass
class _Located:
    """Where a (resource, cgroup) was found: its file, the directory's identity, and the
    siblings read to decide whether a write is blocked (resolved once, on first use)."""

    hierarchy: Path
    directory: Path
    dir_id: tuple[int, int]
    path: Path
    fmt: FileFormat
    file_in_dir: bool  # the file is not a link to another directory (its dir_id is the directory's)
    siblings: dict[str, Path]
    # (device, inode) of the file, read once right after a check of the directory: later
    # checks open the path and compare the open file's identity instead of the directory's.
    file_id: tuple[int, int] | None = None


def _directory_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a directory; None when it is missing or not a directory."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


class _Outcome(Exception):
    """Internal: a write ends early with a result (refused, skipped, missing)."""

    def __init__(self, result: WriteResult) -> None:
        super().__init__(result.detail)
        self.result = result


def _errno_status(err: OSError) -> WriteStatus:
    # The cgroup vanished between lookup and I/O (container exited): not a failure.
    return WriteStatus.MISSING if err.errno == errno.ENOENT else WriteStatus.FAILED


def _describe(err: OSError) -> str:
    name = errno.errorcode.get(err.errno or 0, "")
    return f"{name}: {err.strerror}" if name else str(err)


class _Converger:
    """Write-if-different, read back, log: shared by the cgroup and procfs executors."""

    _event = "kernel_write"

    # Bound on remembered files (~6 per pod: 16384 is ~2700 pods); pruned of vanished cgroups
    # beyond it, so pods that come and go do not grow it.
    _MAX_OWNED = 16384

    def __init__(self, logger: Any = None, *, dry_run: bool = False,
                 originals: OriginalsJournal | None = None) -> None:
        self._log = logger if logger is not None else structlog.get_logger("koordnode.executor")
        self._lock = threading.RLock()
        # Where the originals of node-level targets are kept before their first write
        # (None: not kept, e.g. in tests and tools that restore nothing).
        self.originals = originals
        self._originals_problem: str | None = None
        # Dry run: files are read and compared, differences reported as WOULD_WRITE, never
        # written. Settable at any time (config reload).
        self.dry_run = dry_run
        # Dry run: the text last reported per file, so that the reconcile pass does not log
        # the same "would write" at info level every period.
        self._would_logged: dict[str, str] = {}
        # file -> (inode of its directory, value koordnode last wrote or confirmed there, the
        # file's text then, the UNCHANGED result for that text). The inode tells a recreated
        # cgroup (fresh defaults, not an overwrite) from the same one; the text lets a check
        # that reads the very same text again skip parsing it (it holds the same value).
        self._owned: dict[Path, tuple[int, Hashable, str | None, WriteResult | None]] = {}
        self._overwrites: dict[str, int] = {}
        self._last_overwrite: dict[str, dict[str, str]] = {}

    @property
    def overwrites(self) -> dict[str, int]:
        """Times another writer changed a value koordnode owns, by resource (for status)."""
        with self._lock:
            return dict(self._overwrites)

    @property
    def last_overwrites(self) -> dict[str, dict[str, str]]:
        """The latest overwrite seen per resource: path, value found, value restored."""
        with self._lock:
            return {name: dict(event) for name, event in self._last_overwrite.items()}

    @staticmethod
    def _resource_name(write: CgroupWrite | SysctlWrite) -> str:
        return str(getattr(write, "resource", None) or getattr(write, "name", "unknown"))

    @staticmethod
    def _dir_inode(path: Path) -> int:
        try:
            return path.parent.stat().st_ino
        except OSError:
            return -1

    def _target_dir_inode(self, target: _Target) -> int:
        return target.dir_inode if target.dir_inode is not None else self._dir_inode(target.path)

    def _check_overwrite(self, target: _Target, current: str) -> bool:
        """Whether the file lost the value koordnode last put there (someone else wrote it)."""
        owned = self._owned.get(target.path)
        if owned is None or owned[0] != self._target_dir_inode(target):
            return False
        try:
            found = target.fmt.extract(current, target.value)
        except FileFormatError:
            found = None
        if found == owned[1]:
            return False
        name = self._resource_name(target.write)
        self._overwrites[name] = self._overwrites.get(name, 0) + 1
        self._last_overwrite[name] = {"path": str(target.path), "found": current.strip()}
        self._log.warning(f"{self._event}_overwritten", path=str(target.path), found=current.strip(),
                          **self._log_fields(target.write))
        return True

    def _remember(self, target: _Target, text: str | None = None, unchanged: WriteResult | None = None) -> None:
        if len(self._owned) >= self._MAX_OWNED and target.path not in self._owned:
            self._owned = {p: v for p, v in self._owned.items() if p.parent.is_dir()}
            if len(self._owned) >= self._MAX_OWNED:
                self._owned.clear()  # never unbounded; only overwrite detection is lost
        self._owned[target.path] = (self._target_dir_inode(target), target.expected, text, unchanged)

    def _unchanged_again(self, target: _Target, current: str) -> WriteResult | None:
        """The result of the last check of this file when it reads exactly as it did then, in
        the same directory, for the same value: nothing to parse, compare or remember again."""
        owned = self._owned.get(target.path)
        if (owned is None or owned[2] != current or owned[3] is None or target.dir_inode is None
                or owned[0] != target.dir_inode or owned[1] != target.expected):
            return None
        result = owned[3]
        return result if result.write == target.write else None

    def _log_fields(self, write: CgroupWrite | SysctlWrite) -> dict[str, Any]:
        return {"reason": write.reason}

    def _original_key(self, target: _Target) -> tuple[str, str, str] | None:
        """(kind, root, target) of a node-level file, whose original is kept; None: not one."""
        return None

    def _keep_original(self, target: _Target, current: str) -> str | None:
        """Keep the file's content as its original before koordnode first changes it (the first
        original wins). The problem when it could not be kept: the write is then not made, as
        koordnode could not undo it."""
        key = self._original_key(target) if self.originals is not None else None
        if key is None or self.originals is None:
            return None
        try:
            if self.originals.keep(*key, current):
                self._log.info("original_kept", kind=key[0], target=key[2], value=current.strip(),
                               state_file=str(self.originals.path))
        except OriginalsError as err:
            problem = f"not written: its original could not be kept ({err})"
            if problem != self._originals_problem:  # the reconcile pass retries: log a lasting one once
                self._log.error("original_not_kept", path=str(target.path), error=str(err))
            self._originals_problem = problem
            return problem
        self._originals_problem = None
        return None

    def _converge(self, target: _Target, force: bool, original_old: str | None = None) -> WriteResult:
        write, path, fmt = target.write, target.path, target.fmt
        fields = self._log_fields(write)
        try:
            current = read_file(path)
        except OSError as err:
            return self._io_failure(write, path, None, None, f"read failed: {_describe(err)}", err)
        if original_old is None and not force and not self.dry_run:
            again = self._unchanged_again(target, current)
            if again is not None:
                return again
        old = (original_old if original_old is not None else current).strip()
        overwritten = original_old is None and self._check_overwrite(target, current)
        try:
            text = fmt.render(target.value, current)
        except FileFormatError as err:
            return self._failed(write, path, old, None, str(err))
        already = fmt.extract(current, target.value) == target.expected
        if already and not force:
            result = WriteResult(write, WriteStatus.UNCHANGED, str(path), old, text, overwritten=overwritten)
            if not self.dry_run:  # a dry run owns nothing: it wrote nothing
                self._remember(target, current if original_old is None and not overwritten else None,
                               result if not overwritten else None)
            return result
        if self.dry_run:
            return self._would_write(write, path, old, text, already)
        problem = self._keep_original(target, current)
        if problem is not None:
            return self._failed(write, path, old, text, problem)
        try:
            write_file(path, text)
        except OSError as err:
            return self._io_failure(write, path, old, text, f"write failed: {_describe(err)}", err)
        try:
            back = read_file(path)
        except OSError as err:
            return self._io_failure(write, path, old, text, f"read-back failed: {_describe(err)}", err)
        if fmt.extract(back, target.value) != target.expected:
            detail = f"read back {back.strip()!r} after writing {text!r}"
            return self._failed(write, path, old, text, detail, read_back=back.strip())
        self._remember(target)
        if path.name == "cpu.idle":
            # The kernel resets a group's weight when its idle flag changes: the weight file
            # then differs from what koordnode wrote, but no other writer changed it.
            for weight in _WEIGHT_FILES:
                self._owned.pop(path.with_name(weight), None)
        if overwritten:
            self._last_overwrite[self._resource_name(write)]["restored"] = text
            self._log.info(f"{self._event}_restored", path=str(path), old=old, new=text, **fields)
            return WriteResult(write, WriteStatus.WRITTEN, str(path), old, text, "restored after an overwrite",
                               back.strip(), overwritten=True)
        if already:
            # The reconcile pass re-asserts values every period; keep those quiet.
            self._log.debug(f"{self._event}_forced", path=str(path), old=old, new=text, **fields)
            detail = "forced rewrite"
        else:
            self._log.info(self._event, path=str(path), old=old, new=text, **fields)
            detail = ""
        return WriteResult(write, WriteStatus.WRITTEN, str(path), old, text, detail, back.strip())

    def _would_write(
        self, write: CgroupWrite | SysctlWrite, path: Path, old: str, text: str, already: bool
    ) -> WriteResult:
        if already:  # a forced rewrite of the same value: nothing would change
            return WriteResult(write, WriteStatus.UNCHANGED, str(path), old, text)
        key = str(path)
        level = self._log.debug if self._would_logged.get(key) == text else self._log.info
        if len(self._would_logged) > 50_000:  # bounded: files of long-gone pods
            self._would_logged.clear()
        self._would_logged[key] = text
        level(f"{self._event}_dry_run", path=key, old=old, new=text,
              would=f"would write {text!r} to {key}", **self._log_fields(write))
        return WriteResult(write, WriteStatus.WOULD_WRITE, key, old, text, "dry run: not written")

    def _failed(
        self,
        write: CgroupWrite | SysctlWrite,
        path: Path,
        old: str | None,
        new: str | None,
        detail: str,
        read_back: str | None = None,
    ) -> WriteResult:
        self._log.warning(
            f"{self._event}_failed", path=str(path), old=old, new=new, error=detail, **self._log_fields(write)
        )
        return WriteResult(write, WriteStatus.FAILED, str(path), old, new, detail, read_back)

    def _io_failure(
        self,
        write: CgroupWrite | SysctlWrite,
        path: Path,
        old: str | None,
        new: str | None,
        detail: str,
        err: OSError,
    ) -> WriteResult:
        if _errno_status(err) is WriteStatus.MISSING:
            self._log.debug(f"{self._event}_missing", path=str(path), **self._log_fields(write))
            return WriteResult(write, WriteStatus.MISSING, str(path), old, new, detail)
        return self._failed(write, path, old, new, detail)

    def _refused(self, write: CgroupWrite | SysctlWrite, detail: str) -> _Outcome:
        self._log.warning(f"{self._event}_refused", error=detail, **self._log_fields(write))
        return _Outcome(WriteResult(write, WriteStatus.REFUSED, detail=detail))


class CgroupExecutor(_Converger):
    """Applies CgroupWrite plans under a cgroup root (v1 or v2, detected from the root).

    Thread-safe: applies are serialised, so read-modify-write of shared files (cpu.max,
    io.max) cannot interleave.
    """

    _event = "cgroup_write"

    def __init__(
        self,
        root: Path | str,
        *,
        logger: Any = None,
        version: CgroupVersion | str | None = None,
        dry_run: bool = False,
        originals: OriginalsJournal | None = None,
    ) -> None:
        super().__init__(logger, dry_run=dry_run, originals=originals)
        self._fs = CgroupFS(root, version)
        # (resource, is_root_cgroup) -> reason. Keyed on the root separately because some
        # files exist only below the root (v2 cpu.max, v1 blkio.bfq.weight).
        self._unsupported: dict[tuple[str, bool], str] = {}
        # (resource, cgroup) -> where its file was found. Every write re-checks, with one stat,
        # that the directory is still the one found (same device and inode); anything else
        # (gone, recreated, the file missing) looks the path up again, resolved and confined.
        self._located: dict[tuple[str, str], _Located] = {}
        # A write as last looked up: its located target, or the result that skipped it as
        # unsupported. The reconcile pass repeats the same writes (the same plans) every
        # period; a repeat is not validated, normalised and looked up again.
        self._prepared: dict[CgroupWrite, _Target | WriteResult] = {}

    @property
    def root(self) -> Path:
        return self._fs.root

    @property
    def version(self) -> CgroupVersion:
        return self._fs.version

    @property
    def unsupported(self) -> dict[str, str]:
        """Resources skipped as unsupported, with the reason (for `koordnode status`)."""
        with self._lock:
            return {name + (" (root cgroup)" if at_root else ""): reason
                    for (name, at_root), reason in self._unsupported.items()}

    def forget_unsupported(self) -> None:
        """Re-probe support on the next apply (e.g. after a config reload)."""
        with self._lock:
            self._unsupported.clear()
            self._located.clear()
            self._prepared.clear()

    def _log_fields(self, write: CgroupWrite | SysctlWrite) -> dict[str, Any]:
        fields = {"reason": write.reason}
        if isinstance(write, CgroupWrite):
            fields.update(cgroup=write.cgroup, resource=write.resource)
        return fields

    def _original_key(self, target: _Target) -> tuple[str, str, str] | None:
        if not isinstance(target.write, CgroupWrite) or not outlives_pods(target.write.cgroup):
            return None  # a pod's or container's file: its values go with the pod
        if target.path.name in MEMBERSHIP_FILES:
            return None  # processes moved, no setting: nothing to put back
        return ("cgroup_file", str(self.root), str(target.path.relative_to(self.root)))

    # ------------------------------------------------------------------ public API

    def apply(self, writes: Iterable[CgroupWrite], *, force: bool = False) -> list[WriteResult]:
        """Converge every write; results are in the order of `writes`.

        Order of application: cpu.idle writes first (an idle group refuses cpu.shares, which
        is then SKIPPED, not failed), the rest in plan order, then cpuset writes ordered so
        that v1's rule "a child's set is a subset of its parent's" holds at every step:
        every set is first widened to old|new, parents first, then narrowed to its final
        value, children first.
        """
        plan = list(writes)
        results: list[WriteResult | None] = [None] * len(plan)
        # cpu.idle first: whether a group is idle decides whether its cpu.shares can be set.
        idle = [getattr(write, "resource", None) == "cpu.idle" for write in plan]
        order = [i for i, first in enumerate(idle) if first] + [i for i, first in enumerate(idle) if not first]
        with self._lock:
            subset_ordered: list[int] = []
            for index in order:
                write = plan[index]
                try:
                    prepared = self._prepared.get(write)
                except TypeError:  # an unhashable value: refused by the lookup
                    prepared = None
                if isinstance(prepared, WriteResult):  # unsupported until forget_unsupported()
                    results[index] = prepared
                    continue
                if prepared is not None and not force and not self.dry_run:
                    again = self._checked_again(prepared)
                    if again is not None:
                        results[index] = again
                        continue
                if isinstance(write, CgroupWrite):
                    resource = RESOURCES.get(write.resource) if isinstance(write.resource, str) else None
                    if resource is not None and resource.hierarchical_subset:
                        subset_ordered.append(index)
                        continue
                results[index] = self._apply_one(write, force)
            if subset_ordered:
                self._apply_subset_ordered(plan, subset_ordered, results, force)
        return [result for result in results if result is not None]

    def disown(self, writes: Iterable[CgroupWrite]) -> None:
        """Forget the values koordnode last put in the files of `writes`: the next write there
        is not counted as an overwrite. For files the container runtime has just rewritten
        from kubelet's request (after UpdateContainerResources), which is no foreign writer."""
        with self._lock:
            for write in writes:
                try:
                    target = self._locate(write)
                except _Outcome:
                    continue
                self._owned.pop(target.path, None)

    def read(self, cgroup: str, resource: str) -> str | None:
        """Raw content (stripped) of the file backing `resource` for `cgroup` on this kernel.

        None when the cgroup does not exist or the kernel has no such file. Raises
        UnsafePathError for a path leaving the root, UnknownResourceError for a bad name.
        """
        spec = get_resource(resource)
        cgroup = normalize_cgroup_path(cgroup)
        hierarchy = self._fs.hierarchy(spec.v1_controller)
        if hierarchy is None:
            return None
        directory = self._fs.cgroup_dir(hierarchy, cgroup)
        for fmt in spec.files(self._fs.is_v2):
            path = self._fs.cgroup_file(hierarchy, directory, fmt.filename)
            try:
                return read_file(path).strip()
            except FileNotFoundError:
                continue
        return None

    def read_pids(self, cgroup: str, *, threads: bool = False) -> list[int] | None:
        """Process ids (cgroup.procs) or thread ids (tasks / cgroup.threads); None if missing."""
        text = self.read(cgroup, "tasks" if threads else "cgroup.procs")
        if text is None:
            return None
        return [int(line) for line in text.split() if line.isdigit()]

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
                raise OSError(errno.ENOENT, f"cgroup controller {controller} is not mounted under {self.root}")
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
                self.originals.keep("cgroup_dir", str(self.root), str(path.relative_to(self.root)), None)
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
                directory = self._fs.cgroup_dir(self.root, cgroup)
                available = read_file(self._fs.cgroup_file(self.root, directory, "cgroup.controllers")).split()
                control = self._fs.cgroup_file(self.root, directory, "cgroup.subtree_control")
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
                hierarchies = [self.root]
            else:
                hierarchies = sorted({Path(os.path.realpath(e)) for e in self.root.iterdir() if e.is_dir()})
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
                    problems.append(f"{directory}: {_describe(err)}")
        return problems

    # ------------------------------------------------------------------ internals

    def _apply_one(self, write: CgroupWrite, force: bool) -> WriteResult:
        try:
            target = self._locate(write)
        except _Outcome as outcome:
            return outcome.result
        result = self._converge(target, force)
        if result.status is WriteStatus.MISSING and target.cached:
            # The file went away under a cached location (v2 controller disabled, cgroup
            # removed): look again, as a first write would.
            self._forget_located(write)
            try:
                target = self._locate(write)
            except _Outcome as outcome:
                return outcome.result
            result = self._converge(target, force)
        return result

    _MAX_LOCATED = 65536  # bound on cached locations; cleared beyond it (only a lookup is lost)

    def _forget_located(self, write: CgroupWrite) -> None:
        try:
            key = (get_resource(write.resource).name, normalize_cgroup_path(write.cgroup))
        except (UnknownResourceError, UnsafePathError):
            return
        self._located.pop(key, None)

    def _cached_target(self, write: CgroupWrite, resource: Resource, cgroup: str, value: Any) -> _Target | None:
        located = self._located.get((resource.name, cgroup))
        if located is None:
            return None
        if _directory_id(located.directory) != located.dir_id:
            del self._located[(resource.name, cgroup)]
            return None
        return self._target_in(write, resource, located, value, cached=True, cgroup=cgroup)

    def _target_in(self, write: CgroupWrite, resource: Resource, located: _Located, value: Any,
                   *, cached: bool, cgroup: str) -> _Target:
        """The write's target in a located file, unless a sibling file blocks the write."""
        self._check_not_blocked(write, resource, located)
        return _Target(write, located.path, located.fmt, value, located.fmt.expected(value),
                       dir_inode=located.dir_id[1] if located.file_in_dir else None, cached=cached,
                       key=(resource.name, cgroup), located=located)

    def _unsupported_outcome(self, write: CgroupWrite, key: tuple[str, bool], reason: str) -> _Outcome:
        self._unsupported[key] = reason
        self._log.info("cgroup_resource_unsupported", resource=write.resource, cgroup=write.cgroup, reason=reason)
        return self._skipped_unsupported(write, reason)

    def _skipped_unsupported(self, write: CgroupWrite, reason: str) -> _Outcome:
        result = WriteResult(write, WriteStatus.SKIPPED, detail=reason)
        if len(self._prepared) >= self._MAX_PREPARED:
            self._prepared.clear()
        self._prepared[write] = result
        return _Outcome(result)

    # Bound on remembered writes (a node of 250 pods repeats ~4000): cleared beyond it, which
    # only costs lookups; churned pods' entries go then too.
    _MAX_PREPARED = 16384

    def _locate(self, write: CgroupWrite) -> _Target:
        if not isinstance(write, CgroupWrite):
            raise _Outcome(WriteResult(write, WriteStatus.REFUSED, detail="not a CgroupWrite"))
        try:
            prepared = self._prepared.get(write)
        except TypeError:  # an unhashable value: refused below
            prepared = None
        if prepared is not None:
            repeated = self._repeat(write, prepared)
            if repeated is not None:
                return repeated
        target = self._lookup(write)
        if len(self._prepared) >= self._MAX_PREPARED:
            self._prepared.clear()
        self._prepared[write] = target if target.cached else dataclasses.replace(target, cached=True)
        return target

    def _checked_again(self, target: _Target) -> WriteResult | None:
        """The reconcile pass's common case in one step: a write looked up before, in the same
        directory, whose file reads exactly as at its last check (then UNCHANGED). None: the full
        path decides. A sibling that would block the write (cpu.idle=1 for cpu.shares) is not
        read here: the file holds koordnode's value, so nothing would be written either way."""
        located = target.located
        owned = self._owned.get(target.path)
        if (located is None or target.key is None or owned is None
                or owned[3] is None or owned[1] != target.expected  # a file shared with another value
                or self._located.get(target.key) is not located):
            return None
        if located.file_id is None and _directory_id(located.directory) != located.dir_id:
            return None
        try:
            read = read_file_if_same(target.path, located.file_id)
        except OSError:
            return None
        if read is None:
            return None  # another file at that path now: the full path looks again
        current, located.file_id = read
        return self._unchanged_again(target, current)

    def _repeat(self, write: CgroupWrite, prepared: _Target | WriteResult) -> _Target | None:
        """The target of a write looked up before, if its location still holds; None: look up."""
        if isinstance(prepared, WriteResult):  # unsupported until forget_unsupported()
            raise _Outcome(prepared)
        key, located = prepared.key, prepared.located
        if key is None or located is None or self._located.get(key) is not located:
            return None
        if _directory_id(located.directory) != located.dir_id:
            del self._located[key]
            return None
        self._check_not_blocked(write, get_resource(write.resource), located)
        return prepared

    def _lookup(self, write: CgroupWrite) -> _Target:
        try:
            resource: Resource = get_resource(write.resource)
            value = resource.validate(write.value)
            cgroup = normalize_cgroup_path(write.cgroup)
        except (UnknownResourceError, InvalidValueError, UnsafePathError) as err:
            raise self._refused(write, str(err)) from None

        key = (resource.name, cgroup == "/")
        if key in self._unsupported:
            raise self._skipped_unsupported(write, self._unsupported[key])
        formats = resource.files(self._fs.is_v2)
        if not formats:
            raise self._unsupported_outcome(
                write, key, f"{resource.name} has no cgroup {self._fs.version.value} equivalent"
            )
        try:
            cached = self._cached_target(write, resource, cgroup, value)
            if cached is not None:
                return cached
            hierarchy = self._fs.hierarchy(resource.v1_controller)
            if hierarchy is None:
                raise self._unsupported_outcome(
                    write, key, f"cgroup v1 controller {resource.v1_controller} is not mounted under {self.root}"
                )
            directory = self._fs.cgroup_dir(hierarchy, cgroup)
            dir_id = _directory_id(directory)
            if dir_id is None:
                self._log.debug("cgroup_missing", path=str(directory), **self._log_fields(write))
                raise _Outcome(WriteResult(write, WriteStatus.MISSING, str(directory), detail="cgroup does not exist"))
            for fmt in formats:
                path = self._fs.cgroup_file(hierarchy, directory, fmt.filename)
                if path.is_file():
                    located = _Located(hierarchy, directory, dir_id, path, fmt, path.parent == directory, {})
                    if len(self._located) >= self._MAX_LOCATED:
                        self._located.clear()
                    self._located[(resource.name, cgroup)] = located
                    return self._target_in(write, resource, located, value, cached=False, cgroup=cgroup)
        except UnsafePathError as err:
            raise self._refused(write, str(err)) from None
        names = " or ".join(fmt.filename for fmt in formats)
        raise self._unsupported_outcome(write, key, f"{names} not present on this kernel ({resource.support})")

    def _check_not_blocked(self, write: CgroupWrite, resource: Resource, located: _Located) -> None:
        for sibling, content, why in resource.blocked_when:
            if sibling not in located.siblings:
                located.siblings[sibling] = self._fs.cgroup_file(located.hierarchy, located.directory, sibling)
            try:
                current = read_file(located.siblings[sibling]).strip()
            except OSError:
                continue
            if current == content:
                self._log.debug("cgroup_write_blocked", reason=write.reason, detail=why,
                                cgroup=write.cgroup, resource=write.resource)
                raise _Outcome(WriteResult(write, WriteStatus.SKIPPED, detail=why))

    def _apply_subset_ordered(
        self,
        plan: list[CgroupWrite],
        indices: list[int],
        results: list[WriteResult | None],
        force: bool,
    ) -> None:
        targets: list[tuple[int, _Target, int]] = []
        for index in indices:
            try:
                target = self._locate(plan[index])
            except _Outcome as outcome:
                results[index] = outcome.result
                continue
            targets.append((index, target, cgroup_depth(plan[index].cgroup)))

        original_old: dict[int, str] = {}
        if not self._fs.is_v2:  # v2 does not enforce the subset rule on writes
            for index, target, _depth in sorted(targets, key=lambda item: item[2]):
                widened = self._widen(target, force)
                if isinstance(widened, WriteResult):
                    results[index] = widened
                elif widened is not None:
                    original_old[index] = widened

        for index, target, _depth in sorted(targets, key=lambda item: -item[2]):
            if results[index] is None:
                results[index] = self._converge(target, force, original_old.get(index))
        for index, target, _depth in targets:
            result = results[index]
            if target.cached and result is not None and result.status is WriteStatus.MISSING:
                self._forget_located(plan[index])  # looked up again next time

    def _widen(self, target: _Target, force: bool) -> WriteResult | str | None:
        """Make the set a superset of its old and new value.

        Returns a final result when the write is a pure widening (done now) or failed, the
        original text when an intermediate union was written, None when nothing was needed.
        """
        try:
            current_text = read_file(target.path)
        except OSError:
            return None  # let the final converge step report it
        if not force and not self.dry_run:
            again = self._unchanged_again(target, current_text)
            if again is not None:
                return again  # as at the last check: nothing to widen or narrow
        current = target.fmt.extract(current_text, target.value)
        expected = target.expected
        if not isinstance(current, frozenset) or not isinstance(expected, frozenset) or expected <= current:
            return None
        union = current | expected
        if union == target.expected:
            # Pure widening: this parents-first pass is the right moment for the final value.
            return self._converge(target, force)
        text = format_cpu_list(union)
        if self.dry_run:
            return None  # the final converge step reports the value it would write
        problem = self._keep_original(target, current_text)
        if problem is not None:
            return self._failed(target.write, target.path, current_text.strip(), text, problem)
        try:
            write_file(target.path, text)
        except OSError as err:
            return self._io_failure(
                target.write, target.path, current_text.strip(), text,
                f"widening to {text!r} before narrowing failed: {_describe(err)}", err,
            )
        self._log.info(
            "cgroup_write", path=str(target.path), old=current_text.strip(), new=text,
            step="widen before narrowing", **self._log_fields(target.write),
        )
        return current_text


class ProcfsExecutor(_Converger):
    """Sysctl writes (vm.min_free_kbytes, vm.watermark_scale_factor) under a procfs root."""

    _event = "sysctl_write"

    def __init__(self, root: Path | str = "/proc", *, logger: Any = None, dry_run: bool = False,
                 originals: OriginalsJournal | None = None) -> None:
        super().__init__(logger, dry_run=dry_run, originals=originals)
        self._root = ConfinedRoot(root)
        self._unsupported: dict[str, str] = {}

    @property
    def root(self) -> Path:
        return self._root.root

    def _log_fields(self, write: CgroupWrite | SysctlWrite) -> dict[str, Any]:
        fields = {"reason": write.reason}
        if isinstance(write, SysctlWrite):
            fields["sysctl"] = write.name
        return fields

    def _original_key(self, target: _Target) -> tuple[str, str, str] | None:
        # Every sysctl is node-level. Keyed by the table's name for it (aliases are one file).
        return ("sysctl", str(self.root), get_sysctl(str(getattr(target.write, "name", ""))).name)

    def apply(self, writes: Iterable[SysctlWrite], *, force: bool = False) -> list[WriteResult]:
        with self._lock:
            return [self._apply_one(write, force) for write in writes]

    def write(self, name: str, value: str | int, reason: str = "", *, force: bool = False) -> WriteResult:
        return self.apply([SysctlWrite(name, value, reason)], force=force)[0]

    def read(self, name: str) -> str | None:
        sysctl = get_sysctl(name)
        try:
            return read_file(self._root.file(sysctl.relative_path)).strip()
        except FileNotFoundError:
            return None

    def _apply_one(self, write: SysctlWrite, force: bool) -> WriteResult:
        if not isinstance(write, SysctlWrite):
            return WriteResult(write, WriteStatus.REFUSED, detail="not a SysctlWrite")
        try:
            sysctl = get_sysctl(write.name)
            value = sysctl.parse(write.value, sysctl.name)
            path = self._root.file(sysctl.relative_path)
        except (UnknownResourceError, InvalidValueError, UnsafePathError) as err:
            return self._refused(write, str(err)).result
        if sysctl.name in self._unsupported:
            return WriteResult(write, WriteStatus.SKIPPED, detail=self._unsupported[sysctl.name])
        if not path.is_file():
            reason = f"{sysctl.relative_path} not present under {self.root}"
            self._unsupported[sysctl.name] = reason
            self._log.info("sysctl_unsupported", sysctl=sysctl.name, reason=reason)
            return WriteResult(write, WriteStatus.SKIPPED, detail=reason)
        fmt = sysctl.fmt
        return self._converge(_Target(write, path, fmt, value, fmt.expected(value)), force)
