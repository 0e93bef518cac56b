"""Keeps this node's NodeResourceTopology (kube/topology.py) current in the API server: created
when missing, updated when koordnode's pools or the topology change, checked every
INTERVAL_S against what was last written (a GET only after a write failed or at start). Without
Koordinator's CRD installed it says so and asks again at the slowest pace."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import structlog

from koordnode.kube.client import ApiError, KubeClient
from koordnode.kube.reflector import repeat_with_backoff
from koordnode.kube.topology import NODE_RESOURCE_TOPOLOGIES, TopologyFacts, differs, merged, node_resource_topology

log = structlog.get_logger("koordnode.kube")

INTERVAL_S = 10.0  # pools move when LSE/LSR pods come and go: the scheduler should see it soon


class TopologyReporter:
    def __init__(self, client: KubeClient, node_name: str, facts: Callable[[], TopologyFacts | None],
                 backoff_max_s: float = 60.0) -> None:
        self.client = client
        self.node_name = node_name
        self.facts = facts
        self.backoff_max_s = backoff_max_s
        self.path = f"{NODE_RESOURCE_TOPOLOGIES}/{quote(node_name, safe='')}"
        self.stored: dict[str, Any] | None = None  # as the API server last returned it
        self.status: dict[str, Any] = {"state": "not reported yet"}

    async def report_once(self) -> float:
        """Bring the object up to date; returns how long to wait before the next check."""
        facts = await asyncio.to_thread(self.facts)
        if facts is None:
            self.status = {**self.status, "state": "waiting for the CPU pools"}
            return INTERVAL_S
        wanted = node_resource_topology(self.node_name, facts)
        if self.stored is None:
            try:
                self.stored = await self.client.get(self.path)
            except ApiError as exc:
                if exc.status != 404:
                    raise
                return await self._create(wanted)
        if self.stored is not None and differs(self.stored, wanted):
            try:
                self.stored = await self.client.replace(self.path, merged(self.stored, wanted))
            except ApiError:
                self.stored = None  # changed or deleted meanwhile: read it again next time
                raise
            self._reported("updated")
        return INTERVAL_S

    async def _create(self, wanted: dict[str, Any]) -> float:
        try:
            self.stored = await self.client.create(NODE_RESOURCE_TOPOLOGIES, wanted)
        except ApiError as exc:
            if exc.status == 404:  # the resource itself is unknown: no CRD
                self.status = {"state": "NodeResourceTopology CRD not installed (topology.node.k8s.io/v1alpha1); "
                                        "koord-scheduler cannot bind CPUs on this node"}
                return self.backoff_max_s
            raise
        self._reported("created")
        return INTERVAL_S

    def _reported(self, what: str) -> None:
        self.status = {"state": what, "at": time.time()}
        log.info("node_resource_topology_" + what, node=self.node_name)

    async def run(self, stop: asyncio.Event) -> None:
        await repeat_with_backoff(self.report_once, stop, event="node_resource_topology_report",
                                  on_error=self._failed, backoff_max_s=self.backoff_max_s)

    def _failed(self, error: str) -> None:
        self.status = {**self.status, "last_error": error, "last_error_at": time.time()}
