"""Keeps NodeState current from the intercepted calls' outcomes."""

from __future__ import annotations

from collections.abc import Iterable

from koordnode.cri import api_pb2 as pb
from koordnode.hooks.chain import CallContext, Phase, RuntimeHook, Stage
from koordnode.model.state import (
    CONTAINER_CREATED,
    CONTAINER_EXITED,
    CONTAINER_RUNNING,
    POD_NOTREADY,
    ContainerRecord,
    NodeState,
    PodRecord,
)


class StateRecorder:
    """Loop stages on purpose: it does no I/O, so it runs on the event loop, never in a thread,
    and NodeState has a single writer. It must be the first hook: the others' Post stages read
    what it recorded. A failed call changes nothing (RemovePodSandbox / RemoveContainer of
    something already gone answers OK too)."""

    name = "state-recorder"

    def __init__(self, state: NodeState) -> None:
        self.state = state

    def stages(self) -> Iterable[Stage]:
        post = Phase.POST
        return (
            Stage.on_loop("RunPodSandbox", post, self.pod_started),
            Stage.on_loop("StopPodSandbox", post, self.pod_stopped),
            Stage.on_loop("RemovePodSandbox", post, self.pod_removed),
            Stage.on_loop("CreateContainer", post, self.container_created),
            Stage.on_loop("StartContainer", post, self.container_started),
            Stage.on_loop("UpdateContainerResources", post, self.container_updated),
            Stage.on_loop("StopContainer", post, self.container_stopped),
            Stage.on_loop("RemoveContainer", post, self.container_removed),
        )

    async def pod_started(self, call: CallContext) -> None:
        if not call.succeeded:
            return
        req, cfg, classified = call.request, call.request.config, call.facts.pod_class
        self.state.put_pod(
            PodRecord(
                sandbox_id=call.response.pod_sandbox_id,
                name=cfg.metadata.name,
                namespace=cfg.metadata.namespace,
                uid=cfg.metadata.uid,
                labels=dict(cfg.labels),
                annotations=dict(cfg.annotations),
                cgroup_parent=cfg.linux.cgroup_parent,
                runtime_handler=req.runtime_handler,
                qos_class=classified.qos_class if classified is not None else None,
                qos_reason=classified.reason if classified is not None else "",
                ips=call.facts.pod_ips or (),
            )
        )

    async def pod_stopped(self, call: CallContext) -> None:
        if call.succeeded:
            self.state.set_pod_state(call.request.pod_sandbox_id, POD_NOTREADY)
            self.state.set_pod_containers_state(call.request.pod_sandbox_id, CONTAINER_EXITED)

    async def pod_removed(self, call: CallContext) -> None:
        if call.succeeded:
            # Hooks after this one still need what the pod was (e.g. its cgroup parent).
            call.facts.removed_pod = self.state.remove_pod(call.request.pod_sandbox_id)

    async def container_created(self, call: CallContext) -> None:
        if not call.succeeded:
            return
        req, cfg = call.request, call.request.config
        resources = pb.LinuxContainerResources()
        resources.CopyFrom(cfg.linux.resources)
        self.state.put_container(
            ContainerRecord(
                container_id=call.response.container_id,
                sandbox_id=req.pod_sandbox_id,
                name=cfg.metadata.name,
                labels=dict(cfg.labels),
                annotations=dict(cfg.annotations),
                resources=resources,
                image=cfg.image.image,
                state=CONTAINER_CREATED,
            )
        )

    async def container_started(self, call: CallContext) -> None:
        if call.succeeded:
            self.state.set_container_state(call.request.container_id, CONTAINER_RUNNING)

    async def container_updated(self, call: CallContext) -> None:
        if call.succeeded and call.request.HasField("linux"):
            self.state.update_container_resources(call.request.container_id, call.request.linux)

    async def container_stopped(self, call: CallContext) -> None:
        if call.succeeded:
            self.state.set_container_state(call.request.container_id, CONTAINER_EXITED)

    async def container_removed(self, call: CallContext) -> None:
        if call.succeeded:
            self.state.remove_container(call.request.container_id)


_: type[RuntimeHook] = StateRecorder
