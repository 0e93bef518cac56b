"""Post hooks for the hardware QoS that needs a pod running: its IPs (tc classes), its threads
(resctrl). What to do is handed in by constructor (the network and resctrl components); this
hook only says when."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol

from koordnode.hooks.chain import CallContext, Phase, RuntimeHook, Stage


class PodNetworkBook(Protocol):
    """Keeps the pods' networks and the network classes built from them."""

    def record_pod_network_soon(self, sandbox_id: str) -> None:
        """Ask the runtime for a new pod's IPs, then refresh the classes: started on the loop,
        not waited for (the pod's next call must not wait for the runtime's answer)."""

    def refresh_network_classes(self) -> None:
        """Rebuild the network classes from the pods recorded now (on the loop; the work goes
        to a thread)."""


class ResctrlPlacement(Protocol):
    @property
    def enabled(self) -> bool:
        """Whether containers are placed at all ([resctrl] enable)."""
        ...

    def place_container(self, container_id: str) -> None:
        """Put a started container's threads in its class's resctrl group (blocking I/O)."""


class HardwareQoSHook:
    """After RunPodSandbox: record the pod's network; after StartContainer: place the container in
    its resctrl group; after a pod stops or goes: refresh the network classes."""

    name = "hw-qos"

    def __init__(self, *, networks: PodNetworkBook, resctrl: ResctrlPlacement) -> None:
        self._networks = networks
        self._resctrl = resctrl

    def stages(self) -> Iterable[Stage]:
        post = Phase.POST
        return (
            Stage.on_loop("RunPodSandbox", post, self.pod_started),
            Stage.on_loop("StartContainer", post, self.container_started),
            Stage.on_loop("StopPodSandbox", post, self.pod_gone),
            Stage.on_loop("RemovePodSandbox", post, self.pod_gone),
        )

    async def pod_started(self, call: CallContext) -> None:
        if not call.succeeded or call.response is None:
            return
        if call.facts.pod_ips is not None:  # NRI mode: the runtime said; CRI does not know the pod yet
            self._networks.refresh_network_classes()
        else:
            self._networks.record_pod_network_soon(call.response.pod_sandbox_id)

    async def container_started(self, call: CallContext) -> None:
        # On the loop, to a thread only where resctrl is on (NRI: the runtime waits for this answer).
        if call.succeeded and call.response is not None and self._resctrl.enabled:
            await asyncio.to_thread(self._resctrl.place_container, call.request.container_id)

    async def pod_gone(self, call: CallContext) -> None:
        # A pod stopped or went away: its IPs leave the network classes now.
        if call.succeeded and call.response is not None:
            self._networks.refresh_network_classes()


_: type[RuntimeHook] = HardwareQoSHook
