"""resctrl backend: L3 cache ways and memory bandwidth per QoS class, and the pods' threads.

koordnode owns three groups under the mounted resctrl filesystem (never mounted here):
``<prefix>LSR`` (LSR and LSE pods), ``<prefix>LS`` and ``<prefix>BE``. SYSTEM pods stay in
the root group. The schemata of each group come from koordnode/policy/resctrl.py and the controller
(koordnode/qos/resctrl_control.py) decides when; this module only reads the hardware facts
and converges the files:

- detection: ``/proc/cpuinfo`` (vendor_id, flags ``cat_l3`` / ``mba``) and the mount
  (``schemata``, ``info/L3/{cbm_mask,min_cbm_bits,num_closids}``,
  ``info/MB/{min_bandwidth,bandwidth_gran,delay_linear,num_closids}``);
  an unsupported machine is reported once and then skipped;
- groups: created (mkdir) when enabled, removed (rmdir, which hands their tasks back to the
  root group) when disabled; directories with other names are never touched;
- schemata: written only when a value of ours differs, in one newline-terminated write, then
  read back and compared; a refusal carries the kernel's ``info/last_cmd_status``;
- tasks: every thread of a container (its cgroup's ``tasks`` on v1, ``cgroup.threads`` on
  v2) is written to its group's ``tasks``, one id per write, only those not there yet. New
  threads inherit their creator's group, but processes joined into the container from
  outside (``kubectl exec``) do not, hence the re-sync on every reconcile period.

All file access goes through a :class:`ResctrlIO`, confined beneath the root.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from koordnode.executor.cgroup import ConfinedRoot, read_file, write_file
from koordnode.executor.write_result import WriteStatus
from koordnode.executor.originals import OriginalsError, OriginalsJournal
from koordnode.executor.paths import UnsafePathError
from koordnode.policy.resctrl import (
    CACHE_RESOURCES,
    MB_RESOURCE,
    CacheInfo,
    GroupPlan,
    MemBandwidthInfo,
    ResctrlInfo,
    SchemataError,
    Vendor,
    parse_schemata,
    schemata_differences,
    threads_to_move,
)

__all__ = [
    "ResctrlExecutor",
    "ResctrlIO",
    "ResctrlResult",
    "ResctrlUnsupported",
    "detect_resctrl",
]

_CPU_FLAG_FOR = {"L3": "cat_l3", "L3CODE": "cdp_l3", "L3DATA": "cdp_l3", MB_RESOURCE: "mba"}
_VENDOR_IDS = {"GenuineIntel": Vendor.INTEL, "AuthenticAMD": Vendor.AMD, "HygonGenuine": Vendor.AMD}


class ResctrlUnsupported(Exception):
    """This machine (or mount) offers no resctrl allocation koordnode can use; why."""


class ResctrlIO:
    """File operations on the resctrl mount. The real kernel's; tests pass a kernel model."""

    def read(self, path: Path) -> str:
        return read_file(path)

    def write(self, path: Path, text: str) -> None:
        write_file(path, text)

    def mkdir(self, path: Path) -> None:
        os.mkdir(path)

    def rmdir(self, path: Path) -> None:
        # resctrl groups are removed like cgroups: rmdir on a directory that shows files.
        os.rmdir(path)


# ---------------------------------------------------------------------------------------------
# Detection


def _read_cpuinfo(procfs_root: Path | str) -> tuple[str, frozenset[str]]:
    """vendor_id and flags of the first processor in cpuinfo."""
    path = ConfinedRoot(procfs_root).file("cpuinfo")
    vendor, flags = "", frozenset[str]()
    for line in read_file(path).splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
        if vendor and flags:
            break
    return vendor, flags


def _read_int(io: ResctrlIO, path: Path, base: int = 10) -> int:
    text = io.read(path).strip()
    try:
        return int(text, base)
    except ValueError:
        raise ResctrlUnsupported(f"{path} holds {text!r}, not a number") from None


