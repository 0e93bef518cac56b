"""perf_event_open for cgroup CPU time: the system call, its sample ring and its ioctls.

qos/usage_watch.py decides what to watch and when to wake the manager; the kernel interface
(a raw system call through ctypes, an mmap of the sample ring, enable/disable/reset ioctls)
lives here, with the executor's other kernel calls. An event changes no setting of the node:
it counts one cgroup's CPU time on one CPU, and closing its fd ends it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import platform
import struct

__all__ = ["PerfEvent"]

_NR_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241, "ppc64le": 319, "s390x": 331, "riscv64": 241}
_PERF_TYPE_SOFTWARE = 1
_PERF_COUNT_SW_CPU_CLOCK = 0
_PERF_FLAG_PID_CGROUP = 1 << 2
_PERF_FLAG_FD_CLOEXEC = 1 << 3
_ATTR_SIZE = 128  # PERF_ATTR_SIZE_VER7; the kernel accepts any known size
_ATTR_DISABLED = 1 << 0
# ioctls: _IO('$', n)
_IOC_ENABLE, _IOC_DISABLE, _IOC_RESET = 0x2400, 0x2401, 0x2403
_DATA_HEAD, _DATA_TAIL = 1024, 1032  # offsets in struct perf_event_mmap_page
_PAGES = 2  # the control page and one data page (samples carry only their 8-byte header)

_libc = ctypes.CDLL(None, use_errno=True)


def _attr(period_ns: int) -> ctypes.Array[ctypes.c_char]:
    # type, size, config, sample_period, sample_type, read_format, flags, wakeup_events, bp_type
    raw = struct.pack("IIQQQQQII", _PERF_TYPE_SOFTWARE, _ATTR_SIZE, _PERF_COUNT_SW_CPU_CLOCK, period_ns,
                      0, 0, _ATTR_DISABLED, 1, 0)
    return ctypes.create_string_buffer(raw + b"\0" * (_ATTR_SIZE - len(raw)), _ATTR_SIZE)


class PerfEvent:
    """One cgroup cpu-clock event on one CPU."""

    __slots__ = ("fd", "ring", "cpu", "armed_at", "enabled")

    def __init__(self, cgroup_fd: int, cpu: int, period_ns: int) -> None:
        nr = _NR_PERF_EVENT_OPEN.get(platform.machine())
        if nr is None:
            raise OSError(errno.ENOSYS, f"perf_event_open number unknown for {platform.machine()}")
        fd = _libc.syscall(nr, _attr(period_ns), cgroup_fd, cpu, -1, _PERF_FLAG_PID_CGROUP | _PERF_FLAG_FD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        try:
            self.ring = mmap.mmap(fd, mmap.PAGESIZE * _PAGES)
        except OSError:
            os.close(fd)
            raise
        self.fd, self.cpu = fd, cpu
        self.armed_at = 0.0
        self.enabled = False

    def consume(self) -> None:
        """Mark every sample read, so the ring never fills and POLLIN clears."""
        head = struct.unpack_from("Q", self.ring, _DATA_HEAD)[0]
        struct.pack_into("Q", self.ring, _DATA_TAIL, head)

    def arm(self, now: float) -> None:
        self.consume()
        fcntl.ioctl(self.fd, _IOC_RESET, 0)
        if not self.enabled:
            fcntl.ioctl(self.fd, _IOC_ENABLE, 0)
            self.enabled = True
        self.armed_at = now

    def disarm(self) -> None:
        if self.enabled:
            fcntl.ioctl(self.fd, _IOC_DISABLE, 0)
            self.enabled = False

    def close(self) -> None:
        self.ring.close()
        os.close(self.fd)
