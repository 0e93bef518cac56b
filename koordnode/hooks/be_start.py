"""Which CRI calls and NRI events start a BE pod's sandbox or container (model/be_starts.py).

Proxy mode: RunPodSandbox, CreateContainer and StartContainer of a BE pod count from the
request to the answer; runc's work for them runs inside the pod's cgroups. RunPodSandbox's class
is the one the QoS hook's Pre just gave; the others' come from the recorded pod. No Pre stage is
added: StartContainer goes on at once, as before. NRI mode: a BE container counts from its
CreateContainer event to its PostStartContainer (or its removal); the sandbox's pause starts
before NRI hears of the pod, in kubelet's tier, where koordnode's quota does not reach.
"""

from __future__ import annotations

from koordnode.hooks.chain import CallContext
from koordnode.model.be_starts import BeStarts
from koordnode.model.qos_class import QoSClass
from koordnode.model.state import NodeState

START_METHODS = frozenset({"RunPodSandbox", "CreateContainer", "StartContainer"})
BE = QoSClass.BE.value


class BeStartWatch:
    def __init__(self, state: NodeState, starts: BeStarts) -> None:
        self.state = state
        self.starts = starts

    def _is_be_call(self, call: CallContext) -> bool:
        if call.method == "RunPodSandbox":
            classified = call.facts.pod_class
            return classified is not None and classified.qos_class == BE
        if call.method == "CreateContainer":
            return self._is_be_pod(call.request.pod_sandbox_id)
        pod = self.state.pod_of_container(call.request.container_id)
        return pod is not None and pod.qos_class == BE

    def _is_be_pod(self, sandbox_id: str) -> bool:
        pod = self.state.pods.get(sandbox_id)
        return pod is not None and pod.qos_class == BE

    def call_began(self, call: CallContext) -> None:
        """Proxy: after the call's Pre hooks, before it goes to the runtime."""
        if call.method in START_METHODS and not call.skip_hooks and self._is_be_call(call):
            self.starts.begin(_call_key(call))

    def call_ended(self, call: CallContext) -> None:
        """Proxy: the runtime answered (or the call failed)."""
        if call.method in START_METHODS:
            self.starts.end(_call_key(call))

    def container_creating(self, sandbox_id: str, container_id: str) -> None:
        """NRI: CreateContainer of a container of a recorded pod."""
        if self._is_be_pod(sandbox_id):
            self.starts.begin(f"container:{container_id}")

    def container_started(self, container_id: str) -> None:
        """NRI: PostStartContainer or RemoveContainer."""
        self.starts.end(f"container:{container_id}")


def _call_key(call: CallContext) -> str:
    return f"call:{id(call)}"