def detect_resctrl(
    root: Path | str,
    procfs_root: Path | str = "/proc",
    vendor: str = "auto",
    io: ResctrlIO | None = None,
) -> ResctrlInfo:
    """Read what the hardware and the mounted resctrl filesystem offer.

    Raises ResctrlUnsupported (with the reason) when nothing can be allocated: unknown vendor,
    resctrl not mounted at ``root``, neither L3 CAT nor MBA present.
    """
    io = io or ResctrlIO()
    try:
        vendor_id, flags = _read_cpuinfo(procfs_root)
    except (OSError, UnsafePathError, ValueError) as err:
        raise ResctrlUnsupported(f"cannot read cpuinfo under {procfs_root}: {err}") from None
    if vendor == "auto":
        if vendor_id not in _VENDOR_IDS:
            raise ResctrlUnsupported(f"CPU vendor {vendor_id or 'unknown'!r} has no resctrl support")
        chosen = _VENDOR_IDS[vendor_id]
    else:
        chosen = Vendor(vendor)

    try:
        base = ConfinedRoot(root)
    except ValueError:
        raise ResctrlUnsupported(f"{root} does not exist; mount resctrl there "
                                 "(mount -t resctrl resctrl /sys/fs/resctrl)") from None
    schemata_path = base.file("schemata")
    if not schemata_path.is_file() or not base.file("info").is_dir():
        raise ResctrlUnsupported(f"no resctrl filesystem mounted at {base.root} "
                                 "(no schemata file or info directory)")
    try:
        root_values = parse_schemata(io.read(schemata_path))
    except (OSError, SchemataError) as err:
        raise ResctrlUnsupported(f"cannot read {schemata_path}: {err}") from None

    domains = {resource: tuple(values) for resource, values in root_values.items()}
    caches: dict[str, CacheInfo] = {}
    mb: MemBandwidthInfo | None = None
    for resource in domains:
        flag = _CPU_FLAG_FOR.get(resource)
        if flag is None or flag not in flags:
            continue  # L2, SMBA, or a resource the CPU flags do not confirm
        info_dir = base.file(f"info/{resource}")
        try:
            if resource in CACHE_RESOURCES:
                caches[resource] = CacheInfo(
                    cbm_mask=_read_int(io, info_dir / "cbm_mask", 16),
                    min_cbm_bits=_read_int(io, info_dir / "min_cbm_bits"),
                    num_closids=_read_int(io, info_dir / "num_closids"),
                )
            elif resource == MB_RESOURCE:
                mb = MemBandwidthInfo(
                    min_bandwidth=_read_int(io, info_dir / "min_bandwidth"),
                    bandwidth_gran=_read_int(io, info_dir / "bandwidth_gran"),
                    delay_linear=_read_int(io, info_dir / "delay_linear") == 1,
                    num_closids=_read_int(io, info_dir / "num_closids"),
                )
        except (OSError, SchemataError) as err:
            raise ResctrlUnsupported(f"cannot read {info_dir}: {err}") from None

    if mb is not None and chosen is Vendor.INTEL and any(
        value > 100 for value in root_values[MB_RESOURCE].values()
    ):
        # Mounted with -o mba_MBps: MB takes MBps (the software controller), not percent.
        mb = None
    info = ResctrlInfo(chosen, domains, caches, mb)
    if not info.managed_resources:
        raise ResctrlUnsupported(
            f"resctrl at {base.root} offers no L3 CAT or MBA allocation confirmed by the CPU "
            f"flags (schemata resources: {', '.join(domains) or 'none'})"
        )
    return info


# ---------------------------------------------------------------------------------------------
# Executor


@dataclass(frozen=True)
class ResctrlResult:
    action: str  # "mkdir", "rmdir", "schemata", "tasks"
    group: str
    status: WriteStatus
    old: str | None = None
    new: str | None = None
    detail: str = ""
    moved: tuple[int, ...] = ()  # tasks: thread ids written
    gone: tuple[int, ...] = ()  # tasks: threads that exited before they could be moved

    @property
    def ok(self) -> bool:
        return self.status in (WriteStatus.WRITTEN, WriteStatus.UNCHANGED, WriteStatus.WOULD_WRITE)


