"""`koordnode restore`: put node-level targets back to the originals kept before koordnode's
first write (executor/originals.py), as tuned's unapply does with the values its apply saved.

Each entry is checked against the roots configured now, never the ones the state file names:
an entry recorded under another root, naming a file koordnode does not write, or leading out of
its root (``..``, a symbolic link) is skipped with the reason and stays in the file. Restored
entries (and those already at their original) are dropped, so the next run keeps fresh
originals. Order: cgroup files (cpusets of parents before children, so that widening back
works on v1), then the cgroups koordnode created (deepest first), sysctls, resctrl, tc, nft.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from koordnode.executor.cgroup import ConfinedRoot, read_file, resolve_beneath, write_file
from koordnode.executor.cgroup_executor import MEMBERSHIP_FILES
from koordnode.executor.procfs_executor import ProcfsExecutor
from koordnode.executor.write_result import WriteStatus
from koordnode.executor.netqos import NetQoSExecutor
from koordnode.executor.originals import Original, OriginalsError, OriginalsJournal
from koordnode.executor.paths import CgroupRootError, UnsafePathError
from koordnode.executor.resctrl import ResctrlExecutor
from koordnode.executor.resources import RESOURCES, SYSCTLS
from koordnode.policy.net import NFT_FAMILY, NFT_TABLE

__all__ = ["RestoreAction", "RestoreReport", "RestoreRoots", "restore"]

# The cgroup files koordnode writes (either version's name): the only ones restore writes.
_CGROUP_FILES = frozenset(fmt.filename for resource in RESOURCES.values() for v2 in (False, True)
                          for fmt in resource.files(v2)) - MEMBERSHIP_FILES


@dataclass(frozen=True)
class RestoreRoots:
    """Where restore may act: the configured roots (the state file's are only compared)."""

    cgroup: str = "/sys/fs/cgroup"
    procfs: str = "/proc"
    resctrl: str = "/sys/fs/resctrl"
    resctrl_prefix: str = "koordnode-"
    netns: str = ""  # "" the host's network namespace (the daemon's)
    # Makes the tc/nft executor for a netns, with restore's logger (tests give their own).
    net_executor: Callable[[str, Any], NetQoSExecutor] = field(
        default=lambda netns, logger: NetQoSExecutor(netns=netns or None, logger=logger), compare=False)


class _Quiet:
    """The executors' logger during a restore: the report is the record (one line per target,
    printed by the CLI, logged by the daemon), so their own events would only repeat it."""

    def _drop(self, *_args: Any, **_kwargs: Any) -> None:
        return None

    debug = info = warning = error = _drop


@dataclass(frozen=True)
class RestoreAction:
    kind: str
    target: str
    outcome: str  # restored, removed, unchanged, would restore, would remove, failed, skipped
    detail: str
    original: str | None

    @property
    def done(self) -> bool:
        """The target is at its original now: the entry can go."""
        return self.outcome in ("restored", "removed", "unchanged")

    def line(self) -> str:
        return f"{self.outcome:<14} {self.kind:<16} {self.target}: {self.detail}"


@dataclass
class RestoreReport:
    state_file: str
    dry_run: bool
    actions: list[RestoreAction] = field(default_factory=list)
    error: str | None = None  # the state file itself could not be used

    @property
    def ok(self) -> bool:
        return self.error is None and all(a.outcome not in ("failed", "skipped") for a in self.actions)

    def as_dict(self) -> dict[str, object]:
        return {"state_file": self.state_file, "dry_run": self.dry_run, "ok": self.ok, "error": self.error,
                "actions": [{"kind": a.kind, "target": a.target, "outcome": a.outcome, "detail": a.detail,
                             "original": a.original} for a in self.actions]}

    def text(self) -> str:
        if self.error is not None:
            return f"koordnode restore: {self.error}\n"
        if not self.actions:
            return f"nothing to restore: no originals kept in {self.state_file}\n"
        head = "dry run: nothing changed\n" if self.dry_run else ""
        return head + "".join(action.line() + "\n" for action in self.actions)


def _real(root: str) -> str:
    return os.path.realpath(root)


def _depth(entry: Original) -> int:
    return entry.target.strip("/").count("/")


def _order(entries: Iterable[Original]) -> list[Original]:
    rank = {"cgroup_file": 0, "cgroup_dir": 1, "sysctl": 2, "resctrl_schemata": 3, "resctrl_group": 4,
            "tc_root": 5, "nft_table": 6}

    def key(entry: Original) -> tuple[int, int, str]:
        depth = _depth(entry)
        return (rank[entry.kind], -depth if entry.kind == "cgroup_dir" else depth, entry.target)

    return sorted(entries, key=key)


class _Restorer:
    def __init__(self, roots: RestoreRoots, dry_run: bool, entries: list[Original]) -> None:
        self.roots = roots
        self.dry_run = dry_run
        self.entries = entries
        self.created_groups = {e.target for e in entries if e.kind == "resctrl_group" and e.value is None}
        self._procfs: ProcfsExecutor | None = None
        self._resctrl: ResctrlExecutor | None = None

    def action(self, entry: Original, outcome: str, detail: str) -> RestoreAction:
        return RestoreAction(entry.kind, entry.target, outcome, detail, entry.value)

    def one(self, entry: Original) -> RestoreAction:
        configured = {"cgroup_file": self.roots.cgroup, "cgroup_dir": self.roots.cgroup,
                      "sysctl": self.roots.procfs, "resctrl_group": self.roots.resctrl,
                      "resctrl_schemata": self.roots.resctrl}.get(entry.kind)
        if configured is not None and _real(entry.root) != _real(configured):
            return self.action(entry, "skipped", f"kept under {entry.root}, but the configured root is "
                                                 f"{configured}: not touched")
        if configured is None and entry.root != self.roots.netns:
            return self.action(entry, "skipped", f"kept for network namespace {entry.root!r}, not the "
                                                 f"configured {self.roots.netns!r}: not touched")
        try:
            handler: Callable[[Original], RestoreAction] = getattr(self, f"_{entry.kind}")
            return handler(entry)
        except (UnsafePathError, CgroupRootError) as err:
            return self.action(entry, "skipped", f"refused: {err}")
        except OSError as err:
            return self.action(entry, "failed", err.strerror or str(err))

    # ---------------------------------------------------------------- cgroups

    def _cgroup_file(self, entry: Original) -> RestoreAction:
        root = ConfinedRoot(self.roots.cgroup).root
        path = resolve_beneath(root, entry.target)
        if path.name not in _CGROUP_FILES:
            return self.action(entry, "skipped", f"{path.name} is not a cgroup file koordnode writes: not touched")
        if entry.value is None or "\n" in entry.value:
            return self.action(entry, "skipped", "the recorded original is not one line of text: not written")
        if not path.is_file():
            return self.action(entry, "unchanged", "the cgroup is gone")
        current = read_file(path).strip()
        if current == entry.value:
            return self.action(entry, "unchanged", f"holds its original {entry.value!r}")
        if self.dry_run:
            return self.action(entry, "would restore", f"{current!r} -> {entry.value!r}")
        write_file(path, entry.value + "\n" if entry.value else "\n")
        return self.action(entry, "restored", f"{current!r} -> {entry.value!r}")

    def _cgroup_dir(self, entry: Original) -> RestoreAction:
        root = ConfinedRoot(self.roots.cgroup).root
        path = resolve_beneath(root, entry.target)
        if entry.value is not None:
            return self.action(entry, "skipped", "only cgroups koordnode created are removed")
        if not path.is_dir():
            return self.action(entry, "unchanged", "already gone")
        if path == root or path.parent == root or not (path / "cgroup.procs").is_file():
            return self.action(entry, "skipped", f"{path} is not a cgroup below a hierarchy's root: not removed")
        if self.dry_run:
            return self.action(entry, "would remove", f"rmdir {path} (absent before koordnode)")
        try:
            os.rmdir(path)
        except OSError as err:
            return self.action(entry, "failed", f"{path} stays: {err.strerror} (it still has processes or "
                                                "child cgroups: stop or move them, then run restore again)")
        return self.action(entry, "removed", f"{path} (absent before koordnode)")

    # ---------------------------------------------------------------- sysctls

    def _sysctl(self, entry: Original) -> RestoreAction:
        if entry.target not in SYSCTLS:
            return self.action(entry, "skipped", "not a sysctl koordnode writes: not touched")
        if entry.value is None:
            return self.action(entry, "skipped", "no recorded value")
        if self._procfs is None:
            self._procfs = ProcfsExecutor(self.roots.procfs, dry_run=self.dry_run, logger=_Quiet())
        result = self._procfs.write(entry.target, entry.value, "restore: the original before koordnode")
        outcome = {WriteStatus.WRITTEN: "restored", WriteStatus.UNCHANGED: "unchanged",
                   WriteStatus.WOULD_WRITE: "would restore"}.get(result.status)
        if outcome is None:
            detail = result.detail or result.status.value
            return self.action(entry, "skipped" if result.status is WriteStatus.REFUSED else "failed", detail)
        if outcome == "unchanged":
            return self.action(entry, outcome, f"holds its original {entry.value!r}")
        return self.action(entry, outcome, f"{result.old!r} -> {entry.value!r}")

    # ---------------------------------------------------------------- resctrl

    def _resctrl_executor(self) -> ResctrlExecutor:
        if self._resctrl is None:
            self._resctrl = ResctrlExecutor(self.roots.resctrl, dry_run=self.dry_run, logger=_Quiet())
        return self._resctrl

    def _resctrl_name(self, entry: Original) -> str | None:
        if not entry.target.startswith(self.roots.resctrl_prefix):
            return None
        self._resctrl_executor().group_dir(entry.target)  # refuses names that are no group's
        return entry.target

    def _resctrl_group(self, entry: Original) -> RestoreAction:
        if self._resctrl_name(entry) is None or entry.value is not None:
            return self.action(entry, "skipped", f"not a group koordnode created (prefix "
                                                 f"{self.roots.resctrl_prefix!r}): not touched")
        result = self._resctrl_executor().remove_group(entry.target, reason="restore")
        outcome = {WriteStatus.WRITTEN: "removed", WriteStatus.UNCHANGED: "unchanged",
                   WriteStatus.WOULD_WRITE: "would remove"}.get(result.status, "failed")
        detail = {"removed": "its threads are back in the default group", "unchanged": "already gone",
                  "would remove": "rmdir (absent before koordnode)"}.get(outcome, result.detail)
        return self.action(entry, outcome, detail)

    def _resctrl_schemata(self, entry: Original) -> RestoreAction:
        if self._resctrl_name(entry) is None:
            return self.action(entry, "skipped", f"not a group of koordnode's (prefix "
                                                 f"{self.roots.resctrl_prefix!r}): not touched")
        if entry.target in self.created_groups:
            return self.action(entry, "unchanged", "the group goes (koordnode created it)")
        if entry.value is None:
            return self.action(entry, "skipped", "no recorded schemata")
        path = self._resctrl_executor().group_dir(entry.target) / "schemata"
        if not path.is_file():
            return self.action(entry, "unchanged", "the group is gone")
        if self.dry_run:
            return self.action(entry, "would restore", f"schemata -> {entry.value!r}")
        write_file(path, entry.value + "\n")
        return self.action(entry, "restored", f"schemata -> {entry.value!r}")

    # ---------------------------------------------------------------- tc, nftables

    def _tc_root(self, entry: Original) -> RestoreAction:
        if not entry.target or len(entry.target) > 15 or "/" in entry.target or entry.target in (".", ".."):
            return self.action(entry, "skipped", "not a network device name: not touched")
        try:
            outcome, detail = self.roots.net_executor(entry.root, _Quiet()).restore_root(entry.target, entry.value,
                                                                               dry_run=self.dry_run)
        except Exception as err:  # netlink errors are not OSErrors; one device must not stop the rest
            return self.action(entry, "failed", f"{type(err).__name__}: {err}")
        return self.action(entry, outcome, detail)

    def _nft_table(self, entry: Original) -> RestoreAction:
        if entry.target != f"{NFT_FAMILY} {NFT_TABLE}" or entry.value is not None:
            return self.action(entry, "skipped", "not the table koordnode creates: not touched")
        outcome, detail = self.roots.net_executor(entry.root, _Quiet()).restore_table(dry_run=self.dry_run)
        return self.action(entry, outcome, detail)


def restore(journal: OriginalsJournal, roots: RestoreRoots, *, dry_run: bool = False) -> RestoreReport:
    """Return every kept target to its original; what was done, entry by entry."""
    report = RestoreReport(str(journal.path), dry_run)
    try:
        entries = journal.entries()
    except OriginalsError as err:
        report.error = f"{err}; nothing was restored (move the file away to start afresh)"
        return report
    restorer = _Restorer(roots, dry_run, entries)
    ordered = _order(entries)
    actions = [restorer.one(entry) for entry in ordered]
    # A cpuset going back to a narrower original fails parents-first (v1: a child's set must
    # stay inside its parent's) once the children are narrowed back: retry those children-first.
    retry = [i for i, action in enumerate(actions) if action.outcome == "failed" and ordered[i].kind == "cgroup_file"]
    for i in sorted(retry, key=lambda i: -_depth(ordered[i])):
        actions[i] = restorer.one(ordered[i])
    report.actions = actions
    if not dry_run:
        done = {(a.kind, e.root, a.target) for a, e in zip(actions, ordered, strict=True) if a.done}
        try:
            journal.forget(done)
        except OriginalsError as err:
            report.error = f"restored, but the state file could not be updated: {err}"
    return report

