"""The relay against a small gRPC backend written here (grpcio), for what containerd 1.6 can't show:
server streaming, arbitrary status codes and metadata, huge requests, hooks that misbehave.
"""

from __future__ import annotations

import asyncio
import os
import time

import grpc
import pytest
from structlog.testing import capture_logs

from koordnode.cri import api_pb2 as pb
from support import api_pb2_grpc as pb_grpc
from koordnode.hooks.chain import CallContext, HookChain, Phase, Stage
from koordnode.hooks.interceptor import ChainInterceptor
from koordnode.metrics.recorder import Metrics
from koordnode.proxy.handler import InterceptingHandler
from koordnode.proxy.server import ProxyServer
from koordnode.model.state import NodeState

RS = "/runtime.v1.RuntimeService/"


class Backend(grpc.GenericRpcHandler):
    """Answers every method with raw bytes; records what it received."""

    def __init__(self) -> None:
        self.received: list[tuple[str, bytes, dict, float | None]] = []

    def service(self, details):
        method = details.method

        async def unary(request: bytes, context: grpc.aio.ServicerContext):
            md = dict(context.invocation_metadata())
            self.received.append((method, request, md, context.time_remaining()))
            if method == RS + "Version":
                return pb.VersionResponse(version="0.1.0", runtime_name="fake", runtime_version="1",
                                          runtime_api_version="v1").SerializeToString()
            if method == RS + "CreateContainer":
                return pb.CreateContainerResponse(container_id="c-" + str(len(request))).SerializeToString()
            if method == RS + "RunPodSandbox":
                return pb.RunPodSandboxResponse(pod_sandbox_id="sb-1").SerializeToString()
            if method == RS + "StopContainer":
                await context.abort(grpc.StatusCode.NOT_FOUND, "container \"x\" not found: \u2603 100%",
                                    trailing_metadata=(("x-detail", "from-backend"),))
            if method == RS + "ExecSync":
                await asyncio.sleep(0.5)
                return pb.ExecSyncResponse(stdout=b"slow").SerializeToString()
            if method.endswith("/Echo"):
                await context.send_initial_metadata((("x-initial", md.get("x-token", "")),))
                context.set_trailing_metadata((("x-trailing", "t"),))
                return request[::-1]
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"unknown method {method}")

        async def stream(request: bytes, context):
            self.received.append((method, request, dict(context.invocation_metadata()), None))
            for i in range(5):
                yield pb.ContainerEventResponse(container_id=f"c{i}",
                                                container_event_type=pb.CONTAINER_STARTED_EVENT).SerializeToString()
                await asyncio.sleep(0.01)

        if method == RS + "GetContainerEvents":
            return grpc.unary_stream_rpc_method_handler(stream)
        return grpc.unary_unary_rpc_method_handler(unary)


class Recorder:
    name = "recorder"

    def __init__(self) -> None:
        self.pre_calls: list[str] = []
        self.post_calls: list[CallContext] = []

    def stages(self):
        return [Stage.on_loop(m, phase, fn) for m in ("CreateContainer", "RunPodSandbox", "StopContainer")
                for phase, fn in ((Phase.PRE, self.pre), (Phase.POST, self.post))]

    async def pre(self, call: CallContext) -> None:
        self.pre_calls.append(call.method)

    async def post(self, call: CallContext) -> None:
        self.post_calls.append(call)


class CreatePre:
    """A hook with one thread stage: Pre of CreateContainer (its `pre`)."""

    def stages(self):
        return [Stage.in_thread("CreateContainer", Phase.PRE, self.pre)]


class Grow(CreatePre):
    """Changes the request: adds `size` bytes of annotation (and a cpu_shares tag)."""

    name = "grow"

    def __init__(self, size: int) -> None:
        self.size = size

    def pre(self, call: CallContext) -> None:
        call.request.config.linux.resources.cpu_shares = 4242
        if self.size:
            call.request.config.annotations["pad"] = "x" * self.size
        else:
            call.request.config.annotations.clear()


