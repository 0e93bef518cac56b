"""The in-process runtime hook chain.

Pre hooks may change the request of an intercepted CRI call; Post hooks observe the outcome.
The chain is fail-open: a hook that raises or overruns its timeout is logged and counted, its
changes are dropped, and the call goes on with the request as it was before that hook
(with a single hook: the original request). `failure_policy = "fail"` turns a hook failure
into a failed CRI call instead, for operators who prefer that.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import inspect
import time
from collections import Counter
from typing import Any, Protocol
from collections.abc import Awaitable

import structlog

log = structlog.get_logger("koordnode.hooks")

SKIP_LABEL = "runtimeproxy.koordinator.sh/skip-hookserver"


def skip_requested(labels: dict[str, str]) -> bool:
    """True when a pod's labels ask koordnode to leave it alone."""
    value = labels.get(SKIP_LABEL, "")
    return len(value) == 4 and value.lower() == "true"  # bounded: label values are pod input


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
    # Hooks may leave facts here for their own Post step (e.g. a container id they planned for).
    scratch: dict[str, Any] = dataclasses.field(default_factory=dict)

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


class RuntimeHook:
    """Base class: override `pre` and/or `post` (plain or async) for the methods you list.

    `pre` may return a PreEffect (see there); anything else it returns is ignored."""

    name = "hook"
    methods: frozenset[str] = frozenset()
    # The methods whose request `pre` may change; `pre` runs for these only, so only these calls
    # can fail under failure_policy = "fail". None: all of `methods`.
    pre_methods: frozenset[str] | None = None

    def pre(self, call: CallContext) -> PreEffect | None:  # noqa: B027 - optional override
        pass

    def pre_inline(self, call: CallContext) -> None:  # noqa: B027 - optional override
        """A rewrite the runtime must see even when `pre` fails or overruns its timeout (a
        container's cgroup parent following its sandbox's: dropped, the two would be split).
        Runs on the event loop, before `pre`, for `pre_methods`: cheap, no blocking I/O."""

    def post(self, call: CallContext) -> Awaitable[None] | None:  # noqa: B027 - optional override
        pass


class HookFailed(Exception):
    def __init__(self, hook: str, phase: str, reason: str) -> None:
        super().__init__(f"hook {hook} failed in {phase}: {reason}")
        self.hook = hook
        self.phase = phase
        self.reason = reason


