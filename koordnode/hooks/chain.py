"""The in-process runtime hook chain and the contract its hooks implement.

A hook (`RuntimeHook`) names itself and lists its `stages()`: for a CRI method and a phase, the
function to call and where it runs (`runs_on`: the event loop or a worker thread). The chain
keeps them in one table, so what runs at, say, CreateContainer Pre is `chain.at("CreateContainer",
Phase.PRE)`, in the order the hooks were given.

Phases, in order: `PRE_INLINE` rewrites of the request the runtime must see even when a later
Pre fails (on the loop, cheap, no blocking I/O); `PRE` may change the request and may return a
`PreEffect`; `POST` observes the outcome. Facts a hook learns for another (the pod's class from
the QoS hook's Pre, for the state recorder's Post) travel in the call's typed `facts`.

The chain is fail-open: a hook that raises or overruns its timeout is logged and counted, its
changes are dropped, and the call goes on with the request as it was before that hook
(with a single hook: the original request). `failure_policy = "fail"` turns a hook failure
into a failed CRI call instead, for operators who prefer that.

Loop stages may read and write `NodeState` (it has the loop as its single writer); thread
stages must not write it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import enum
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import structlog

from koordnode.model.state import PodRecord

log = structlog.get_logger("koordnode.hooks")

SKIP_LABEL = "runtimeproxy.koordinator.sh/skip-hookserver"


def skip_requested(labels: dict[str, str]) -> bool:
    """True when a pod's labels ask koordnode to leave it alone."""
    value = labels.get(SKIP_LABEL, "")
    return len(value) == 4 and value.lower() == "true"  # bounded: label values are pod input


@dataclasses.dataclass(frozen=True)
class PodClassified:
    """The class a Pre hook gave a new pod, and why."""

    qos_class: str
    reason: str


@dataclasses.dataclass
class CallFacts:
    """What the parties of one call learn about it besides its request and response. Each
    field names who sets it and who reads it; nothing else passes between hooks."""

    # Set by the QoS hook's Pre at RunPodSandbox; the state recorder's Post records it with the pod.
    pod_class: PodClassified | None = None
    # Set by the NRI plugin at RunPodSandbox: the IPs the runtime gave the pod. None (the proxy):
    # the pod's network is asked of CRI after the call.
    pod_ips: tuple[str, ...] | None = None
    # Set by the NRI plugin at UpdateContainer: the runtime writes kubelet's values after the
    # hooks' answer, so the class values follow at PostUpdateContainer, not in this call's Post.
    runtime_applies_later: bool = False
    # Set by the state recorder's Post at RemovePodSandbox (the first Post hook): the pod as it
    # was, for the Post hooks after it (the state no longer has it).
    removed_pod: PodRecord | None = None
    # Set by the chain: the hooks whose Pre result was dropped (failed or overran its bound), so
    # the runtime got the request without their changes; read by their Post stages (the QoS hook
    # then learns kubelet's resize from the request as kubelet sent it).
    pre_dropped: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class CallContext:
    """One intercepted CRI call as the hooks see it."""

    method: str  # e.g. "CreateContainer"
    request: Any  # the protobuf request; Pre hooks may change it in place
    pod_labels: dict[str, str] = dataclasses.field(default_factory=dict)
    response: Any = None  # set before Post hooks run; None when the call failed
    grpc_status: int | None = None
    grpc_message: str = ""
    started: float = dataclasses.field(default_factory=time.monotonic)
    hook_failures: list[str] = dataclasses.field(default_factory=list)
    facts: CallFacts = dataclasses.field(default_factory=CallFacts)

    @property
    def skip_hooks(self) -> bool:
        return skip_requested(self.pod_labels)

    @property
    def succeeded(self) -> bool:
        return self.grpc_status == 0


class PreEffect(Protocol):
    """State a Pre hook set aside for its result (e.g. CPUs it reserved for the request it
    rewrote). The chain commits it where it keeps the hook's result and releases it where it
    drops the result (the hook failed or overran its timeout, even when it finishes late), so
    nothing outlives a result the runtime never saw. Both are called on the event loop."""

    def commit(self) -> None: ...

    def release(self) -> None: ...


class Phase(enum.Enum):
    """A stage's place in a call; the value is the phase in failure counters and logs."""

    PRE_INLINE = "pre_inline"
    PRE = "pre"
    POST = "post"


