"""The cgroup executor: applies CgroupWrite plans under a cgroup root (v1 or v2).

Each logical write is validated, mapped onto the file of this kernel and cgroup version
(located once and cached while its directory stays the same) and converged (converge.py).
Unsupported files are skipped once and remembered; unsafe paths and invalid values are
refused. v1 cpusets are written in an order that keeps every child a subset of its parent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from koordnode.executor.cgroup import CgroupFS, read_file, read_file_if_same, write_file
from koordnode.executor.cgroup_tree import CgroupTree
from koordnode.executor.converge import Converger, Located, Outcome, Target, describe_os_error, directory_id
from koordnode.executor.originals import OriginalsJournal
from koordnode.executor.paths import CgroupVersion, UnsafePathError, cgroup_depth, normalize_cgroup_path
from koordnode.executor.resources import (
    RESOURCES,
    InvalidValueError,
    Resource,
    UnknownResourceError,
    get_resource,
)
from koordnode.executor.write_result import WriteResult, WriteStatus
from koordnode.model.cgroup_scope import outlives_pods
from koordnode.model.cpulist import format_cpu_list
from koordnode.policy.plan import CgroupWrite, SysctlWrite

# Files that list a cgroup's processes: writing them moves a process, it sets no value.
MEMBERSHIP_FILES = frozenset({"cgroup.procs", "cgroup.threads", "tasks"})


class CgroupExecutor(CgroupTree, Converger):
    """Applies CgroupWrite plans under a cgroup root (v1 or v2, detected from the root).

    Thread-safe: applies are serialised, so read-modify-write of shared files (cpu.max,
    io.max) cannot interleave. Reads and changes of the tree's directories (make_cgroup,
    remove_cgroup, ...) come from CgroupTree.
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
        self._located: dict[tuple[str, str], Located] = {}
        self._membership_files = {}
        # A write as last looked up: its located target, or the result that skipped it as
        # unsupported. The reconcile pass repeats the same writes (the same plans) every
        # period; a repeat is not validated, normalised and looked up again.
        self._prepared: dict[CgroupWrite, Target | WriteResult] = {}

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

    def _original_key(self, target: Target) -> tuple[str, str, str] | None:
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

    def original_of(self, cgroup: str, resource: str) -> tuple[bool, str | None]:
        """(kept, value): whether the originals journal holds the original of a node-level
        cgroup file (koordnode changed it before, in this run or an earlier one), and what it
        was. (False, None) without a journal or for a pod's file."""
        if self.originals is None or not outlives_pods(cgroup):
            return False, None
        spec = get_resource(resource)
        hierarchy = self._fs.hierarchy(spec.v1_controller)
        if hierarchy is None:
            return False, None
        directory = self._fs.cgroup_dir(hierarchy, normalize_cgroup_path(cgroup))
        entries = {entry.key: entry for entry in self.originals.entries()}
        for fmt in spec.files(self._fs.is_v2):
            path = self._fs.cgroup_file(hierarchy, directory, fmt.filename)
            entry = entries.get(("cgroup_file", str(self.root), str(path.relative_to(self.root))))
            if entry is not None:
                return True, entry.value
        return False, None

    def disown(self, writes: Iterable[CgroupWrite]) -> None:
        """Forget the values koordnode last put in the files of `writes`: the next write there
        is not counted as an overwrite. For files the container runtime has just rewritten
        from kubelet's request (after UpdateContainerResources), which is no foreign writer."""
        with self._lock:
            for write in writes:
                try:
                    target = self._locate(write)
                except Outcome:
                    continue
                self._owned.pop(target.path, None)


    # ------------------------------------------------------------------ internals

    def _apply_one(self, write: CgroupWrite, force: bool) -> WriteResult:
        try:
            target = self._locate(write)
        except Outcome as outcome:
            return outcome.result
        result = self._converge(target, force)
        if result.status is WriteStatus.MISSING and target.cached:
            # The file went away under a cached location (v2 controller disabled, cgroup
            # removed): look again, as a first write would.
            self._forget_located(write)
            try:
                target = self._locate(write)
            except Outcome as outcome:
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

    def _cached_target(self, write: CgroupWrite, resource: Resource, cgroup: str, value: Any) -> Target | None:
        located = self._located.get((resource.name, cgroup))
        if located is None:
            return None
        if directory_id(located.directory) != located.dir_id:
            del self._located[(resource.name, cgroup)]
            return None
        return self._target_in(write, resource, located, value, cached=True, cgroup=cgroup)

    def _target_in(self, write: CgroupWrite, resource: Resource, located: Located, value: Any,
                   *, cached: bool, cgroup: str) -> Target:
        """The write's target in a located file, unless a sibling file blocks the write."""
        self._check_not_blocked(write, resource, located)
        return Target(write, located.path, located.fmt, value, located.fmt.expected(value),
                       dir_inode=located.dir_id[1] if located.file_in_dir else None, cached=cached,
                       key=(resource.name, cgroup), located=located)

    def _unsupported_outcome(self, write: CgroupWrite, key: tuple[str, bool], reason: str) -> Outcome:
        self._unsupported[key] = reason
        self._log.info("cgroup_resource_unsupported", resource=write.resource, cgroup=write.cgroup, reason=reason)
        return self._skipped_unsupported(write, reason)

    def _skipped_unsupported(self, write: CgroupWrite, reason: str) -> Outcome:
        result = WriteResult(write, WriteStatus.SKIPPED, detail=reason)
        if len(self._prepared) >= self._MAX_PREPARED:
            self._prepared.clear()
        self._prepared[write] = result
        return Outcome(result)

    # Bound on remembered writes (a node of 250 pods repeats ~4000): cleared beyond it, which
    # only costs lookups; churned pods' entries go then too.
    _MAX_PREPARED = 16384

    def _locate(self, write: CgroupWrite) -> Target:
        if not isinstance(write, CgroupWrite):
            raise Outcome(WriteResult(write, WriteStatus.REFUSED, detail="not a CgroupWrite"))
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

    def _checked_again(self, target: Target) -> WriteResult | None:
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
        if located.file_id is None and directory_id(located.directory) != located.dir_id:
            return None
        try:
            read = read_file_if_same(target.path, located.file_id)
        except OSError:
            return None
        if read is None:
            return None  # another file at that path now: the full path looks again
        current, located.file_id = read
        return self._unchanged_again(target, current)

    def _repeat(self, write: CgroupWrite, prepared: Target | WriteResult) -> Target | None:
        """The target of a write looked up before, if its location still holds; None: look up."""
        if isinstance(prepared, WriteResult):  # unsupported until forget_unsupported()
            raise Outcome(prepared)
        key, located = prepared.key, prepared.located
        if key is None or located is None or self._located.get(key) is not located:
            return None
        if directory_id(located.directory) != located.dir_id:
            del self._located[key]
            return None
        self._check_not_blocked(write, get_resource(write.resource), located)
        return prepared

    def _lookup(self, write: CgroupWrite) -> Target:
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
            dir_id = directory_id(directory)
            if dir_id is None:
                self._log.debug("cgroup_missing", path=str(directory), **self._log_fields(write))
                raise Outcome(WriteResult(write, WriteStatus.MISSING, str(directory), detail="cgroup does not exist"))
            for fmt in formats:
                path = self._fs.existing_file(hierarchy, directory, fmt.filename)
                if path is not None:
                    located = Located(hierarchy, directory, dir_id, path, fmt, path.parent == directory, {})
                    if len(self._located) >= self._MAX_LOCATED:
                        self._located.clear()
                    self._located[(resource.name, cgroup)] = located
                    return self._target_in(write, resource, located, value, cached=False, cgroup=cgroup)
        except UnsafePathError as err:
            raise self._refused(write, str(err)) from None
        names = " or ".join(fmt.filename for fmt in formats)
        raise self._unsupported_outcome(write, key, f"{names} not present on this kernel ({resource.support})")

    def _check_not_blocked(self, write: CgroupWrite, resource: Resource, located: Located) -> None:
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
                raise Outcome(WriteResult(write, WriteStatus.SKIPPED, detail=why))

    def _apply_subset_ordered(
        self,
        plan: list[CgroupWrite],
        indices: list[int],
        results: list[WriteResult | None],
        force: bool,
    ) -> None:
        targets: list[tuple[int, Target, int]] = []
        for index in indices:
            try:
                target = self._locate(plan[index])
            except Outcome as outcome:
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

    def _widen(self, target: Target, force: bool) -> WriteResult | str | None:
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
                f"widening to {text!r} before narrowing failed: {describe_os_error(err)}", err,
            )
        self._log.info(
            "cgroup_write", path=str(target.path), old=current_text.strip(), new=text,
            step="widen before narrowing", **self._log_fields(target.write),
        )
        return current_text
