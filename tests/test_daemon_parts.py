"""The parts daemon.py wires but no longer implements: pod networks, resctrl placement, the
hw-qos hook driving them (in process, with fakes for the runtime and the controllers)."""

from __future__ import annotations

import asyncio
import types

from koordnode.config import CgroupConfig, NetQoSConfig
from koordnode.cri import api_pb2 as pb
from koordnode.cri.client import CriError, RuntimeBackend
from koordnode.hooks.chain import CallContext, CallFacts, HookChain
from koordnode.hooks.hw_qos import HardwareQoSHook
from koordnode.model.state import ContainerRecord, NodeState, PodRecord
from koordnode.qos.net_control import NetQoSController
from koordnode.qos.pod_networks import PodNetworks
from koordnode.qos.resctrl_control import ResctrlPlacement


class _Backend(RuntimeBackend):
    """The real RuntimeBackend (its status parsing included) with the call answered here."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__("/nonexistent.sock")
        self.fail = fail

    async def call(self, path, request, response_cls, timeout):
        if self.fail:
            raise CriError.of(5, "gone")
        status = pb.PodSandboxStatusResponse()
        status.status.network.ip = "10.0.0.7"
        return status


class _Net(NetQoSController):
    def __init__(self, enable: bool) -> None:
        super().__init__(NetQoSConfig(enable=enable))
        self.passes: list[list[str]] = []

    def reconcile(self, pods):
        self.passes.append([p.sandbox_id for p in pods])


def _state() -> NodeState:
    state = NodeState()
    state.put_pod(PodRecord("s1", "web", "team", "u1", {}, {}, "/kubepods/burstable/pod-u1", qos_class="LS"))
    state.put_container(ContainerRecord("c1", "s1", "app", {}, {}, pb.LinuxContainerResources()))
    return state


def _networks(state: NodeState, net: _Net, backend: _Backend) -> tuple[PodNetworks, list]:
    spawned: list = []

    def spawn(coro):
        task = asyncio.get_running_loop().create_task(coro)
        spawned.append(task)
        return task

    return PodNetworks(state, net, backend, spawn), spawned


def test_a_new_pods_ips_are_recorded_and_the_classes_rebuilt_in_a_thread():
    state, net = _state(), _Net(enable=True)

    async def body():
        networks, spawned = _networks(state, net, _Backend())
        networks.record_pod_network_soon("s1")  # the hook's call: the work goes on beside it
        while not all(task.done() for task in spawned):
            await asyncio.gather(*spawned)

    asyncio.run(body())
    assert state.pods["s1"].ips == ("10.0.0.7",)
    assert net.passes == [["s1"]]


def test_an_unreadable_status_and_a_disabled_net_change_nothing():
    state = _state()

    async def body(net: _Net, backend: _Backend) -> PodNetworks:
        networks, spawned = _networks(state, net, backend)
        await networks.record_pod_network("s1")
        await asyncio.gather(*spawned)
        return networks

    off = _Net(enable=False)
    networks = asyncio.run(body(off, _Backend()))
    assert off.passes == [] and networks.for_reconcile() == [] and len(networks.ready_pods()) == 1
    on = _Net(enable=True)
    asyncio.run(body(on, _Backend(fail=True)))
    # The IPs stay as the first (readable) status gave them; no pass without a status.
    assert on.passes == [] and state.pods["s1"].ips == ("10.0.0.7",)


def test_with_net_off_no_runtime_call_and_the_pods_are_asked_once_it_is_turned_on():
    state = _state()
    state.put_pod(PodRecord("s2", "gone", "team", "u2", {}, {}, "/kubepods/burstable/pod-u2", qos_class="LS"))
    asked: list[str] = []

    class Counting(_Backend):
        async def call(self, path, request, response_cls, timeout):
            asked.append(request.pod_sandbox_id)
            return await super().call(path, request, response_cls, timeout)

    net = _Net(enable=False)

    async def body():
        networks, spawned = _networks(state, net, Counting())
        networks.record_pod_network_soon("s1")
        networks.record_pod_network_soon("s2")
        assert networks.for_reconcile() == [] and spawned == []  # off: not a call inside a pod's start
        state.remove_pod("s2")
        net.update_config(NetQoSConfig(enable=True))  # a reload turned [net] on
        networks.for_reconcile()
        while not all(task.done() for task in spawned):
            await asyncio.gather(*spawned)
        networks.for_reconcile()  # asked once only
        await asyncio.gather(*spawned)

    asyncio.run(body())
    assert asked == ["s1"]  # the pod gone meanwhile is not asked
    assert state.pods["s1"].ips == ("10.0.0.7",) and net.passes == [["s1"]]


class _Resctrl:
    def __init__(self, enable: bool) -> None:
        self.config = types.SimpleNamespace(enable=enable)
        self.placed: list[tuple[str, str]] = []

    def place_container(self, group, cgroup):
        self.placed.append((group, cgroup))


def test_a_started_container_goes_to_its_class_group_when_resctrl_is_on():
    state = _state()
    on, off = _Resctrl(True), _Resctrl(False)
    ResctrlPlacement(on, state, CgroupConfig(driver="cgroupfs")).place_container("c1")
    ResctrlPlacement(off, state, CgroupConfig(driver="cgroupfs")).place_container("c1")
    ResctrlPlacement(on, state, CgroupConfig()).place_container("unknown")
    assert on.placed == [("LS", "/kubepods/burstable/pod-u1/c1")] and off.placed == []
    placement = ResctrlPlacement(on, state, CgroupConfig(driver="cgroupfs"))
    assert placement.groups() == {"LS": ["/kubepods/burstable/pod-u1/c1"]}
    assert ResctrlPlacement(off, state, CgroupConfig()).groups() == {}


def test_the_hw_qos_hook_asks_the_runtime_only_in_proxy_mode_and_hops_to_a_thread_only_for_resctrl():
    calls: list[str] = []

    class Networks:
        def record_pod_network_soon(self, sandbox_id: str) -> None:
            calls.append(f"record {sandbox_id}")

        def refresh_network_classes(self) -> None:
            calls.append("refresh")

    class Placement:
        enabled = False

        def place_container(self, container_id: str) -> None:
            calls.append(f"place {container_id}")

    placement = Placement()
    chain = HookChain([HardwareQoSHook(networks=Networks(), resctrl=placement)])

    def post(method: str, request, response, facts: CallFacts | None = None) -> None:
        call = CallContext(method=method, request=request, facts=facts or CallFacts())
        call.response, call.grpc_status = response, 0
        asyncio.run(chain.run_post_now(call))

    try:
        post("RunPodSandbox", pb.RunPodSandboxRequest(), pb.RunPodSandboxResponse(pod_sandbox_id="s1"))
        post("RunPodSandbox", pb.RunPodSandboxRequest(), pb.RunPodSandboxResponse(pod_sandbox_id="s2"),
             CallFacts(pod_ips=("10.0.0.8",)))  # NRI: the runtime said
        post("StartContainer", pb.StartContainerRequest(container_id="c1"), pb.StartContainerResponse())
        placement.enabled = True
        post("StartContainer", pb.StartContainerRequest(container_id="c1"), pb.StartContainerResponse())
        post("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id="s1"), pb.RemovePodSandboxResponse())
    finally:
        chain.close()
    assert calls == ["record s1", "refresh", "place c1", "refresh"]
