"""Collectors: read-only access to the node's and cgroups' statistics files.

Roots are configurable (procfs root, cgroup root) so tests run on fake trees in the kernel's
formats. Nothing here writes. Files are read through cached descriptors with pread at offset
0 (the kernel regenerates seq files on every read from 0): re-opening a cgroup file costs
about 15 us of path walk, a pread about 2 us, and a tick reads hundreds of them.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from koordnode.executor.paths import CgroupVersion, detect_cgroup_version, normalize_cgroup_path, v1_controller_dir
from koordnode.executor.resources import InvalidValueError, parse_cpu_list
from koordnode.model.meminfo import MemInfo
from koordnode.qos.parse import (
    CpuStat,
    CpuTimes,
    MemoryStat,
    ParseError,
    Pressure,
    parse_cpu_max,
    parse_cpu_stat,
    parse_cpuacct_usage,
    parse_int,
    parse_memory_stat,
    parse_meminfo,
    parse_pressure,
    parse_proc_stat,
)

PSI_RESOURCES = ("cpu", "memory", "io")
_READ_CHUNK = 16384
# errnos meaning "this file is gone or was never there" (a cgroup removed under us).
_GONE = (errno.ENOENT, errno.ENODEV, errno.ENOTDIR, errno.ESTALE)


class StatReader:
    """Reads small kernel files through descriptors kept open between ticks.

    `sweep()` closes the descriptors not read since the previous sweep, so files of cgroups
    that went away are released and the number held is what one tick reads (bounded by
    `max_open`; beyond it files are opened and closed per read).
    """

    def __init__(self, max_open: int = 4096) -> None:
        self.max_open = max_open
        self._fds: dict[str, int] = {}
        self._used: set[str] = set()

    @property
    def open_count(self) -> int:
        return len(self._fds)

    def read(self, path: str) -> str | None:
        """The file's text, or None when it does not exist. Other OSErrors propagate."""
        self._used.add(path)
        fd = self._fds.get(path)
        if fd is not None:
            try:
                return self._pread_all(fd)
            except OSError:
                # Removed cgroup (ENODEV) or similar: forget the descriptor, retry fresh once.
                self._drop(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            if err.errno in _GONE:
                return None
            raise
        try:
            text = self._pread_all(fd)
        except OSError as err:
            os.close(fd)
            if err.errno in _GONE:
                return None
            raise
        if len(self._fds) < self.max_open:
            self._fds[path] = fd
        else:
            os.close(fd)
        return text

    @staticmethod
    def _pread_all(fd: int) -> str:
        data = os.pread(fd, _READ_CHUNK, 0)
        if len(data) == _READ_CHUNK:  # rare: a long memory.stat; read the rest
            chunks = [data]
            offset = len(data)
            while chunk := os.pread(fd, _READ_CHUNK, offset):
                chunks.append(chunk)
                offset += len(chunk)
            data = b"".join(chunks)
        return data.decode("ascii", errors="replace")

    def _drop(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def sweep(self) -> None:
        for path in [p for p in self._fds if p not in self._used]:
            self._drop(path)
        self._used.clear()

    def close(self) -> None:
        for path in list(self._fds):
            self._drop(path)
        self._used.clear()


@dataclass(frozen=True)
class NodeSample:
    at: float  # time.monotonic()
    cpu: CpuTimes | None
    memory: MemInfo | None
    # "cpu" / "memory" / "io" -> pressure; None where /proc/pressure is absent (PSI off).
    pressure: dict[str, Pressure | None] = field(default_factory=dict)


class Collector:
    """Reads the node's and cgroups' statistics under a procfs root and a cgroup root.

    Every read method returns None when the file is missing or malformed (malformed text is
    counted in `errors` with the last message in `last_error`, never raised): a cgroup can
    vanish between listing and reading, and one odd file must not stop a tick.
    """

    def __init__(self, procfs_root: str | Path = "/proc", cgroup_root: str | Path = "/sys/fs/cgroup",
                 *, reader: StatReader | None = None) -> None:
        self.procfs_root = os.path.realpath(procfs_root)
        self.cgroup_root = os.path.realpath(cgroup_root)
        self.version = detect_cgroup_version(self.cgroup_root)
        self.reader = reader if reader is not None else StatReader()
        self.errors = 0
        self.last_error: str | None = None
        root = self.cgroup_root
        self._v1_dirs: dict[str, str | None] = {}
        self._normalized: dict[str, str] = {}  # cgroup path as given -> normalised
        # Each controller's mount (None: not mounted here).
        self._cpu: str | None
        self._cpuacct: str | None
        self._memory: str | None
        self._cpuset: str | None
        self._psi: str | None
        if self.version is CgroupVersion.V2:
            self._cpu = self._cpuacct = self._memory = self._cpuset = self._psi = root
        else:
            self._cpu = self._controller(root, "cpu")
            self._cpuacct = self._controller(root, "cpuacct")
            self._memory = self._controller(root, "memory")
            self._cpuset = self._controller(root, "cpuset")
            # Hybrid hosts: a cgroup2 mount without controllers, carrying PSI per cgroup.
            unified = os.path.join(root, "unified")
            self._psi = unified if os.path.isfile(os.path.join(unified, "cgroup.procs")) else None
        self._perf: str | None = None  # found on first use
        self._proc_stat = os.path.join(self.procfs_root, "stat")
        self._meminfo = os.path.join(self.procfs_root, "meminfo")
        self._proc_pressure = {r: os.path.join(self.procfs_root, "pressure", r) for r in PSI_RESOURCES}

    @staticmethod
    def _controller(root: str, name: str) -> str | None:
        found = v1_controller_dir(root, name)
        return os.path.realpath(found) if found is not None else None

    @property
    def is_v2(self) -> bool:
        return self.version is CgroupVersion.V2

    @property
    def has_cgroup_psi(self) -> bool:
        return self._psi is not None

    # ---------------------------------------------------------------------- plumbing

    def _read(self, path: str | None) -> str | None:
        if path is None:
            return None
        try:
            return self.reader.read(path)
        except OSError as err:
            self._error(f"{path}: {os.strerror(err.errno or 0)}")
            return None

    def _error(self, message: str) -> None:
        self.errors += 1
        self.last_error = message

    def _join(self, base: str | None, cgroup: str, name: str) -> str | None:
        if base is None:
            return None
        normalized = self._normalized.get(cgroup)
        if normalized is None:
            normalized = self._normalized[cgroup] = normalize_cgroup_path(cgroup)
        return f"{base}{normalized}/{name}" if normalized != "/" else f"{base}/{name}"

    def sweep(self) -> None:
        """Release descriptors of files not read since the previous sweep. Call it at a pace
        where every file still wanted has been read in between (the manager: every reconcile
        interval, right after the reconcile pass)."""
        self.reader.sweep()
        self._normalized.clear()

    def close(self) -> None:
        self.reader.close()

    # ---------------------------------------------------------------------- node

    def node(self) -> NodeSample:
        return NodeSample(
            at=time.monotonic(),
            cpu=self.proc_stat(),
            memory=self.meminfo(),
            pressure={r: self.node_pressure(r) for r in PSI_RESOURCES},
        )

    def proc_stat(self) -> CpuTimes | None:
        text = self._read(self._proc_stat)
        return self._parse(parse_proc_stat, text, self._proc_stat)

    def meminfo(self) -> MemInfo | None:
        text = self._read(self._meminfo)
        return self._parse(parse_meminfo, text, self._meminfo)

    def node_pressure(self, resource: str) -> Pressure | None:
        path = self._proc_pressure[resource]
        text = self._read(path)
        return self._parse(parse_pressure, text, path)

    def node_pressure_path(self, resource: str) -> str:
        return self._proc_pressure[resource]

    # ---------------------------------------------------------------------- cgroups

    def cgroup_file_text(self, controller: str | None, cgroup: str, filename: str) -> str | None:
        """Raw text of any file of a cgroup (v1: in `controller`'s hierarchy); None if absent."""
        if self.is_v2:
            base: str | None = self.cgroup_root
        else:
            if controller is None:
                return None
            if controller not in self._v1_dirs:
                self._v1_dirs[controller] = self._controller(self.cgroup_root, controller)
            base = self._v1_dirs[controller]
        return self._read(self._join(base, cgroup, filename))

    def cpu_usage_ns(self, cgroup: str) -> int | None:
        """Cumulative CPU time of the cgroup and its descendants, nanoseconds."""
        if self.is_v2:
            stat = self.cpu_stat(cgroup)
            return stat.usage_ns if stat is not None else None
        path = self._join(self._cpuacct, cgroup, "cpuacct.usage")
        return self._parse(parse_cpuacct_usage, self._read(path), path)

    def cpu_stat(self, cgroup: str) -> CpuStat | None:
        path = self._join(self._cpu, cgroup, "cpu.stat")
        return self._parse(parse_cpu_stat, self._read(path), path)

    def memory_usage(self, cgroup: str) -> int | None:
        name = "memory.current" if self.is_v2 else "memory.usage_in_bytes"
        path = self._join(self._memory, cgroup, name)
        text = self._read(path)
        return self._parse(lambda t: parse_int(t, name), text, path)

    def memory_stat(self, cgroup: str) -> MemoryStat | None:
        path = self._join(self._memory, cgroup, "memory.stat")
        return self._parse(parse_memory_stat, self._read(path), path)

    def pressure(self, cgroup: str, resource: str = "cpu") -> Pressure | None:
        path = self.pressure_path(cgroup, resource)
        return self._parse(parse_pressure, self._read(path), path)

    def perf_cgroup_dir(self, cgroup: str) -> str | None:
        """The cgroup's directory perf events are bound to: v2 (or the hybrid `unified` mount
        while no v1 perf_event hierarchy is mounted), else the v1 perf_event hierarchy."""
        if self._perf is None:
            self._perf = self._controller(self.cgroup_root, "perf_event") or self._psi or ""
        if not self._perf:
            return None
        path = self._join(self._perf, cgroup, "")
        return path.rstrip("/") if path else None

    def pressure_path(self, cgroup: str, resource: str = "cpu") -> str | None:
        """The cgroup2 pressure file of a cgroup (v2, or the hybrid `unified` mount on v1)."""
        if resource not in PSI_RESOURCES:
            raise ValueError(f"unknown pressure resource {resource!r}")
        return self._join(self._psi, cgroup, f"{resource}.pressure")

    def cfs_quota(self, cgroup: str) -> tuple[int, int] | None:
        """(quota_us or -1, period_us) of a cgroup."""
        if self.is_v2:
            path = self._join(self._cpu, cgroup, "cpu.max")
            return self._parse(parse_cpu_max, self._read(path), path)
        quota_path = self._join(self._cpu, cgroup, "cpu.cfs_quota_us")
        period_path = self._join(self._cpu, cgroup, "cpu.cfs_period_us")
        quota = self._parse(lambda t: parse_int(t, "cpu.cfs_quota_us"), self._read(quota_path), quota_path)
        period = self._parse(lambda t: parse_int(t, "cpu.cfs_period_us"), self._read(period_path), period_path)
        if quota is None or period is None:
            return None
        return quota, period

    def cpuset_cpus(self, cgroup: str) -> frozenset[int] | None:
        """The CPUs a cgroup may use (v2: the effective set, as an empty cpuset.cpus inherits)."""
        path = self._join(self._cpuset, cgroup, "cpuset.cpus.effective" if self.is_v2 else "cpuset.cpus")
        text = self._read(path)
        if text is None:
            return None
        try:
            return parse_cpu_list(text)
        except InvalidValueError as err:
            self._error(f"{path}: {err}")
            return None

    def _parse(self, parser, text: str | None, path: str | None):  # type: ignore[no-untyped-def]
        if text is None:
            return None
        try:
            return parser(text)
        except ParseError as err:
            self._error(f"{path}: {err}")
            return None
