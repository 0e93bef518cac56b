"""The engine's pool moves as NRI container updates: in the answer being prepared (CreateContainer,
StopContainer, Synchronize), else sent on their own (UpdateContainers); and the class values
written again once the runtime has applied an update (it rewrites the whole spec to the cgroup)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import structlog

from koordnode.hooks.pool_updates import PoolUpdates
from koordnode.hooks.qos_engine import QoSEngine
from koordnode.model.state import NodeState
from koordnode.nri import api_pb2 as nri
from koordnode.nri import convert
from koordnode.nri.mux import MuxClosed
from koordnode.nri.stats import NriStats
from koordnode.nri.ttrpc import TtrpcClient, TtrpcError

log = structlog.get_logger("koordnode.nri")

# The runtime's service on the connection: RegisterPlugin (plugin.py) and UpdateContainers (here).
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
# The runtime applies a container update (a pool move, Synchronize's) by writing every resource
# of the container's spec to its cgroup again: kubelet's cpu shares, quota and memory limit too,
# which the spec keeps (policy REPORTED_BY_RUNTIME). Their class values go back once it has: at
# once after an UpdateContainers call, this long after an answer that carried updates.
RUNTIME_APPLIES_ANSWER_S = 1.0
UPDATE_TIMEOUT_S = 5.0


class ContainerUpdates:
    def __init__(self, state: NodeState, engine: QoSEngine | None, pool_updates: PoolUpdates, stats: NriStats,
                 spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]]) -> None:
        self.state = state
        self.engine = engine
        self.pool_updates = pool_updates
        self.stats = stats
        self._spawn = spawn
        self.dry_run = False  # set with the plugin's
        self.client: TtrpcClient | None = None  # while registered
        self.loop: asyncio.AbstractEventLoop | None = None  # the plugin's, once it runs
        self._collecting = 0
        self._flush_wanted = asyncio.Event()
        self.pool_updates.subscribe(self._pool_changed)

    @contextlib.contextmanager
    def collecting(self) -> Iterator[None]:
        """An answer is being prepared: pool moves wait for it (take()) instead of going out alone."""
        self._collecting += 1
        try:
            yield
        finally:
            self._collecting -= 1

    def _pool_changed(self) -> None:
        """The engine published pool moves (from any thread): deliver them from the loop."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.flush_soon)

    def take(self) -> list[nri.ContainerUpdate]:
        moves = self.pool_updates.take()
        updates = []
        for cid, cpus in moves.items():
            record = self.state.containers.get(cid)
            if record is None or record.resources.cpuset_cpus == cpus:
                continue
            resources = convert.cri_message(record.resources)
            resources.cpuset_cpus = cpus
            self.state.update_container_resources(cid, resources)
            updates.append(convert.cpuset_update(cid, cpus))
        return updates

    def answered(self, updates: list[nri.ContainerUpdate]) -> list[nri.ContainerUpdate]:
        """Updates going out in an answer: counted, and their class values follow once applied."""
        self.stats.updates_answered += len(updates)
        self.class_values_after(updates, RUNTIME_APPLIES_ANSWER_S)
        return updates

    def flush_soon(self) -> None:
        self._flush_wanted.set()

    async def flush_loop(self) -> None:
        """Pool changes outside Create/StopContainer (removals, reconcile) as unsolicited updates."""
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted.clear()
            if self._collecting or self.client is None:
                # Picked up by the answer being prepared, or by the next Synchronize.
                if self._collecting:
                    await asyncio.sleep(0.05)
                    self._flush_wanted.set()
                continue
            updates = self.take()
            if updates:
                self._spawn(self.send(updates))

    async def send(self, updates: list[nri.ContainerUpdate]) -> None:
        client = self.client
        if client is None:
            return
        if self.dry_run:
            self.stats.dry_run_withheld["UpdateContainers"] += 1
            log.info("dry_run_container_updates_not_sent", containers=[u.container_id for u in updates])
            return
        request = nri.UpdateContainersRequest(update=updates)
        try:
            raw = await client.call(RUNTIME_SERVICE, "UpdateContainers", request.SerializeToString(), UPDATE_TIMEOUT_S)
        except (TtrpcError, MuxClosed) as exc:
            self.stats.updates_failed += len(updates)
            log.warning("container_updates_not_delivered", error=str(exc),
                        containers=[u.container_id for u in updates])
            return
        failed = nri.UpdateContainersResponse.FromString(raw).failed
        self.class_values_after(updates, 0.0)
        self.stats.updates_sent += len(updates) - len(failed)
        self.stats.updates_failed += len(failed)
        if failed:
            log.warning("container_updates_failed", detail="the runtime could not update some containers",
                        containers=[u.container_id for u in failed])

    def class_values_after(self, updates: list[nri.ContainerUpdate], delay_s: float) -> None:
        """The runtime applies (or has applied) `updates`: write the class values of what it
        rewrote from the containers' specs again, `delay_s` from now (the reconcile pass would,
        later, and count it as an overwrite)."""
        ids = [u.container_id for u in updates]
        if self.engine is None or not ids or self.dry_run:
            return
        engine = self.engine

        async def later() -> None:
            if delay_s:
                await asyncio.sleep(delay_s)
            await asyncio.to_thread(engine.containers_updated, ids)
        self._spawn(later())
