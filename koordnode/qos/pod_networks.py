"""The pods' networks for the network classes ([net]): a new pod's IPs asked of the runtime
(kubelet's own status calls are not parsed), and the classes rebuilt when pods come and go.
Only while [net] is on: the IPs serve nothing else, and the question costs the runtime and
koordnode a round trip inside every pod's start. The pods started while it was off are asked
when it is turned on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from koordnode.model.state import POD_READY, NodeState
from koordnode.policy.net import PodNetwork
from koordnode.qos.net_control import NetQoSController

Spawn = Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]


class PodNetworkSource(Protocol):
    """The runtime's view of a pod's network (cri.client.RuntimeBackend)."""

    async def pod_network(self, sandbox_id: str) -> tuple[tuple[str, ...], bool] | None:
        """(IPs, host network); None when the runtime cannot say (it logs why)."""
        ...


class PodNetworks:
    """On the event loop (the state's writer); the tc and nft work goes to a thread through
    `spawn` (the daemon's, which cancels what is left at stop)."""

    def __init__(self, state: NodeState, controller: NetQoSController, runtime: PodNetworkSource,
                 spawn: Spawn) -> None:
        self._state = state
        self._controller = controller
        self._runtime = runtime
        self._spawn = spawn
        self._not_asked: set[str] = set()  # pods started while [net] was off

    def record_pod_network_soon(self, sandbox_id: str) -> None:
        """RunPodSandbox's Post hook: the IPs are asked for beside the hooks, so the pod's
        CreateContainer (whose Pre hooks wait for that Post hook) never waits for the round trip
        to the runtime; no Pre hook reads them. [net] off: remembered, to ask when it is on."""
        if self._controller.config.enable:
            self._spawn(self.record_pod_network(sandbox_id))
            return
        self._not_asked.add(sandbox_id)
        if len(self._not_asked) > 2 * len(self._state.pods) + 64:  # pods gone meanwhile
            self._not_asked &= self._state.pods.keys()

    def _ask_those_not_asked(self) -> None:
        """[net] is on: the pods started while it was off, still here, are asked now."""
        waiting, self._not_asked = self._not_asked & self._state.pods.keys(), set()
        for sandbox_id in sorted(waiting):
            self._spawn(self.record_pod_network(sandbox_id))

    async def record_pod_network(self, sandbox_id: str) -> None:
        """A new pod's IPs, then the classes with it."""
        network = await self._runtime.pod_network(sandbox_id)
        if network is None:
            return
        ips, host_network = network
        self._state.set_pod_network(sandbox_id, ips, host_network)
        self.refresh_network_classes()

    def refresh_network_classes(self) -> None:
        if self._controller.config.enable:
            self._ask_those_not_asked()
            self._spawn(asyncio.to_thread(self._controller.reconcile, self.ready_pods()))

    def ready_pods(self) -> list[PodNetwork]:
        return [
            PodNetwork(p.sandbox_id, f"{p.namespace}/{p.name}", p.qos_class, p.ips, p.host_network, p.annotations)
            for p in list(self._state.pods.values())
            if p.state == POD_READY
        ]

    def for_reconcile(self) -> list[PodNetwork]:
        """For the reconcile pass (on the loop): the ready pods; none while [net] is off (the
        pass then only removes what koordnode left). The pods started while it was off are asked
        for their IPs (after a reload turned it on), and join the classes when they answer."""
        if not self._controller.config.enable:
            return []
        self._ask_those_not_asked()
        return self.ready_pods()