class Raising(CreatePre):
    name = "raising"

    def pre(self, call: CallContext) -> None:
        call.request.config.linux.resources.cpu_shares = 1  # must be dropped
        raise RuntimeError("boom")


class Hanging(CreatePre):
    name = "hanging"

    def pre(self, call: CallContext) -> None:
        call.request.config.linux.resources.cpu_shares = 1  # must be dropped
        time.sleep(3)


class Env:
    def __init__(self, tmp_path, hooks, failure_policy="ignore", timeout_s=0.2, backend_up=True):
        self.tmp = tmp_path
        self.hooks = hooks
        self.failure_policy = failure_policy
        self.timeout_s = timeout_s
        self.backend_up = backend_up
        self.backend_sock = str(tmp_path / "backend.sock")
        self.proxy_sock = str(tmp_path / "proxy.sock")
        self.backend = Backend()

    async def __aenter__(self):
        self.server = None
        if self.backend_up:
            self.server = grpc.aio.server()
            self.server.add_generic_rpc_handlers((self.backend,))
            self.server.add_insecure_port(f"unix://{self.backend_sock}")
            await self.server.start()
        self.state = NodeState()
        self.chain = HookChain(self.hooks, timeout_s=self.timeout_s, failure_policy=self.failure_policy)
        self.proxy = ProxyServer(self.proxy_sock, self.backend_sock, InterceptingHandler(ChainInterceptor(self.chain, self.state.pod_labels_for, Metrics())))
        await self.proxy.start()
        self.channel = grpc.aio.insecure_channel(f"unix://{self.proxy_sock}")
        self.rt = pb_grpc.RuntimeServiceStub(self.channel)
        return self

    async def __aexit__(self, *exc):
        await self.channel.close()
        await self.proxy.stop(1.0)
        if self.server is not None:
            await self.server.stop(0)
        self.chain.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def create_request(name="app", annotations=None) -> pb.CreateContainerRequest:
    req = pb.CreateContainerRequest(pod_sandbox_id="sb-1")
    req.config.metadata.name = name
    req.config.image.image = "busybox"
    req.config.linux.resources.cpu_shares = 512
    req.config.annotations.update(annotations or {})
    req.sandbox_config.metadata.name = "pod"
    return req


def test_unary_passthrough_and_socket_mode(tmp_path):
    async def body():
        async with Env(tmp_path, []) as env:
            resp = await env.rt.Version(pb.VersionRequest(version="v1"))
            assert resp.runtime_name == "fake"
            assert oct(os.stat(env.proxy_sock).st_mode & 0o777) == "0o660"
            method, raw, _, _ = env.backend.received[0]
            assert method == RS + "Version"
            assert raw == pb.VersionRequest(version="v1").SerializeToString()

    run(body())


def test_status_message_and_metadata_come_back_verbatim(tmp_path):
    async def body():
        async with Env(tmp_path, [Recorder()]) as env:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await env.rt.StopContainer(pb.StopContainerRequest(container_id="x"))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            assert err.value.details() == "container \"x\" not found: \u2603 100%"
            assert ("x-detail", "from-backend") in tuple(err.value.trailing_metadata())

            echo = env.channel.unary_unary(RS + "Echo")
            call = echo(b"abc", metadata=(("x-token", "secret"),), timeout=7)
            assert await call == b"cba"
            assert ("x-initial", "secret") in tuple(await call.initial_metadata())
            assert ("x-trailing", "t") in tuple(await call.trailing_metadata())
            remaining = env.backend.received[-1][3]
            assert 5 < remaining <= 7.1  # the client's deadline reached the backend

    run(body())


