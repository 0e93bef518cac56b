"""`koordnode run`: wire the proxy, hooks and state together and serve until told to stop."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import structlog

from koordnode import __version__
from koordnode.admin.server import AdminServer
from koordnode.hooks.chain import HookChain
from koordnode.hooks.qos_engine import QoSEngine
from koordnode.hooks.qos_hook import QoSHook
from koordnode.hooks.state_recorder import StateRecorder
from koordnode.proxy.handler import HookCallHandler, ProxyStats
from koordnode.proxy.server import ProxyServer, SocketInUseError
from koordnode.recovery import rebuild_until_done
from koordnode.state import NodeState

log = structlog.get_logger("koordnode")

SHUTDOWN_GRACE_S = 5.0


class Daemon:
    """Everything a running koordnode owns; also what `koordnode status` reports on."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.started_at = time.time()
        self.state = NodeState()
        self.stats = ProxyStats()
        hooks = [StateRecorder(self.state)]
        self.qos: QoSEngine | None = None
        self.qos_error: str | None = None
        try:
            self.qos = QoSEngine(config, self.state)
            hooks.append(QoSHook(self.qos))
        except Exception as exc:  # the proxy must serve even where QoS cannot be applied
            self.qos_error = f"QoS hooks disabled: {exc}"
            log.error("QoS hooks disabled; proxying without them", error=str(exc))
        self.chain = HookChain(
            hooks,
            timeout_s=config.proxy.hook_timeout_ms / 1000.0,
            failure_policy=config.proxy.failure_policy,
        )
        self.handler = HookCallHandler(self.chain, self.state, self.stats)
        self.server = ProxyServer(config.proxy.listen, config.proxy.backend, self.handler)
        self.admin = AdminServer(config.admin.socket, self.status)
        self._stop = asyncio.Event()
        self._background: set[asyncio.Task] = set()

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def start(self) -> None:
        await self.server.start()
        await self.admin.start()
        # Serve first: if the runtime is down, calls fail as they would without us, and the
        # state is rebuilt once it answers.
        self.spawn(rebuild_until_done(self.state, self.config.proxy.backend, on_done=self._adopt))
        if self.qos is not None and self.config.cgroup.reconcile_interval_s > 0:
            self.spawn(self._reconcile_loop())

    async def _adopt(self) -> None:
        if self.qos is not None:
            await asyncio.to_thread(self.qos.adopt)

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.cgroup.reconcile_interval_s)
            if self.state.rebuilt_at is None:
                continue  # not before the running pods are known
            try:
                await asyncio.to_thread(self.qos.reconcile)
            except Exception:
                log.exception("reconcile pass failed")

    def request_stop(self) -> None:
        self._stop.set()

    async def serve_forever(self) -> None:
        await self._stop.wait()

    async def stop(self) -> None:
        await self.server.stop(SHUTDOWN_GRACE_S)
        await self.admin.stop()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self.chain.close()

    def status(self) -> dict[str, Any]:
        snapshot = self.state.snapshot()
        if self.qos is not None:
            snapshot = self.qos.decorate(snapshot)
        return {
            "version": __version__,
            "uptime_s": round(time.time() - self.started_at, 1),
            "listen": self.config.proxy.listen,
            "backend": self.config.proxy.backend,
            "proxy": {
                "connections_open": self.stats.connections_open,
                "connections_total": self.stats.connections_total,
                "intercepted_calls": self.stats.intercepted_calls,
                "hook_failures": {
                    f"{hook}.{phase}.{kind}": n for (hook, phase, kind), n in self.chain.failures.items()
                },
            },
            "qos": self.qos.status() if self.qos is not None else {"error": self.qos_error},
            **snapshot,
        }


async def _main(config: Any) -> int:
    daemon = Daemon(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.request_stop)
    try:
        await daemon.start()
    except (SocketInUseError, OSError) as exc:
        log.error("cannot start", error=str(exc))
        return 1
    log.info("koordnode started", version=__version__, listen=config.proxy.listen,
             backend=config.proxy.backend)
    await daemon.serve_forever()
    log.info("shutting down")
    await daemon.stop()
    log.info("koordnode stopped")
    return 0


def run(config: Any) -> int:
    return asyncio.run(_main(config))