class HookChain:
    def __init__(
        self,
        hooks: list[RuntimeHook],
        *,
        timeout_s: float = 0.2,
        failure_policy: str = "ignore",
        max_threads: int = 8,
    ) -> None:
        self.hooks = list(hooks)
        self.timeout_s = timeout_s
        self.failure_policy = failure_policy
        # Plain hooks run in threads so a hung one cannot stall the relay's event loop.
        self._pool = concurrent.futures.ThreadPoolExecutor(max_threads, thread_name_prefix="hook")
        self._pending_post: set[asyncio.Task[Any]] = set()
        # The Post tasks a new call waits for: not those already late, or one stuck hook would
        # cost every later call the full timeout.
        self._awaited_post: set[asyncio.Task[Any]] = set()
        self.failures: Counter[tuple[str, str, str]] = Counter()  # (hook, phase, kind)

    def configure(self, *, timeout_s: float, failure_policy: str) -> None:
        self.timeout_s = timeout_s
        self.failure_policy = failure_policy

    async def run_post_now(self, call: CallContext) -> None:
        """Run the Post hooks of a call and wait for them (NRI: the answer carries their effects)."""
        if call.skip_hooks or not self.wants(call.method):
            return
        await self._run_post(call)

    def wants(self, method: str) -> bool:
        return any(method in h.methods for h in self.hooks)

    @staticmethod
    def _runs_pre(hook: RuntimeHook, method: str, phase: str = "pre") -> bool:
        if method not in hook.methods or not _overrides(hook, phase):
            return False
        return hook.pre_methods is None or method in hook.pre_methods

    async def run_pre(self, call: CallContext) -> None:
        """Run Pre hooks; raises HookFailed only under failure_policy = "fail"."""
        # Post hooks of earlier calls first: kubelet only sends this call after it saw their
        # responses, so their effects (e.g. the pod being recorded) must be visible now.
        await self.drain_post(self.timeout_s)
        if call.skip_hooks:
            return
        for hook in self.hooks:
            if self._runs_pre(hook, call.method, "pre_inline"):
                self._rewrite_inline(hook, call)
            if not self._runs_pre(hook, call.method):
                continue
            before = _hand_a_copy(call)
            ok = await self._invoke(hook, "pre", call)
            if not ok:
                call.request = before
                # Its effect (if it ever returns one) goes with its dropped result: _settle_pre.
                if self.failure_policy == "fail":
                    raise HookFailed(hook.name, "pre", call.hook_failures[-1])

    def _rewrite_inline(self, hook: RuntimeHook, call: CallContext) -> None:
        """A hook's `pre_inline`: kept whatever its `pre` does; one that raises is dropped whole."""
        before = _hand_a_copy(call)
        started = time.monotonic()
        try:
            hook.pre_inline(call)
        except Exception as exc:
            call.request = before
            self._failed(hook, "pre_inline", call, "error", repr(exc), started)
            if self.failure_policy == "fail":
                raise HookFailed(hook.name, "pre_inline", call.hook_failures[-1]) from exc

    def schedule_post(self, call: CallContext) -> None:
        if call.skip_hooks or not self.wants(call.method):
            return
        task = asyncio.get_running_loop().create_task(self._run_post(call))
        self._pending_post.add(task)
        self._awaited_post.add(task)
        task.add_done_callback(self._pending_post.discard)
        task.add_done_callback(self._awaited_post.discard)

    async def _run_post(self, call: CallContext) -> None:
        # In order, each to its end: a Post hook keeps books (state, CPU release), so one that
        # overruns its timeout is counted late but still runs, exactly once, before the next.
        for hook in self.hooks:
            if call.method in hook.methods and _overrides(hook, "post"):
                await self._invoke(hook, "post", call, run_to_end=True)

    async def drain_post(self, timeout_s: float) -> None:
        if self._awaited_post:
            await asyncio.wait(list(self._awaited_post), timeout=timeout_s)

    async def _invoke(self, hook: RuntimeHook, phase: str, call: CallContext,
                      run_to_end: bool = False) -> bool:
        """Run one hook within the timeout; False if it failed or overran.

        A Pre hook that overruns is cancelled (its changes are dropped anyway). With
        `run_to_end`, an overrunning hook is reported as a timeout but awaited to its end:
        cancelling it while still queued for a thread would mean it never runs at all."""
        fn = getattr(hook, phase)
        started = time.monotonic()
        timeout = self.timeout_s
        if inspect.iscoroutinefunction(fn):
            work = asyncio.ensure_future(fn(call))
            source: asyncio.Future[Any] | concurrent.futures.Future[Any] = work
        else:
            # The thread's own future: it still carries the result when the hook ends after
            # the chain gave up on it (the asyncio wrapper is cancelled by then).
            source = self._pool.submit(fn, call)
            work = asyncio.wrap_future(source)
        try:
            if run_to_end:
                await asyncio.wait({work}, timeout=timeout)
                if not work.done():
                    self._awaited_post.discard(asyncio.current_task())
                    self._failed(hook, phase, call, "timeout", f"exceeded {timeout * 1000:.0f} ms",
                                 started, "running to its end")
                    try:
                        await asyncio.shield(work)
                    except Exception as exc:
                        log.warning("late_hook_failed", hook=hook.name, phase=phase,
                                    method=call.method, **call_ids(call), reason=repr(exc))
                    return False
                work.result()
            else:
                result = await asyncio.wait_for(work, timeout)
                if phase == "pre" and _is_effect(result):
                    result.commit()  # the chain keeps this result: here, before the call goes on
            return True
        except TimeoutError:
            kind, reason = "timeout", f"exceeded {timeout * 1000:.0f} ms"
        except Exception as exc:
            kind, reason = "error", repr(exc)
        if phase == "pre":
            _release_when_done(source, hook.name)
        self._failed(hook, phase, call, kind, reason, started)
        return False

    def _failed(self, hook: RuntimeHook, phase: str, call: CallContext, kind: str, reason: str,
                started: float, then: str | None = None) -> None:
        self.failures[(hook.name, phase, kind)] += 1
        call.hook_failures.append(f"{hook.name}.{phase}: {reason}")
        log.warning(
            "hook_failed",
            hook=hook.name,
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


def _overrides(hook: RuntimeHook, phase: str) -> bool:
    return getattr(type(hook), phase) is not getattr(RuntimeHook, phase)
