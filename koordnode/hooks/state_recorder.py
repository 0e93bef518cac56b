"""Keeps NodeState current from the intercepted calls' outcomes."""

from __future__ import annotations

from koordnode.cri import api_pb2 as pb
from koordnode.hooks.chain import CallContext, RuntimeHook
from koordnode.cri.methods import INTERCEPTED_METHODS
from koordnode.model.state import (
    CONTAINER_CREATED,
    CONTAINER_EXITED,
    CONTAINER_RUNNING,
    POD_NOTREADY,
    ContainerRecord,
    NodeState,
    PodRecord,
)


class StateRecorder(RuntimeHook):
    name = "state-recorder"
    methods = frozenset(INTERCEPTED_METHODS)

    def __init__(self, state: NodeState) -> None:
        self.state = state

    # Async on purpose: it does no I/O, so it runs on the event loop, never in a thread,
    # and NodeState has a single writer.
    async def post(self, call: CallContext) -> None:
        # RemovePodSandbox / RemoveContainer of something already gone answers OK too; a failed
        # call changes nothing.
        if not call.succeeded:
            return
        req, resp, state = call.request, call.response, self.state
        method = call.method
        if method == "RunPodSandbox":
            cfg = req.config
            state.put_pod(
                PodRecord(
                    sandbox_id=resp.pod_sandbox_id,
                    name=cfg.metadata.name,
                    namespace=cfg.metadata.namespace,
                    uid=cfg.metadata.uid,
                    labels=dict(cfg.labels),
                    annotations=dict(cfg.annotations),
                    cgroup_parent=cfg.linux.cgroup_parent,
                    runtime_handler=req.runtime_handler,
                    qos_class=call.scratch.get("qos_class"),
                    qos_reason=call.scratch.get("qos_reason", ""),
                    ips=tuple(call.scratch.get("pod_ips", ())),
                )
            )
        elif method == "StopPodSandbox":
            state.set_pod_state(req.pod_sandbox_id, POD_NOTREADY)
            state.set_pod_containers_state(req.pod_sandbox_id, CONTAINER_EXITED)
        elif method == "RemovePodSandbox":
            # Hooks after this one still need what the pod was (e.g. its cgroup parent).
            call.scratch["removed_pod"] = state.remove_pod(req.pod_sandbox_id)
        elif method == "CreateContainer":
            cfg = req.config
            resources = pb.LinuxContainerResources()
            resources.CopyFrom(cfg.linux.resources)
            state.put_container(
                ContainerRecord(
                    container_id=resp.container_id,
                    sandbox_id=req.pod_sandbox_id,
                    name=cfg.metadata.name,
                    labels=dict(cfg.labels),
                    annotations=dict(cfg.annotations),
                    resources=resources,
                    image=cfg.image.image,
                    state=CONTAINER_CREATED,
                )
            )
        elif method == "StartContainer":
            state.set_container_state(req.container_id, CONTAINER_RUNNING)
        elif method == "UpdateContainerResources":
            if req.HasField("linux"):
                state.update_container_resources(req.container_id, req.linux)
        elif method == "StopContainer":
            state.set_container_state(req.container_id, CONTAINER_EXITED)
        elif method == "RemoveContainer":
            state.remove_container(req.container_id)
