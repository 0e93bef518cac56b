"""koordnode as an external NRI plugin: containerd calls the hooks itself, no proxy in between.

The plugin connects to the runtime's NRI socket, registers, and serves the plugin service on
the same connection. Each NRI event is handed to the hook chain as the CRI call it stands
for (events.py, convert.py), so the QoS engine, state recorder and hardware hooks work unchanged;
what CreateContainer's hooks changed goes back as the container's adjustment, and pool
changes of other containers as NRI container updates (container_updates.py). This module is the
connection: registration, the plugin service's handlers and their answer deadline; the
runtime's Synchronize is rebuilt in synchronize.py.

Fail-open: the runtime waits for a plugin at most its request timeout (2 s by default). Every
answer is given well inside it; a hook that fails or is late yields an answer without changes,
and the container is created as kubelet asked. When the connection drops (runtime restart)
the plugin reconnects, registers again, and the runtime's Synchronize rebuilds the state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

import structlog

from koordnode.hooks.be_start import BeStartWatch
from koordnode.hooks.chain import HookChain, HookFailed
from koordnode.hooks.pool_updates import PoolUpdates
from koordnode.hooks.qos_engine import QoSEngine
from koordnode.model.state import NodeState
from koordnode.nri import api_pb2 as nri
from koordnode.nri.container_updates import RUNTIME_SERVICE, ContainerUpdates
from koordnode.nri.events import NriEvents
from koordnode.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Mux, MuxClosed
from koordnode.nri.oom import OomScoreAdj
from koordnode.nri.stats import NriStats
from koordnode.nri.synchronize import Synchronizer
from koordnode.nri.ttrpc import INTERNAL, Handler, TtrpcClient, TtrpcError, TtrpcServer

log = structlog.get_logger("koordnode.nri")

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"

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
DEFAULT_REQUEST_TIMEOUT_MS = 2000
# Share of the runtime's request timeout an answer may take; the rest is transport and slack.
ANSWER_SHARE = 0.6


def event_mask(events: Iterable[int]) -> int:
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


class NriPlugin:
    def __init__(self, socket_path: str, plugin_name: str, plugin_index: str, *, chain: HookChain,
                 state: NodeState, engine: QoSEngine | None,
                 on_synchronized: Callable[[], Coroutine[Any, Any, None]] | None = None, procfs_root: str = "/proc",
                 pool_updates: PoolUpdates | None = None, be_starts: BeStartWatch | None = None) -> None:
        """`pool_updates`: the channel the engine publishes pool moves of running containers on
        (the same one handed to the engine); the plugin delivers them to the runtime.
        `be_starts`: where BE containers starting are noted (the QoS manager lifts BE for them)."""
        self.socket_path = socket_path
        self.plugin_name = plugin_name
        self.plugin_index = plugin_index
        self.stats = NriStats()
        self.request_timeout_s = DEFAULT_REQUEST_TIMEOUT_MS / 1000
        self._sync_pods: list[nri.PodSandbox] = []
        self._sync_containers: list[nri.Container] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._late: set[asyncio.Future[Any]] = set()  # work answered without changes, still running
        self.updates = ContainerUpdates(state, engine, pool_updates if pool_updates is not None else PoolUpdates(),
                                        self.stats, self._spawn)
        self.oom = OomScoreAdj(state, engine, procfs_root)
        self.events = NriEvents(chain, state, engine, self.updates, self.oom, self._spawn, be_starts)
        self.synchronizer = Synchronizer(state, engine, self.updates, self.oom, self.stats, self._spawn,
                                         self._answered_late, on_synchronized)
        self._dry_run = False

    @property
    def dry_run(self) -> bool:
        """Dry run: every event is decided as usual, but the runtime gets answers without changes,
        no container updates and no oom_score_adj writes (set by the daemon, also on reload)."""
        return self._dry_run

    @dry_run.setter
    def dry_run(self, dry_run: bool) -> None:
        self._dry_run = self.updates.dry_run = self.oom.dry_run = self.events.dry_run = dry_run

    # ---- connection -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, *, kubelet_view: NodeState | None = None,
                  max_backoff_s: float = 5.0) -> None:
        """Connect, register and serve; reconnect whenever the runtime goes away.

        `kubelet_view`: the runtime's CRI view (kubelet's own container resources), None when
        it could not be read: the resources containers run with are taken for kubelet's then."""
        self.updates.loop = asyncio.get_running_loop()
        self.synchronizer.kubelet_view = kubelet_view
        flusher = self._spawn(self.updates.flush_loop())
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
            self.updates.client = client
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
            self.updates.client = None
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
            (PLUGIN_SERVICE, "StateChange"): rpc(nri.StateChangeEvent, self.events.state_change, empty),
            (PLUGIN_SERVICE, "CreateContainer"): rpc(nri.CreateContainerRequest, container_event(self.events.create_container),
                                                     nri.CreateContainerResponse, "CreateContainer"),
            (PLUGIN_SERVICE, "UpdateContainer"): rpc(nri.UpdateContainerRequest, self.events.update_container,
                                                     nri.UpdateContainerResponse, "UpdateContainer"),
            (PLUGIN_SERVICE, "StopContainer"): rpc(nri.StopContainerRequest, container_event(self.events.stop_container),
                                                   nri.StopContainerResponse, "StopContainer"),
            # Newer runtimes send these as calls of their own rather than as StateChange.
            (PLUGIN_SERVICE, "RunPodSandbox"): rpc(nri.RunPodSandboxRequest, pod_event(self.events.run_pod_sandbox),
                                                   nri.RunPodSandboxResponse, "RunPodSandbox"),
            (PLUGIN_SERVICE, "StopPodSandbox"): rpc(nri.StopPodSandboxRequest, pod_event(self.events.stop_pod_sandbox),
                                                    nri.StopPodSandboxResponse, "StopPodSandbox"),
            (PLUGIN_SERVICE, "RemovePodSandbox"): rpc(nri.RemovePodSandboxRequest, pod_event(self.events.remove_pod_sandbox),
                                                      nri.RemovePodSandboxResponse, "RemovePodSandbox"),
            (PLUGIN_SERVICE, "PostStartContainer"): rpc(nri.PostStartContainerRequest,
                                                        container_event(self.events.post_start_container),
                                                        nri.PostStartContainerResponse, "PostStartContainer"),
            (PLUGIN_SERVICE, "PostUpdateContainer"): rpc(nri.PostUpdateContainerRequest,
                                                         container_event(self.events.post_update_container),
                                                         nri.PostUpdateContainerResponse, "PostUpdateContainer"),
            (PLUGIN_SERVICE, "RemoveContainer"): rpc(nri.RemoveContainerRequest,
                                                     container_event(self.events.remove_container),
                                                     nri.RemoveContainerResponse, "RemoveContainer"),
            (PLUGIN_SERVICE, "UpdatePodSandbox"): rpc(nri.UpdatePodSandboxRequest, self.events.update_pod_sandbox,
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
        if self._dry_run and result.ByteSize() > 0:
            self.stats.dry_run_withheld[name] += 1
            log.info("dry_run_answered_without_changes", nri_event=name,
                     would_answer=str(result).replace("\n", " ")[:2000])
            return empty_cls()
        return result

    def _answered_late(self) -> bool:
        """Whether the runtime already had an empty answer for the current task's work."""
        current = asyncio.current_task()
        if current in self._late:
            self._late.discard(current)
            return True
        return False

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

    async def _synchronize_handler(self, payload: bytes) -> bytes:
        req = nri.SynchronizeRequest.FromString(payload)
        self._sync_pods.extend(req.pods)
        self._sync_containers.extend(req.containers)
        if req.more:  # the runtime sends the node in parts; answer each but the last with "more"
            return nri.SynchronizeResponse(more=True).SerializeToString()
        pods, containers = self._sync_pods, self._sync_containers
        self._sync_pods, self._sync_containers = [], []
        response = await self._answer("Synchronize", self.synchronizer.synchronize(pods, containers), nri.SynchronizeResponse)
        return response.SerializeToString()

    def status(self) -> dict[str, Any]:
        return {"socket": self.socket_path, "plugin_name": self.plugin_name, "plugin_index": self.plugin_index,
                **self.stats.as_dict()}


def _event_label(value: int) -> str:
    try:
        return nri.Event.Name(value)
    except ValueError:  # an event of a newer runtime
        return f"event {value}"
