"""Run koordnode for tests: as a real process (`koordnode run`) or in-process with extra hooks."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from koordnode.admin.client import fetch_status
from koordnode.config import parse_config

REPO = Path(__file__).resolve().parents[2]


def short_socket_dir() -> Path:
    # sun_path is 108 bytes; pytest tmp paths can be longer.
    return Path(tempfile.mkdtemp(prefix="kn-sock-"))


def wait_for_socket(path: str | Path, timeout_s: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"koordnode exited early with {proc.returncode}")
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(path))
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nobody listens on {path} after {timeout_s} s")


def write_config(workdir: Path, backend: str, sockdir: Path, extra: str = "",
                 metrics_listen: str = "", kubepods: str = "", nri_socket: str = "") -> tuple[Path, str, str]:
    listen = str(sockdir / "koordnode.sock")
    admin = str(sockdir / "admin.sock")
    qos_manager = f'[qos_manager]\nkubepods_cgroup = "{kubepods}"\n' if kubepods else ""
    if qos_manager and "[qos_manager]\n" in extra:
        # TOML defines a table once: the caller's [qos_manager] gets the key instead.
        extra, qos_manager = extra.replace("[qos_manager]\n", qos_manager, 1), ""
    # The originals of node-level values go to the test's directory, never the host's
    # /var/lib/koordnode (a caller's [daemon] table gets the key instead: TOML defines it once).
    daemon = f'[daemon]\nstate_dir = "{workdir / "state"}"\n'
    if "[daemon]\n" in extra:
        extra, daemon = extra.replace("[daemon]\n", daemon, 1), ""
    text = (
        daemon
        + (f'[runtime]\nmode = "nri"\n[nri]\nsocket = "{nri_socket}"\n' if nri_socket else "")
        + f'[proxy]\nlisten = "{listen}"\nbackend = "{backend}"\n'
        f'[admin]\nsocket = "{admin}"\n'
        f'[metrics]\nlisten = "{metrics_listen}"\n'
        + qos_manager
        + '[log]\nformat = "json"\nlevel = "info"\n' + extra
    )
    path = workdir / "koordnode.toml"
    path.write_text(text)
    return path, listen, admin


class KoordnodeProcess:
    """`python -m koordnode run --config ...` as a child process."""

    def __init__(self, workdir: Path, backend: str, extra_toml: str = "", metrics_listen: str = "",
                 kubepods: str = "", nri_socket: str = "", sockdir: Path | None = None,
                 repo: Path | None = None) -> None:
        """``nri_socket``: run in NRI mode on that socket (no CRI socket is served then).
        ``sockdir``: where its sockets (and node lock) go; default a fresh directory.
        ``repo``: the checkout koordnode runs from (default this one; benchmarks compare two)."""
        self.repo = Path(repo) if repo is not None else REPO
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sockdir = sockdir or short_socket_dir()
        self.nri = bool(nri_socket)
        self.config_path, self.listen, self.admin = write_config(
            self.workdir, backend, self.sockdir, extra_toml, metrics_listen, kubepods, nri_socket)
        self.log_path = self.workdir / "koordnode.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 20.0) -> KoordnodeProcess:
        log = open(self.log_path, "ab")
        env = dict(os.environ, PYTHONPATH=str(self.repo) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "koordnode", "run", "--config", str(self.config_path)],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(self.repo),
            # A session of its own, as containerd's and kubelet's in the bed: its CPU weight never
            # follows the caller's (a shell's autogroup at nice 19 gave it 1/70 of kubepods').
            start_new_session=True,
        )
        log.close()
        if not self.nri:
            wait_for_socket(self.listen, timeout_s, proc=self.proc)
        wait_for_socket(self.admin, timeout_s, proc=self.proc)
        return self

    def wait_synchronized(self, count: int = 1, timeout_s: float = 20.0) -> dict:
        """NRI mode: until the runtime has synchronized the plugin ``count`` times."""
        deadline = time.monotonic() + timeout_s
        st: dict = {}
        while time.monotonic() < deadline:
            st = self.status()
            nri = st.get("nri") or {}
            if nri.get("connected") and nri.get("synchronizations", 0) >= count:
                return st
            time.sleep(0.05)
        raise TimeoutError(f"NRI plugin not synchronized {count} time(s): {st.get('nri')}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.proc = None
        return code

    def status(self) -> dict:
        # A daemon on a machine busy with builds and other beds can take seconds to answer
        # (the demo and the tests ask while their pods burn CPU): wait longer than the CLI's 5 s.
        return fetch_status(self.admin, timeout_s=20.0)

    def wait_rebuilt(self, timeout_s: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            st = self.status()
            if st.get("rebuilt_at"):
                return st
            time.sleep(0.1)
        raise TimeoutError("state not rebuilt")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


class InProcessKoordnode:
    """The daemon on an event loop in a thread, so tests can add hooks of their own."""

    def __init__(self, workdir: Path, backend: str, extra_toml: str = "", extra_hooks=(),
                 nri_socket: str = "") -> None:
        self.sockdir = short_socket_dir()
        path, self.listen, self.admin = write_config(Path(workdir), backend, self.sockdir, extra_toml,
                                                     nri_socket=nri_socket)
        self.config = parse_config(path.read_text(), str(path))
        self.extra_hooks = list(extra_hooks)
        self.daemon = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> InProcessKoordnode:
        from koordnode.daemon import Daemon

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self.daemon = Daemon(self.config)
            for hook in self.extra_hooks:
                self.daemon.chain.add(hook)
            await self.daemon.start()
            self._ready.set()
            await self.daemon.serve_forever()
            await self.daemon.stop()

        def target() -> None:
            try:
                asyncio.run(main())
            except BaseException as exc:  # surfaced by start()/stop()
                self._error = exc
                self._ready.set()

        self._thread = threading.Thread(target=target, name="koordnode", daemon=True)
        self._thread.start()
        self._ready.wait(20)
        if self._error is not None:
            raise self._error
        return self

    def call(self, fn, timeout_s: float = 10.0):
        """Run fn() on the daemon's loop (state is single-threaded) and return its result."""
        fut = asyncio.run_coroutine_threadsafe(_as_coro(fn), self._loop)
        return fut.result(timeout_s)

    def wait_rebuilt(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.call(lambda: self.daemon.state.rebuilt_at):
                return
            time.sleep(0.1)
        raise TimeoutError("state not rebuilt")

    def stop(self) -> None:
        if self._loop is not None and self.daemon is not None:
            self._loop.call_soon_threadsafe(self.daemon.request_stop)
        if self._thread is not None:
            self._thread.join(20)
        if self._error is not None:
            raise self._error


async def _as_coro(fn):
    result = fn()
    return await result if inspect.isawaitable(result) else result
