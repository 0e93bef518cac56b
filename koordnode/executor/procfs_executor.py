"""The procfs executor: sysctl writes under a procfs root, converged like cgroup files."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from koordnode.executor.cgroup import ConfinedRoot, read_file
from koordnode.executor.converge import Converger, Target
from koordnode.executor.originals import OriginalsJournal
from koordnode.executor.paths import UnsafePathError
from koordnode.executor.resources import InvalidValueError, UnknownResourceError, get_sysctl
from koordnode.executor.write_result import WriteResult, WriteStatus
from koordnode.policy.plan import CgroupWrite, SysctlWrite


class ProcfsExecutor(Converger):
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

    def _original_key(self, target: Target) -> tuple[str, str, str] | None:
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
        return self._converge(Target(write, path, fmt, value, fmt.expected(value)), force)