def test_unknown_and_old_api_methods_are_forwarded(tmp_path):
    async def body():
        async with Env(tmp_path, [Recorder()]) as env:
            assert await env.channel.unary_unary("/runtime.v1.RuntimeService/Echo")(b"12") == b"21"
            assert await env.channel.unary_unary("/runtime.v1alpha2.RuntimeService/Echo")(b"ab") == b"ba"
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await env.channel.unary_unary("/runtime.v1.RuntimeService/NoSuchThing")(b"")
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
            # A CreateContainer under the old API is not intercepted.
            old = env.channel.unary_unary("/runtime.v1alpha2.RuntimeService/CreateContainer")
            with pytest.raises(grpc.aio.AioRpcError):
                await old(create_request().SerializeToString())
            assert env.hooks[0].pre_calls == []

    run(body())


def test_server_streaming_is_relayed(tmp_path):
    async def body():
        async with Env(tmp_path, []) as env:
            events = [e.container_id async for e in env.rt.GetContainerEvents(pb.GetEventsRequest())]
            assert events == ["c0", "c1", "c2", "c3", "c4"]

    run(body())


def test_pre_hook_changes_request_and_post_hook_sees_response(tmp_path):
    async def body():
        rec = Recorder()
        async with Env(tmp_path, [Grow(100), rec]) as env:
            resp = await env.rt.CreateContainer(create_request())
            sent = pb.CreateContainerRequest.FromString(env.backend.received[-1][1])
            assert sent.config.linux.resources.cpu_shares == 4242
            assert sent.config.annotations["pad"] == "x" * 100
            await env.chain.drain_post(1)
            call = rec.post_calls[-1]
            assert call.succeeded and call.response.container_id == resp.container_id
            assert call.request.config.linux.resources.cpu_shares == 4242

    run(body())


def test_cri_call_log_line_splits_the_time_into_hooks_and_the_rest(tmp_path):
    """An operator reads koordnode's share of a slow call from its log line."""

    class SlowPre:
        name = "slow-pre"

        def stages(self):
            return [Stage.in_thread("CreateContainer", Phase.PRE, self.pre)]

        def pre(self, call: CallContext) -> None:
            time.sleep(0.05)

    async def body():
        async with Env(tmp_path, [SlowPre()]) as env:
            with capture_logs() as logs:
                await env.rt.CreateContainer(create_request())
        return [e for e in logs if e["event"] == "cri_call"]

    [line] = run(body())
    assert line["method"] == "CreateContainer"
    assert line["hooks_ms"] >= 50
    assert line["runtime_ms"] >= 0
    assert abs(line["hooks_ms"] + line["runtime_ms"] - line["duration_ms"]) < 0.01


@pytest.mark.parametrize("size", [0, 70_000, 300_000])
def test_flow_control_survives_requests_that_change_size(tmp_path, size):
    """Many calls whose size the hook changes: the connection must not stall or break.

    300 kB per call against 64 kB default windows: the relay has to wait for the backend's
    window, and correct the client's view of it call after call.
    """

    async def body():
        async with Env(tmp_path, [Grow(size)], timeout_s=2) as env:
            for _i in range(12):
                req = create_request(annotations={"orig": "y" * 20_000})
                await asyncio.wait_for(env.rt.CreateContainer(req), 10)
                sent = pb.CreateContainerRequest.FromString(env.backend.received[-1][1])
                assert sent.config.linux.resources.cpu_shares == 4242
                assert len(sent.config.annotations.get("pad", "")) == size
            # Pass-through traffic on the same connection still flows after the drift.
            for _ in range(5):
                assert await env.channel.unary_unary(RS + "Echo")(b"z" * 50_000) == b"z" * 50_000

    run(body())


def test_concurrent_connections_each_get_their_own_bytes(tmp_path):
    """Every connection's reads go through one buffer on the loop's thread: six clients, each
    with its own channel, echo large payloads of their own at the same time; every answer is
    exactly its own request reversed (nothing read for one connection shows up in another)."""

    async def body():
        async with Env(tmp_path, []) as env:
            channels = [grpc.aio.insecure_channel(f"unix://{env.proxy_sock}") for _ in range(6)]
            try:
                async def client(i: int) -> None:
                    echo = channels[i].unary_unary(RS + "Echo")
                    for round_ in range(4):
                        payload = bytes((i * 37 + round_ + k) % 251 for k in range(150_000 + i * 1000))
                        assert await echo(payload) == payload[::-1]

                await asyncio.gather(*(client(i) for i in range(6)))
            finally:
                for channel in channels:
                    await channel.close()

    run(body())


