"""NRI events as the CRI calls they stand for, run through the hook chain (see convert.py): what
CreateContainer's hooks changed goes back as the container's adjustment, a resize's class
values as its update."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from koordnode.cri import api_pb2 as cri
from koordnode.hooks.be_start import BeStartWatch
from koordnode.hooks.chain import CallContext, CallFacts, HookChain
from koordnode.hooks.qos_engine import QoSEngine
from koordnode.model.state import NodeState
from koordnode.nri import api_pb2 as nri
from koordnode.nri import convert
from koordnode.nri.container_updates import ContainerUpdates
from koordnode.nri.oom import OomScoreAdj

log = structlog.get_logger("koordnode.nri")


class NriEvents:
    def __init__(self, chain: HookChain, state: NodeState, engine: QoSEngine | None, updates: ContainerUpdates,
                 oom: OomScoreAdj, spawn: Callable[[Coroutine[Any, Any, Any]], object],
                 be_starts: BeStartWatch | None = None) -> None:
        self.chain = chain
        self.be_starts = be_starts  # a BE container counts as starting until PostStartContainer
        self.spawn = spawn  # work that follows an answer (the plugin keeps and cancels it)
        self.state = state
        self.engine = engine
        self.updates = updates
        self.oom = oom
        self.dry_run = False  # set with the plugin's

    async def state_change(self, ev: nri.StateChangeEvent) -> None:
        handlers = {
            nri.RUN_POD_SANDBOX: lambda: self.run_pod_sandbox(ev.pod),
            nri.STOP_POD_SANDBOX: lambda: self.stop_pod_sandbox(ev.pod),
            nri.REMOVE_POD_SANDBOX: lambda: self.remove_pod_sandbox(ev.pod),
            nri.POST_START_CONTAINER: lambda: self.post_start_container(ev.pod, ev.container),
            nri.POST_UPDATE_CONTAINER: lambda: self.post_update_container(ev.pod, ev.container),
            nri.REMOVE_CONTAINER: lambda: self.remove_container(ev.pod, ev.container),
        }
        handler = handlers.get(ev.event)
        if handler is not None:
            await handler()
        return None

    async def _hooks(self, method: str, request: Any, response: Any, labels: dict[str, str],
                     facts: CallFacts | None = None, *, answer_first: bool = False) -> CallContext:
        original = type(request)()
        original.CopyFrom(request)
        call = CallContext(method=method, request=request, pod_labels=labels, facts=facts or CallFacts())
        await self.chain.run_pre(call)
        if self.dry_run:  # the Post hooks (state recorder) see what the runtime really has
            call.request = original
        call.response, call.grpc_status = response, 0
        if answer_first:
            # The runtime waits for an answer that carries nothing: the Post hooks run after it,
            # and still before the Pre hooks of the next event (the pod's CreateContainer).
            self.chain.schedule_post(call)
        else:
            await self.chain.run_post_now(call)
        return call

    def _labels_of(self, pod: nri.PodSandbox) -> dict[str, str]:
        """The pod's labels (for the skip label): as the runtime sent them, else as recorded."""
        if pod.labels:
            return dict(pod.labels)
        record = self.state.pods.get(pod.id)
        return dict(record.labels) if record is not None else {}

    async def run_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        req = cri.RunPodSandboxRequest(config=convert.sandbox_config(pod), runtime_handler=pod.runtime_handler)
        await self._hooks("RunPodSandbox", req, cri.RunPodSandboxResponse(pod_sandbox_id=pod.id), dict(pod.labels),
                          facts=CallFacts(pod_ips=tuple(pod.ips)), answer_first=True)

    async def stop_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        await self._hooks("StopPodSandbox", cri.StopPodSandboxRequest(pod_sandbox_id=pod.id),
                          cri.StopPodSandboxResponse(), self._labels_of(pod))

    async def remove_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        await self._hooks("RemovePodSandbox", cri.RemovePodSandboxRequest(pod_sandbox_id=pod.id),
                          cri.RemovePodSandboxResponse(), self._labels_of(pod))
        self.updates.flush_soon()

    async def create_container(self, pod: nri.PodSandbox, container: nri.Container) -> nri.CreateContainerResponse:
        request = convert.create_request(pod, container)
        original = cri.CreateContainerRequest()
        original.CopyFrom(request)
        call = CallContext(method="CreateContainer", request=request, pod_labels=dict(pod.labels))
        floor = self.oom.floor
        with self.updates.collecting():
            await self.chain.run_pre(call)
            try:
                adjust = convert.adjustment(original, call.request, container)
            except convert.CgroupsPathNotMoved as exc:
                # The container stays where the runtime put it, and is recorded there.
                log.warning("be_container_not_moved_to_be_group", container_id=container.id, problem=str(exc))
                call.request.sandbox_config.linux.cgroup_parent = original.sandbox_config.linux.cgroup_parent
                adjust = convert.adjustment(original, call.request, container)
            if (floor is not None and adjust.linux.HasField("oom_score_adj")
                    and adjust.linux.oom_score_adj.value < floor):
                floor = max(floor, original.config.linux.resources.oom_score_adj)
                if floor == original.config.linux.resources.oom_score_adj:
                    adjust.linux.ClearField("oom_score_adj")
                else:
                    adjust.linux.oom_score_adj.value = floor
            if self.dry_run:  # the plugin withholds the adjustment; the state records kubelet's values
                call.request = original
            call.response, call.grpc_status = cri.CreateContainerResponse(container_id=container.id), 0
            await self.chain.run_post_now(call)
            updates = self.updates.take()
        if self.be_starts is not None:
            self.be_starts.container_creating(pod.id, container.id)
        if call.hook_failures:
            log.warning("hooks_failed_container_unchanged", detail="container created without the hooks' changes",
                        container_id=container.id,
                        failures=call.hook_failures)
        return nri.CreateContainerResponse(adjust=adjust, update=self.updates.answered(updates))

    async def post_start_container(self, pod: nri.PodSandbox, container: nri.Container) -> None:
        if self.be_starts is not None:
            self.be_starts.container_started(container.id)
        await self._hooks("StartContainer", cri.StartContainerRequest(container_id=container.id),
                          cri.StartContainerResponse(), dict(pod.labels), answer_first=True)
        # The process already runs with the runtime's value, and the runtime's StartContainer
        # waits for this answer: the class value (a thread hop and a write) follows it.
        self.spawn(self._oom_after_start(container))

    async def _oom_after_start(self, container: nri.Container) -> None:
        try:
            await self.oom.after_start(container)
        except Exception:  # nobody awaits this task: say it here
            log.exception("oom_score_adj_after_start_failed", container_id=container.id)

    async def update_container(self, req: nri.UpdateContainerRequest) -> nri.UpdateContainerResponse:
        """kubelet changes a container's resources (resize): keep the class values on top."""
        asked = convert.cri_resources(req.linux_resources)
        request = cri.UpdateContainerResourcesRequest(container_id=req.container.id, linux=asked)
        # The runtime applies the update after this answer: the class values of what it
        # writes from kubelet's request follow at PostUpdateContainer.
        call = await self._hooks("UpdateContainerResources", request, cri.UpdateContainerResourcesResponse(),
                                 dict(req.pod.labels), facts=CallFacts(runtime_applies_later=True))
        delta = convert.resources_delta(asked, call.request.linux)
        if delta is None:
            return nri.UpdateContainerResponse()
        update = nri.ContainerUpdate(container_id=req.container.id)
        update.linux.resources.CopyFrom(delta)
        return nri.UpdateContainerResponse(update=[update])

    async def post_update_container(self, pod: nri.PodSandbox, container: nri.Container) -> None:
        """The runtime has applied an update with kubelet's values of the fields it reports back
        (cpu shares, quota, memory limit: never adjusted, see policy REPORTED_BY_RUNTIME): the
        class values go to the container's cgroup again."""
        if self.engine is None:
            return
        await asyncio.to_thread(self.engine.container_updated, container.id)

    async def stop_container(self, pod: nri.PodSandbox, container: nri.Container) -> nri.StopContainerResponse:
        with self.updates.collecting():
            await self._hooks("StopContainer", cri.StopContainerRequest(container_id=container.id),
                              cri.StopContainerResponse(), dict(pod.labels))
            updates = self.updates.take()
        return nri.StopContainerResponse(update=self.updates.answered(updates))

    async def remove_container(self, pod: nri.PodSandbox, container: nri.Container) -> None:
        if self.be_starts is not None:
            self.be_starts.container_started(container.id)  # created, never started
        await self._hooks("RemoveContainer", cri.RemoveContainerRequest(container_id=container.id),
                          cri.RemoveContainerResponse(), dict(pod.labels))
        self.updates.flush_soon()

    async def update_pod_sandbox(self, req: nri.UpdatePodSandboxRequest) -> None:
        # Pod-level values are the engine's (reconcile); nothing to change in the runtime's update.
        log.debug("pod_sandbox_update_seen", sandbox_id=req.pod.id)
