"""The originals of node-level targets, kept on disk before koordnode first changes them.

Pod and container cgroups go with their pods; what outlives them does not: the sysctls
(vm.min_free_kbytes, vm.watermark_scale_factor), the files of non-pod cgroups (kubelet's QoS
tiers, koordnode's BE group: quota, cpuset, memory bounds), the cgroups, resctrl groups, the
root qdiscs and the nftables table koordnode creates. Before the first write to one of them the
executor records what was there (``None``: nothing, koordnode created it) in
``<state_dir>/originals.json``; the first original wins, so koordnode's own values never
replace it, across restarts too. ``koordnode restore`` (executor/restore.py) puts them back,
as tuned's unapply does with the values its apply saved.

The file is written atomically (a temporary file, fsync, rename) and read defensively: a file
that is not root's regular file, is writable by others, too large or malformed is refused with
an OriginalsError saying why, and nothing is recorded or restored from it.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["KINDS", "Original", "OriginalsError", "OriginalsJournal", "STATE_FILE"]

STATE_FILE = "originals.json"
_FORMAT = 1
_MAX_FILE_BYTES = 4 << 20  # a node has a few dozen node-level targets; anything near this is not ours
_MAX_TEXT = 4096  # a target or value longer than any kernel file koordnode writes

# What an entry may be: kind -> what its target names.
KINDS = {
    "sysctl": "the sysctl's name (vm.min_free_kbytes), under [procfs] root",
    "cgroup_file": "a cgroup file, relative to [cgroup] root (cpu/kubepods/besteffort/cpu.cfs_quota_us)",
    "cgroup_dir": "a cgroup directory koordnode created, relative to [cgroup] root",
    "resctrl_group": "a resctrl group koordnode created (its name), under [resctrl] root",
    "resctrl_schemata": "a resctrl group's schemata (the group's name)",
    "tc_root": "a network device whose root qdisc koordnode replaced (root: the netns, '' for the host's)",
    "nft_table": "the nftables table koordnode created ('inet koordnode')",
}


class OriginalsError(Exception):
    """The state file cannot be read, trusted or written: why, and which file."""


@dataclass(frozen=True)
class Original:
    kind: str
    # Where koordnode's root for this kind was (cgroup/procfs/resctrl root, or the netns):
    # restore only touches an entry recorded under the root it is configured with now.
    root: str
    target: str
    # The content before koordnode's first write; None: absent (koordnode created it).
    value: str | None
    recorded_at: float

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.root, self.target)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "root": self.root, "target": self.target, "value": self.value,
                "recorded_at": self.recorded_at}


def _text(entry: dict[str, Any], name: str, *, optional: bool = False) -> str | None:
    value = entry.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{name} is {type(value).__name__}, not a string")
    if len(value) > _MAX_TEXT or "\0" in value:
        raise ValueError(f"{name} is longer than {_MAX_TEXT} characters or holds a NUL")
    return value


def _parse(entry: Any) -> Original:
    if not isinstance(entry, dict):
        raise ValueError("not an object")
    kind = _text(entry, "kind")
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}")
    at = entry.get("recorded_at", 0.0)
    if not isinstance(at, (int, float)) or isinstance(at, bool):
        raise ValueError("recorded_at is not a number")
    return Original(kind, _text(entry, "root") or "", _text(entry, "target") or "",
                    _text(entry, "value", optional=True), float(at))


def parse_state(data: bytes, source: str) -> dict[tuple[str, str, str], Original]:
    """The entries of a state file's content; OriginalsError on anything malformed."""
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise OriginalsError(f"{source}: not a koordnode originals file (invalid JSON: {err})") from None
    if not isinstance(document, dict) or document.get("format") != _FORMAT \
            or not isinstance(document.get("originals"), list):
        raise OriginalsError(f"{source}: not a koordnode originals file "
                             f"(expected {{\"format\": {_FORMAT}, \"originals\": [...]}})")
    entries: dict[tuple[str, str, str], Original] = {}
    for index, raw in enumerate(document["originals"]):
        try:
            entry = _parse(raw)
        except ValueError as err:
            raise OriginalsError(f"{source}: entry {index}: {err}") from None
        entries.setdefault(entry.key, entry)  # a duplicate: the first (oldest) wins here too
    return entries


