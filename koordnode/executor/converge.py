"""Converging one kernel file on a value: shared by the cgroup and procfs executors.

Write only when the value differs (or when forced), read back and compare, log every write;
notice when another writer changed a value koordnode owns, keep the original of a node-level
file before its first change, and in a dry run only report what would be written.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
import threading
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from koordnode.executor.cgroup import read_file, write_file
from koordnode.executor.originals import OriginalsError, OriginalsJournal
from koordnode.executor.resources import FileFormat, FileFormatError
from koordnode.executor.write_result import WriteResult, WriteStatus
from koordnode.policy.plan import CgroupWrite, SysctlWrite

# What the kernel changes by itself when a cgroup's cpu.idle changes.
_WEIGHT_FILES = ("cpu.shares", "cpu.weight", "cpu.weight.nice")


@dataclass(frozen=True)
class Target:
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
    located: Located | None = dataclasses.field(default=None, compare=False)


@dataclass
class Located:
    """Where a (resource, cgroup) was found: its file, the directory's identity, and the
    siblings read to decide whether a write is blocked (resolved once, on first use). Cached
    by the cgroup executor's lookup; a Target keeps it for a repeat of the same write."""

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


def directory_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a directory; None when it is missing or not a directory."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


class Outcome(Exception):
    """Internal: a write ends early with a result (refused, skipped, missing)."""

    def __init__(self, result: WriteResult) -> None:
        super().__init__(result.detail)
        self.result = result


def _errno_status(err: OSError) -> WriteStatus:
    # The cgroup vanished between lookup and I/O (container exited): not a failure.
    return WriteStatus.MISSING if err.errno == errno.ENOENT else WriteStatus.FAILED


def describe_os_error(err: OSError) -> str:
    """The errno's name and message ("EBUSY: Device or resource busy") for results and logs."""
    name = errno.errorcode.get(err.errno or 0, "")
    return f"{name}: {err.strerror}" if name else str(err)


class Converger:
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

    def _target_dir_inode(self, target: Target) -> int:
        return target.dir_inode if target.dir_inode is not None else self._dir_inode(target.path)

    def _check_overwrite(self, target: Target, current: str) -> bool:
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

    def _remember(self, target: Target, text: str | None = None, unchanged: WriteResult | None = None) -> None:
        if len(self._owned) >= self._MAX_OWNED and target.path not in self._owned:
            self._owned = {p: v for p, v in self._owned.items() if p.parent.is_dir()}
            if len(self._owned) >= self._MAX_OWNED:
                self._owned.clear()  # never unbounded; only overwrite detection is lost
        self._owned[target.path] = (self._target_dir_inode(target), target.expected, text, unchanged)

    def _unchanged_again(self, target: Target, current: str) -> WriteResult | None:
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

    def _original_key(self, target: Target) -> tuple[str, str, str] | None:
        """(kind, root, target) of a node-level file, whose original is kept; None: not one."""
        return None

    def _keep_original(self, target: Target, current: str) -> str | None:
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

    def _converge(self, target: Target, force: bool, original_old: str | None = None) -> WriteResult:
        write, path, fmt = target.write, target.path, target.fmt
        fields = self._log_fields(write)
        try:
            current = read_file(path)
        except OSError as err:
            return self._io_failure(write, path, None, None, f"read failed: {describe_os_error(err)}", err)
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
            return self._io_failure(write, path, old, text, f"write failed: {describe_os_error(err)}", err)
        try:
            back = read_file(path)
        except OSError as err:
            return self._io_failure(write, path, old, text, f"read-back failed: {describe_os_error(err)}", err)
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

    def _refused(self, write: CgroupWrite | SysctlWrite, detail: str) -> Outcome:
        self._log.warning(f"{self._event}_refused", error=detail, **self._log_fields(write))
        return Outcome(WriteResult(write, WriteStatus.REFUSED, detail=detail))
