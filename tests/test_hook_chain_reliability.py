"""The hook chain under timeouts and a busy thread pool (in process: what is asserted here is
the chain's own scheduling, which containerd cannot show):

- Post hooks keep books (state, CPU release): each runs exactly once whatever the timeout;
- under failure_policy = "fail" only a hook that can change the call's request can fail it;
- "hook_failed" log lines name the pod and container.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import grpc
import pytest
from structlog.testing import capture_logs

from koordnode.cri import api_pb2 as pb
from koordnode.hooks.chain import CallContext, HookChain, HookFailed, Phase, RunsOn, Stage
from koordnode.hooks.hw_qos import HardwareQoSHook
from koordnode.hooks.qos_hook import QoSHook
from koordnode.hooks.state_recorder import StateRecorder
from koordnode.model.state import NodeState
from koordnode.cri.methods import INTERCEPTED_METHODS
from test_relay import RS, Env, create_request, run


class CountingPost:
    """A bookkeeping Post hook slower than the timeout (a thread stage: it runs in the pool)."""

    name = "counting"

    def stages(self):
        return [Stage.in_thread("RemovePodSandbox", Phase.POST, self.post)]

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.seen: Counter[str] = Counter()
        self.lock = threading.Lock()

    def post(self, call: CallContext) -> None:
        time.sleep(self.seconds)
        with self.lock:
            self.seen[call.request.pod_sandbox_id] += 1


class AsyncCountingPost:
    name = "async-counting"

    def stages(self):
        return [Stage.on_loop("RemovePodSandbox", Phase.POST, self.post)]

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    async def post(self, call: CallContext) -> None:
        await asyncio.sleep(0.01)
        self.seen[call.request.pod_sandbox_id] += 1


async def _post_many(chain: HookChain, n: int) -> None:
    for i in range(n):
        call = CallContext(method="RemovePodSandbox", request=pb.RemovePodSandboxRequest(pod_sandbox_id=f"p{i}"))
        call.grpc_status = 0
        chain.schedule_post(call)
    deadline = time.monotonic() + 20
    while chain._pending_post and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def test_post_hooks_queued_past_their_timeout_still_run_exactly_once():
    """1 ms timeout, one worker thread: most Post hooks are still queued when it fires."""
    threaded, asynchronous = CountingPost(0.005), AsyncCountingPost()
    chain = HookChain([threaded, asynchronous], timeout_s=0.001, max_threads=1)

    async def body():
        await _post_many(chain, 40)

    try:
        run(body())
    finally:
        chain.close()
    expected = Counter({f"p{i}": 1 for i in range(40)})
    assert threaded.seen == expected
    assert asynchronous.seen == expected
    # They are still reported as late.
    assert chain.failures[("counting", "post", "timeout")] > 0


def test_a_late_post_hook_finishes_before_the_next_hook_of_the_call():
    order: list[str] = []

    class Slow:
        name = "slow"

        def stages(self):
            return [Stage.in_thread("RemovePodSandbox", Phase.POST, self.post)]

        def post(self, call):
            time.sleep(0.05)
            order.append("slow")

    class Next:
        name = "next"

        def stages(self):
            return [Stage.on_loop("RemovePodSandbox", Phase.POST, self.post)]

        async def post(self, call):
            order.append("next")

    chain = HookChain([Slow(), Next()], timeout_s=0.001)
    try:
        run(_post_many(chain, 1))
    finally:
        chain.close()
    assert order == ["slow", "next"]


def test_a_stuck_post_hook_does_not_delay_later_calls():
    """A Post hook that never returns is waited for once (its timeout), not by every call."""
    release = threading.Event()

    class Stuck:
        name = "stuck"

        def stages(self):
            return [Stage.in_thread(m, Phase.POST, self.post) for m in ("RemovePodSandbox", "CreateContainer")]

        def post(self, call):
            release.wait(10)

    chain = HookChain([Stuck()], timeout_s=0.2)

    async def body():
        await _schedule(chain, 1)
        await asyncio.sleep(0.3)  # it is late now
        started = time.monotonic()
        for _ in range(5):
            await chain.run_pre(CallContext(method="CreateContainer", request=create_request()))
        return time.monotonic() - started

    try:
        elapsed = run(body())
    finally:
        release.set()
        chain.close()
    assert elapsed < 0.2, elapsed


def test_a_call_no_pre_hook_reads_goes_on_at_once_and_its_post_hooks_still_come_after_the_earlier():
    """kubelet sends StartContainer right after CreateContainer's answer: nothing looks at it
    before it is forwarded, so it does not wait for CreateContainer's bookkeeping, but its own
    bookkeeping (the class values) runs after that."""
    order: list[str] = []
    release = threading.Event()

    class Books:
        name = "books"

        def stages(self):
            return [Stage.in_thread("CreateContainer", Phase.PRE, self.pre),
                    *(Stage.in_thread(m, Phase.POST, self.post) for m in ("CreateContainer", "StartContainer"))]

        def pre(self, call):
            order.append(f"pre {call.method}")

        def post(self, call):
            if call.method == "CreateContainer":
                release.wait(5)
            order.append(f"post {call.method}")

    chain = HookChain([Books()], timeout_s=2.0)

    async def body():
        create = CallContext(method="CreateContainer", request=create_request())
        await chain.run_pre(create)
        create.grpc_status = 0
        chain.schedule_post(create)
        start = CallContext(method="StartContainer", request=pb.StartContainerRequest(container_id="c"))
        await asyncio.wait_for(chain.run_pre(start), 1.0)  # not held by CreateContainer's Post hook
        order.append("StartContainer forwarded")
        start.grpc_status = 0
        chain.schedule_post(start)
        await asyncio.sleep(0.05)
        release.set()
        await chain.drain_post(5.0)

    try:
        run(body())
    finally:
        release.set()
        chain.close()
    assert order == ["pre CreateContainer", "StartContainer forwarded", "post CreateContainer",
                     "post StartContainer"]


async def _schedule(chain: HookChain, n: int) -> None:
    for i in range(n):
        call = CallContext(method="RemovePodSandbox", request=pb.RemovePodSandboxRequest(pod_sandbox_id=f"p{i}"))
        call.grpc_status = 0
        chain.schedule_post(call)


class SlowCreatePre:
    """Changes CreateContainer requests only; Post-only bookkeeping for the rest."""

    name = "slow-create"

    def stages(self):
        return [Stage.in_thread("CreateContainer", Phase.PRE, self.pre),
                *(Stage.in_thread(m, Phase.POST, self.post) for m in INTERCEPTED_METHODS)]

    def pre(self, call: CallContext) -> None:
        time.sleep(0.5)
        call.request.config.linux.resources.cpu_shares = 2

    def post(self, call: CallContext) -> None:
        pass


def _occupy(chain: HookChain, seconds: float) -> None:
    """Keep every worker thread busy, as on a node where hooks queue behind slow cgroup writes."""
    for _ in range(chain._pool._max_workers):
        chain._pool.submit(time.sleep, seconds)


def test_failure_policy_fail_only_fails_calls_a_hook_can_change(tmp_path):
    async def body():
        async with Env(tmp_path, [SlowCreatePre()], failure_policy="fail", timeout_s=0.05) as env:
            _occupy(env.chain, 1.0)
            # StopContainer reaches the runtime (the fake answers NOT_FOUND) instead of failing in
            # koordnode with "hook ... failed in pre".
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await env.rt.StopContainer(pb.StopContainerRequest(container_id="x"))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND, err.value.details()
            assert any(m == RS + "StopContainer" for m, *_ in env.backend.received)
            # The one call the hook changes does fail under "fail".
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await env.rt.CreateContainer(create_request())
            assert err.value.code() == grpc.StatusCode.INTERNAL
            assert "slow-create failed in pre" in err.value.details()

    run(body())


class _RecordingEngine:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name):
        def record(*args, **kwargs):
            self.calls.append(name)
            return (_Decision(), None) if name == "plan_create" else _Decision()  # (plan, CPUs reserved)
        return record


class _Decision:
    class qos_class:  # noqa: N801 - shaped like QoSDecision.qos_class
        value = "LS"

    why = "test"


def test_the_qos_hooks_pre_stages_are_exactly_the_requests_it_changes():
    """Only these calls can fail under failure_policy = "fail"; all its stages run in threads
    (they write cgroup files) but the inline rewrite, which must survive a dropped Pre, and
    RunPodSandbox's Post, which hops to a thread only for a pod with file work (a pod slice in the
    systemd BE group; the pod's class values come with its first container's start)."""
    chain = HookChain([QoSHook(_RecordingEngine())])
    try:
        pre = {m for m in INTERCEPTED_METHODS if chain.at(m, Phase.PRE)}
        assert pre == {"RunPodSandbox", "CreateContainer", "UpdateContainerResources", "UpdatePodSandboxResources"}
        assert [r.stage.runs_on for r in chain.at("CreateContainer", Phase.PRE_INLINE)] == [RunsOn.LOOP]
        for method in INTERCEPTED_METHODS:
            for phase in (Phase.PRE, Phase.POST):
                on_loop = method == "RunPodSandbox" and phase is Phase.POST
                want = RunsOn.LOOP if on_loop else RunsOn.THREAD
                assert all(r.stage.runs_on is want for r in chain.at(method, phase)), (method, phase)
            assert chain.wants(method), method
    finally:
        chain.close()


@pytest.mark.parametrize("method", ["RunPodSandbox", "CreateContainer", "UpdateContainerResources",
                                    "UpdatePodSandboxResources"])
def test_each_pre_stage_of_the_qos_hook_asks_the_engine(method):
    engine = _RecordingEngine()
    chain = HookChain([QoSHook(engine)])
    try:
        call = CallContext(method=method, request=getattr(pb, f"{method}Request")())
        for registered in chain.at(method, Phase.PRE):
            registered.stage.handler(call)
    finally:
        chain.close()
    assert engine.calls, method
    if method == "RunPodSandbox":
        assert call.facts.pod_class is not None and call.facts.pod_class.qos_class == "LS"


def test_the_state_recorder_posts_first_on_the_loop():
    """The other hooks' Post stages read what it recorded (or, for a removed pod, the facts)."""
    state = NodeState()
    chain = HookChain([StateRecorder(state), QoSHook(_RecordingEngine()), HardwareQoSHook(networks=None, resctrl=None)])
    try:
        for method in ("RunPodSandbox", "RemovePodSandbox", "StopPodSandbox"):
            first = chain.at(method, Phase.POST)[0]
            assert (first.hook, first.stage.runs_on) == ("state-recorder", RunsOn.LOOP), method
        assert [r.hook for r in chain.at("RemovePodSandbox", Phase.POST)] == ["state-recorder", "qos", "hw-qos"]
    finally:
        chain.close()


