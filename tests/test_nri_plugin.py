"""The NRI plugin against a fake runtime that speaks the protocol (tests/support/nri_runtime.py):
registration, event subscription, adjustments, deadlines, framing, hostile frames, reconnects.
The real-containerd counterpart is tests/test_e2e_nri.py."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest

from koordnode.hooks.chain import CallContext, CallFacts, HookChain, Phase, Stage
from koordnode.hooks.pool_updates import PoolUpdates
from koordnode.hooks.state_recorder import StateRecorder
from koordnode.nri import api_pb2 as nri
from koordnode.nri.mux import MAX_WRITE_FRAME, Mux
from koordnode.nri.plugin import BASE_EVENTS, NriPlugin, event_mask
from koordnode.nri.ttrpc import TtrpcClient, TtrpcServer
from koordnode.cri import api_pb2 as cri
from koordnode.model.state import ContainerRecord, NodeState, PodRecord
from support.koordnode_runner import short_socket_dir
from support.nri_runtime import CallFailed, FakeRuntime


class CreatePre:
    """A hook with one thread stage: Pre of CreateContainer (its `pre`)."""

    def stages(self):
        return [Stage.in_thread("CreateContainer", Phase.PRE, self.pre)]


class SharesHook(CreatePre):
    """Doubles the CPU shares and annotates, like a QoS hook would."""

    name = "shares"

    def pre(self, call: CallContext) -> None:
        res = call.request.config.linux.resources
        res.cpu_shares *= 2
        call.request.config.annotations["example.io/seen"] = "yes"


class SleepingHook(CreatePre):
    name = "sleeps"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def pre(self, call: CallContext) -> None:
        time.sleep(self.seconds)
        call.request.config.linux.resources.cpu_shares = 7


def pod(pid: str = "pod1", labels=None) -> nri.PodSandbox:
    p = nri.PodSandbox(id=pid, name="web", uid="u-" + pid, namespace="default")
    p.labels.update(labels or {})
    p.linux.cgroup_parent = "/kubepods/burstable/pod-u"
    return p


def container(cid: str = "c1", pid: str = "pod1", shares: int = 512) -> nri.Container:
    c = nri.Container(id=cid, pod_sandbox_id=pid, name="app", state=nri.CONTAINER_CREATED)
    c.linux.resources.cpu.shares.value = shares
    c.linux.resources.memory.limit.value = 1 << 28
    return c


class Harness:
    def __init__(self, hooks, *, chain_timeout_s: float = 1.0, engine=None, procfs_root: str = "/proc",
                 **runtime_kw) -> None:
        self.path = str(short_socket_dir() / "nri.sock")
        self.state = NodeState()
        self.chain = HookChain([StateRecorder(self.state), *hooks], timeout_s=chain_timeout_s)
        self.runtime = FakeRuntime(self.path, **runtime_kw)
        self.pool_updates = PoolUpdates()  # what the engine publishes on (wired as the daemon does)
        self.plugin = NriPlugin(self.path, "koordnode", "07", chain=self.chain, state=self.state, engine=engine,
                                pool_updates=self.pool_updates, procfs_root=procfs_root)
        self.stop = asyncio.Event()
        self.task = None

    async def __aenter__(self) -> Harness:
        await self.runtime.start()
        self.task = asyncio.get_running_loop().create_task(self.plugin.run(self.stop, max_backoff_s=0.2))
        await asyncio.wait_for(self.runtime.ready.wait(), 5)
        return self

    async def __aexit__(self, *exc) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 5)
        await self.runtime.stop()
        self.chain.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_registers_subscribes_and_synchronizes_the_state() -> None:
    async def main():
        async with Harness([], pods=[pod()], containers=[container()]) as h:
            reg = h.runtime.registrations[0]
            assert (reg.plugin_name, reg.plugin_idx) == ("koordnode", "07")
            events = h.runtime.configured[0].events
            assert events == event_mask(BASE_EVENTS)
            assert not events & (1 << (nri.UPDATE_POD_SANDBOX - 1))  # refused by runtimes that lack it
            assert events & (1 << (nri.CREATE_CONTAINER - 1)) and events & (1 << (nri.POST_START_CONTAINER - 1))
            assert set(h.state.pods) == {"pod1"} and set(h.state.containers) == {"c1"}
            assert h.state.containers["c1"].resources.cpu_shares == 512
            assert h.plugin.stats.synchronizations == 1

    run(main())


def test_update_pod_sandbox_is_asked_for_only_where_the_runtime_knows_it() -> None:
    async def main():
        async with Harness([], nri_version="v0.10.0") as h:
            assert h.runtime.configured[0].events & (1 << (nri.UPDATE_POD_SANDBOX - 1))

    run(main())


def test_create_container_answers_with_only_what_the_hooks_changed() -> None:
    async def main():
        async with Harness([SharesHook()]) as h:
            await h.runtime.call("StateChange", nri.StateChangeEvent(event=nri.RUN_POD_SANDBOX, pod=pod()), nri.Empty)
            resp = await h.runtime.call("CreateContainer", nri.CreateContainerRequest(pod=pod(), container=container()),
                                        nri.CreateContainerResponse)
            res = resp.adjust.linux.resources
            assert res.cpu.shares.value == 1024
            assert not res.memory.HasField("limit") and not res.cpu.HasField("quota")  # untouched: not claimed
            assert not resp.adjust.linux.HasField("oom_score_adj")
            assert dict(resp.adjust.annotations) == {"example.io/seen": "yes"}
            assert h.state.containers["c1"].resources.cpu_shares == 1024

    run(main())


def test_pod_start_answers_come_before_their_bookkeeping_which_lands_before_the_next_event() -> None:
    """The runtime waits for the RunPodSandbox and PostStartContainer answers, which carry
    nothing: the Post hooks (the pod's class values) run after them, yet a container's
    CreateContainer still finds its pod's done."""
    import threading

    release, release_start = threading.Event(), threading.Event()
    order: list[str] = []

    class PodBooks:
        name = "pod-books"

        def stages(self):
            return [Stage.in_thread("CreateContainer", Phase.PRE, self.pre),
                    *(Stage.in_thread(m, Phase.POST, self.post)
                      for m in ("RunPodSandbox", "CreateContainer", "StartContainer"))]

        def pre(self, call):
            order.append(f"pre {call.method}")

        def post(self, call):
            if call.method == "RunPodSandbox":
                release.wait(5)
            if call.method == "StartContainer":
                release_start.wait(5)
            order.append(f"post {call.method}")

    async def main():
        async with Harness([PodBooks()], chain_timeout_s=5.0) as h:
            await asyncio.wait_for(h.runtime.call(
                "StateChange", nri.StateChangeEvent(event=nri.RUN_POD_SANDBOX, pod=pod()), nri.Empty), 2)
            order.append("RunPodSandbox answered")
            asyncio.get_running_loop().call_later(0.1, release.set)
            await h.runtime.call("CreateContainer", nri.CreateContainerRequest(pod=pod(), container=container()),
                                 nri.CreateContainerResponse)
            await asyncio.wait_for(h.runtime.call("StateChange", nri.StateChangeEvent(
                event=nri.POST_START_CONTAINER, pod=pod(), container=container()), nri.Empty), 2)
            order.append("PostStartContainer answered")
            release_start.set()
            await h.chain.drain_post(5)

    try:
        run(main())
    finally:
        release.set()
        release_start.set()
    assert order == ["RunPodSandbox answered", "post RunPodSandbox", "pre CreateContainer", "post CreateContainer",
                     "PostStartContainer answered", "post StartContainer"]


def test_post_start_is_answered_before_the_class_oom_score_adj_is_written(tmp_path) -> None:
    """A runtime that did not apply the adjusted oom_score_adj (containerd 1.7) started the
    process with kubelet's: the class value is written to it, after the answer (StartContainer
    waits for it), not before."""
    import threading

    (tmp_path / "4242").mkdir()
    oom_file = tmp_path / "4242" / "oom_score_adj"
    oom_file.write_text("999\n")
    writing, release = threading.Event(), threading.Event()

    async def main():
        async with Harness([], procfs_root=str(tmp_path)) as h:
            h.plugin.oom.floor = None  # as with CAP_SYS_RESOURCE, whatever this machine has
            real_write = h.plugin.oom.write

            def slow_write(*args):
                writing.set()
                release.wait(5)
                real_write(*args)

            h.plugin.oom.write = slow_write
            h.state.put_pod(PodRecord("pod1", "p", "ns", "uid1", {}, {}, "/kubepods/burstable/poduid1"))
            h.state.put_container(ContainerRecord("c1", "pod1", "app", {}, {},
                                                  cri.LinuxContainerResources(oom_score_adj=-300)))
            started = container()
            started.pid = 4242
            started.linux.oom_score_adj.value = 999
            await asyncio.wait_for(h.runtime.call("StateChange", nri.StateChangeEvent(
                event=nri.POST_START_CONTAINER, pod=pod(), container=started), nri.Empty), 2)
            answered_while_writing = not release.is_set() and not sum(h.plugin.stats.late_answers.values())
            await asyncio.to_thread(writing.wait, 2)
            release.set()
            deadline = time.monotonic() + 5
            while oom_file.read_text().strip() != "-300" and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            return answered_while_writing

    try:
        assert run(main())
    finally:
        release.set()
    assert oom_file.read_text().strip() == "-300"


def test_unmodelled_fields_of_the_runtime_are_tolerated() -> None:
    async def main():
        async with Harness([SharesHook()]) as h:
            # Container.args (7) and env (8), which our model leaves out, inside field 2.
            extra = b"\x3a\x02sh\x42\x05A=1:2"
            inner = container().SerializeToString() + extra
            req = nri.CreateContainerRequest(pod=pod()).SerializeToString() + b"\x12" + bytes([len(inner)]) + inner
            parsed = nri.CreateContainerRequest.FromString(req)
            resp = await h.runtime.call("CreateContainer", parsed, nri.CreateContainerResponse)
            assert resp.adjust.linux.resources.cpu.shares.value == 1024

    run(main())


def test_a_hook_slower_than_the_runtime_allows_yields_an_answer_without_changes() -> None:
    async def main():
        # The chain would wait 30 s; the runtime allows 500 ms.
        async with Harness([SleepingHook(2.0)], chain_timeout_s=30.0, request_timeout_ms=500) as h:
            started = time.monotonic()
            resp = await h.runtime.call("CreateContainer", nri.CreateContainerRequest(pod=pod(), container=container()),
                                        nri.CreateContainerResponse)
            took = time.monotonic() - started
            assert took < 0.5, took
            assert resp.adjust.ByteSize() == 0
            assert h.plugin.stats.late_answers["CreateContainer"] == 1

    run(main())


def test_a_failing_hook_yields_an_answer_without_changes() -> None:
    class Raises(CreatePre):
        name = "raises"

        def pre(self, call):
            call.request.config.linux.resources.cpu_shares = 9
            raise RuntimeError("boom")

    async def main():
        async with Harness([Raises()]) as h:
            resp = await h.runtime.call("CreateContainer", nri.CreateContainerRequest(pod=pod(), container=container()),
                                        nri.CreateContainerResponse)
            assert resp.adjust.ByteSize() == 0
            assert h.chain.failures[("raises", "pre", "error")] == 1

    run(main())


def test_methods_it_does_not_serve_are_unimplemented() -> None:
    async def main():
        async with Harness([]) as h:
            with pytest.raises(CallFailed) as err:
                await h.runtime.call("ValidateContainerAdjustment", nri.Empty(), nri.Empty)
            assert err.value.code == 12

    run(main())


def test_a_hostile_frame_drops_the_connection_and_the_plugin_comes_back() -> None:
    async def main():
        async with Harness([]) as h:
            # A frame claiming 64 MiB: refused without reading it, connection closed.
            h.runtime.send_raw(struct.pack(">II", 1, 64 << 20) + b"x" * 16)
            deadline = time.monotonic() + 5
            while len(h.runtime.registrations) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert len(h.runtime.registrations) == 2
            await asyncio.wait_for(h.runtime.ready.wait(), 5)
            assert h.plugin.stats.registrations == 2

    run(main())


def test_runtime_restart_means_register_and_synchronize_again() -> None:
    async def main():
        async with Harness([], pods=[pod()], containers=[container()]) as h:
            await h.runtime.stop()
            h.runtime2 = FakeRuntime(h.path, pods=[pod("pod2")], containers=[container("c9", "pod2")])
            await h.runtime2.start()
            await asyncio.wait_for(h.runtime2.ready.wait(), 5)
            # The second Synchronize is the whole truth: the first runtime's pod is gone.
            assert set(h.state.pods) == {"pod2"} and set(h.state.containers) == {"c9"}
            assert h.plugin.stats.registrations == 2
            await h.runtime2.stop()

    run(main())


def test_synchronize_in_parts_is_collected_before_it_is_applied() -> None:
    async def main():
        async with Harness([]) as h:
            first = await h.runtime.call("Synchronize", nri.SynchronizeRequest(pods=[pod("a")], more=True),
                                         nri.SynchronizeResponse)
            assert first.more
            await h.runtime.call("Synchronize", nri.SynchronizeRequest(pods=[pod("b")], containers=[container("c", "b")]),
                                 nri.SynchronizeResponse)
            assert set(h.state.pods) == {"a", "b"}

    run(main())


def test_large_messages_travel_in_frames_go_can_read() -> None:
    async def main():
        a, b = socket.socketpair()
        ra, wa = await asyncio.open_unix_connection(sock=a)
        rb, wb = await asyncio.open_unix_connection(sock=b)
        left, right = Mux(ra, wa), Mux(rb, wb)
        tasks = [asyncio.ensure_future(left.run()), asyncio.ensure_future(right.run())]
        sizes = []

        async def echo(payload: bytes) -> bytes:
            return payload[::-1]

        server = TtrpcServer(right.open(1), {("svc", "Echo"): echo})
        client = TtrpcClient(left.open(1))
        tasks += [asyncio.ensure_future(server.serve()), asyncio.ensure_future(client.receive())]
        original_write = wa.write
        wa.write = lambda data: (sizes.append(struct.unpack(">II", data[:8])[1]), original_write(data))[1]
        big = bytes(range(256)) * 2000  # 512000 bytes
        assert await client.call("svc", "Echo", big, 5) == big[::-1]
        assert max(sizes) <= MAX_WRITE_FRAME and len(sizes) > 100
        for t in tasks:
            t.cancel()
        left.close()
        right.close()

    run(main())


def test_pool_changes_outside_an_answer_go_out_as_unsolicited_updates() -> None:
    async def main():
        async with Harness([], pods=[pod()], containers=[container()]) as h:
            h.state.containers["c1"].resources.cpuset_cpus = "0-3"
            # As the engine publishes: from a worker thread.
            await asyncio.to_thread(h.pool_updates.publish, {"c1": "2-3", "unknown": "1"})
            deadline = time.monotonic() + 5
            while not h.runtime.updates and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            (req,) = h.runtime.updates
            assert [(u.container_id, u.linux.resources.cpu.cpus) for u in req.update] == [("c1", "2-3")]
            # Unchanged afterwards: nothing more is sent.
            await asyncio.to_thread(h.pool_updates.publish, {"c1": "2-3"})
            await asyncio.sleep(0.2)
            assert len(h.runtime.updates) == 1

    run(main())


def test_a_late_synchronize_still_delivers_its_updates() -> None:
    """When the rebuild overruns the answer deadline, the runtime gets an empty answer in time
    and the container updates follow as an UpdateContainers call."""

    class SlowPlanEngine:
        def has_kubelet_resources(self, cid):
            return False

        def classify(self, labels, parent):
            from koordnode.model.qos_class import resolve_qos_class
            return resolve_qos_class(labels, parent, {})

        def forget_containers_except(self, live):
            time.sleep(0.6)  # beyond 60% of the 500 ms request timeout

        def remember_kubelet_resources(self, cid, res):
            pass

        def adopt(self, view):
            return {}

        def planned_resources(self, cid):
            from koordnode.cri import api_pb2 as cri
            return cri.LinuxContainerResources(cpu_shares=4096)

        def containers_updated(self, ids):
            pass

    async def main():
        h = Harness([], request_timeout_ms=500, engine=SlowPlanEngine())
        c = container()
        c.state = nri.CONTAINER_RUNNING
        h.runtime.pods, h.runtime.containers = [pod()], [c]
        async with h:
            assert h.runtime.synchronized[0].update == []  # answered in time, without changes
            deadline = time.monotonic() + 5
            while not h.runtime.updates and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            (req,) = h.runtime.updates
            assert [(u.container_id, u.linux.resources.cpu.shares.value) for u in req.update] == [("c1", 4096)]
            assert h.plugin.stats.late_answers["Synchronize"] == 1

    run(main())


def test_dry_run_answers_without_changes_and_records_what_the_runtime_has() -> None:
    """[daemon] dry_run in NRI mode: the hooks decide as usual, the runtime gets no adjustment,
    and the state keeps kubelet's values (what the container really runs with)."""
    async def main():
        async with Harness([SharesHook()]) as h:
            h.plugin.dry_run = True
            await h.runtime.call("StateChange", nri.StateChangeEvent(event=nri.RUN_POD_SANDBOX, pod=pod()), nri.Empty)
            resp = await h.runtime.call("CreateContainer", nri.CreateContainerRequest(pod=pod(), container=container()),
                                        nri.CreateContainerResponse)
            assert resp.ByteSize() == 0
            assert h.state.containers["c1"].resources.cpu_shares == 512
            assert h.plugin.stats.dry_run_withheld["CreateContainer"] == 1
            h.plugin.dry_run = False  # switched off by a reload: adjustments flow again
            resp = await h.runtime.call("CreateContainer",
                                        nri.CreateContainerRequest(pod=pod(), container=container("c2")),
                                        nri.CreateContainerResponse)
            assert resp.adjust.linux.resources.cpu.shares.value == 1024

    run(main())


def test_the_class_values_go_back_after_the_runtime_applied_an_update() -> None:
    """UpdateContainer comes before the runtime applies kubelet's values (the hooks are told:
    `runtime_applies_later`, so no cgroup write is made then); PostUpdateContainer comes after
    it, and the engine writes the class values of what the runtime reports back again."""
    seen: list[CallFacts] = []

    class Recorder:
        name = "recorder"

        def stages(self):
            return [Stage.in_thread("UpdateContainerResources", Phase.POST, self.post)]

        def post(self, call: CallContext) -> None:
            seen.append(call.facts)

    class Engine:
        def has_kubelet_resources(self, cid):
            return False

        def __init__(self) -> None:
            self.updated: list[str] = []

        def classify(self, labels, parent):
            from koordnode.model.qos_class import resolve_qos_class
            return resolve_qos_class(labels, parent, {})

        def forget_containers_except(self, live):
            pass

        def remember_kubelet_resources(self, cid, res):
            pass

        def adopt(self, view):
            return {}

        def planned_resources(self, cid):
            return None

        def container_updated(self, cid):
            self.updated.append(cid)

        def containers_updated(self, ids):
            self.updated.extend(ids)

    engine = Engine()

    async def main():
        async with Harness([Recorder()], engine=engine) as h:
            assert h.runtime.configured[0].events & (1 << (nri.POST_UPDATE_CONTAINER - 1))
            update = nri.UpdateContainerRequest(pod=pod(), container=container())
            update.linux_resources.cpu.shares.value = 2048
            resp = await h.runtime.call("UpdateContainer", update, nri.UpdateContainerResponse)
            assert list(resp.update) == [] and engine.updated == []
            assert seen and seen[0].runtime_applies_later is True
            await h.runtime.call("PostUpdateContainer", nri.PostUpdateContainerRequest(pod=pod(), container=container()),
                                 nri.PostUpdateContainerResponse)
            assert engine.updated == ["c1"]

    run(main())


class MovesToBeGroupHook:
    """Points CreateContainer's sandbox parent into the BE group, as the QoS engine does for a pod
    it placed there."""

    name = "moves"

    def stages(self):
        return [Stage.in_thread("CreateContainer", Phase.PRE, self.pre)]

    def pre(self, call: CallContext) -> None:
        parent = call.request.sandbox_config.linux.cgroup_parent
        call.request.sandbox_config.linux.cgroup_parent = parent.replace("/besteffort/", "/koordnode_be/")


def be_pod(pid: str = "pod1") -> nri.PodSandbox:
    p = pod(pid)
    p.linux.cgroup_parent = "/kubepods/besteffort/podu1"
    return p


@pytest.mark.parametrize("cgroups_path, adjusted", [
    ("/kubepods/besteffort/podu1/c1", "/kubepods/koordnode_be/podu1/c1"),
    ("", "/kubepods/koordnode_be/podu1/c1"),  # not sent: containerd's cgroupfs form
    ("/somewhere/else/c1", ""),  # not below kubelet's parent: the container stays
])
def test_a_moved_sandbox_parent_becomes_the_containers_cgroups_path(cgroups_path, adjusted) -> None:
    async def main():
        async with Harness([MovesToBeGroupHook()]) as h:
            c = container()
            c.linux.cgroups_path = cgroups_path
            resp = await h.runtime.call("CreateContainer", nri.CreateContainerRequest(pod=be_pod(), container=c),
                                        nri.CreateContainerResponse)
            assert resp.adjust.linux.cgroups_path == adjusted

    run(main())


def test_synchronize_records_a_pod_where_its_containers_were_placed() -> None:
    moved, stayed = be_pod("pod1"), be_pod("pod2")
    stayed.linux.cgroup_parent = "/kubepods/besteffort/podu2"
    in_group, in_tier = container("c1", "pod1"), container("c2", "pod2")
    in_group.linux.cgroups_path = "/kubepods/koordnode_be/podu1/c1"
    in_tier.linux.cgroups_path = "/kubepods/besteffort/podu2/c2"

    async def main():
        async with Harness([], pods=[moved, stayed], containers=[in_group, in_tier]) as h:
            assert h.state.pods["pod1"].cgroup_parent == "/kubepods/koordnode_be/podu1"
            assert h.state.pods["pod2"].cgroup_parent == "/kubepods/besteffort/podu2"

    run(main())