class OriginalsJournal:
    """``<state_dir>/originals.json``: loaded on first use, rewritten whole on every change.

    Thread-safe. ``keep`` returns only once the original is on disk, so an executor that calls
    it right before a write never changes a target whose original could be lost.
    """

    def __init__(self, state_dir: Path | str) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / STATE_FILE
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str, str], Original] | None = None

    def entries(self) -> list[Original]:
        with self._lock:
            return list(self._load().values())

    def has(self, kind: str, root: str, target: str) -> bool:
        with self._lock:
            return (kind, root, target) in self._load()

    def keep(self, kind: str, root: str, target: str, value: str | None) -> bool:
        """Record `value` as the original of the target unless one is recorded already.
        True when it was recorded now. Raises OriginalsError when it cannot be kept."""
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}")
        with self._lock:
            entries = self._load()
            key = (kind, root, target)
            if key in entries:
                return False
            entry = Original(kind, root, target, value if value is None else value.strip(), time.time())
            _parse(entry.as_dict())  # what is written must read back
            self._save({**entries, key: entry})
            entries[key] = entry  # the loaded dict itself: on disk first, then here
            return True

    def forget(self, keys: Iterable[tuple[str, str, str]]) -> None:
        """Drop entries (restored): the next run records fresh originals. The file goes with
        the last entry."""
        with self._lock:
            entries = self._load()
            remaining = {key: entry for key, entry in entries.items() if key not in set(keys)}
            if remaining == entries:
                return
            if remaining:
                self._save(remaining)
            else:
                self._remove()
            self._entries = remaining

    # ---------------------------------------------------------------- the file

    def _load(self) -> dict[tuple[str, str, str], Original]:
        if self._entries is None:
            self._entries = self._read()
        return self._entries

    def _read(self) -> dict[tuple[str, str, str], Original]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return {}
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise OriginalsError(f"{self.path} is a symbolic link: refusing to read it") from None
            raise OriginalsError(f"{self.path}: cannot read: {err.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OriginalsError(f"{self.path} is not a regular file")
            if st.st_uid != os.geteuid():
                raise OriginalsError(f"{self.path} is owned by uid {st.st_uid}, not koordnode's "
                                     f"({os.geteuid()}): refusing to trust it")
            if st.st_mode & 0o022:
                raise OriginalsError(f"{self.path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): "
                                     "refusing to trust it")
            if st.st_size > _MAX_FILE_BYTES:
                raise OriginalsError(f"{self.path} is {st.st_size} bytes, more than an originals file holds")
            data = os.read(fd, _MAX_FILE_BYTES + 1)
        finally:
            os.close(fd)
        return parse_state(data, str(self.path))

    def _ensure_dir(self) -> None:
        try:
            self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as err:
            raise OriginalsError(f"cannot create the state directory {self.state_dir}: {err.strerror}") from None
        st = os.lstat(self.state_dir)
        if not stat.S_ISDIR(st.st_mode):
            raise OriginalsError(f"the state directory {self.state_dir} is not a directory (a symbolic link?)")

    def _save(self, entries: dict[tuple[str, str, str], Original]) -> None:
        document = {"format": _FORMAT, "originals": [e.as_dict() for e in entries.values()]}
        data = (json.dumps(document, indent=1) + "\n").encode()
        self._ensure_dir()
        tmp = self.state_dir / f".{STATE_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)  # readers see the old file or the new one, never half of one
            self._sync_dir()
        except OSError as err:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise OriginalsError(f"cannot write {self.path}: {err.strerror or err}") from None

    def _remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return
        except OSError as err:
            raise OriginalsError(f"cannot remove {self.path}: {err.strerror}") from None
        self._sync_dir()

    def _sync_dir(self) -> None:
        fd = os.open(self.state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
