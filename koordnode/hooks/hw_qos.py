"""Post hooks for the hardware QoS that needs a pod running: its IPs (tc classes), its threads
(resctrl). What to do is handed in by constructor (the daemon's network and resctrl wiring);
this hook only says when."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from koordnode.hooks.chain import CallContext, RuntimeHook


class HardwareQoSHook(RuntimeHook):
    """After RunPodSandbox: record the pod's network; after StartContainer: place the container in
    its resctrl group; after a pod stops or goes: refresh the network classes."""

    name = "hw-qos"
    methods = frozenset({"RunPodSandbox", "StartContainer", "StopPodSandbox", "RemovePodSandbox"})

    def __init__(
        self,
        *,
        record_pod_network: Callable[[str], Awaitable[None]],
        refresh_network_classes: Callable[[], None],
        place_container_resctrl: Callable[[str], None],
    ) -> None:
        self._record_pod_network = record_pod_network
        self._refresh_network_classes = refresh_network_classes
        self._place_container_resctrl = place_container_resctrl

    async def post(self, call: CallContext) -> None:
        if not call.succeeded or call.response is None:
            return
        if call.method == "RunPodSandbox":
            if "pod_ips" in call.scratch:  # NRI mode: the runtime said; CRI does not know the pod yet
                self._refresh_network_classes()
            else:
                await self._record_pod_network(call.response.pod_sandbox_id)
        elif call.method == "StartContainer":
            await asyncio.to_thread(self._place_container_resctrl, call.request.container_id)
        else:  # a pod stopped or went away: its IPs leave the network classes now
            self._refresh_network_classes()