def test_failure_policy_fail_with_a_busy_pool_and_the_qos_hook(tmp_path):
    """The reported case: a short timeout and queued hooks failed StartContainer,
    StopPodSandbox and RemovePodSandbox with "hook qos failed in pre"."""
    async def body():
        async with Env(tmp_path, [QoSHook(_RecordingEngine())], failure_policy="fail", timeout_s=0.02) as env:
            _occupy(env.chain, 1.0)
            for method, request in (("StartContainer", pb.StartContainerRequest(container_id="c")),
                                    ("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id="p")),
                                    ("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id="p")),
                                    ("RemoveContainer", pb.RemoveContainerRequest(container_id="c"))):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await getattr(env.rt, method)(request)
                # The fake runtime answers UNIMPLEMENTED for these: the call reached it.
                assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED, (method, err.value.details())

    run(body())


def test_hook_failed_log_lines_name_the_pod_and_container():
    class Raising:
        name = "raising"

        def stages(self):
            return [Stage.in_thread("CreateContainer", Phase.PRE, self.pre),
                    Stage.in_thread("StopPodSandbox", Phase.POST, self.post)]

        def pre(self, call):
            raise RuntimeError("boom")

        def post(self, call):
            raise RuntimeError("boom")

    chain = HookChain([Raising()], timeout_s=1.0)
    req = create_request(name="app")
    req.sandbox_config.metadata.namespace = "team"

    async def body():
        await chain.run_pre(CallContext(method="CreateContainer", request=req))
        stop = CallContext(method="StopPodSandbox", request=pb.StopPodSandboxRequest(pod_sandbox_id="sb-9"))
        stop.grpc_status = 0
        chain.schedule_post(stop)
        await chain.drain_post(2.0)

    try:
        with capture_logs() as logs:
            run(body())
    finally:
        chain.close()
    failed = [e for e in logs if e["event"] == "hook_failed"]
    assert len(failed) == 2
    create, stop = failed
    assert create["pod"] == "team/pod" and create["container"] == "app" and create["pod_sandbox_id"] == "sb-1"
    assert stop["pod_sandbox_id"] == "sb-9" and stop["phase"] == "post"


class FollowsThenStalls:
    """Rewrites the cgroup parent inline, then overruns its `pre` (as the QoS hook can on a slow
    node waiting for the engine's lock)."""

    name = "follows"

    def stages(self):
        return [Stage.inline("CreateContainer", self.pre_inline), Stage.in_thread("CreateContainer", Phase.PRE, self.pre)]

    def __init__(self, *, inline_raises: bool = False) -> None:
        self.release = threading.Event()
        self.inline_raises = inline_raises

    def pre_inline(self, call: CallContext) -> None:
        call.request.sandbox_config.linux.cgroup_parent = "/kubepods/koordnode_be/poda"
        if self.inline_raises:
            raise RuntimeError("inline boom")

    def pre(self, call: CallContext) -> None:
        call.request.config.annotations["from-pre"] = "1"
        if not self.inline_raises:
            self.release.wait(5)


def test_an_inline_rewrite_is_kept_when_pre_overruns():
    """The chain drops an overrunning `pre`'s changes; the inline rewrite still reaches the
    runtime (the CI failure: a BE pod's container created outside the group its sandbox is in)."""
    hook = FollowsThenStalls()
    chain = HookChain([hook], timeout_s=0.05)
    call = CallContext(method="CreateContainer", request=create_request(name="app"))
    try:
        run(chain.run_pre(call))
    finally:
        hook.release.set()
        chain.close()
    assert call.request.sandbox_config.linux.cgroup_parent == "/kubepods/koordnode_be/poda"
    assert "from-pre" not in call.request.config.annotations
    assert call.hook_failures == ["follows.pre: exceeded 50 ms"]


def test_an_inline_rewrite_that_raises_is_dropped_whole_and_pre_still_runs():
    hook = FollowsThenStalls(inline_raises=True)
    chain = HookChain([hook], timeout_s=1.0)
    request = create_request(name="app")
    kubelet_parent = request.sandbox_config.linux.cgroup_parent
    call = CallContext(method="CreateContainer", request=request)
    try:
        with capture_logs() as logs:
            run(chain.run_pre(call))
    finally:
        chain.close()
    assert call.request.sandbox_config.linux.cgroup_parent == kubelet_parent
    assert call.request.config.annotations["from-pre"] == "1"
    assert [e["phase"] for e in logs if e["event"] == "hook_failed"] == ["pre_inline"]
    # Under failure_policy = "fail" the call fails instead of going on without the rewrite.
    strict = HookChain([FollowsThenStalls(inline_raises=True)], timeout_s=1.0, failure_policy="fail")
    try:
        with pytest.raises(HookFailed, match="follows failed in pre_inline"):
            run(strict.run_pre(CallContext(method="CreateContainer", request=create_request(name="app"))))
    finally:
        strict.close()
