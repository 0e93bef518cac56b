"""The runtime hook that applies QoS classes at creation time (through QoSEngine)."""

from __future__ import annotations

from koordnode.hooks.chain import CallContext, RuntimeHook
from koordnode.cri.methods import INTERCEPTED_METHODS
from koordnode.hooks.qos_engine import CpuReservation, QoSEngine

UNIMPLEMENTED = 12  # grpc status code


class QoSHook(RuntimeHook):
    """Plain (threaded) methods: they write cgroup files, and a stuck write must not stall the
    relay's event loop; the chain's timeout bounds them."""

    name = "qos"
    methods = frozenset(INTERCEPTED_METHODS)
    # The only requests `pre` changes; the other calls' bookkeeping is all in `post`, so a slow
    # node can never fail them under failure_policy = "fail".
    pre_methods = frozenset({"RunPodSandbox", "CreateContainer", "UpdateContainerResources",
                             "UpdatePodSandboxResources"})

    def __init__(self, engine: QoSEngine) -> None:
        self.engine = engine

    def pre(self, call: CallContext) -> CpuReservation | None:
        """Rewrites the request; returns the CPUs reserved for a CreateContainer (the chain
        commits them with the kept request, or cancels them with a dropped one)."""
        req = call.request
        if call.method == "RunPodSandbox":
            decision = self.engine.pod_sandbox_pre(req.config)
            self.engine.place_be_pod(req.config, decision)
            # Read by the state recorder when it records the pod.
            call.scratch["qos_class"] = decision.qos_class.value
            call.scratch["qos_reason"] = decision.why
        elif call.method == "CreateContainer":
            _, reservation = self.engine.plan_create(req)
            return reservation
        elif call.method == "UpdateContainerResources":
            self.engine.update_resources_pre(req)
        elif call.method == "UpdatePodSandboxResources":
            self.engine.pod_resources_pre(req)
        return None

    def pre_inline(self, call: CallContext) -> None:
        """CreateContainer into a pod koordnode moved to the BE group: the container goes where
        its sandbox is even when `pre` overruns (a dict lookup; a stat of kernfs for a pod not
        recorded yet)."""
        if call.method == "CreateContainer":
            self.engine.follow_sandbox_parent(call.request)

    def post(self, call: CallContext) -> None:
        req, resp = call.request, call.response
        ok = call.succeeded and resp is not None
        if call.method == "RunPodSandbox":
            if ok:
                self.engine.pod_sandbox_started(resp.pod_sandbox_id, req.config)
                self.engine.kubelet_slice_after_scope_start(sandbox_id=resp.pod_sandbox_id)
        elif call.method == "CreateContainer":
            self.engine.container_created(req, resp.container_id if ok else None)
        elif call.method == "StartContainer":
            if ok:
                self.engine.container_started(req.container_id)
                self.engine.kubelet_slice_after_scope_start(container_id=req.container_id)
        elif call.method == "UpdateContainerResources":
            # The runtime has written kubelet's values (also when it failed half-way): the
            # class values of what it reports back go to the files again. NRI: at
            # PostUpdateContainer instead (this call comes before the runtime applies).
            if not call.scratch.get("runtime_applies_later"):
                self.engine.container_updated(req.container_id)
        elif call.method in ("StopContainer", "RemoveContainer"):
            if ok:
                self.engine.container_gone(req.container_id)
        elif call.method == "UpdatePodSandboxResources":
            # kubelet has resized the pod cgroup before this notification; a runtime without
            # the method (UNIMPLEMENTED, which kubelet tolerates) still gets the class values.
            if ok or call.grpc_status == UNIMPLEMENTED:
                self.engine.pod_resources_updated(req.pod_sandbox_id)
        elif call.method in ("StopPodSandbox", "RemovePodSandbox"):
            if ok:
                self.engine.pod_gone(req.pod_sandbox_id, removed=call.method == "RemovePodSandbox")
                # The state recorder ran first: a removed pod is only in the call's scratch.
                pod = self.engine.state.pods.get(req.pod_sandbox_id) or call.scratch.get("removed_pod")
                self.engine.remove_be_pod_cgroup(pod.cgroup_parent if pod is not None else "",
                                                 removed=call.method == "RemovePodSandbox")
