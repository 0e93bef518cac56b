"""One koordnode per node: a lock file next to the admin socket, held while the daemon runs.

Two instances would both decide and write every pod's cgroups — worst of all one as the CRI
proxy and one as an NRI plugin, each undoing the other. The lock lives in the directory of
the admin socket (by default /var/run/koordnode), which every koordnode on a node shares
unless configured otherwise; the holder writes its pid, mode and endpoint into it so the
refusal can say who runs. In NRI mode, a CRI proxy still answering on [proxy] listen counts
as another koordnode too.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path

LOCK_NAME = "koordnode.lock"


class NodeLockError(RuntimeError):
    pass


def lock_path(admin_socket: str) -> Path:
    return Path(admin_socket).parent / LOCK_NAME


class NodeLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, mode: str, endpoint: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(fd)
            os.close(fd)
            raise NodeLockError(
                f"another koordnode already runs on this node ({holder}; lock {self.path}): "
                f"refusing to start in {mode} mode, as two instances would both apply QoS "
                f"(the CRI proxy and the NRI plugin cannot run at once); stop the other one, "
                f"or switch modes with [runtime] mode"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "mode": mode, "endpoint": endpoint}).encode() + b"\n")
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
            finally:
                os.close(self._fd)  # closing drops the flock
                self._fd = None


def _describe(fd: int) -> str:
    try:
        doc = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {int(doc['pid'])}, {doc['mode']} mode on {doc['endpoint']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


def refuse_if_proxy_serves(listen: str) -> None:
    """NRI mode: a CRI proxy answering on [proxy] listen (kubelet may still use it) would apply
    QoS a second time; refuse instead. A stale socket file with nobody behind it is fine."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(listen)
    except OSError:
        return
    finally:
        probe.close()
    raise NodeLockError(
        f"a CRI proxy serves {listen} (another koordnode in proxy mode?): refusing to start in "
        f"nri mode, the two would both apply QoS; stop it and point kubelet at containerd first"
    )
