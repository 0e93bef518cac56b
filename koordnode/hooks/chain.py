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
from typing import Any

import structlog

log = structlog.get_logger("koordnode.hooks")

SKIP_LABEL = "runtimeproxy.koordinator.sh/skip-hookserver"


def skip_requested(labels: dict[str, str]) -> bool:
    """True when a pod's labels ask koordnode to leave it alone."""
    return labels.get(SKIP_LABEL, "").lower() == "true"


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


class RuntimeHook:
    """Base class: override `pre` and/or `post` (plain or async) for the methods you list."""

    name = "hook"
    methods: frozenset[str] = frozenset()

    def pre(self, call: CallContext) -> None:  # noqa: B027 - optional override
        pass

    def post(self, call: CallContext) -> None:  # noqa: B027 - optional override
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
        self._pending_post: set[asyncio.Task] = set()
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

    async def run_pre(self, call: CallContext) -> None:
        """Run Pre hooks; raises HookFailed only under failure_policy = "fail"."""
        # Post hooks of earlier calls first: kubelet only sends this call after it saw their
        # responses, so their effects (e.g. the pod being recorded) must be visible now.
        await self.drain_post(self.timeout_s)
        if call.skip_hooks:
            return
        for hook in self.hooks:
            if call.method not in hook.methods or not _overrides(hook, "pre"):
                continue
            before = call.request
            attempt = type(before)()
            attempt.CopyFrom(before)
            call.request = attempt
            ok = await self._invoke(hook, "pre", call)
            if not ok:
                call.request = before
                if self.failure_policy == "fail":
                    raise HookFailed(hook.name, "pre", call.hook_failures[-1])

    def schedule_post(self, call: CallContext) -> None:
        if call.skip_hooks or not self.wants(call.method):
            return
        task = asyncio.get_running_loop().create_task(self._run_post(call))
        self._pending_post.add(task)
        task.add_done_callback(self._pending_post.discard)

    async def _run_post(self, call: CallContext) -> None:
        for hook in self.hooks:
            if call.method in hook.methods and _overrides(hook, "post"):
                await self._invoke(hook, "post", call)

    async def drain_post(self, timeout_s: float) -> None:
        if self._pending_post:
            await asyncio.wait(list(self._pending_post), timeout=timeout_s)

    async def _invoke(self, hook: RuntimeHook, phase: str, call: CallContext) -> bool:
        fn = getattr(hook, phase)
        started = time.monotonic()
        try:
            if inspect.iscoroutinefunction(fn):
                await asyncio.wait_for(fn(call), self.timeout_s)
            else:
                loop = asyncio.get_running_loop()
                await asyncio.wait_for(loop.run_in_executor(self._pool, fn, call), self.timeout_s)
            return True
        except (asyncio.TimeoutError, TimeoutError):
            kind, reason = "timeout", f"exceeded {self.timeout_s * 1000:.0f} ms"
        except Exception as exc:
            kind, reason = "error", repr(exc)
        self.failures[(hook.name, phase, kind)] += 1
        call.hook_failures.append(f"{hook.name}.{phase}: {reason}")
        log.warning(
            "hook failed",
            hook=hook.name,
            phase=phase,
            method=call.method,
            kind=kind,
            reason=reason,
            elapsed_ms=round((time.monotonic() - started) * 1000, 2),
            policy=self.failure_policy,
        )
        return False

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _overrides(hook: RuntimeHook, phase: str) -> bool:
    return getattr(type(hook), phase) is not getattr(RuntimeHook, phase)
