"""The runtime hook that applies QoS classes at creation time (through QoSEngine)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from koordnode.hooks.chain import CallContext, Phase, PodClassified, RuntimeHook, Stage
from koordnode.hooks.cpu_pools import CpuReservation
from koordnode.hooks.qos_engine import QoSEngine

UNIMPLEMENTED = 12  # grpc status code


class QoSHook:
    """Thread stages: they write cgroup files, and a stuck write must not stall the relay's
    event loop; the chain's timeout bounds them (RunPodSandbox's Post decides on the loop whether
    it has file work). Pre stages only for the requests it changes, so a slow node can never
    fail the other calls under failure_policy = "fail"."""

    name = "qos"

    def __init__(self, engine: QoSEngine) -> None:
        self.engine = engine

    def stages(self) -> Iterable[Stage]:
        pre, post = Phase.PRE, Phase.POST
        return (
            Stage.in_thread("RunPodSandbox", pre, self.classify_pod),
            Stage.inline("CreateContainer", self.follow_sandbox_parent),
            Stage.in_thread("CreateContainer", pre, self.plan_container),
            Stage.in_thread("UpdateContainerResources", pre, self.resize_container),
            Stage.in_thread("UpdatePodSandboxResources", pre, self.resize_pod),
            Stage.on_loop("RunPodSandbox", post, self.pod_started),
            Stage.in_thread("CreateContainer", post, self.container_created),
            Stage.in_thread("StartContainer", post, self.container_started),
            Stage.in_thread("UpdateContainerResources", post, self.container_updated),
            Stage.in_thread("StopContainer", post, self.container_gone),
            Stage.in_thread("RemoveContainer", post, self.container_gone),
            Stage.in_thread("UpdatePodSandboxResources", post, self.pod_resized),
            Stage.in_thread("StopPodSandbox", post, self.pod_gone),
            Stage.in_thread("RemovePodSandbox", post, self.pod_gone),
        )

    # ---- Pre ---------------------------------------------------------------------------

    def classify_pod(self, call: CallContext) -> None:
        config = call.request.config
        decision = self.engine.pod_sandbox_pre(config)
        self.engine.place_be_pod(config, decision)
        call.facts.pod_class = PodClassified(decision.qos_class.value, decision.why)

    def follow_sandbox_parent(self, call: CallContext) -> None:
        """CreateContainer into a pod koordnode moved to the BE group: the container goes where
        its sandbox is even when the Pre stage overruns (a dict lookup; a stat of kernfs for a pod
        not recorded yet)."""
        self.engine.follow_sandbox_parent(call.request)

    def plan_container(self, call: CallContext) -> CpuReservation | None:
        """Rewrites the request; returns the CPUs reserved for it (the chain commits them with the
        kept request, or cancels them with a dropped one)."""
        _, reservation = self.engine.plan_create(call.request)
        return reservation

    def resize_container(self, call: CallContext) -> None:
        self.engine.update_resources_pre(call.request)

    def resize_pod(self, call: CallContext) -> None:
        self.engine.pod_resources_pre(call.request)

    # ---- Post --------------------------------------------------------------------------

    async def pod_started(self, call: CallContext) -> None:
        """The pod's class values go to its cgroup with its first container's start (the
        container_started apply covers the pod): the sandbox's pause process needs none, and one
        apply instead of two is CPU kubelet's next calls on a busy node do not wait for. Here only
        a pod in the systemd BE group has file work (its kubelet slice), in a thread; the others
        cost no hop to one."""
        if call.succeeded and call.response is not None and self.engine.has_kubelet_slice(call.response.pod_sandbox_id):
            await asyncio.to_thread(self.engine.kubelet_slice_after_scope_start,
                                    sandbox_id=call.response.pod_sandbox_id)

    def container_created(self, call: CallContext) -> None:
        ok = call.succeeded and call.response is not None
        self.engine.container_created(call.request, call.response.container_id if ok else None)

    def container_started(self, call: CallContext) -> None:
        if call.succeeded and call.response is not None:
            self.engine.container_started(call.request.container_id)
            self.engine.kubelet_slice_after_scope_start(container_id=call.request.container_id)

    def container_updated(self, call: CallContext) -> None:
        if self.name in call.facts.pre_dropped:
            # The runtime got kubelet's request unchanged: what kubelet asks is learnt here.
            self.engine.kubelet_resized_unrewritten(call.request)
        # The runtime has written kubelet's values (also when it failed half-way): the class
        # values of what it reports back go to the files again. NRI: at PostUpdateContainer
        # instead (this call comes before the runtime applies).
        if not call.facts.runtime_applies_later:
            self.engine.container_updated(call.request.container_id)

    def container_gone(self, call: CallContext) -> None:
        if call.succeeded and call.response is not None:
            self.engine.container_gone(call.request.container_id)

    def pod_resized(self, call: CallContext) -> None:
        if self.name in call.facts.pre_dropped:
            self.engine.pod_resized_unrewritten(call.request)
        # kubelet has resized the pod cgroup before this notification; a runtime without the
        # method (UNIMPLEMENTED, which kubelet tolerates) still gets the class values.
        if (call.succeeded and call.response is not None) or call.grpc_status == UNIMPLEMENTED:
            self.engine.pod_resources_updated(call.request.pod_sandbox_id)

    def pod_gone(self, call: CallContext) -> None:
        if not call.succeeded or call.response is None:
            return
        sandbox_id = call.request.pod_sandbox_id
        removed = call.method == "RemovePodSandbox"
        self.engine.pod_gone(sandbox_id, removed=removed)
        # The state recorder's Post ran first: a removed pod is only in the call's facts.
        pod = self.engine.state.pods.get(sandbox_id) or call.facts.removed_pod
        self.engine.remove_be_pod_cgroup(pod.cgroup_parent if pod is not None else "", removed=removed)


_: type[RuntimeHook] = QoSHook