class RunsOn(enum.Enum):
    LOOP = "loop"  # awaited on the event loop: no blocking I/O; may touch NodeState
    THREAD = "thread"  # in the chain's thread pool: may block (cgroup writes); bounded by the timeout


LoopHandler = Callable[["CallContext"], Awaitable["PreEffect | None"]]
ThreadHandler = Callable[["CallContext"], "PreEffect | None"]
InlineHandler = Callable[["CallContext"], None]


@dataclasses.dataclass(frozen=True)
class Stage:
    """One thing a hook does in one phase of one CRI method. Build it with `on_loop`,
    `in_thread` or `inline`: each takes the handler shape its `runs_on` needs."""

    method: str
    phase: Phase
    runs_on: RunsOn
    handler: Callable[[CallContext], Any]

    @classmethod
    def on_loop(cls, method: str, phase: Phase, handler: LoopHandler) -> Stage:
        if phase is Phase.PRE_INLINE:
            raise ValueError("an inline rewrite is a plain function: use Stage.inline")
        return cls(method, phase, RunsOn.LOOP, handler)

    @classmethod
    def in_thread(cls, method: str, phase: Phase, handler: ThreadHandler) -> Stage:
        if phase is Phase.PRE_INLINE:
            raise ValueError("an inline rewrite runs on the loop: use Stage.inline")
        return cls(method, phase, RunsOn.THREAD, handler)

    @classmethod
    def inline(cls, method: str, handler: InlineHandler) -> Stage:
        """A request rewrite kept even when this hook's `PRE` fails or overruns (a container's
        cgroup parent following its sandbox's: dropped, the two would be split). Runs on the
        loop, before every `PRE`, and must be cheap; one that raises is dropped whole."""
        return cls(method, Phase.PRE_INLINE, RunsOn.LOOP, handler)


class RuntimeHook(Protocol):
    """What the chain needs of a hook. Hooks state conformance where they are defined with a
    line mypy checks: `_: type[RuntimeHook] = MyHook`."""

    @property
    def name(self) -> str: ...

    def stages(self) -> Iterable[Stage]: ...


@dataclasses.dataclass(frozen=True)
class Registered:
    """A stage in the chain's table, with the hook it belongs to."""

    hook: str
    stage: Stage


class HookFailed(Exception):
    def __init__(self, hook: str, phase: str, reason: str) -> None:
        super().__init__(f"hook {hook} failed in {phase}: {reason}")
        self.hook = hook
        self.phase = phase
        self.reason = reason


