"""What the executors report for each logical write: its status and the file's before and after."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from koordnode.policy.plan import CgroupWrite, SysctlWrite


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