@pytest.mark.parametrize("hook", [Raising(), Hanging()], ids=["raising", "hanging"])
def test_failing_hook_fails_open(tmp_path, hook):
    async def body():
        async with Env(tmp_path, [hook]) as env:
            started = time.monotonic()
            resp = await env.rt.CreateContainer(create_request())
            elapsed = time.monotonic() - started
            assert resp.container_id
            sent = pb.CreateContainerRequest.FromString(env.backend.received[-1][1])
            assert sent == create_request()  # the original request went to the runtime
            assert elapsed < 2.5  # bounded by the hook timeout, not by the hung hook
            kind = "error" if isinstance(hook, Raising) else "timeout"
            assert env.chain.failures[(hook.name, "pre", kind)] == 1

    run(body())


def test_failure_policy_fail_fails_the_call(tmp_path):
    async def body():
        async with Env(tmp_path, [Raising()], failure_policy="fail") as env:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await env.rt.CreateContainer(create_request())
            assert err.value.code() == grpc.StatusCode.INTERNAL
            assert "raising" in err.value.details()
            assert not any(m == RS + "CreateContainer" for m, *_ in env.backend.received)
            # The connection is still good.
            assert (await env.rt.Version(pb.VersionRequest())).runtime_name == "fake"

    run(body())


def test_skip_label_bypasses_hooks(tmp_path):
    async def body():
        rec = Recorder()
        async with Env(tmp_path, [Grow(10), rec]) as env:
            req = create_request()
            req.sandbox_config.labels["runtimeproxy.koordinator.sh/skip-hookserver"] = "true"
            await env.rt.CreateContainer(req)
            sent = pb.CreateContainerRequest.FromString(env.backend.received[-1][1])
            assert sent == req
            assert rec.pre_calls == []

    run(body())


def test_backend_down_gives_unavailable(tmp_path):
    async def body():
        async with Env(tmp_path, [], backend_up=False) as env:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await env.rt.Version(pb.VersionRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE

    run(body())


def test_graceful_stop_finishes_calls_in_flight(tmp_path):
    async def body():
        async with Env(tmp_path, []) as env:
            slow = asyncio.ensure_future(env.rt.ExecSync(pb.ExecSyncRequest(container_id="c")))
            await asyncio.sleep(0.2)
            await env.proxy.stop(3.0)
            assert (await slow).stdout == b"slow"
            assert not os.path.exists(env.proxy_sock)

    run(body())


def test_stale_socket_replaced_and_live_socket_refused(tmp_path):
    import socket as socketlib

    from koordnode.proxy.server import SocketInUseError, prepare_socket_path

    path = str(tmp_path / "s.sock")
    live = socketlib.socket(socketlib.AF_UNIX)
    live.bind(path)
    live.listen(1)
    with pytest.raises(SocketInUseError):
        prepare_socket_path(path)
    live.close()  # the file stays, nobody listens: stale
    prepare_socket_path(path)
    assert not os.path.exists(path)
    (tmp_path / "plain").write_text("x")
    with pytest.raises(SocketInUseError):
        prepare_socket_path(str(tmp_path / "plain"))


def test_oversized_intercepted_request_is_refused_like_the_runtime_would(tmp_path):
    async def body():
        async with Env(tmp_path, [Recorder()]) as env:
            req = create_request(annotations={"huge": "x" * (17 * 1024 * 1024)})
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await env.rt.CreateContainer(req, timeout=30)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert not any(m == RS + "CreateContainer" for m, *_ in env.backend.received)
            # The connection still works afterwards.
            assert (await env.rt.Version(pb.VersionRequest())).runtime_name == "fake"

    run(body())