class HookChain:
    def __init__(
        self,
        hooks: Iterable[RuntimeHook],
        *,
        timeout_s: float = 0.2,
        failure_policy: str = "ignore",
        max_threads: int = 8,
    ) -> None:
        self._hooks: list[RuntimeHook] = []
        self._table: dict[tuple[str, Phase], tuple[Registered, ...]] = {}
        for hook in hooks:
            self.add(hook)
        self.timeout_s = timeout_s
        self.failure_policy = failure_policy
        # Thread stages run here so a hung one cannot stall the relay's event loop.
        self._pool = concurrent.futures.ThreadPoolExecutor(max_threads, thread_name_prefix="hook")
        self._pending_post: set[asyncio.Task[Any]] = set()
        # The Post tasks a new call waits for: not those already late, or one stuck hook would
        # cost every later call the full timeout.
        self._awaited_post: set[asyncio.Task[Any]] = set()
        self.failures: Counter[tuple[str, str, str]] = Counter()  # (hook, phase, kind)

    @property
    def hooks(self) -> tuple[RuntimeHook, ...]:
        return tuple(self._hooks)

    def add(self, hook: RuntimeHook) -> None:
        """Append a hook: its stages run after those of the hooks already in the chain."""
        self._hooks.append(hook)
        for stage in hook.stages():
            key = (stage.method, stage.phase)
            self._table[key] = (*self._table.get(key, ()), Registered(hook.name, stage))

    def at(self, method: str, phase: Phase) -> tuple[Registered, ...]:
        """What runs in `phase` of a `method` call, in order."""
        return self._table.get((method, phase), ())

    def failure_counts(self) -> dict[tuple[str, str, str], int]:
        """{(hook, phase, kind): count} so far, a copy (the metrics read it from their thread)."""
        return dict(self.failures)

    def configure(self, *, timeout_s: float, failure_policy: str) -> None:
        self.timeout_s = timeout_s
        self.failure_policy = failure_policy

    async def run_post_now(self, call: CallContext) -> None:
        """Run the Post hooks of a call and wait for them (NRI: the answer carries their effects)."""
        if call.skip_hooks or not self.wants(call.method):
            return
        await self._run_post(call, set(self._awaited_post))

    def wants(self, method: str) -> bool:
        """Whether any hook has a stage for `method` (else the call is relayed untouched)."""
        return any(self.at(method, phase) for phase in Phase)

    def _looks_before_forwarding(self, method: str) -> bool:
        """Whether a Pre or inline stage reads `method`'s request (else it is forwarded at once)."""
        return bool(self.at(method, Phase.PRE) or self.at(method, Phase.PRE_INLINE))

    async def run_pre(self, call: CallContext) -> None:
        """Run the inline rewrites, then the Pre stages; raises HookFailed only under
        failure_policy = "fail"."""
        if call.skip_hooks or not self._looks_before_forwarding(call.method):
            # Nothing reads this request: it goes on at once (kubelet sends StartContainer right
            # after CreateContainer's answer), and its Post hooks still run after the earlier
            # calls' (schedule_post).
            return
        # Post hooks of earlier calls first: kubelet only sends this call after it saw their
        # responses, so their effects (e.g. the pod being recorded) must be visible now.
        await self.drain_post(self.timeout_s)
        for registered in self.at(call.method, Phase.PRE_INLINE):
            self._rewrite_inline(registered, call)
        for registered in self.at(call.method, Phase.PRE):
            before = _hand_a_copy(call)
            ok = await self._invoke(registered, call)
            if not ok:
                call.request = before
                call.facts.pre_dropped.append(registered.hook)
                # Its effect (if it ever returns one) goes with its dropped result: _release_when_done.
                if self.failure_policy == "fail":
                    raise HookFailed(registered.hook, Phase.PRE.value, call.hook_failures[-1])

    def _rewrite_inline(self, registered: Registered, call: CallContext) -> None:
        """An inline rewrite: kept whatever the Pre stages do; one that raises is dropped whole."""
        before = _hand_a_copy(call)
        started = time.monotonic()
        try:
            registered.stage.handler(call)
        except Exception as exc:
            call.request = before
            self._failed(registered, call, "error", repr(exc), started)
            if self.failure_policy == "fail":
                raise HookFailed(registered.hook, Phase.PRE_INLINE.value, call.hook_failures[-1]) from exc

    def schedule_post(self, call: CallContext) -> None:
        if call.skip_hooks or not self.wants(call.method):
            return
        # After the Post hooks of the calls before it: a call may reach the runtime before
        # those finished (run_pre), its bookkeeping may not overtake theirs.
        task = asyncio.get_running_loop().create_task(self._run_post(call, set(self._awaited_post)))
        self._pending_post.add(task)
        self._awaited_post.add(task)
        task.add_done_callback(self._pending_post.discard)
        task.add_done_callback(self._awaited_post.discard)

    async def _run_post(self, call: CallContext, earlier: set[asyncio.Task[Any]]) -> None:
        # The earlier calls' Post hooks first, as long as a call's Pre hooks would wait for them.
        if earlier:
            await asyncio.wait(earlier, timeout=self.timeout_s)
        # In order, each to its end: a Post hook keeps books (state, CPU release), so one that
        # overruns its timeout is counted late but still runs, exactly once, before the next.
        for registered in self.at(call.method, Phase.POST):
            await self._invoke(registered, call, run_to_end=True)

    async def drain_post(self, timeout_s: float) -> None:
        if self._awaited_post:
            await asyncio.wait(list(self._awaited_post), timeout=timeout_s)

    async def _invoke(self, registered: Registered, call: CallContext, run_to_end: bool = False) -> bool:
        """Run one stage within the timeout; False if it failed or overran.

        A Pre stage that overruns is cancelled (its changes are dropped anyway). With
        `run_to_end`, an overrunning stage is reported as a timeout but awaited to its end:
        cancelling it while still queued for a thread would mean it never runs at all."""
        stage = registered.stage
        started = time.monotonic()
        timeout = self.timeout_s
        if stage.runs_on is RunsOn.LOOP:
            work = asyncio.ensure_future(stage.handler(call))
            source: asyncio.Future[Any] | concurrent.futures.Future[Any] = work
        else:
            # The thread's own future: it still carries the result when the hook ends after
            # the chain gave up on it (the asyncio wrapper is cancelled by then).
            source = self._pool.submit(stage.handler, call)
            work = asyncio.wrap_future(source)
        try:
            if run_to_end:
                await asyncio.wait({work}, timeout=timeout)
                if not work.done():
                    self._awaited_post.discard(asyncio.current_task())
                    self._failed(registered, call, "timeout", f"exceeded {timeout * 1000:.0f} ms",
                                 started, "running to its end")
                    try:
                        await asyncio.shield(work)
                    except Exception as exc:
                        log.warning("late_hook_failed", hook=registered.hook, phase=stage.phase.value,
                                    method=call.method, **call_ids(call), reason=repr(exc))
                    return False
                work.result()
            else:
                result = await asyncio.wait_for(work, timeout)
                if stage.phase is Phase.PRE and _is_effect(result):
                    result.commit()  # the chain keeps this result: here, before the call goes on
            return True
        except TimeoutError:
            kind, reason = "timeout", f"exceeded {timeout * 1000:.0f} ms"
        except Exception as exc:
            kind, reason = "error", repr(exc)
        if stage.phase is Phase.PRE:
            _release_when_done(source, registered.hook)
        self._failed(registered, call, kind, reason, started)
        return False

    def _failed(self, registered: Registered, call: CallContext, kind: str, reason: str,
                started: float, then: str | None = None) -> None:
        phase = registered.stage.phase.value
        self.failures[(registered.hook, phase, kind)] += 1
        call.hook_failures.append(f"{registered.hook}.{phase}: {reason}")
        log.warning(
            "hook_failed",
            hook=registered.hook,
            phase=phase,
            method=call.method,
            **call_ids(call),
            kind=kind,
            reason=reason,
            elapsed_ms=round((time.monotonic() - started) * 1000, 2),
            policy=self.failure_policy,
            **({"then": then} if then else {}),
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _hand_a_copy(call: CallContext) -> Any:
    """Give the hooks a copy of the call's request to change; returns the request as it was, to
    put back if their changes are dropped."""
    before = call.request
    attempt = type(before)()
    attempt.CopyFrom(before)
    call.request = attempt
    return before


def _is_effect(result: Any) -> bool:
    return result is not None and callable(getattr(result, "commit", None)) and callable(
        getattr(result, "release", None))


def _release_when_done(source: asyncio.Future[Any] | concurrent.futures.Future[Any], hook: str) -> None:
    """A dropped Pre result: release the PreEffect the hook returns, on the event loop, whenever
    it returns -- a hook that overran its timeout may finish long after the call went on."""
    loop = asyncio.get_running_loop()

    def release(_: object = None) -> None:
        if source.cancelled() or source.exception() is not None:
            return  # it never returned an effect
        effect = source.result()
        if _is_effect(effect):
            try:
                effect.release()
            except Exception:
                log.exception("hook_effect_release_failed", hook=hook)

    if isinstance(source, concurrent.futures.Future):
        def from_thread(_: object) -> None:
            try:
                loop.call_soon_threadsafe(release)
            except RuntimeError:  # the loop is closed: koordnode is exiting, nothing to keep
                pass

        source.add_done_callback(from_thread)
    else:
        source.add_done_callback(release)


def call_ids(call: CallContext) -> dict[str, str]:
    """The identifiers worth logging for a call (pod, sandbox id, container id/name)."""
    ids: dict[str, str] = {}
    req = call.request
    for field in ("pod_sandbox_id", "container_id"):
        value = getattr(req, field, "")
        if value:
            ids[field] = value
    resp = call.response
    for field in ("pod_sandbox_id", "container_id"):
        value = getattr(resp, field, "") if resp is not None else ""
        if value:
            ids[field] = value
    sandbox_config = None
    if call.method == "RunPodSandbox":
        sandbox_config = req.config
    elif call.method == "CreateContainer":
        sandbox_config = req.sandbox_config
        ids["container"] = req.config.metadata.name
    if sandbox_config is not None and sandbox_config.metadata.name:
        ids["pod"] = f"{sandbox_config.metadata.namespace}/{sandbox_config.metadata.name}"
    return ids