class ResctrlExecutor:
    """Converges koordnode's resctrl groups under ``root``. Thread-safe (one lock)."""

    def __init__(self, root: Path | str, *, io: ResctrlIO | None = None, logger: Any = None,
                 dry_run: bool = False, originals: OriginalsJournal | None = None) -> None:
        self._root = ConfinedRoot(root)
        # Groups koordnode creates and schemata it changes are kept there first (restore).
        self.originals = originals
        self._io = io or ResctrlIO()
        self._log = logger if logger is not None else structlog.get_logger("koordnode.executor")
        self._lock = threading.RLock()
        # Dry run: read and compare, report WOULD_WRITE; no mkdir, rmdir or write.
        self.dry_run = dry_run

    @property
    def root(self) -> Path:
        return self._root.root

    def _group_dir(self, name: str) -> Path:
        if not name or "/" in name or name in (".", "..", "info", "mon_groups", "mon_data"):
            raise UnsafePathError(f"bad resctrl group name {name!r}")
        return self._root.file(name)

    def group_dir(self, name: str) -> Path:
        """The group's directory; UnsafePathError for a name that is no group's (info, ../x)."""
        return self._group_dir(name)

    def group_exists(self, name: str) -> bool:
        return self._group_dir(name).is_dir()

    def existing_groups(self, names: Iterable[str]) -> list[str]:
        return [name for name in names if self.group_exists(name)]

    def _keep_original(self, kind: str, name: str, value: str | None) -> str | None:
        """Keep the original before the first change (None: the group was absent); the problem."""
        if self.originals is None:
            return None
        try:
            if self.originals.keep(kind, str(self.root), name, value):
                self._log.info("original_kept", kind=kind, target=name, value=value,
                               state_file=str(self.originals.path))
        except OriginalsError as err:
            self._log.error("original_not_kept", kind=kind, target=name, error=str(err))
            return f"not changed: its original could not be kept ({err})"
        return None

    def last_cmd_status(self) -> str:
        try:
            return self._io.read(self._root.file("info/last_cmd_status")).strip()
        except OSError:
            return ""

    # ---------------------------------------------------------------- groups and schemata

    def ensure_group(self, plan: GroupPlan, *, reason: str = "", force: bool = False) -> list[ResctrlResult]:
        """Create the group if missing, then converge its schemata."""
        results = []
        with self._lock:
            directory = self._group_dir(plan.name)
            if not directory.is_dir() and self.dry_run:
                self._log.info("resctrl_dry_run", group=plan.name, reason=reason,
                               would=f"would create {directory} with schemata {plan.text.strip()!r}")
                return [ResctrlResult("mkdir", plan.name, WriteStatus.WOULD_WRITE, detail="dry run"),
                        ResctrlResult("schemata", plan.name, WriteStatus.WOULD_WRITE, None,
                                      plan.text.strip(), "dry run")]
            if not directory.is_dir():
                problem = self._keep_original("resctrl_group", plan.name, None)
                if problem is not None:
                    return [self._failed("mkdir", plan.name, None, None, problem)]
                try:
                    self._io.mkdir(directory)
                except OSError as err:
                    detail = _describe(err, self.last_cmd_status())
                    if err.errno == errno.ENOSPC:
                        detail += " (no free CLOSID: too many resctrl groups on this machine)"
                    self._log.warning("resctrl_group_create_failed", group=plan.name, error=detail)
                    return [ResctrlResult("mkdir", plan.name, WriteStatus.FAILED, detail=detail)]
                self._log.info("resctrl_group_created", group=plan.name, path=str(directory), reason=reason)
                results.append(ResctrlResult("mkdir", plan.name, WriteStatus.WRITTEN))
            results.append(self._converge_schemata(plan, directory / "schemata", reason, force))
        return results

    def _converge_schemata(self, plan: GroupPlan, path: Path, reason: str, force: bool) -> ResctrlResult:
        try:
            old_text = self._io.read(path)
            current = parse_schemata(old_text)
        except OSError as err:
            return self._failed("schemata", plan.name, None, plan.text, f"read failed: {_describe(err)}")
        except SchemataError as err:
            return self._failed("schemata", plan.name, None, plan.text, str(err))
        old = old_text.strip()
        differs = bool(schemata_differences(plan.values, current))
        if not differs and (not force or self.dry_run):
            return ResctrlResult("schemata", plan.name, WriteStatus.UNCHANGED, old, plan.text.strip())
        if self.dry_run:
            self._log.info("resctrl_dry_run", group=plan.name, reason=reason, old=old,
                           would=f"would write {plan.text.strip()!r} to {path}")
            return ResctrlResult("schemata", plan.name, WriteStatus.WOULD_WRITE, old, plan.text.strip(),
                                 "dry run")
        problem = self._keep_original("resctrl_schemata", plan.name, old)
        if problem is not None:
            return self._failed("schemata", plan.name, old, plan.text, problem)
        try:
            self._io.write(path, plan.text)
        except OSError as err:
            detail = f"write failed: {_describe(err, self.last_cmd_status())}"
            return self._failed("schemata", plan.name, old, plan.text, detail)
        try:
            back = parse_schemata(self._io.read(path))
        except (OSError, SchemataError) as err:
            return self._failed("schemata", plan.name, old, plan.text, f"read-back failed: {err}")
        remaining = schemata_differences(plan.values, back)
        if remaining:
            detail = f"read back differs after writing: {_show_diff(remaining)}"
            return self._failed("schemata", plan.name, old, plan.text, detail)
        self._log.info("resctrl_write", path=str(path), group=plan.name, old=old,
                       new=plan.text.strip(), reason=reason)
        return ResctrlResult("schemata", plan.name, WriteStatus.WRITTEN, old, plan.text.strip())

    def remove_group(self, name: str, *, reason: str = "") -> ResctrlResult:
        """rmdir the group; the kernel hands its tasks back to the root group."""
        with self._lock:
            directory = self._group_dir(name)
            if not directory.is_dir():
                return ResctrlResult("rmdir", name, WriteStatus.UNCHANGED)
            if self.dry_run:
                self._log.info("resctrl_dry_run", group=name, reason=reason, would=f"would remove {directory}")
                return ResctrlResult("rmdir", name, WriteStatus.WOULD_WRITE, detail="dry run")
            try:
                self._io.rmdir(directory)
            except FileNotFoundError:
                return ResctrlResult("rmdir", name, WriteStatus.UNCHANGED)
            except OSError as err:
                return self._failed("rmdir", name, None, None, _describe(err))
            self._log.info("resctrl_group_removed", group=name, path=str(directory), reason=reason)
            return ResctrlResult("rmdir", name, WriteStatus.WRITTEN)

    # ---------------------------------------------------------------- tasks

    def group_tasks(self, name: str) -> set[int] | None:
        """Thread ids in the group (None: no such group)."""
        try:
            text = self._io.read(self._group_dir(name) / "tasks")
        except FileNotFoundError:
            return None
        return {int(word) for word in text.split() if word.isdigit()}

    def move_threads(self, name: str, tids: Iterable[int], *, reason: str = "") -> ResctrlResult:
        """Write each thread id not yet in the group to its ``tasks`` (one id per write)."""
        with self._lock:
            path = self._group_dir(name) / "tasks"
            present = self.group_tasks(name)
            if present is None and not self.dry_run:
                return ResctrlResult("tasks", name, WriteStatus.MISSING, detail="group does not exist")
            todo = threads_to_move(tids, present or set())
            if not todo:
                return ResctrlResult("tasks", name, WriteStatus.UNCHANGED)
            if self.dry_run:
                self._log.debug("resctrl_dry_run", group=name, reason=reason,
                                would=f"would move {len(todo)} threads to {path}")
                return ResctrlResult("tasks", name, WriteStatus.WOULD_WRITE, detail="dry run",
                                     moved=tuple(todo))
            moved: list[int] = []
            gone: list[int] = []
            for tid in todo:
                try:
                    self._io.write(path, f"{tid}\n")
                except OSError as err:
                    if err.errno == errno.ESRCH:
                        gone.append(tid)  # exited since its cgroup was read
                        continue
                    detail = f"moving thread {tid} failed: {_describe(err, self.last_cmd_status())}"
                    self._log.warning("resctrl_tasks_failed", group=name, error=detail,
                                      moved=len(moved), reason=reason)
                    return ResctrlResult("tasks", name, WriteStatus.FAILED, detail=detail,
                                         moved=tuple(moved), gone=tuple(gone))
                moved.append(tid)
            if moved:
                self._log.info("resctrl_tasks_moved", path=str(path), group=name, count=len(moved),
                               tids=_short_list(moved), reason=reason)
            status = WriteStatus.WRITTEN if moved else WriteStatus.UNCHANGED
            return ResctrlResult("tasks", name, status, moved=tuple(moved), gone=tuple(gone))

    def _failed(self, action: str, group: str, old: str | None, new: str | None, detail: str) -> ResctrlResult:
        self._log.warning("resctrl_write_failed", action=action, group=group, old=old,
                          new=new.strip() if new else new, error=detail)
        return ResctrlResult(action, group, WriteStatus.FAILED, old, new, detail)


def _describe(err: OSError, kernel_status: str = "") -> str:
    name = errno.errorcode.get(err.errno or 0, "")
    text = f"{name}: {err.strerror}" if name else str(err)
    if kernel_status and kernel_status != "ok":
        text += f" (last_cmd_status: {kernel_status})"
    return text


def _show_diff(diff: Mapping[str, Mapping[int, tuple[int | None, int]]]) -> str:
    parts = []
    for resource, domains in diff.items():
        for dom, (have, want) in domains.items():
            parts.append(f"{resource}:{dom} is {have if have is not None else 'absent'}, want {want}")
    return "; ".join(parts)


def _short_list(values: list[int], limit: int = 20) -> list[int] | str:
    return values if len(values) <= limit else f"{values[:limit]} and {len(values) - limit} more"
