"""``process_*`` and ``python_info``: the process's own series every Prometheus client
exports under these names (dashboards and alerts that watch any exporter's memory, CPU and
file descriptors use them). Read from /proc at each scrape; a value that cannot be read is
left out (another OS, a /proc without it)."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator

from koordnode.metrics.types import Family

__all__ = ["PlatformCollector", "ProcessCollector"]


class ProcessCollector:
    def __init__(self, proc: str = "/proc") -> None:
        self._proc = proc
        try:
            self._ticks = os.sysconf("SC_CLK_TCK")
            self._page = os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            self._ticks, self._page = 100, 4096
        self._boot_time = self._read_boot_time()

    def _read_boot_time(self) -> float | None:
        try:
            with open(f"{self._proc}/stat", "rb") as f:
                for line in f:
                    if line.startswith(b"btime "):
                        return float(line.split()[1])
        except OSError:
            pass
        return None

    def collect(self) -> Iterator[Family]:
        try:
            with open(f"{self._proc}/self/stat", "rb") as f:
                # Fields after the command name (which may hold spaces and parentheses).
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            fields = []
        if len(fields) > 21:
            yield _gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", float(fields[20]))
            yield _gauge("process_resident_memory_bytes", "Resident memory size in bytes.",
                         float(fields[21]) * self._page)
            if self._boot_time is not None:
                yield _gauge("process_start_time_seconds",
                             "Start time of the process since unix epoch in seconds.",
                             self._boot_time + float(fields[19]) / self._ticks)
            cpu = Family("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.")
            cpu.add((), (float(fields[11]) + float(fields[12])) / self._ticks)
            yield cpu
        try:
            yield _gauge("process_open_fds", "Number of open file descriptors.",
                         len(os.listdir(f"{self._proc}/self/fd")))
        except OSError:
            pass
        max_fds = self._max_fds()
        if max_fds is not None:
            yield _gauge("process_max_fds", "Maximum number of open file descriptors.", max_fds)

    def _max_fds(self) -> float | None:
        try:
            with open(f"{self._proc}/self/limits", "rb") as f:
                for line in f:
                    if line.startswith(b"Max open files"):
                        return float(line.split()[3])  # the soft limit
        except (OSError, IndexError, ValueError):
            pass
        return None


class PlatformCollector:
    def __init__(self) -> None:
        major, minor, patchlevel = platform.python_version_tuple()
        self._labels = (("implementation", platform.python_implementation()), ("major", major),
                        ("minor", minor), ("patchlevel", patchlevel), ("version", platform.python_version()))

    def collect(self) -> Iterator[Family]:
        family = Family("python_info", "gauge", "Python platform information")
        family.add(self._labels, 1)
        yield family


def _gauge(name: str, help_text: str, value: float) -> Family:
    family = Family(name, "gauge", help_text)
    family.add((), value)
    return family
