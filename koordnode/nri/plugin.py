"""koordnode as an external NRI plugin: containerd calls the hooks itself, no proxy in between.

The plugin connects to the runtime's NRI socket, registers, and serves the plugin service on
the same connection. Each NRI event is handed to the hook chain as the CRI call it stands
for (see convert.py), so the QoS engine, state recorder and hardware hooks work unchanged;
what CreateContainer's hooks changed goes back as the container's adjustment, and pool
changes of other containers as NRI container updates.

Fail-open: the runtime waits for a plugin at most its request timeout (2 s by default). Every
answer is given well inside it; a hook that fails or is late yields an answer without changes,
and the container is created as kubelet asked. When the connection drops (runtime restart)
the plugin reconnects, registers again, and the runtime's Synchronize rebuilds the state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

import structlog

from koordnode.cri import api_pb2 as cri
from koordnode.executor.process import oom_score_adj_floor, oom_score_adj_wanted, set_oom_score_adj
from koordnode.hooks.chain import CallContext, CallFacts, HookChain, HookFailed
from koordnode.hooks.pool_updates import PoolUpdates
from koordnode.hooks.qos_engine import QoSEngine
from koordnode.nri import api_pb2 as nri
from koordnode.nri import convert
from koordnode.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Mux, MuxClosed
from koordnode.nri.ttrpc import INTERNAL, TtrpcClient, TtrpcError, TtrpcServer, Handler
from koordnode.model.state import CONTAINER_RUNNING, POD_READY, NodeState, NodeView, RecordedResources

log = structlog.get_logger("koordnode.nri")

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"

# What koordnode needs. POST_START (not START): pod-level values need the container running.
BASE_EVENTS = (
    nri.RUN_POD_SANDBOX, nri.STOP_POD_SANDBOX, nri.REMOVE_POD_SANDBOX, nri.CREATE_CONTAINER,
    nri.POST_START_CONTAINER, nri.UPDATE_CONTAINER, nri.POST_UPDATE_CONTAINER, nri.STOP_CONTAINER,
    nri.REMOVE_CONTAINER,
)
# Runtimes whose NRI predates UpdatePodSandbox refuse a subscription naming it; those that
# announce their NRI version in Configure know it.
UPDATE_POD_SANDBOX_EVENTS = (nri.UPDATE_POD_SANDBOX,)

REGISTER_TIMEOUT_S = 5.0
# The runtime applies a container update (a pool move, Synchronize's) by writing every resource
# of the container's spec to its cgroup again: kubelet's cpu shares, quota and memory limit too,
# which the spec keeps (policy REPORTED_BY_RUNTIME). Their class values go back once it has: at
# once after an UpdateContainers call, this long after an answer that carried updates.
RUNTIME_APPLIES_ANSWER_S = 1.0
DEFAULT_REQUEST_TIMEOUT_MS = 2000
# Share of the runtime's request timeout an answer may take; the rest is transport and slack.
ANSWER_SHARE = 0.6
UPDATE_TIMEOUT_S = 5.0


def event_mask(events: Iterable[int]) -> int:
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


class NriStats:
    def __init__(self) -> None:
        self.connected = False
        self.connected_since: float | None = None
        self.registrations = 0
        self.synchronizations = 0
        self.last_error: str | None = None
        self.runtime = ""
        self.events: Counter[str] = Counter()
        self.answer_seconds: defaultdict[str, float] = defaultdict(float)  # total time to answer, per event
        self.answer_max_seconds: dict[str, float] = {}
        self.late_answers: Counter[str] = Counter()
        self.updates_answered = 0  # in CreateContainer/StopContainer/Synchronize answers
        self.updates_sent = 0  # unsolicited (UpdateContainers)
        self.updates_failed = 0
        self.dry_run_withheld: Counter[str] = Counter()  # answers with changes a dry run did not send

    def as_dict(self) -> dict[str, Any]:
        return {
            "connected": self.connected,
            "connected_since": self.connected_since,
            "registrations": self.registrations,
            "synchronizations": self.synchronizations,
            "runtime": self.runtime,
            "last_error": self.last_error,
            "events": dict(self.events),
            "answer_ms": {name: {"mean": round(total * 1000 / max(self.events[name], 1), 2),
                                 "max": round(self.answer_max_seconds.get(name, 0.0) * 1000, 2)}
                          for name, total in self.answer_seconds.items()},
            "answered_without_changes_after_deadline": dict(self.late_answers),
            "container_updates_in_answers": self.updates_answered,
            "container_updates_sent": self.updates_sent,
            "container_updates_failed": self.updates_failed,
            "dry_run_answers_without_changes": dict(self.dry_run_withheld),
        }


class NriPlugin:
    def __init__(self, socket_path: str, plugin_name: str, plugin_index: str, *, chain: HookChain,
                 state: NodeState, engine: QoSEngine | None,
                 on_synchronized: Callable[[], Coroutine[Any, Any, None]] | None = None, procfs_root: str = "/proc",
                 pool_updates: PoolUpdates | None = None) -> None:
        """`pool_updates`: the channel the engine publishes pool moves of running containers on
        (the same one handed to the engine); the plugin delivers them to the runtime."""
        self.socket_path = socket_path
        self.plugin_name = plugin_name
        self.plugin_index = plugin_index
        self.chain = chain
        self.state = state
        self.engine = engine
        self.on_synchronized = on_synchronized
        self.procfs_root = procfs_root
        # kubelet's own resources by container id, from the runtime's CRI view (given to run()).
        self.kubelet_view: NodeState | None = None
        self.stats = NriStats()
        # Dry run: every event is decided as usual, but the runtime gets answers without changes,
        # no container updates and no oom_score_adj writes (set by the daemon, also on reload).
        self.dry_run = False
        self.request_timeout_s = DEFAULT_REQUEST_TIMEOUT_MS / 1000
        self._client: TtrpcClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sync_pods: list[nri.PodSandbox] = []
        self._sync_containers: list[nri.Container] = []
        self.pool_updates = pool_updates if pool_updates is not None else PoolUpdates()
        self.pool_updates.subscribe(self._pool_changed)
        self._collecting = 0
        self._flush_wanted = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()
        self._late: set[asyncio.Future[Any]] = set()  # work answered without changes, still running
        self.oom_floor = oom_score_adj_floor()
        if self.oom_floor is not None:
            log.warning("oom_score_adj_clamped",
                        detail="no CAP_SYS_RESOURCE: oom_score_adj below koordnode's own is clamped to it, "
                               "as containerd's restrict_oom_score_adj does", floor=self.oom_floor)

    # ---- connection -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, *, kubelet_view: NodeState | None = None,
                  max_backoff_s: float = 5.0) -> None:
        """Connect, register and serve; reconnect whenever the runtime goes away.

        `kubelet_view`: the runtime's CRI view (kubelet's own container resources), None when
        it could not be read: the resources containers run with are taken for kubelet's then."""
        self._loop = asyncio.get_running_loop()
        self.kubelet_view = kubelet_view
        flusher = self._spawn(self._flush_loop())
        backoff = 0.2
        try:
            while not stop.is_set():
                try:
                    reader, writer = await asyncio.open_unix_connection(self.socket_path)
                except OSError as exc:
                    self._note_error(f"cannot connect to {self.socket_path}: {exc.strerror or exc}", backoff)
                else:
                    backoff = 0.2
                    await self._session(reader, writer, stop)
                    if stop.is_set():
                        break
                try:
                    await asyncio.wait_for(stop.wait(), backoff)
                except TimeoutError:
                    pass
                backoff = min(backoff * 2, max_backoff_s)
        finally:
            flusher.cancel()

    def _note_error(self, error: str, retry_in_s: float) -> None:
        if error != self.stats.last_error:
            log.warning("nri_runtime_unreachable", detail="will retry", error=error, retry_in_s=retry_in_s)
        self.stats.last_error = error

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       stop: asyncio.Event) -> None:
        mux = Mux(reader, writer)
        server = TtrpcServer(mux.open(PLUGIN_SERVICE_CONN), self._handlers())
        client = TtrpcClient(mux.open(RUNTIME_SERVICE_CONN))
        tasks = [self._spawn(mux.run()), self._spawn(server.serve()), self._spawn(client.receive())]
        stopper = self._spawn(stop.wait())
        try:
            request = nri.RegisterPluginRequest(plugin_name=self.plugin_name, plugin_idx=self.plugin_index)
            try:
                await client.call(RUNTIME_SERVICE, "RegisterPlugin", request.SerializeToString(), REGISTER_TIMEOUT_S)
            except (TtrpcError, MuxClosed) as exc:
                self._note_error(f"registration refused: {exc}", 0.2)
                return
            self._client = client
            self.stats.connected, self.stats.connected_since = True, time.time()
            self.stats.registrations += 1
            self.stats.last_error = None
            log.info("nri_plugin_registered", socket=self.socket_path,
                     plugin=self.plugin_name, index=self.plugin_index)
            await asyncio.wait([tasks[0], stopper], return_when=asyncio.FIRST_COMPLETED)
            if not stop.is_set():
                log.warning("nri_connection_lost", detail="reconnecting", reason=mux.close_reason)
                self.stats.last_error = f"connection lost: {mux.close_reason}"
        finally:
            self._client = None
            self.stats.connected = False
            mux.close("plugin stopping" if stop.is_set() else mux.close_reason)
            for task in [*tasks, stopper]:
                task.cancel()
            await asyncio.gather(*tasks, stopper, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # ---- the plugin service ---------------------------------------------------------------

    def _handlers(self) -> dict[tuple[str, str], Handler]:
        def rpc(request_cls: Any, fn: Callable[[Any], Any], empty_cls: Any, name: str | None = None) -> Handler:
            async def handler(payload: bytes) -> bytes:
                request = request_cls.FromString(payload)
                label = name or _event_label(request.event)
                return (await self._answer(label, fn(request), empty_cls)).SerializeToString()
            return handler

        def pod_event(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
            return lambda req: fn(req.pod)

        def container_event(fn: Callable[[Any, Any], Any]) -> Callable[[Any], Any]:
            return lambda req: fn(req.pod, req.container)

        empty = nri.Empty
        return {
            (PLUGIN_SERVICE, "Configure"): self._configure_handler,
            (PLUGIN_SERVICE, "Synchronize"): self._synchronize_handler,
            (PLUGIN_SERVICE, "Shutdown"): self._shutdown_handler,
            (PLUGIN_SERVICE, "StateChange"): rpc(nri.StateChangeEvent, self._state_change, empty),
            (PLUGIN_SERVICE, "CreateContainer"): rpc(nri.CreateContainerRequest, container_event(self._create_container),
                                                     nri.CreateContainerResponse, "CreateContainer"),
            (PLUGIN_SERVICE, "UpdateContainer"): rpc(nri.UpdateContainerRequest, self._update_container,
                                                     nri.UpdateContainerResponse, "UpdateContainer"),
            (PLUGIN_SERVICE, "StopContainer"): rpc(nri.StopContainerRequest, container_event(self._stop_container),
                                                   nri.StopContainerResponse, "StopContainer"),
            # Newer runtimes send these as calls of their own rather than as StateChange.
            (PLUGIN_SERVICE, "RunPodSandbox"): rpc(nri.RunPodSandboxRequest, pod_event(self._run_pod_sandbox),
                                                   nri.RunPodSandboxResponse, "RunPodSandbox"),
            (PLUGIN_SERVICE, "StopPodSandbox"): rpc(nri.StopPodSandboxRequest, pod_event(self._stop_pod_sandbox),
                                                    nri.StopPodSandboxResponse, "StopPodSandbox"),
            (PLUGIN_SERVICE, "RemovePodSandbox"): rpc(nri.RemovePodSandboxRequest, pod_event(self._remove_pod_sandbox),
                                                      nri.RemovePodSandboxResponse, "RemovePodSandbox"),
            (PLUGIN_SERVICE, "PostStartContainer"): rpc(nri.PostStartContainerRequest,
                                                        container_event(self._post_start_container),
                                                        nri.PostStartContainerResponse, "PostStartContainer"),
            (PLUGIN_SERVICE, "PostUpdateContainer"): rpc(nri.PostUpdateContainerRequest,
                                                         container_event(self._post_update_container),
                                                         nri.PostUpdateContainerResponse, "PostUpdateContainer"),
            (PLUGIN_SERVICE, "RemoveContainer"): rpc(nri.RemoveContainerRequest,
                                                     container_event(self._remove_container),
                                                     nri.RemoveContainerResponse, "RemoveContainer"),
            (PLUGIN_SERVICE, "UpdatePodSandbox"): rpc(nri.UpdatePodSandboxRequest, self._update_pod_sandbox,
                                                      nri.UpdatePodSandboxResponse, "UpdatePodSandbox"),
        }

    async def _answer(self, name: str, work: Awaitable[Any], empty_cls: type) -> Any:
        """Run an event's work within the answer deadline; late or failed: answer with no changes."""
        self.stats.events[name] += 1
        started = time.monotonic()
        task = asyncio.ensure_future(work)
        try:
            # Shielded: work that overruns finishes in the background, so the state it records
            # stays consistent even though the runtime has had its (empty) answer.
            result = await asyncio.wait_for(asyncio.shield(task), self.request_timeout_s * ANSWER_SHARE)
        except TimeoutError:
            self.stats.late_answers[name] += 1
            self._late.add(task)
            task.add_done_callback(self._late.discard)
            log.warning("nri_event_timed_out", detail="answered without changes", nri_event=name,
                        deadline_ms=round(self.request_timeout_s * ANSWER_SHARE * 1000))
            return empty_cls()
        except HookFailed as exc:  # failure_policy = "fail": the runtime fails the operation
            if self.dry_run:
                log.warning("dry_run_runtime_would_fail", nri_event=name, error=str(exc))
                return empty_cls()
            raise TtrpcError(INTERNAL, f"koordnode: {exc}") from exc
        except Exception:
            log.exception("nri_event_failed", detail="answered without changes", nri_event=name)
            return empty_cls()
        finally:
            elapsed = time.monotonic() - started
            self.stats.answer_seconds[name] += elapsed
            self.stats.answer_max_seconds[name] = max(self.stats.answer_max_seconds.get(name, 0.0), elapsed)
        if result is None:
            return empty_cls()
        if self.dry_run and result.ByteSize() > 0:
            self.stats.dry_run_withheld[name] += 1
            log.info("dry_run_answered_without_changes", nri_event=name,
                     would_answer=str(result).replace("\n", " ")[:2000])
            return empty_cls()
        return result

    async def _configure_handler(self, payload: bytes) -> bytes:
        req = nri.ConfigureRequest.FromString(payload)
        self.request_timeout_s = (req.request_timeout or DEFAULT_REQUEST_TIMEOUT_MS) / 1000
        self.stats.runtime = f"{req.runtime_name} {req.runtime_version}".strip()
        events = BASE_EVENTS + (UPDATE_POD_SANDBOX_EVENTS if req.NRI_version else ())
        log.info("nri_plugin_configured", runtime=self.stats.runtime, nri_version=req.NRI_version or None,
                 request_timeout_ms=req.request_timeout, registration_timeout_ms=req.registration_timeout)
        self._sync_pods, self._sync_containers = [], []
        return nri.ConfigureResponse(events=event_mask(events)).SerializeToString()

    async def _shutdown_handler(self, payload: bytes) -> bytes:
        log.info("nri_shutdown_by_runtime")
        return nri.Empty().SerializeToString()

    async def _state_change(self, ev: nri.StateChangeEvent) -> None:
        handlers = {
            nri.RUN_POD_SANDBOX: lambda: self._run_pod_sandbox(ev.pod),
            nri.STOP_POD_SANDBOX: lambda: self._stop_pod_sandbox(ev.pod),
            nri.REMOVE_POD_SANDBOX: lambda: self._remove_pod_sandbox(ev.pod),
            nri.POST_START_CONTAINER: lambda: self._post_start_container(ev.pod, ev.container),
            nri.POST_UPDATE_CONTAINER: lambda: self._post_update_container(ev.pod, ev.container),
            nri.REMOVE_CONTAINER: lambda: self._remove_container(ev.pod, ev.container),
        }
        handler = handlers.get(ev.event)
        if handler is not None:
            await handler()
        return None

    # ---- events as CRI calls --------------------------------------------------------------

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

    async def _run_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        req = cri.RunPodSandboxRequest(config=convert.sandbox_config(pod), runtime_handler=pod.runtime_handler)
        await self._hooks("RunPodSandbox", req, cri.RunPodSandboxResponse(pod_sandbox_id=pod.id), dict(pod.labels),
                          facts=CallFacts(pod_ips=tuple(pod.ips)), answer_first=True)

    async def _stop_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        await self._hooks("StopPodSandbox", cri.StopPodSandboxRequest(pod_sandbox_id=pod.id),
                          cri.StopPodSandboxResponse(), self._labels_of(pod))

    async def _remove_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        await self._hooks("RemovePodSandbox", cri.RemovePodSandboxRequest(pod_sandbox_id=pod.id),
                          cri.RemovePodSandboxResponse(), self._labels_of(pod))
        self._flush_soon()

    async def _create_container(self, pod: nri.PodSandbox, container: nri.Container) -> nri.CreateContainerResponse:
        request = convert.create_request(pod, container)
        original = cri.CreateContainerRequest()
        original.CopyFrom(request)
        call = CallContext(method="CreateContainer", request=request, pod_labels=dict(pod.labels))
        self._collecting += 1
        try:
            await self.chain.run_pre(call)
            try:
                adjust = convert.adjustment(original, call.request, container)
            except convert.CgroupsPathNotMoved as exc:
                # The container stays where the runtime put it, and is recorded there.
                log.warning("be_container_not_moved_to_be_group", container_id=container.id, problem=str(exc))
                call.request.sandbox_config.linux.cgroup_parent = original.sandbox_config.linux.cgroup_parent
                adjust = convert.adjustment(original, call.request, container)
            if (self.oom_floor is not None and adjust.linux.HasField("oom_score_adj")
                    and adjust.linux.oom_score_adj.value < self.oom_floor):
                floor = max(self.oom_floor, original.config.linux.resources.oom_score_adj)
                if floor == original.config.linux.resources.oom_score_adj:
                    adjust.linux.ClearField("oom_score_adj")
                else:
                    adjust.linux.oom_score_adj.value = floor
            if self.dry_run:  # _answer withholds the adjustment; the state records kubelet's values
                call.request = original
            call.response, call.grpc_status = cri.CreateContainerResponse(container_id=container.id), 0
            await self.chain.run_post_now(call)
            updates = self._take_pool_updates()
        finally:
            self._collecting -= 1
        if call.hook_failures:
            log.warning("hooks_failed_container_unchanged", detail="container created without the hooks' changes",
                        container_id=container.id,
                        failures=call.hook_failures)
        self.stats.updates_answered += len(updates)
        self._class_values_after(updates, RUNTIME_APPLIES_ANSWER_S)
        return nri.CreateContainerResponse(adjust=adjust, update=updates)

    async def _post_start_container(self, pod: nri.PodSandbox, container: nri.Container) -> None:
        await self._hooks("StartContainer", cri.StartContainerRequest(container_id=container.id),
                          cri.StartContainerResponse(), dict(pod.labels), answer_first=True)
        await self._oom_score_adj_fallback(container)

    async def _oom_score_adj_fallback(self, container: nri.Container) -> None:
        """Runtimes whose NRI cannot adjust oom_score_adj (containerd 1.7) run the container with
        kubelet's: give its process the class value after start instead."""
        record = self.state.containers.get(container.id)
        if record is None or not container.pid or not container.linux.HasField("oom_score_adj"):
            return
        want = self._oom_wanted(record.resources.oom_score_adj, container.linux.oom_score_adj.value)
        if want is not None:
            await asyncio.to_thread(self._write_oom, container.id, [container.pid], want,
                                    "class value; the runtime did not apply the NRI adjustment")

    def _oom_wanted(self, want: int, have: int) -> int | None:
        """The value to write over `have`, or None (already right, or not lowerable here)."""
        want = oom_score_adj_wanted(want, have, self.oom_floor)
        return None if want == have else want

    def _write_oom(self, container_id: str, pids: list[int], value: int, reason: str) -> None:
        if self.dry_run:
            log.info("dry_run_would_set_oom_score_adj", container_id=container_id, pids=pids, value=value,
                     reason=reason)
            return
        for pid in pids:
            error = set_oom_score_adj(self.procfs_root, pid, value, reason)
            if error is not None:
                log.warning("oom_score_adj_not_set", container_id=container_id, pid=pid, error=error)

    def _fix_oom_after_sync(self, fixes: list[tuple[str, str, int, int]]) -> None:
        """Engine thread: running containers whose processes run with another oom_score_adj than
        their class's (created while koordnode was away): NRI updates cannot carry it."""
        if self.engine is None:
            return
        for cid, cgroup, pid, value in fixes:
            pids = None
            try:
                pids = self.engine.executor.read_pids(cgroup)
            except Exception:  # the cgroup may be gone; the init process is enough then
                pids = None
            self._write_oom(cid, pids or [pid], value, "class value for a container synchronized from the runtime")

    async def _update_container(self, req: nri.UpdateContainerRequest) -> nri.UpdateContainerResponse:
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

    def _class_values_after(self, updates: list[nri.ContainerUpdate], delay_s: float) -> None:
        """The runtime applies (or has applied) `updates`: write the class values of what it
        rewrote from the containers' specs again, `delay_s` from now (the reconcile pass would,
        later, and count it as an overwrite)."""
        ids = [u.container_id for u in updates]
        if self.engine is None or not ids or self.dry_run:
            return
        engine = self.engine

        async def later() -> None:
            if delay_s:
                await asyncio.sleep(delay_s)
            await asyncio.to_thread(engine.containers_updated, ids)
        self._spawn(later())

    async def _post_update_container(self, pod: nri.PodSandbox, container: nri.Container) -> None:
        """The runtime has applied an update with kubelet's values of the fields it reports back
        (cpu shares, quota, memory limit: never adjusted, see policy REPORTED_BY_RUNTIME): the
        class values go to the container's cgroup again."""
        if self.engine is None:
            return
        await asyncio.to_thread(self.engine.container_updated, container.id)

    async def _stop_container(self, pod: nri.PodSandbox, container: nri.Container) -> nri.StopContainerResponse:
        self._collecting += 1
        try:
            await self._hooks("StopContainer", cri.StopContainerRequest(container_id=container.id),
                              cri.StopContainerResponse(), dict(pod.labels))
            updates = self._take_pool_updates()
        finally:
            self._collecting -= 1
        self.stats.updates_answered += len(updates)
        self._class_values_after(updates, RUNTIME_APPLIES_ANSWER_S)
        return nri.StopContainerResponse(update=updates)

    async def _remove_container(self, pod: nri.PodSandbox, container: nri.Container) -> None:
        await self._hooks("RemoveContainer", cri.RemoveContainerRequest(container_id=container.id),
                          cri.RemoveContainerResponse(), dict(pod.labels))
        self._flush_soon()

    async def _update_pod_sandbox(self, req: nri.UpdatePodSandboxRequest) -> None:
        # Pod-level values are the engine's (reconcile); nothing to change in the runtime's update.
        log.debug("pod_sandbox_update_seen", sandbox_id=req.pod.id)

    # ---- Synchronize: state recovery --------------------------------------------------------

    async def _synchronize_handler(self, payload: bytes) -> bytes:
        req = nri.SynchronizeRequest.FromString(payload)
        self._sync_pods.extend(req.pods)
        self._sync_containers.extend(req.containers)
        if req.more:  # the runtime sends the node in parts; answer each but the last with "more"
            return nri.SynchronizeResponse(more=True).SerializeToString()
        pods, containers = self._sync_pods, self._sync_containers
        self._sync_pods, self._sync_containers = [], []
        response = await self._answer("Synchronize", self._synchronize(pods, containers), nri.SynchronizeResponse)
        return response.SerializeToString()

    async def _synchronize(self, pods: list[nri.PodSandbox], containers: list[nri.Container]) -> nri.SynchronizeResponse:
        """Rebuild the node state and CPU ownership from the runtime's list, and bring every
        running container to its class values (pods created while koordnode was away too)."""
        kubelet = self._kubelet_values(containers)
        state = self.state
        pod_records = [dataclasses.replace(convert.pod_record(p, "recovered"),
                                           cgroup_parent=convert.placed_parent(p, containers)) for p in pods]
        container_records = [convert.container_record(c, "recovered") for c in containers]
        if self.engine is not None:  # the class at once; the reconcile pass applies the values
            pod_records = [dataclasses.replace(r, qos_class=d.qos_class.value, qos_reason=d.why)
                           for r in pod_records for d in [self.engine.classify(r.labels, r.cgroup_parent)]]
        state.install(pod_records, container_records)
        live = {c.container_id for c in container_records}
        updates: list[nri.ContainerUpdate] = []
        if self.engine is not None:
            engine = self.engine
            self._collecting += 1
            try:
                view = state.view()

                def rebuild() -> tuple[dict[str, tuple[str, str]],
                                       list[tuple[str, cri.LinuxContainerResources, nri.ContainerUpdate | None]]]:
                    engine.forget_containers_except(live)
                    for cid, res in kubelet.items():
                        engine.remember_kubelet_resources(cid, res)
                    classes = engine.adopt(view)  # CPU ownership from the records, then a reconcile pass
                    return classes, self._class_updates(view)

                classes, planned = await asyncio.to_thread(rebuild)
                for sandbox_id, (qos_class, why) in classes.items():
                    state.set_pod_class(sandbox_id, qos_class, why)
                self._take_pool_updates()  # superseded by the full updates
                by_id = {c.id: c for c in containers}
                oom_fixes = []
                for cid, target, update in planned:
                    record = state.containers.get(cid)
                    if record is not None:
                        state.update_container_resources(cid, _with_delta(record.resources, target))
                    if update is not None:
                        updates.append(update)
                    nri_c = by_id.get(cid)
                    if nri_c is not None and nri_c.pid and nri_c.linux.HasField("oom_score_adj"):
                        want = self._oom_wanted(target.oom_score_adj, nri_c.linux.oom_score_adj.value)
                        pod = state.pods.get(record.sandbox_id) if record is not None else None
                        if want is not None and pod is not None:
                            try:
                                cgroup = engine.container_cgroup(pod.cgroup_parent, cid)
                            except Exception:
                                cgroup = ""
                            oom_fixes.append((cid, cgroup, nri_c.pid, want))
                if oom_fixes:
                    self._spawn(asyncio.to_thread(self._fix_oom_after_sync, oom_fixes))
            finally:
                self._collecting -= 1
        self.stats.synchronizations += 1
        log.info("nri_synchronized", pods=len(pod_records), containers=len(container_records),
                 updates=len(updates))
        if self.on_synchronized is not None:
            self._spawn(self.on_synchronized())
        current = asyncio.current_task()
        if current in self._late:  # the runtime already had an empty answer: deliver them now
            self._late.discard(current)
            if updates:
                self._spawn(self._send_updates(updates))
            return nri.SynchronizeResponse()
        self.stats.updates_answered += len(updates)
        self._class_values_after(updates, RUNTIME_APPLIES_ANSWER_S)
        return nri.SynchronizeResponse(update=updates)

    def _kubelet_values(self, containers: list[nri.Container]) -> dict[str, cri.LinuxContainerResources]:
        """kubelet's own resources per container: what the runtime's CRI view recorded (its
        CreateContainer config; NRI changes only the OCI spec), else — for a container never
        seen — what it runs with, which is what kubelet asked while koordnode was away."""
        out: dict[str, cri.LinuxContainerResources] = {}
        engine = self.engine
        for c in containers:
            if engine is not None and engine.has_kubelet_resources(c.id):
                continue
            seen = self.kubelet_view.containers.get(c.id) if self.kubelet_view is not None else None
            out[c.id] = convert.cri_message(seen.resources) if seen is not None else convert.cri_resources(
                c.linux.resources, c.linux.oom_score_adj if c.linux.HasField("oom_score_adj") else None)
        return out

    def _class_updates(self, view: NodeView) -> list[tuple[str, cri.LinuxContainerResources,
                                                           nri.ContainerUpdate | None]]:
        """Updates that bring each running container to its class values (engine thread)."""
        updates: list[tuple[str, cri.LinuxContainerResources, nri.ContainerUpdate | None]] = []
        if self.engine is None:
            return updates
        for c in view.containers.values():
            pod = view.pods.get(c.sandbox_id)
            if c.state != CONTAINER_RUNNING or pod is None or pod.state != POD_READY:
                continue
            target = self.engine.planned_resources(c.container_id)
            if target is None:
                continue
            delta = convert.resources_delta(c.resources, target)
            update = None
            if delta is not None:
                update = nri.ContainerUpdate(container_id=c.container_id, ignore_failure=True)
                update.linux.resources.CopyFrom(delta)
            updates.append((c.container_id, target, update))
        return updates

    # ---- pool changes as container updates ----------------------------------------------

    def _pool_changed(self) -> None:
        """The engine published pool moves (from any thread): deliver them from the loop."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._flush_soon)

    def _take_pool_updates(self) -> list[nri.ContainerUpdate]:
        moves = self.pool_updates.take()
        updates = []
        for cid, cpus in moves.items():
            record = self.state.containers.get(cid)
            if record is None or record.resources.cpuset_cpus == cpus:
                continue
            resources = convert.cri_message(record.resources)
            resources.cpuset_cpus = cpus
            self.state.update_container_resources(cid, resources)
            updates.append(convert.cpuset_update(cid, cpus))
        return updates

    def _flush_soon(self) -> None:
        self._flush_wanted.set()

    async def _flush_loop(self) -> None:
        """Pool changes outside Create/StopContainer (removals, reconcile) as unsolicited updates."""
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted.clear()
            if self._collecting or self._client is None:
                # Picked up by the answer being prepared, or by the next Synchronize.
                if self._collecting:
                    await asyncio.sleep(0.05)
                    self._flush_wanted.set()
                continue
            updates = self._take_pool_updates()
            if updates:
                self._spawn(self._send_updates(updates))

    async def _send_updates(self, updates: list[nri.ContainerUpdate]) -> None:
        client = self._client
        if client is None:
            return
        if self.dry_run:
            self.stats.dry_run_withheld["UpdateContainers"] += 1
            log.info("dry_run_container_updates_not_sent", containers=[u.container_id for u in updates])
            return
        request = nri.UpdateContainersRequest(update=updates)
        try:
            raw = await client.call(RUNTIME_SERVICE, "UpdateContainers", request.SerializeToString(), UPDATE_TIMEOUT_S)
        except (TtrpcError, MuxClosed) as exc:
            self.stats.updates_failed += len(updates)
            log.warning("container_updates_not_delivered", error=str(exc),
                        containers=[u.container_id for u in updates])
            return
        failed = nri.UpdateContainersResponse.FromString(raw).failed
        self._class_values_after(updates, 0.0)
        self.stats.updates_sent += len(updates) - len(failed)
        self.stats.updates_failed += len(failed)
        if failed:
            log.warning("container_updates_failed", detail="the runtime could not update some containers",
                        containers=[u.container_id for u in failed])

    def status(self) -> dict[str, Any]:
        return {"socket": self.socket_path, "plugin_name": self.plugin_name, "plugin_index": self.plugin_index,
                **self.stats.as_dict()}


def _event_label(value: int) -> str:
    try:
        return nri.Event.Name(value)
    except ValueError:  # an event of a newer runtime
        return f"event {value}"


def _with_delta(current: RecordedResources, target: cri.LinuxContainerResources) -> cri.LinuxContainerResources:
    """What an update makes the container run with (a new message: state records never change)."""
    out = convert.cri_message(current)
    for field in ("cpu_shares", "cpu_quota", "cpu_period", "cpuset_cpus", "cpuset_mems", "memory_limit_in_bytes"):
        value = getattr(target, field)
        if value:
            setattr(out, field, value)
    out.unified.update(target.unified)
    return out
