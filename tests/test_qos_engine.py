"""QoSEngine on fake kernel trees: cgroup v2, group identity (Anolis) and plain v1.

The engine is driven the way the proxy drives it: real CRI protobuf requests go through the
real hook chain (StateRecorder + QoSHook) with CallContext objects; a small fake runtime
answers, and creates the cgroups the way kubelet (pod) and runc (container, at start) do,
without writing any value itself, so every value read back was put there by koordnode.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import errno
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

import pytest

from faketree import add_cgroup, make_cgroup_tree, read_cgroup_file, write_cgroup_file
from koordnode.config import EngineSettings, parse_config
from koordnode.cri import api_pb2 as pb
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.executor.write_result import WriteStatus
from koordnode.hooks.chain import CallContext, HookChain
from koordnode.model.cpu_topology import CpuTopology
from koordnode.model.cpulist import format_cpu_list, parse_cpu_list
from koordnode.cri.koordnode_annotations import KUBELET_RESOURCES_ANNOTATION
from koordnode.hooks.qos_engine import QoSEngine
from koordnode.hooks.pool_updates import PoolUpdates
from koordnode.hooks.qos_hook import QoSHook
from koordnode.hooks.state_recorder import StateRecorder
from koordnode.model.state import NodeState
from koordnode.executor.core_sched import CoreScheduling
from support.fake_core_sched import FakeCoreKernel
from support.koordinator_formulas import koordinator_memory_high

MIB = 1 << 20
QOS_LABEL = "koordinator.sh/qosClass"
EXTENDED_SPEC = "node.koordinator.sh/extended-resource-spec"


def weight(shares: int) -> int:
    """cgroup v2 cpu.weight for cpu.shares, the formula from the issue."""
    return 1 + (shares - 2) * 9999 // 262142


def slice_path(name: str) -> str:
    """systemd's nesting of a slice name: a-b-c.slice -> /a.slice/a-b.slice/a-b-c.slice."""
    parts = name.removesuffix(".slice").split("-")
    return "/" + "/".join("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))


def cpus_of(root: Path, cgroup: str) -> frozenset[int]:
    return parse_cpu_list(read_cgroup_file(root, cgroup, "cpuset.cpus"))


# --- a node: fake tree + engine + hook chain + fake runtime ----------------------------------


@dataclasses.dataclass
class Pod:
    sandbox_id: str
    config: pb.PodSandboxConfig
    cgroup: str  # where kubelet created it (relative to the root); "" when hostile
    driver: str

    def container_cgroup(self, container_id: str) -> str:
        if self.driver == "systemd":
            return f"{self.cgroup}/cri-containerd-{container_id}.scope"
        return f"{self.cgroup}/{container_id}"


class Node:
    def __init__(
        self,
        directory: Path,
        *,
        version: str = "v2",
        anolis: bool = False,
        topology: CpuTopology | None = None,
        toml: str = "",
        root: Path | None = None,
        state: NodeState | None = None,
        be_idle_group: bool = False,
        pool_updates: PoolUpdates | None = None,
    ) -> None:
        # The BE group (model/be_group.py) moves BE pods away from the cgroup this fake runtime
        # creates their containers in: it is tested against the real runtime (test_e2e_be_group).
        self.be_idle_group = be_idle_group
        self.topology = topology or CpuTopology.describe(cores_per_numa=4, threads_per_core=2)
        all_cpus = format_cpu_list(self.topology.online)
        self.root = root or make_cgroup_tree(directory, version, anolis, cpus=all_cpus)
        self.toml = toml
        self.config = parse_config(f'[cgroup]\nroot = "{self.root}"\n'
                                   f'be_idle_group = {str(be_idle_group).lower()}\n' + toml)
        self.state = state if state is not None else NodeState()
        self.engine = QoSEngine(EngineSettings.of(self.config), self.state, executor=CgroupExecutor(self.root),
                                topology=self.topology, pool_updates=pool_updates)
        self.chain = HookChain([StateRecorder(self.state), QoSHook(self.engine)], timeout_s=5.0)
        self.loop = asyncio.new_event_loop()
        self.pods: dict[str, Pod] = {}
        self.container_pod: dict[str, Pod] = {}
        self.created: dict[str, pb.CreateContainerRequest] = {}  # as forwarded to the runtime
        self._next = 0
        self.restarts: list[Node] = []

    def close(self) -> None:
        for node in self.restarts:
            node.close()
        self.chain.close()
        self.loop.close()

    def restarted(self) -> Node:
        """A fresh koordnode over the same tree, its state rebuilt from the runtime."""
        state = NodeState()
        state.replace_all(
            [dataclasses.replace(p, qos_class=None, qos_reason="", source="recovered")
             for p in self.state.pods.values()],
            [dataclasses.replace(c, resources=copy.deepcopy(c.resources), source="recovered")
             for c in self.state.containers.values()],
        )
        node = Node(self.root.parent, topology=self.topology, toml=self.toml, root=self.root, state=state,
                    be_idle_group=self.be_idle_group)
        node.pods, node.container_pod = dict(self.pods), dict(self.container_pod)
        node._next = self._next + 1000
        self.restarts.append(node)
        node.engine.adopt()
        return node

    def _id(self) -> str:
        self._next += 1
        return hashlib.sha256(str(self._next).encode()).hexdigest()

    # The proxy: Pre hooks, the runtime, Post hooks (drained like the next call would).
    def call(self, method: str, request, *, fail: bool = False, hooks_may_fail: bool = False) -> CallContext:
        async def run() -> CallContext:
            ctx = CallContext(method=method, request=request,
                              pod_labels=self.state.pod_labels_for(method, request))
            await self.chain.run_pre(ctx)
            if fail:
                ctx.grpc_status, ctx.grpc_message = 2, "runtime said no"
            else:
                ctx.response = self._runtime(method, ctx.request)
                ctx.grpc_status = 0
            self.chain.schedule_post(ctx)
            await self.chain.drain_post(10.0)
            return ctx

        ctx = self.loop.run_until_complete(run())
        if not hooks_may_fail:
            assert not ctx.hook_failures, ctx.hook_failures
            assert not self.chain.failures, dict(self.chain.failures)
        return ctx

    def _runtime(self, method: str, req):
        if method == "RunPodSandbox":
            return pb.RunPodSandboxResponse(pod_sandbox_id=self._id())
        if method == "CreateContainer":
            cid = self._id()
            forwarded = pb.CreateContainerRequest()
            forwarded.CopyFrom(req)
            self.created[cid] = forwarded
            return pb.CreateContainerResponse(container_id=cid)
        if method == "StartContainer":
            pod = self.container_pod[req.container_id]
            if pod.cgroup:  # runc creates the container cgroup with the kernel's defaults
                add_cgroup(self.root, pod.container_cgroup(req.container_id))
                self._runc_writes(req.container_id, self.created[req.container_id].config.linux.resources)
            return pb.StartContainerResponse()
        if method == "UpdateContainerResources":
            self._runc_writes(req.container_id, req.linux)
            return pb.UpdateContainerResourcesResponse()
        return {
            "StopContainer": pb.StopContainerResponse,
            "RemoveContainer": pb.RemoveContainerResponse,
            "StopPodSandbox": pb.StopPodSandboxResponse,
            "RemovePodSandbox": pb.RemovePodSandboxResponse,
            "UpdateContainerResources": pb.UpdateContainerResourcesResponse,
            "UpdatePodSandboxResources": pb.UpdatePodSandboxResourcesResponse,
        }[method]()

    def _runc_writes(self, cid: str, res: pb.LinuxContainerResources) -> None:
        """The container's CPU weight as the runtime writes it from the request (at start and at
        each UpdateContainerResources), which is also what it reports back to kubelet."""
        pod = self.container_pod.get(cid)
        if pod is None or not pod.cgroup or not res.cpu_shares:
            return
        cgroup = pod.container_cgroup(cid)
        if self.engine.executor.version.value == "v2":
            write_cgroup_file(self.root, cgroup, "cpu.weight", str(weight(res.cpu_shares)))
        else:
            write_cgroup_file(self.root, cgroup, "cpu.shares", str(res.cpu_shares))

    # --- kubelet's side ----------------------------------------------------------------------

    def run_pod(self, name: str, *, parent: str, labels: dict | None = None,
                annotations: dict | None = None, pod_cgroup: str | None = None) -> Pod:
        """kubelet creates the pod cgroup, then calls RunPodSandbox. `pod_cgroup` None: derive
        it from `parent`; "": do not create one (hostile parents)."""
        driver = "systemd" if parent.endswith(".slice") else "cgroupfs"
        if pod_cgroup is None:
            pod_cgroup = slice_path(parent) if driver == "systemd" else parent
        if pod_cgroup:
            add_cgroup(self.root, pod_cgroup)
        cfg = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=f"uid-{name}", namespace="default"),
            labels=labels or {}, annotations=annotations or {},
            linux=pb.LinuxPodSandboxConfig(cgroup_parent=parent),
        )
        ctx = self.call("RunPodSandbox", pb.RunPodSandboxRequest(config=cfg))
        pod = Pod(ctx.response.pod_sandbox_id, cfg, pod_cgroup, driver)
        self.pods[pod.sandbox_id] = pod
        return pod

    def create(self, pod: Pod, name: str, *, fail: bool = False, unified: dict | None = None,
               **resources) -> tuple[str | None, CallContext]:
        res = pb.LinuxContainerResources(**{"cpu_period": 100000, **resources}, unified=unified or {})
        req = pb.CreateContainerRequest(
            pod_sandbox_id=pod.sandbox_id,
            config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name),
                                      image=pb.ImageSpec(image="busybox"),
                                      linux=pb.LinuxContainerConfig(resources=res)),
            sandbox_config=pod.config,
        )
        ctx = self.call("CreateContainer", req, fail=fail)
        if fail:
            return None, ctx
        cid = ctx.response.container_id
        self.container_pod[cid] = pod
        return cid, ctx

    def start(self, cid: str) -> None:
        self.call("StartContainer", pb.StartContainerRequest(container_id=cid))

    def run_container(self, pod: Pod, name: str = "app", **kwargs) -> str:
        cid, _ = self.create(pod, name, **kwargs)
        self.start(cid)
        return cid

    def stop_container(self, cid: str) -> None:
        self.call("StopContainer", pb.StopContainerRequest(container_id=cid))

    def remove_pod(self, pod: Pod) -> None:
        self.call("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=pod.sandbox_id))

    # --- views ---------------------------------------------------------------------------------

    def read(self, cgroup: str, name: str) -> str:
        return read_cgroup_file(self.root, cgroup, name)

    def ccg(self, cid: str) -> str:
        return self.container_pod[cid].container_cgroup(cid)

    def status_pod(self, pod: Pod) -> dict:
        snapshot = self.engine.decorate(self.state.snapshot())
        return next(p for p in snapshot["pods"] if p["sandbox_id"] == pod.sandbox_id)

    def allocations(self) -> dict[str, frozenset[int]]:
        return {owner: frozenset(a["cpus"])
                for owner, a in self.engine.status()["cpus"]["allocations"].items()}


@pytest.fixture
def scratch(tmp_path):
    """Fake trees are thousands of small files: on tmpfs when there is one (3x faster here)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    directory = Path(tempfile.mkdtemp(prefix="koordnode-test-qos-engine-", dir=shm))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def make_node(scratch):
    nodes: list[Node] = []

    def make(**kwargs) -> Node:
        sub = scratch / f"node{len(nodes)}"
        node = Node(sub, **kwargs)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.close()


def assert_disjoint(sets: Iterable[frozenset[int]]) -> None:
    seen: set[int] = set()
    for cpus in sets:
        assert not (cpus & seen), f"CPUs {sorted(cpus & seen)} handed out twice"
        seen |= cpus


# --- kubelet's resources for the pods of the tests -------------------------------------------

GUARANTEED_1CPU = dict(cpu_shares=1024, cpu_quota=100000, memory_limit_in_bytes=256 * MIB)
GUARANTEED_2CPU = dict(cpu_shares=2048, cpu_quota=200000, memory_limit_in_bytes=256 * MIB)
BE_SPEC = json.dumps({"containers": {"app": {
    "requests": {"kubernetes.io/batch-cpu": "250", "kubernetes.io/batch-memory": "256Mi"},
    "limits": {"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": "1Gi"},
}}})


def parents(driver: str) -> dict[str, str]:
    """cgroup parents kubelet passes for Guaranteed / Burstable / BestEffort pods, per driver."""
    if driver == "systemd":
        return {
            "guaranteed": "kubepods-pod{uid}.slice",
            "burstable": "kubepods-burstable-pod{uid}.slice",
            "besteffort": "kubepods-besteffort-pod{uid}.slice",
        }
    return {
        "guaranteed": "/kubepods/pod{uid}",
        "burstable": "/kubepods/burstable/pod{uid}",
        "besteffort": "/kubepods/besteffort/pod{uid}",
    }


def run_one_pod_per_class(node: Node, driver: str) -> dict[str, tuple[Pod, list[str], dict]]:
    """SYSTEM, LSE, LSR (Guaranteed, no label), LS (Burstable, two containers), BE (BestEffort
    with batch resources). Returns class -> (pod, container ids, forwarded resources by id)."""
    p = parents(driver)
    out = {}

    def run(cls, tier, labels=None, annotations=None, containers=()):
        uid = cls.lower() + "0123"
        pod = node.run_pod(cls.lower(), parent=p[tier].format(uid=uid), labels=labels,
                           annotations=annotations)
        cids, forwarded = [], {}
        for name, res in containers:
            cid, ctx = node.create(pod, name, **res)
            forwarded[cid] = ctx.request.config.linux.resources
            node.start(cid)
            cids.append(cid)
        out[cls] = (pod, cids, forwarded)

    run("SYSTEM", "guaranteed", {QOS_LABEL: "SYSTEM"}, containers=[("app", GUARANTEED_1CPU)])
    run("LSE", "guaranteed", {QOS_LABEL: "LSE"}, containers=[("app", GUARANTEED_2CPU)])
    run("LSR", "guaranteed", containers=[("app", GUARANTEED_1CPU)])
    run("LS", "burstable", containers=[
        ("app", dict(cpu_shares=512, memory_limit_in_bytes=512 * MIB, unified={"memory.min": str(128 * MIB)})),
        ("sidecar", dict(cpu_shares=256, memory_limit_in_bytes=128 * MIB, unified={"memory.min": str(64 * MIB)})),
    ])
    run("BE", "besteffort", annotations={EXTENDED_SPEC: BE_SPEC}, containers=[("app", dict(cpu_shares=2))])
    return out


# --- cgroup v2 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
def test_v2_each_class_request_rewritten_and_files_hold_the_values(make_node, driver):
    node = make_node(version="v2", toml='pod_class_weight = true\n[node]\nblkio_devices = ["8:0"]\n')
    assert node.engine.features.cgroup_version == "v2"
    pods = run_one_pod_per_class(node, driver)
    all_cpus = node.topology.online

    # --- the CreateContainer requests as forwarded to the runtime ---
    def fwd(cls, i=0):
        pod, cids, forwarded = pods[cls]
        return forwarded[cids[i]]

    expected_shares = {"SYSTEM": 32768, "LSE": 262144, "LSR": 65536, "BE": 256}
    expected_oom = {"SYSTEM": -1000, "LSE": -900, "LSR": -700, "LS": -300, "BE": 1000}
    # What the runtime reports back to kubelet (cpu shares, quota/period, memory limit) stays as
    # kubelet asked: the class values of those go to the files (below), not into the request.
    kubelet_shares = {"SYSTEM": 1024, "LSE": 2048, "LSR": 1024, "BE": 2}
    for cls, shares in kubelet_shares.items():
        assert fwd(cls).cpu_shares == shares, cls
    assert (fwd("LS", 0).cpu_shares, fwd("LS", 1).cpu_shares) == (512, 256)
    for cls, oom in expected_oom.items():
        assert fwd(cls).oom_score_adj == oom, cls
    assert (fwd("BE").cpu_quota, fwd("BE").memory_limit_in_bytes) == (0, 0)  # the batch ones: files only
    assert fwd("LSE").cpu_quota == 200000 and fwd("LS").cpu_quota == 0
    # cpusets from the allocator.
    lse = parse_cpu_list(fwd("LSE").cpuset_cpus)
    lsr = parse_cpu_list(fwd("LSR").cpuset_cpus)
    assert len(lse) == 2 and lse == node.topology.siblings(min(lse))  # one whole core
    assert len(lsr) == 1 and not lse & lsr
    # unified memory keys (v2): min/low from the request, high request + 90 % of (limit - request)
    # (Guaranteed: request = limit).
    lse_unified = {"memory.min": str(256 * MIB), "memory.low": str(256 * MIB),  # low capped at limit
                   "memory.high": str(256 * MIB)}
    assert dict(fwd("LSE").unified) == lse_unified
    assert dict(fwd("LSR").unified) == {"memory.min": str(256 * MIB * 80 // 100),
                                        "memory.low": str(256 * MIB), "memory.high": str(256 * MIB)}
    ls_app = {"memory.min": 64 * MIB, "memory.low": 128 * MIB * 80 // 100,
              "memory.high": koordinator_memory_high(128 * MIB, 512 * MIB, 90)}
    ls_side = {"memory.min": 32 * MIB, "memory.low": 64 * MIB * 80 // 100,
               "memory.high": koordinator_memory_high(64 * MIB, 128 * MIB, 90)}
    assert {k: int(v) for k, v in fwd("LS", 0).unified.items()} == ls_app
    assert {k: int(v) for k, v in fwd("LS", 1).unified.items()} == ls_side
    be_high = koordinator_memory_high(256 * MIB, 1 << 30, 70)  # the batch-memory request and limit
    assert dict(fwd("BE").unified) == {"memory.min": "0", "memory.low": "0", "memory.high": str(be_high)}
    assert dict(fwd("SYSTEM").unified) == {}  # SYSTEM: no memory QoS by default
    # kubelet's own values travel along for a restart.
    kubelet = json.loads(node.created[pods["LS"][1][0]].config.annotations[KUBELET_RESOURCES_ANNOTATION])
    assert kubelet["cpu_shares"] == 512 and kubelet["unified"] == {"memory.min": str(128 * MIB)}

    # --- the files after StartContainer (the runtime wrote kubelet's weight, koordnode the class's) ---
    for cls, (_pod, cids, _) in pods.items():
        for i, cid in enumerate(cids):
            shares = {"LS": (512, 256)[i]}.get(cls, expected_shares.get(cls))
            assert node.read(node.ccg(cid), "cpu.weight") == str(weight(shares)), cls
    assert node.read(node.ccg(pods["LSE"][1][0]), "cpu.weight") == "10000"
    assert node.read(node.ccg(pods["LSR"][1][0]), "cpu.weight") == str(weight(65536)) == "2500"

    # No pod is idle by default ([qos.BE] cpu_idle = 0), so the BE pod's weight is set: the sum
    # of its batch-cpu requests (250m = 256 shares).
    for cls, (pod, _, _) in pods.items():
        assert node.read(pod.cgroup, "cpu.idle") == "0", cls
    be_pod, be_cids, _ = pods["BE"]
    assert node.read(be_pod.cgroup, "cpu.weight") == str(weight(256))
    # The other pods compete with the class weight too: the sum of their containers'.
    pod_shares = {"SYSTEM": 32768, "LSE": 262144, "LSR": 65536, "LS": 512 + 256}
    for cls, shares in pod_shares.items():
        assert node.read(pods[cls][0].cgroup, "cpu.weight") == str(weight(shares)), cls
        assert node.status_pod(pods[cls][0])["cpu_weight"] == {"cpu.shares": shares, "cpu.weight": weight(shares)}
    assert node.status_pod(be_pod)["cpu_weight"] == {"cpu.shares": 256, "cpu.weight": weight(256)}
    # cpu.max: BE container from its batch-cpu limit, BE pod from the sum of the limits.
    assert node.read(node.ccg(be_cids[0]), "cpu.max") == "200000 100000"
    assert node.read(be_pod.cgroup, "cpu.max") == "200000 100000"
    assert node.read(node.ccg(be_cids[0]), "memory.max") == str(1 << 30)
    assert node.read(be_pod.cgroup, "memory.max") == str(1 << 30)

    # memory.min/low/high: containers as planned, pods the sums.
    def mem(cgroup):
        return {k: int(node.read(cgroup, k)) for k in ("memory.min", "memory.low", "memory.high")}

    ls_pod, ls_cids, _ = pods["LS"]
    assert mem(node.ccg(ls_cids[0])) == ls_app
    assert mem(node.ccg(ls_cids[1])) == ls_side
    assert mem(ls_pod.cgroup) == {k: ls_app[k] + ls_side[k] for k in ls_app}
    assert mem(pods["LSE"][0].cgroup) == {k: int(v) for k, v in lse_unified.items()}
    assert mem(be_pod.cgroup) == {"memory.min": 0, "memory.low": 0, "memory.high": be_high}
    sys_pod, sys_cids, _ = pods["SYSTEM"]
    assert node.read(sys_pod.cgroup, "memory.min") == "0" and node.read(sys_pod.cgroup, "memory.high") == "max"

    # io.weight per class (SYSTEM: left alone); BE disk throttle on the configured device.
    io = {"SYSTEM": "default 100", "LSE": "default 1000", "LSR": "default 800", "LS": "default 500",
          "BE": "default 100"}
    for cls, (pod, _, _) in pods.items():
        assert node.read(pod.cgroup, "io.weight") == io[cls], cls
    assert node.read(be_pod.cgroup, "io.max") == f"8:0 rbps={500 * MIB} wbps={200 * MIB}"
    assert node.read(ls_pod.cgroup, "io.max") == ""

    # cpuset.cpus: LSE/LSR own theirs; LS and SYSTEM run on the share pool, BE on the BE pool.
    assert cpus_of(node.root, node.ccg(pods["LSE"][1][0])) == lse
    assert cpus_of(node.root, node.ccg(pods["LSR"][1][0])) == lsr
    for cid in ls_cids + sys_cids:
        assert cpus_of(node.root, node.ccg(cid)) == all_cpus - lse - lsr
    assert cpus_of(node.root, node.ccg(be_cids[0])) == all_cpus - lse

    # status: classes and reasons.
    for cls, (pod, _, _) in pods.items():
        entry = node.status_pod(pod)
        assert entry["qos_class"] == cls and entry["qos_reason"], cls
        assert entry["verified_at"] is not None
        assert not [s for s in entry["skipped"] if "failed" in s or "refused" in s], entry["skipped"]


def test_a_pods_class_values_come_with_its_first_container_start(make_node):
    """RunPodSandbox's Post writes nothing of the pod's (its pause process needs none, and a
    second apply would cost every pod start); the first StartContainer applies pod and container,
    and the reconcile pass a pod whose containers never start."""
    node = make_node(toml="[qos.BE]\ncpu_idle = 1\n")
    be = node.run_pod("be", parent="/kubepods/besteffort/podbe", annotations={EXTENDED_SPEC: BE_SPEC})
    assert node.read(be.cgroup, "cpu.idle") == "0"
    node.run_container(be, cpu_shares=2)
    assert node.read(be.cgroup, "cpu.idle") == "1"
    waiting = node.run_pod("waiting", parent="/kubepods/besteffort/podwaiting", annotations={EXTENDED_SPEC: BE_SPEC})
    assert node.read(waiting.cgroup, "cpu.idle") == "0"
    node.engine.reconcile()
    assert node.read(waiting.cgroup, "cpu.idle") == "1"


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_an_idle_be_pod_when_configured_gets_no_pod_weight(make_node, version):
    # [qos.BE] cpu_idle = 1 (no longer the default): the pod is idle and its batch cpu.shares are
    # not planned (the kernel pins an idle group's weight); its containers keep theirs.
    node = make_node(version=version, toml="[qos.BE]\ncpu_idle = 1\n")
    be = node.run_pod("be", parent="/kubepods/besteffort/podbe", annotations={EXTENDED_SPEC: BE_SPEC})
    cid = node.run_container(be, cpu_shares=2)
    assert node.read(be.cgroup, "cpu.idle") == "1"
    if version == "v2":
        assert node.read(be.cgroup, "cpu.weight") == "100"
        assert node.read(node.ccg(cid), "cpu.weight") == str(weight(256))
    else:
        assert node.read(be.cgroup, "cpu.shares") == "1024"
        assert node.read(node.ccg(cid), "cpu.shares") == "256"
    entry = node.status_pod(be)
    assert not any(line.startswith("cpu.shares") or line.startswith("cpu.weight") for line in entry["applied"])
    assert any("idle" in note for note in entry["notes"]), entry["notes"]
    assert not [s for s in entry["skipped"] if "failed" in s or "refused" in s], entry["skipped"]


def test_v2_systemd_paths_are_the_expanded_slices(make_node):
    node = make_node(version="v2")
    pod = node.run_pod("be", parent="kubepods-besteffort-podabc.slice")
    cid = node.run_container(pod, cpu_shares=2)
    assert pod.cgroup == "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podabc.slice"
    scope = f"{pod.cgroup}/cri-containerd-{cid}.scope"
    # The pod's cpu.idle (0 by default for BE, as the file starts) was planned on the expanded slice.
    assert node.read(pod.cgroup, "cpu.idle") == "0"
    assert any(line.startswith(f"cpu.idle=0 on {pod.cgroup} (") for line in node.status_pod(pod)["applied"])
    assert node.read(scope, "cpu.weight") == str(weight(2)) == "1"
    assert node.read(scope, "cpuset.cpus") == format_cpu_list(node.topology.online)
    assert node.status_pod(pod)["qos_class"] == "BE"


# --- group identity (Anolis) and plain v1 --------------------------------------------------------


def test_anolis_v1_group_identity_and_watermarks(make_node):
    node = make_node(version="v1", anolis=True)
    assert node.engine.features.group_identity is True
    be = node.run_pod("be", parent="/kubepods/besteffort/podbe", annotations={EXTENDED_SPEC: BE_SPEC})
    be_cid = node.run_container(be, cpu_shares=2)
    ls = node.run_pod("ls", parent="/kubepods/burstable/podls")
    ls_cid = node.run_container(ls, cpu_shares=512, memory_limit_in_bytes=512 * MIB,
                                unified={"memory.min": str(128 * MIB)})

    # CPU priority: group identity instead of cpu.idle.
    assert node.read(be.cgroup, "cpu.bvt_warp_ns") == "-1"
    assert node.read(be.cgroup, "cpu.idle") == "0"
    assert node.read(ls.cgroup, "cpu.bvt_warp_ns") == "0"
    # Not idle, so the BE pod's shares are set: the sum of the batch-cpu requests.
    assert node.read(be.cgroup, "cpu.shares") == "256"
    assert node.read(node.ccg(be_cid), "cpu.shares") == "256"
    assert node.read(node.ccg(be_cid), "cpu.cfs_quota_us") == "200000"
    assert node.read(be.cgroup, "cpu.cfs_quota_us") == "200000"
    assert node.read(node.ccg(be_cid), "memory.limit_in_bytes") == str(1 << 30)
    # Watermarks on pod and container, per class.
    for cgroup, min_adj in ((be.cgroup, "50"), (node.ccg(be_cid), "50"), (ls.cgroup, "-25"),
                            (node.ccg(ls_cid), "-25")):
        assert node.read(cgroup, "memory.wmark_ratio") == "95", cgroup
        assert node.read(cgroup, "memory.wmark_scale_factor") == "20", cgroup
        assert node.read(cgroup, "memory.wmark_min_adj") == min_adj, cgroup
    # Memory protection exists on Anolis v1: written directly (CRI cannot carry it on v1).
    assert node.read(node.ccg(ls_cid), "memory.min") == str(64 * MIB)
    assert node.read(ls.cgroup, "memory.min") == str(64 * MIB)
    assert node.read(ls.cgroup, "memory.high") == str(koordinator_memory_high(128 * MIB, 512 * MIB, 90))
    assert node.read(ls.cgroup, "blkio.bfq.weight") == "500"
    assert node.status_pod(be)["skipped"] == []
    assert node.engine.status()["unsupported"] == {}


def test_anolis_v2_watermarks_and_memory_qos(make_node):
    node = make_node(version="v2", anolis=True)
    ls = node.run_pod("ls", parent="kubepods-burstable-podls.slice")
    cid = node.run_container(ls, cpu_shares=512, memory_limit_in_bytes=512 * MIB,
                             unified={"memory.min": str(128 * MIB)})
    for cgroup in (ls.cgroup, node.ccg(cid)):
        assert node.read(cgroup, "memory.wmark_ratio") == "95", cgroup
        assert node.read(cgroup, "memory.wmark_min_adj") == "-25", cgroup
        assert node.read(cgroup, "memory.min") == str(64 * MIB), cgroup
    assert node.status_pod(ls)["skipped"] == []


def test_anolis_v2_group_identity_is_detected(make_node):
    node = make_node(version="v2", anolis=True)
    be = node.run_pod("be", parent="kubepods-besteffort-podbe.slice")
    node.run_container(be, cpu_shares=2)
    assert node.engine.features.group_identity is True
    assert node.read(be.cgroup, "cpu.bvt_warp_ns") == "-1"
    assert node.read(be.cgroup, "cpu.idle") == "0"


def test_group_identity_is_not_probed_again_once_a_pod_cgroup_shows_the_kernel_lacks_it(make_node):
    node = make_node(version="v1", anolis=False)
    probes: list[str] = []
    read = node.engine.executor.read

    def counting_read(cgroup: str, resource: str) -> str | None:
        if resource == "cpu.bvt_warp_ns":
            probes.append(cgroup)
        return read(cgroup, resource)

    node.engine.executor.read = counting_read  # type: ignore[method-assign]
    for name in ("a", "b", "c"):
        pod = node.run_pod(name, parent=f"/kubepods/burstable/pod{name}")
        node.run_container(pod, cpu_shares=512)
    node.engine.reconcile(force=False)
    node.engine.reconcile(force=False)
    assert probes == ["/kubepods/burstable/poda"]
    assert node.engine.features.group_identity is False


def test_plain_v1_skips_anolis_files_and_says_why(make_node):
    node = make_node(version="v1", anolis=False)
    assert node.engine.features.group_identity is False
    be = node.run_pod("be", parent="/kubepods/besteffort/podbe")
    be_cid = node.run_container(be, cpu_shares=2)
    ls = node.run_pod("ls", parent="/kubepods/burstable/podls")
    ls_cid = node.run_container(ls, cpu_shares=512, memory_limit_in_bytes=512 * MIB)

    # Upstream CPU priority: cpu.idle (0 by default for BE, as the file starts), not bvt.
    assert node.read(be.cgroup, "cpu.idle") == "0"
    assert any(line.startswith(f"cpu.idle=0 on {be.cgroup} (") for line in node.status_pod(be)["applied"])
    assert node.read(node.ccg(be_cid), "cpu.shares") == "2"
    assert node.read(node.ccg(ls_cid), "cpu.shares") == "512"
    assert not (node.root / "cpu" / be.cgroup.lstrip("/") / "cpu.bvt_warp_ns").exists()

    for pod, _cid in ((be, be_cid), (ls, ls_cid)):
        entry = node.status_pod(pod)
        pod_skips = " | ".join(entry["skipped"])
        for name in ("memory.wmark_ratio", "memory.wmark_scale_factor", "memory.wmark_min_adj"):
            assert name in pod_skips, (name, entry["skipped"])
        assert "not present on this kernel" in pod_skips
        container_skips = " | ".join(entry["containers"][0]["skipped"])
        names = ("memory.wmark_ratio", "memory.min", "memory.low") + (("memory.high",) if pod is ls else ())
        for name in names:
            assert name in container_skips, (name, container_skips)
    unsupported = node.engine.status()["unsupported"]
    assert {"memory.wmark_ratio", "memory.min", "memory.high"} <= set(unsupported)
    # No file was created for them.
    assert not (node.root / "memory" / ls.cgroup.lstrip("/") / "memory.wmark_ratio").exists()


# --- the allocator through the engine ------------------------------------------------------------

BIG = CpuTopology.describe(sockets=2, cores_per_numa=8, threads_per_core=2)  # 32 CPUs, siblings c, c+16


def lse_res(n_cpus: int) -> dict:
    return dict(cpu_shares=1024 * n_cpus, cpu_quota=100000 * n_cpus, memory_limit_in_bytes=64 * MIB)


def assert_whole_cores_on_one_socket(topology: CpuTopology, cpus: frozenset[int]) -> None:
    for cpu in cpus:
        assert topology.siblings(cpu) <= cpus, f"{sorted(cpus)} splits the core of CPU {cpu}"
    assert len({topology.by_cpu[cpu].socket for cpu in cpus}) == 1, sorted(cpus)


def test_exclusive_cores_shrink_and_grow_the_pools_of_running_containers(make_node):
    node = make_node(version="v2", topology=BIG)
    everything = BIG.online
    ls = node.run_pod("ls", parent="/kubepods/burstable/podls")
    ls_cid = node.run_container(ls, cpu_shares=512)
    be = node.run_pod("be", parent="/kubepods/besteffort/podbe")
    be_cid = node.run_container(be, cpu_shares=2)

    def ls_cpus():
        return cpus_of(node.root, node.ccg(ls_cid))

    def be_cpus():
        return cpus_of(node.root, node.ccg(be_cid))

    assert ls_cpus() == be_cpus() == everything

    a = node.run_pod("lse-a", parent="/kubepods/poda", labels={QOS_LABEL: "LSE"})
    a_cid = node.run_container(a, **lse_res(4))
    b = node.run_pod("lse-b", parent="/kubepods/podb", labels={QOS_LABEL: "LSE"})
    b_cid = node.run_container(b, **lse_res(4))
    a_cpus, b_cpus = cpus_of(node.root, node.ccg(a_cid)), cpus_of(node.root, node.ccg(b_cid))
    assert len(a_cpus) == len(b_cpus) == 4
    assert not a_cpus & b_cpus
    assert_whole_cores_on_one_socket(BIG, a_cpus)
    assert_whole_cores_on_one_socket(BIG, b_cpus)
    assert node.allocations() == {"uid-lse-a/app": a_cpus, "uid-lse-b/app": b_cpus}
    # The running shared-pool containers moved off the exclusive cores.
    assert ls_cpus() == be_cpus() == everything - a_cpus - b_cpus

    # LSR: out of the share pool, but BE may still use it.
    r = node.run_pod("lsr", parent="/kubepods/podr")
    r_cid = node.run_container(r, **lse_res(2))
    r_cpus = cpus_of(node.root, node.ccg(r_cid))
    assert len(r_cpus) == 2 and not r_cpus & (a_cpus | b_cpus)
    assert ls_cpus() == everything - a_cpus - b_cpus - r_cpus
    assert be_cpus() == everything - a_cpus - b_cpus
    status = node.engine.status()["cpus"]
    assert set(status["share_pool"]) == ls_cpus() and set(status["be_pool"]) == be_cpus()

    # Release: a stopped container gives its cores back, so does a removed pod.
    node.stop_container(a_cid)
    assert ls_cpus() == everything - b_cpus - r_cpus
    assert be_cpus() == everything - b_cpus
    node.remove_pod(b)
    assert ls_cpus() == everything - r_cpus
    assert be_cpus() == everything
    assert node.allocations() == {"uid-lsr/app": r_cpus}
    # The status line of the LS container follows its current cpuset.
    applied = node.status_pod(ls)["containers"][0]["applied"]
    cpuset_lines = [line for line in applied if line.startswith("cpuset.cpus=")]
    assert len(cpuset_lines) == 1, applied
    assert cpuset_lines[0].startswith(f"cpuset.cpus={format_cpu_list(ls_cpus())} "), applied


def test_nri_mode_publishes_pool_moves_instead_of_writing_them(make_node):
    """NRI mode: the runtime owns running containers' cpusets. An LSE container's arrival and
    departure publish the share-pool container's new cpuset on the channel the daemon hands to
    the engine and the NRI plugin (which sends it as a container update); the engine leaves
    that container's cgroup file alone."""
    updates = PoolUpdates()
    notified: list[str] = []
    updates.subscribe(lambda: notified.append(threading.current_thread().name))
    node = make_node(version="v2", topology=BIG, pool_updates=updates)
    ls = node.run_pod("ls", parent="/kubepods/burstable/podls")
    ls_cid = node.run_container(ls, cpu_shares=512)
    assert updates.take() == {}  # nothing moved yet

    a = node.run_pod("lse-a", parent="/kubepods/poda", labels={QOS_LABEL: "LSE"})
    a_cid = node.run_container(a, **lse_res(4))
    a_cpus = parse_cpu_list(node.created[a_cid].config.linux.resources.cpuset_cpus)
    assert len(a_cpus) == 4
    assert updates.take() == {ls_cid: format_cpu_list(BIG.online - a_cpus)}
    assert notified and all(name != threading.main_thread().name for name in notified)  # the hook's thread
    assert cpus_of(node.root, node.ccg(ls_cid)) == BIG.online  # not written here: the runtime applies it

    node.stop_container(a_cid)
    assert updates.take() == {ls_cid: format_cpu_list(BIG.online)}
    assert cpus_of(node.root, node.ccg(ls_cid)) == BIG.online


def test_pool_moves_follow_allocation_changes_only_and_a_failed_move_is_tried_again(make_node):
    """A CreateContainer or removal that changes no allocation leaves the running containers'
    cpusets unread and unwritten (it used to check every one of them, at every pod start); one
    that does moves them all, and a move that failed is made again at the next event."""
    node = make_node(version="v2", topology=BIG)
    running = [node.run_container(node.run_pod(f"ls-{i}", parent=f"/kubepods/burstable/podls{i}"), cpu_shares=512)
               for i in range(3)]
    touched: list[str] = []
    fail_cpuset_of: set[str] = set()
    apply = node.engine.executor.apply

    def watching(writes, **kwargs):
        results = apply(writes, **kwargs)
        touched.extend(r.write.cgroup for r in results if r.write.resource == "cpuset.cpus")
        return [dataclasses.replace(r, status=WriteStatus.FAILED, detail="device busy")
                if r.write.resource == "cpuset.cpus" and r.write.cgroup in fail_cpuset_of else r
                for r in results]

    node.engine.executor.apply = watching
    others = {node.ccg(cid) for cid in running}

    later = node.run_pod("ls-later", parent="/kubepods/burstable/podlater")
    later_cid = node.run_container(later, cpu_shares=512)
    node.stop_container(later_cid)
    assert not others & set(touched), touched

    # An LSE allocation moves every running shared-pool container; one move fails.
    fail_cpuset_of.add(node.ccg(running[0]))
    lse = node.run_pod("lse", parent="/kubepods/podlse", labels={QOS_LABEL: "LSE"})
    lse_cid = node.run_container(lse, **lse_res(4))
    lse_cpus = cpus_of(node.root, node.ccg(lse_cid))
    assert others <= set(touched)
    assert all(cpus_of(node.root, node.ccg(cid)) == BIG.online - lse_cpus for cid in running)

    # The next event with no allocation change makes the moves again, until none fails.
    touched.clear()
    fail_cpuset_of.clear()
    node.run_container(node.run_pod("ls-next", parent="/kubepods/burstable/podnext"), cpu_shares=512)
    assert others <= set(touched)
    touched.clear()
    node.run_container(node.run_pod("ls-last", parent="/kubepods/burstable/podlast"), cpu_shares=512)
    assert not others & set(touched), touched


def test_failed_create_container_releases_its_allocation(make_node):
    node = make_node(topology=BIG)
    ls = node.run_pod("ls", parent="/kubepods/burstable/podls")
    ls_cid = node.run_container(ls, cpu_shares=512)
    a = node.run_pod("lse-a", parent="/kubepods/poda", labels={QOS_LABEL: "LSE"})
    _, ctx = node.create(a, "app", fail=True, **lse_res(8))
    asked = parse_cpu_list(ctx.request.config.linux.resources.cpuset_cpus)
    assert len(asked) == 8  # the request carried an exclusive set...
    assert node.allocations() == {}  # ...which went back when the runtime failed the call
    assert cpus_of(node.root, node.ccg(ls_cid)) == BIG.online
    assert node.state.containers_of(a.sandbox_id) == []
    # kubelet retries: it gets cores again (the same ones: nothing else took them).
    cid = node.run_container(a, **lse_res(8))
    assert cpus_of(node.root, node.ccg(cid)) == asked
    assert node.allocations() == {"uid-lse-a/app": asked}
    assert cpus_of(node.root, node.ccg(ls_cid)) == BIG.online - asked


def test_not_enough_free_cores_falls_back_to_the_share_pool_and_follows_it(make_node):
    node = make_node(topology=BIG, toml='[node]\nreserved_cpus = "0,16"\n')
    huge = node.run_pod("huge", parent="/kubepods/podh", labels={QOS_LABEL: "LSE"})
    huge_cid = node.run_container(huge, **lse_res(31))  # 30 CPUs are left after the reservation
    assert cpus_of(node.root, node.ccg(huge_cid)) == BIG.online - {0, 16}
    assert node.allocations() == {}
    notes = " ".join(node.status_pod(huge)["containers"][0]["notes"])
    assert "not enough free CPUs" in notes, notes
    # Cores handed out later are exclusive at once: the fallback container leaves them too
    # (not only at the next reconcile pass).
    a = node.run_pod("lse-a", parent="/kubepods/poda", labels={QOS_LABEL: "LSE"})
    a_cpus = cpus_of(node.root, node.ccg(node.run_container(a, **lse_res(4))))
    assert cpus_of(node.root, node.ccg(huge_cid)) == BIG.online - {0, 16} - a_cpus
    node.remove_pod(a)
    assert cpus_of(node.root, node.ccg(huge_cid)) == BIG.online - {0, 16}


def test_scheduler_cpuset_is_shared_by_the_pods_containers_and_survives_a_restart(make_node):
    node = make_node(topology=BIG, toml='[node]\nsystem_cpus = "1,17"\n')
    status = {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": "4-5,20-21"})}
    pod = node.run_pod("lse", parent="/kubepods/podx", labels={QOS_LABEL: "LSE"}, annotations=status)
    app, side = node.run_container(pod, "app", **lse_res(2)), node.run_container(pod, "side", **lse_res(1))
    chosen = frozenset({4, 5, 20, 21})
    assert cpus_of(node.root, node.ccg(app)) == cpus_of(node.root, node.ccg(side)) == chosen
    system = node.run_pod("sys", parent="/kubepods/pods", labels={QOS_LABEL: "SYSTEM"})
    assert cpus_of(node.root, node.ccg(node.run_container(system, cpu_shares=100))) == {1, 17}
    assert node.allocations() == {"uid-lse": chosen}

    again = node.restarted()
    assert again.allocations() == {"uid-lse": chosen}
    again.stop_container(app)  # the pod's other container still holds the set
    assert again.allocations() == {"uid-lse": chosen}
    again.stop_container(side)
    assert again.allocations() == {}


def test_adopt_after_restart_restores_allocations_and_never_hands_a_cpu_out_twice(make_node):
    node = make_node(topology=BIG)
    ls = node.run_pod("ls", parent="/kubepods/burstable/podls")
    ls_cid = node.run_container(ls, cpu_shares=512)
    pods = {}
    for name, labels, n in (("lse-a", {QOS_LABEL: "LSE"}, 4), ("lse-b", {QOS_LABEL: "LSE"}, 2),
                            ("lsr", {}, 3)):
        pod = node.run_pod(name, parent=f"/kubepods/pod{name}", labels=labels)
        pods[name] = (pod, node.run_container(pod, **lse_res(n)))
    before = node.allocations()
    assert len(before) == 3
    assert_disjoint(before.values())
    files_before = {name: cpus_of(node.root, node.ccg(cid)) for name, (_, cid) in pods.items()}
    ls_before = cpus_of(node.root, node.ccg(ls_cid))

    # koordnode restarts; the state comes back from the runtime with the containers' cpusets.
    again = node.restarted()
    assert again.allocations() == before
    assert {n: cpus_of(node.root, node.ccg(cid)) for n, (_, cid) in pods.items()} == files_before
    assert cpus_of(node.root, node.ccg(ls_cid)) == ls_before
    # A new LSE pod after the restart gets cores nobody holds.
    c = again.run_pod("lse-c", parent="/kubepods/podc", labels={QOS_LABEL: "LSE"})
    c_cid = again.run_container(c, **lse_res(4))
    c_cpus = cpus_of(node.root, again.ccg(c_cid))
    assert len(c_cpus) == 4
    assert_disjoint(again.allocations().values())
    assert not c_cpus & frozenset().union(*before.values())
    assert cpus_of(node.root, node.ccg(ls_cid)) == ls_before - c_cpus
    # Releasing a restored allocation works like any other.
    again.remove_pod(pods["lse-a"][0])
    assert "uid-lse-a/app" not in again.allocations()
    assert cpus_of(node.root, node.ccg(ls_cid)) == ls_before - c_cpus | before["uid-lse-a/app"]


def test_adopt_refuses_a_cpu_claimed_twice_and_reallocates(make_node):
    node = make_node(topology=BIG)
    a = node.run_pod("lse-a", parent="/kubepods/poda", labels={QOS_LABEL: "LSE"})
    a_cid = node.run_container(a, **lse_res(2))
    b = node.run_pod("lse-b", parent="/kubepods/podb", labels={QOS_LABEL: "LSE"})
    b_cid = node.run_container(b, **lse_res(2))
    a_cpus = cpus_of(node.root, node.ccg(a_cid))
    # The runtime reports B on A's CPUs (e.g. an operator moved it while koordnode was down).
    node.state.containers[b_cid].resources.cpuset_cpus = format_cpu_list(a_cpus)
    write_cgroup_file(node.root, node.ccg(b_cid), "cpuset.cpus", format_cpu_list(a_cpus))

    again = node.restarted()
    allocations = again.allocations()
    assert len(allocations) == 2
    assert_disjoint(allocations.values())
    b_now = cpus_of(node.root, node.ccg(b_cid))
    assert len(b_now) == 2 and not b_now & a_cpus
    assert allocations == {"uid-lse-a/app": a_cpus, "uid-lse-b/app": b_now}


# --- kubelet's resources survive a restart ------------------------------------------------------


def test_restart_plans_from_kubelets_values_not_from_the_rewritten_request(make_node):
    # LS gets 2048 shares per CPU here, so a rewritten request would be rewritten again.
    node = make_node(version="v2", toml="[qos.LS]\ncpu_shares_per_cpu = 2048\n")
    ls = node.run_pod("ls", parent="/kubepods/burstable/podls")
    ls_cid, ls_ctx = node.create(ls, "app", cpu_shares=512, memory_limit_in_bytes=512 * MIB,
                                 unified={"memory.min": str(128 * MIB)})
    node.start(ls_cid)
    lsr = node.run_pod("lsr", parent="/kubepods/podlsr")
    lsr_cid = node.run_container(lsr, **GUARANTEED_1CPU)

    def values() -> dict:
        return {
            "ls weight": node.read(node.ccg(ls_cid), "cpu.weight"),
            "ls min": node.read(node.ccg(ls_cid), "memory.min"),
            "ls pod min": node.read(ls.cgroup, "memory.min"),
            "lsr weight": node.read(node.ccg(lsr_cid), "cpu.weight"),
        }

    expected = {"ls weight": str(weight(1024)), "ls min": str(64 * MIB), "ls pod min": str(64 * MIB),
                "lsr weight": str(weight(65536))}
    assert values() == expected
    rewritten = ls_ctx.request.config.linux.resources
    assert rewritten.cpu_shares == 512 and rewritten.unified["memory.min"] == str(64 * MIB)  # kubelet's shares
    kubelet = json.loads(ls_ctx.request.config.annotations[KUBELET_RESOURCES_ANNOTATION])
    assert kubelet == {"cpu_period": 100000, "cpu_shares": 512, "memory_limit_in_bytes": 512 * MIB,
                       "unified": {"memory.min": str(128 * MIB)}}

    again = node.restarted()
    again.engine.reconcile(force=True)
    assert values() == expected
    # kubelet resizes nothing but re-sends its values: still planned from kubelet's numbers.
    ctx = again.call("UpdateContainerResources", pb.UpdateContainerResourcesRequest(
        container_id=ls_cid, linux=pb.LinuxContainerResources(
            cpu_period=100000, cpu_shares=512, memory_limit_in_bytes=512 * MIB,
            unified={"memory.min": str(128 * MIB)})))
    assert ctx.request.linux.cpu_shares == 512  # kubelet's, as the runtime reports it back
    assert ctx.request.linux.unified["memory.min"] == str(64 * MIB)
    assert values() == expected  # the class weight again over the runtime's rewrite
    again.engine.reconcile(force=True)
    assert values() == expected


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_what_kubelet_reads_back_reaches_the_runtime_as_kubelet_asked(make_node, version):
    """kubelet turns the cpu_shares, quota/period and memory limit the runtime reports into the
    pod's status.containerStatuses[].resources: the requests keep kubelet's values; the class
    values are written to the files after StartContainer and after each update (the runtime
    rewrote kubelet's values then: that is not counted as an overwrite)."""
    node = make_node(version=version)
    lsr = node.run_pod("lsr", parent="/kubepods/podlsr")
    lsr_cid, ctx = node.create(lsr, "app", **GUARANTEED_1CPU)
    be = node.run_pod("be", parent="/kubepods/besteffort/podbe", annotations={EXTENDED_SPEC: BE_SPEC})
    be_cid, be_ctx = node.create(be, "app", cpu_shares=2)
    asked = {"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000, "memory_limit_in_bytes": 256 * MIB}
    forwarded = ctx.request.config.linux.resources
    assert {f: getattr(forwarded, f) for f in asked} == asked
    be_forwarded = be_ctx.request.config.linux.resources
    assert (be_forwarded.cpu_shares, be_forwarded.cpu_quota, be_forwarded.memory_limit_in_bytes) == (2, 0, 0)
    shares_file = "cpu.weight" if version == "v2" else "cpu.shares"

    def class_value(shares: int) -> str:
        return str(weight(shares)) if version == "v2" else str(shares)

    node.start(lsr_cid)
    node.start(be_cid)
    assert node.read(node.ccg(lsr_cid), shares_file) == class_value(65536)
    assert node.read(node.ccg(be_cid), shares_file) == class_value(256)  # batch-cpu request 250m
    if version == "v1":
        assert node.read(node.ccg(be_cid), "cpu.cfs_quota_us") == "200000"
        assert node.read(node.ccg(be_cid), "memory.limit_in_bytes") == str(1 << 30)
    else:
        assert node.read(node.ccg(be_cid), "cpu.max") == "200000 100000"
        assert node.read(node.ccg(be_cid), "memory.max") == str(1 << 30)
    lsr_line = f"cpu.shares=65536 on {node.ccg(lsr_cid)} "
    assert any(line.startswith(lsr_line) for line in node.status_pod(lsr)["containers"][0]["applied"])

    # An in-place resize: the runtime writes kubelet's new weight, koordnode the class's after it.
    update = pb.LinuxContainerResources(cpu_period=100000, cpu_quota=200000, cpu_shares=2048,
                                        memory_limit_in_bytes=256 * MIB)
    ctx = node.call("UpdateContainerResources", pb.UpdateContainerResourcesRequest(container_id=lsr_cid,
                                                                                  linux=update))
    assert ctx.request.linux.cpu_shares == 2048 and ctx.request.linux.cpu_quota == 200000
    assert node.read(node.ccg(lsr_cid), shares_file) == class_value(131072)
    # kubelet re-sends the same values: the runtime rewrites kubelet's weight again, and it is put back.
    node.call("UpdateContainerResources", pb.UpdateContainerResourcesRequest(container_id=lsr_cid, linux=update))
    assert node.read(node.ccg(lsr_cid), shares_file) == class_value(131072)
    node.engine.reconcile(force=False)
    assert node.read(node.ccg(lsr_cid), shares_file) == class_value(131072)
    assert "cpu.shares" not in node.engine.executor.overwrites  # the runtime's rewrites are no overwrites
    if version == "v1":
        assert node.engine.executor.overwrites == {}
    # Another writer still is one.
    write_cgroup_file(node.root, node.ccg(lsr_cid), shares_file, class_value(4096))
    node.engine.reconcile(force=False)
    assert node.read(node.ccg(lsr_cid), shares_file) == class_value(131072)
    assert node.engine.executor.overwrites.get("cpu.shares") == 1


@pytest.mark.parametrize("bad", ['{"cpu_shares": "x"}', '{"cpu_quota": true}', '{"cpuset_cpus": 3}',
                                 '{"unified": [1]}', "[1]", '"text"', "{not json"])
def test_restart_with_a_foreign_kubelet_resources_annotation_falls_back_to_the_recorded_values(
        make_node, bad):
    node = make_node(version="v2")
    a = node.run_pod("a", parent="/kubepods/burstable/poda")
    a_cid = node.run_container(a, cpu_shares=512)
    b = node.run_pod("b", parent="/kubepods/burstable/podb")
    b_cid = node.run_container(b, cpu_shares=256)
    # Not what koordnode wrote (e.g. a container created past koordnode with this annotation).
    node.state.containers[a_cid].annotations[KUBELET_RESOURCES_ANNOTATION] = bad
    for cid in (a_cid, b_cid):
        write_cgroup_file(node.root, node.ccg(cid), "cpu.weight", "100")
    node.restarted()  # adopt + reconcile must neither raise nor stop early
    assert node.read(node.ccg(a_cid), "cpu.weight") == str(weight(512))  # from the recorded request
    assert node.read(node.ccg(b_cid), "cpu.weight") == str(weight(256))


# --- reconcile ------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_reconcile_rewrites_what_an_operator_changed(make_node, version):
    node = make_node(version=version)
    be = node.run_pod("be", parent="/kubepods/besteffort/podbe")
    be_cid = node.run_container(be, cpu_shares=2)
    ls = node.run_pod("ls", parent="/kubepods/burstable/podls")
    ls_cid = node.run_container(ls, cpu_shares=512)
    shares_file = "cpu.weight" if version == "v2" else "cpu.shares"
    want = {
        (node.ccg(ls_cid), shares_file): node.read(node.ccg(ls_cid), shares_file),
        (be.cgroup, "cpu.idle"): "0",  # [qos.BE] cpu_idle = 0
        (node.ccg(be_cid), "cpuset.cpus"): format_cpu_list(node.topology.online),
    }
    for (cgroup, name), _value in want.items():
        write_cgroup_file(node.root, cgroup, name, {"cpu.idle": "1", "cpuset.cpus": "3"}.get(name, "1000"))
    node.engine.reconcile(force=True)
    for (cgroup, name), value in want.items():
        assert node.read(cgroup, name) == value, (cgroup, name)
    # Forced: an unchanged file is written again and says so in the status.
    node.engine.reconcile(force=True)
    assert any("forced rewrite" in line for line in node.status_pod(ls)["containers"][0]["applied"])


def test_while_the_qos_manager_confines_be_by_cpuset_it_is_the_one_writer_of_be_cpusets(make_node):
    node = make_node(version="v1")
    confined: list[frozenset[int] | None] = [None]
    node.engine.pools.be_cpuset = lambda: confined[0]  # the QoS manager's cpuset policy (daemon.py wires it)
    be = node.run_pod("be", parent="/kubepods/besteffort/podbe")
    be_cid = node.run_container(be, cpu_shares=2)
    everything = format_cpu_list(node.topology.online)
    assert node.read(node.ccg(be_cid), "cpuset.cpus") == everything  # the BE pool, the engine's
    confined[0] = frozenset({6, 7})
    # The manager writes its set (tier, pods, containers); the engine's pass leaves it alone.
    write_cgroup_file(node.root, node.ccg(be_cid), "cpuset.cpus", "6-7")
    node.engine.reconcile(force=True)  # forced: every value it plans is written again
    assert node.read(node.ccg(be_cid), "cpuset.cpus") == "6-7"
    applied = node.status_pod(be)["containers"][0]["applied"]
    assert applied and not [line for line in applied if line.startswith("cpuset.")], applied
    # A new BE container starts inside the set: the CreateContainer request carries it.
    _, ctx = node.create(be, "second", cpu_shares=2)
    assert ctx.request.config.linux.resources.cpuset_cpus == "6-7"
    # Confinement over: the engine writes the BE pool again.
    confined[0] = None
    node.engine.reconcile(force=False)
    assert node.read(node.ccg(be_cid), "cpuset.cpus") == everything


def test_pod_weights_are_kubelets_unless_pod_class_weight_is_on(make_node):
    # kubelet >= 1.36 reads the pod cgroup's cpu.shares back as the pod's CPU request.
    node = make_node(version="v1")
    lsr = node.run_pod("lsr", parent="/kubepods/podlsr", labels={QOS_LABEL: "LSR"})
    write_cgroup_file(node.root, lsr.cgroup, "cpu.shares", "1024")
    node.run_container(lsr, **GUARANTEED_1CPU)
    node.engine.reconcile(force=False)
    assert node.read(lsr.cgroup, "cpu.shares") == "1024"
    assert node.status_pod(lsr)["cpu_weight"] is None


def test_pod_weight_follows_its_containers_and_is_restored_after_kubelets_write(make_node):
    node = make_node(version="v1", toml="pod_class_weight = true\n")
    lsr = node.run_pod("lsr", parent="/kubepods/podlsr", labels={QOS_LABEL: "LSR"})
    write_cgroup_file(node.root, lsr.cgroup, "cpu.shares", "1024")  # kubelet's: 1 CPU requested
    node.run_container(lsr, **GUARANTEED_1CPU)
    assert node.read(lsr.cgroup, "cpu.shares") == "65536"
    # A second container adds its class weight as soon as it starts.
    node.run_container(lsr, "sidecar", cpu_shares=512, cpu_quota=50000, cpu_period=100000,
                       memory_limit_in_bytes=64 * MIB)
    assert node.read(lsr.cgroup, "cpu.shares") == str(65536 + 32768)
    assert any(line.startswith("cpu.shares=98304 ") for line in node.status_pod(lsr)["applied"])
    assert node.status_pod(lsr)["cpu_weight"] == {"cpu.shares": 98304}
    # kubelet writes its own weight again: the pass restores the class's and counts it.
    write_cgroup_file(node.root, lsr.cgroup, "cpu.shares", "1536")
    node.engine.reconcile(force=False)
    assert node.read(lsr.cgroup, "cpu.shares") == "98304"
    assert node.engine.executor.overwrites == {"cpu.shares": 1}
    # A container resize changes the pod's weight with the call.
    sidecar = next(c.container_id for c in node.state.containers_of(lsr.sandbox_id) if c.name == "sidecar")
    node.call("UpdateContainerResources", pb.UpdateContainerResourcesRequest(
        container_id=sidecar, linux=pb.LinuxContainerResources(cpu_shares=1024, cpu_quota=100000,
                                                               cpu_period=100000)))
    assert node.read(lsr.cgroup, "cpu.shares") == str(2 * 65536)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_pass_gives_every_container_process_its_class_oom_score_adj(make_node, version):
    procfs = Path(tempfile.mkdtemp(prefix="koordnode-test-procfs-"))
    try:
        node = make_node(version=version, toml=f'[procfs]\nroot = "{procfs}"\n')
        node.engine.processes.floor = None  # as with CAP_SYS_RESOURCE (the floor is tested alone)
        be = node.run_pod("be", parent="/kubepods/besteffort/podbe")
        be_cid = node.run_container(be, cpu_shares=2)
        ls = node.run_pod("ls", parent="/kubepods/burstable/podls")
        ls_cid = node.run_container(ls, cpu_shares=512)
        # The containers' processes, as after a hook timeout (kubelet's values) and a script's write.
        procs = {be_cid: {101: "1000", 102: "0"}, ls_cid: {201: "998"}}
        for cid, pids in procs.items():
            write_cgroup_file(node.root, node.ccg(cid), "cgroup.procs", "".join(f"{pid}\n" for pid in pids))
            for pid, value in pids.items():
                (procfs / str(pid)).mkdir()
                (procfs / str(pid) / "oom_score_adj").write_text(value + "\n")

        def oom(pid: int) -> str:
            return (procfs / str(pid) / "oom_score_adj").read_text().strip()

        node.engine.reconcile(force=False)
        assert (oom(101), oom(102), oom(201)) == ("1000", "1000", "-300")
        assert node.engine.status()["overwrites"]["counts"] == {"oom_score_adj": 2}
        processes = node.status_pod(be)["containers"][0]["processes"]
        assert processes == ["oom_score_adj=1000 on 1 process(es) (restored)",
                             "oom_score_adj=1000 on 1 process(es) (unchanged)"], processes
        # Nothing changed: nothing written; a process that exits meanwhile is no failure.
        (procfs / "201" / "oom_score_adj").unlink()
        (procfs / "201").rmdir()
        node.engine.reconcile(force=False)
        assert node.engine.status()["overwrites"]["counts"] == {"oom_score_adj": 2}
        assert node.status_pod(ls)["containers"][0]["processes"] == []  # its one process exited
        # A dry run only says what it would do.
        (procfs / "102" / "oom_score_adj").write_text("0\n")
        node.engine.executor.dry_run = True
        node.engine.reconcile(force=False)
        assert oom(102) == "0"
        assert "oom_score_adj=1000 on 1 process(es) (would_write)" in node.status_pod(be)["containers"][0]["processes"]
    finally:
        shutil.rmtree(procfs, ignore_errors=True)


def test_lse_pods_with_core_sched_get_one_cookie_each_and_status_says_so(make_node):
    node = make_node(version="v2", toml="[qos.LSE]\ncore_sched = true\n")
    kernel = FakeCoreKernel()
    node.engine.core_sched = CoreScheduling(kernel)
    pids = iter(range(100, 200))
    lse_pods = []
    for name in ("a", "b"):
        pod = node.run_pod(name, parent=f"/kubepods/pod{name}", labels={QOS_LABEL: "LSE"})
        cids = [node.run_container(pod, f"c{i}", **GUARANTEED_1CPU) for i in range(2)]
        for cid in cids:
            write_cgroup_file(node.root, node.ccg(cid), "cgroup.procs", f"{next(pids)}\n{next(pids)}\n")
        lse_pods.append((pod, cids))
    ls = node.run_pod("ls", parent="/kubepods/burstable/podls")
    ls_cid = node.run_container(ls, cpu_shares=512)
    write_cgroup_file(node.root, node.ccg(ls_cid), "cgroup.procs", "300\n")
    node.engine.reconcile(force=False)
    cookies = [{kernel.cookies[pid] for pid in range(100 + 4 * i, 104 + 4 * i)} for i in range(2)]
    assert all(len(c) == 1 and 0 not in c for c in cookies) and cookies[0] != cookies[1]
    assert 300 not in kernel.cookies  # LS does not ask for it
    assert node.status_pod(lse_pods[0][0])["core_sched"] == "on: 4 process(es) share the pod's cookie"
    assert "core_sched" not in node.status_pod(ls)
    assert node.engine.status()["core_sched"] == {"classes": ["LSE"], "expellers": [], "state": "on"}
    # Where the kernel refuses it, status says why and nothing is tried.
    node.engine.core_sched = CoreScheduling(FakeCoreKernel(error=errno.ENODEV))
    node.engine.reconcile(force=False)
    assert node.status_pod(lse_pods[1][0])["core_sched"].startswith("unavailable: the kernel refuses core")
    assert node.engine.status()["core_sched"]["state"].startswith("unavailable: ")


def test_be_tasks_share_one_cookie_apart_from_the_expellers_and_a_class_that_stops_expelling_joins_it(make_node):
    """[qos.<CLASS>] core_expeller: every BE process has BE's one cookie, LS and LSR processes
    none (beside the node's own), LSE its pod's own; LS without it shares BE's; with it again,
    koordnode's cookie is taken back from LS (another one is left)."""
    node = make_node(version="v2", toml="[qos.LSE]\ncore_sched = true\n[qos.LS]\ncore_expeller = true\n"
                                         "[qos.LSR]\ncore_expeller = true\n")
    kernel = FakeCoreKernel()
    core = node.engine.core_sched = CoreScheduling(kernel)
    try:
        def pod(name: str, parent: str, procs: list[int], labels: dict | None = None, **resources):
            made = node.run_pod(name, parent=parent, labels=labels,
                                annotations={EXTENDED_SPEC: BE_SPEC} if "besteffort" in parent else None)
            cid = node.run_container(made, **resources)
            write_cgroup_file(node.root, node.ccg(cid), "cgroup.procs", "".join(f"{p}\n" for p in procs))
            return made, cid

        be_a, _ = pod("be-a", "/kubepods/besteffort/podbea", [400, 401], cpu_shares=2)
        be_b, be_b_cid = pod("be-b", "/kubepods/besteffort/podbeb", [410], cpu_shares=2)
        ls, _ = pod("ls", "/kubepods/burstable/podls", [300, 301], cpu_shares=512)
        lse, _ = pod("lse", "/kubepods/podlse", [500, 501], labels={QOS_LABEL: "LSE"}, **GUARANTEED_1CPU)
        node.engine.reconcile(force=False)
        shared = kernel.cookies[400]
        assert shared and [kernel.cookies[p] for p in (401, 410)] == [shared, shared]
        assert kernel.cookies.get(300, 0) == kernel.cookies.get(301, 0) == 0
        assert kernel.cookies[500] == kernel.cookies[501] not in (0, shared)
        expellers = "kept off the cores of LSR, LS"
        assert node.status_pod(be_a)["core_sched"] == f"on: 2 process(es) share BE's cookie, {expellers}"
        assert node.status_pod(ls)["core_sched"] == "on: no cookie, BE tasks kept off its cores"
        assert node.status_pod(lse)["core_sched"] == "on: 2 process(es) share the pod's cookie"
        assert node.engine.status()["core_sched"] == {"classes": ["LSE"], "expellers": ["LSR", "LS"], "state": "on"}
        # A process started later in a BE pod (an exec) joins the cookie at the next pass.
        write_cgroup_file(node.root, node.ccg(be_b_cid), "cgroup.procs", "410\n411\n")
        node.engine.reconcile(force=False)
        assert kernel.cookies[411] == shared

        # LS no longer expels BE: it shares BE's cookie.
        settings = node.engine.settings
        no_ls = dataclasses.replace(settings.qos, LS=dataclasses.replace(settings.qos.LS, core_expeller=False))
        node.engine.reconfigure(dataclasses.replace(settings, qos=no_ls))
        node.engine.reconcile(force=False)
        assert kernel.cookies[300] == kernel.cookies[301] == shared
        # Expelling again: koordnode's cookie is taken back; a cookie the application made stays.
        kernel.cookies[301] = 4242
        node.engine.reconfigure(settings)
        node.engine.reconcile(force=False)
        assert (kernel.cookies[300], kernel.cookies[301]) == (0, 4242)
        assert kernel.cookies[400] == shared and kernel.cookies[500] not in (0, shared)
        # Where the kernel refuses it, the pods of the classes that ask say why.
        node.engine.core_sched = CoreScheduling(FakeCoreKernel(error=errno.EINVAL))
        node.engine.reconcile(force=False)
        for made in (be_a, ls):
            assert node.status_pod(made)["core_sched"].startswith("unavailable: the kernel has no core scheduling")
    finally:
        core.close()


def test_pod_resize_notification_writes_the_pods_values_again(make_node):
    # After UpdatePodSandboxResources kubelet has rewritten the pod cgroup; the hook re-applies.
    node = make_node(version="v2")
    be = node.run_pod("be", parent="/kubepods/besteffort/podbe")
    node.run_container(be, cpu_shares=2)
    write_cgroup_file(node.root, be.cgroup, "cpu.idle", "1")  # not koordnode's value ([qos.BE] cpu_idle = 0)
    node.engine.pod_resources_updated(be.sandbox_id)
    assert node.read(be.cgroup, "cpu.idle") == "0"


# --- hostile input --------------------------------------------------------------------------------

SENTINEL_FILES = {"cpu.shares": "1024", "cpu.weight": "100", "cpu.idle": "0", "cpu.max": "max 100000",
                  "cpu.cfs_quota_us": "-1", "cpu.bvt_warp_ns": "0", "cpuset.cpus": "0-7",
                  "memory.min": "0", "memory.low": "0", "memory.high": "max", "memory.max": "max",
                  "io.weight": "default 100", "blkio.bfq.weight": "100", "memory.wmark_ratio": "0"}


def snapshot_tree(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): p.read_text() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("case", ["dotdot", "slice-dotdot", "symlink"])
def test_hostile_cgroup_parent_writes_nothing_outside_the_root(make_node, version, case):
    node = make_node(version=version)
    outside = node.root.parent / "outside"  # where every hostile parent below leads
    for directory in (outside, outside / "kubepods-besteffort.slice"):
        directory.mkdir(parents=True, exist_ok=True)
        for name, value in SENTINEL_FILES.items():
            (directory / name).write_text(value)
    if case == "dotdot":
        # <root>/kubepods/besteffort/../../../outside (v2), <root>/cpu/kubepods/... (v1)
        ups = "../" * (3 if version == "v2" else 4)
        parent = f"/kubepods/besteffort/{ups}outside"
    elif case == "slice-dotdot":
        parent = "kubepods-besteffort-..-..-outside.slice"
    else:
        # A pod cgroup that is a symlink out of the tree (in every v1 hierarchy, or in v2's).
        parent = "/kubepods/besteffort/podevil"
        for hierarchy in ([node.root] if version == "v2" else [node.root / c for c in ("cpu", "cpuset", "memory", "blkio")]):
            (hierarchy / "kubepods" / "besteffort").mkdir(parents=True, exist_ok=True)
            (hierarchy / "kubepods" / "besteffort" / "podevil").symlink_to(outside, target_is_directory=True)
    pod = node.run_pod("evil", parent=parent, annotations={EXTENDED_SPEC: BE_SPEC}, pod_cgroup="")
    cid, ctx = node.create(pod, "app", cpu_shares=2)
    # A naive runtime would create the container cgroup where the parent points.
    for name, value in SENTINEL_FILES.items():
        (outside / cid).mkdir(exist_ok=True)
        (outside / cid / name).write_text(value)
    before = snapshot_tree(outside)
    node.start(cid)
    node.engine.reconcile(force=True)
    entry = node.status_pod(pod)
    node.stop_container(cid)
    node.remove_pod(pod)
    assert snapshot_tree(outside) == before
    # Refused, and the status says so.
    assert any("refused" in line for line in entry["skipped"]), entry["skipped"]
    assert not [line for line in entry["applied"] if "outside" in line or "evil" in line], entry["applied"]
    # The calls went through, the request still rewritten (CRI values do not touch the tree).
    # A malformed slice is not under the besteffort tier, so that pod counts as Guaranteed (LSR).
    assert ctx.response.container_id == cid
    expected_class = "LSR" if case == "slice-dotdot" else "BE"
    assert entry["qos_class"] == expected_class
    assert ctx.request.config.linux.resources.oom_score_adj == {"BE": 1000, "LSR": -700}[expected_class]
    assert ctx.request.config.linux.resources.cpu_shares == 2  # kubelet's: the class value is a file write


def test_skip_labelled_pod_stays_untouched_by_reconcile_and_pool_changes(make_node):
    """The skip label also holds for the reconcile pass and for pods adopted after a restart."""
    node = make_node(version="v1")
    skip = node.run_pod("skip", parent="/kubepods/burstable/podskip",
                        labels={"runtimeproxy.koordinator.sh/skip-hookserver": "true"})
    add_cgroup(node.root, f"{skip.cgroup}/manual")
    write_cgroup_file(node.root, skip.cgroup, "cpu.idle", "1")
    before = snapshot_tree(node.root)
    cid = node.run_container(skip, cpu_shares=512)
    write_cgroup_file(node.root, node.ccg(cid), "cpu.shares", "777")
    node.engine.reconcile(force=True)
    node.engine.adopt()
    assert node.read(node.ccg(cid), "cpu.shares") == "777"
    assert node.read(skip.cgroup, "cpu.idle") == "1"
    # An LSE pod takes cores: the skipped container's cpuset is not moved either.
    cpuset_before = node.read(node.ccg(cid), "cpuset.cpus")
    lse = node.run_pod("lse", parent="/kubepods/podlse", labels={"koordinator.sh/qosClass": "LSE"})
    lse_cid = node.run_container(lse, cpu_shares=2048, cpu_quota=200000)
    assert node.read(node.ccg(lse_cid), "cpuset.cpus") != cpuset_before  # LSE did get cores
    assert node.read(node.ccg(cid), "cpuset.cpus") == cpuset_before
    assert set(before) <= set(snapshot_tree(node.root))


# --- reliability (issue 9): ownership after kill -9, the share pool, status, the thread rule ---

TWO = CpuTopology.describe(cores_per_numa=2)  # the test bed's machine: 2 CPUs, no SMT
FOUR = CpuTopology.describe(cores_per_numa=4)


def lse(node: Node, name: str, n_cpus: int = 1, **kwargs) -> tuple[Pod, str]:
    pod = node.run_pod(name, parent=f"/kubepods/pod{name}", labels={QOS_LABEL: "LSE"}, **kwargs)
    return pod, node.run_container(pod, **lse_res(n_cpus))


def test_restart_does_not_take_a_fallback_containers_cpuset_for_an_allocation(make_node):
    # The issue's sequence: LSE A and B take both CPUs, LSE C falls back to the share pool,
    # A and B go, koordnode is killed and restarted. C must not own CPUs afterwards.
    node = make_node(version="v1", topology=TWO, toml="[node]\nmin_shared_cpus = 0\n")
    a, _ = lse(node, "a")
    b, _ = lse(node, "b")
    c, c_cid = lse(node, "c")
    assert node.allocations() == {"uid-a/app": {0}, "uid-b/app": {1}}
    assert "uid-c/app" not in node.allocations()
    node.remove_pod(a)
    node.remove_pod(b)
    again = node.restarted()  # kill -9: nothing released, the state comes back from the runtime
    assert again.allocations() == {}
    status = again.engine.status()["cpus"]
    assert status["share_pool"] == [0, 1]
    assert cpus_of(node.root, node.ccg(c_cid)) == {0, 1}
    # A new LSE pod can still get a CPU: nothing is held by the fallback container.
    _, d_cid = lse(again, "d")
    assert again.allocations() == {"uid-d/app": cpus_of(node.root, again.ccg(d_cid))}


def test_kill_during_calls_keeps_the_real_owners_cpus(make_node):
    # A fallback container created while one LSE held every CPU carries the whole node as its
    # creation cpuset; restored first, it used to claim the CPUs of the real owners.
    node = make_node(version="v1", topology=FOUR, toml="[node]\nmin_shared_cpus = 0\n")
    big, _ = lse(node, "big", 4)
    fallback, f_cid = lse(node, "fallback")
    assert node.created[f_cid].config.linux.resources.cpuset_cpus == "0-3"
    node.remove_pod(big)
    r = node.run_pod("lsr", parent="/kubepods/podr")
    r_cid = node.run_container(r, **lse_res(1))
    a, a_cid = lse(node, "a", 2)
    # kill -9 while an LSE container's CreateContainer is in flight: its Pre hook allocated and
    # the runtime created it, the Post hook never ran.
    d = node.run_pod("d", parent="/kubepods/podd", labels={QOS_LABEL: "LSE"})
    req = pb.CreateContainerRequest(
        pod_sandbox_id=d.sandbox_id, sandbox_config=d.config,
        config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"), image=pb.ImageSpec(image="busybox"),
                                  linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(**lse_res(1)))))
    ctx = CallContext(method="CreateContainer", request=req)
    node.loop.run_until_complete(node.chain.run_pre(ctx))
    d_cid = node._runtime("CreateContainer", ctx.request).container_id
    node.container_pod[d_cid] = d
    node.state.put_container(dataclasses.replace(
        next(iter(node.state.containers.values())), container_id=d_cid, sandbox_id=d.sandbox_id,
        annotations=dict(ctx.request.config.annotations), state="created",
        resources=copy.deepcopy(ctx.request.config.linux.resources)))
    before = node.allocations()
    assert set(before) == {"uid-lsr/app", "uid-a/app", "uid-d/app"}
    files = {cid: cpus_of(node.root, node.ccg(cid)) for cid in (r_cid, a_cid)}

    # The rebuilt state lists the fallback container first, as it was created first.
    again = node.restarted()
    assert again.allocations() == before
    assert {cid: cpus_of(node.root, node.ccg(cid)) for cid in (r_cid, a_cid)} == files
    # The fallback container shares what pool containers get (all four CPUs are owned now).
    status = again.engine.status()["cpus"]
    assert cpus_of(node.root, node.ccg(f_cid)) == set(status["ls_containers_run_on"])
    assert status["share_pool"] == [] and "share pool is empty" in status["notes"][0]


def test_a_dropped_create_pre_hook_gives_its_cpus_back(make_node):
    # The chain drops a Pre hook's request changes when it fails or times out; the allocation
    # it made must go too, or the CPUs leak until a restart.
    node = make_node(version="v1", topology=FOUR)
    pod = node.run_pod("a", parent="/kubepods/poda", labels={QOS_LABEL: "LSE"})
    res = pb.LinuxContainerResources(**lse_res(2))
    req = pb.CreateContainerRequest(
        pod_sandbox_id=pod.sandbox_id, sandbox_config=pod.config,
        config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"), image=pb.ImageSpec(image="busybox"),
                                  linux=pb.LinuxContainerConfig(resources=res)))
    allocated = pb.CreateContainerRequest()
    allocated.CopyFrom(req)
    node.engine.container_create_pre(allocated)  # the hook ran, but the chain kept `req`
    assert node.allocations() == {"uid-a/app": parse_cpu_list(allocated.config.linux.resources.cpuset_cpus)}
    node.engine.container_created(req, "c" * 64)
    assert node.allocations() == {}


def _create_request(pod, cpus: int) -> pb.CreateContainerRequest:
    return pb.CreateContainerRequest(
        pod_sandbox_id=pod.sandbox_id, sandbox_config=pod.config,
        config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"), image=pb.ImageSpec(image="busybox"),
                                  linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(**lse_res(cpus)))))


def test_a_create_pre_hook_that_times_out_holds_no_cpus_even_without_a_post_step(make_node):
    # The chain gives up on a slow Pre hook and forwards the request without its changes; the
    # hook finishes later. Its CPUs must be free again whether or not the call's Post step ever
    # runs (a client that resets the stream never gets one): the chain releases what a dropped
    # result reserved. On main the allocation stayed until a Post step released it.
    node = make_node(version="v1", topology=FOUR)
    pod = node.run_pod("a", parent="/kubepods/poda", labels={QOS_LABEL: "LSE"})
    slow = threading.Event()
    classify = node.engine.classify

    def slow_classify(labels, cgroup_parent):
        slow.wait(5)  # until the chain has given up
        return classify(labels, cgroup_parent)

    node.engine.classify = slow_classify
    finished = threading.Event()

    class Watched(QoSHook):
        def plan_container(self, call):
            try:
                return super().plan_container(call)
            finally:
                finished.set()

    chain = HookChain([Watched(node.engine)], timeout_s=0.05)
    req = _create_request(pod, 2)
    ctx = CallContext(method="CreateContainer", request=req)

    async def body():
        await chain.run_pre(ctx)
        slow.set()
        await asyncio.get_running_loop().run_in_executor(None, finished.wait, 5)
        for _ in range(5):  # the late result is settled on the loop
            await asyncio.sleep(0.01)

    try:
        node.loop.run_until_complete(body())
    finally:
        slow.set()
        chain.close()
    assert finished.is_set()
    assert ctx.hook_failures
    assert ctx.request.config.linux.resources.cpuset_cpus == ""  # the request went on unchanged
    assert node.allocations() == {}
    assert node.engine.pools.allocator.reservation_of("uid-a/app") is None
    # ... and the CPUs are there for the next container.
    _, cid = lse(node, "b", 3)
    assert len(cpus_of(node.root, node.ccg(cid))) == 3


def test_a_kept_create_pre_hook_result_commits_its_cpus(make_node):
    # The other half: where the chain keeps the rewritten request, the reserved CPUs become the
    # owner's before the call goes on (a concurrent CreateContainer cannot get them).
    node = make_node(version="v1", topology=FOUR)
    pod = node.run_pod("a", parent="/kubepods/poda", labels={QOS_LABEL: "LSE"})
    ctx = CallContext(method="CreateContainer", request=_create_request(pod, 2))
    node.loop.run_until_complete(node.chain.run_pre(ctx))
    cpus = parse_cpu_list(ctx.request.config.linux.resources.cpuset_cpus)
    assert len(cpus) == 2 and node.allocations() == {"uid-a/app": cpus}
    assert node.engine.pools.allocator.reservation_of("uid-a/app") is None


def test_exclusive_cpus_leave_the_share_pool_at_least_one_cpu(make_node):
    node = make_node(version="v1", topology=TWO)
    ls = node.run_pod("ls", parent="/kubepods/burstable/podls")
    ls_cid = node.run_container(ls, cpu_shares=512)
    a, a_cid = lse(node, "a")
    b, b_cid = lse(node, "b")  # would take the last CPU: falls back instead
    a_cpus = cpus_of(node.root, node.ccg(a_cid))
    assert node.allocations() == {"uid-a/app": a_cpus}
    assert cpus_of(node.root, node.ccg(b_cid)) == cpus_of(node.root, node.ccg(ls_cid)) == TWO.online - a_cpus
    notes = " ".join(node.status_pod(b)["containers"][0]["notes"])
    assert "min_shared_cpus = 1" in notes, notes
    status = node.engine.status()["cpus"]
    assert status["allocations"]["uid-a/app"]["exclusive"] is True
    assert status["share_pool"] == sorted(TWO.online - a_cpus) and status["notes"] == []
    # The scheduler's cpuset is held to the same floor.
    sched = node.run_pod("s", parent="/kubepods/pods", labels={QOS_LABEL: "LSE"}, annotations={
        "scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": format_cpu_list(TWO.online - a_cpus)})})
    node.run_container(sched, **lse_res(1))
    assert set(node.allocations()) == {"uid-a/app"}


def test_status_says_when_exclusive_cpus_are_shared_after_all(make_node):
    # With the floor switched off, two LSE pods take both CPUs: LS containers then run on
    # them, and status must not call them exclusive.
    node = make_node(version="v1", topology=TWO, toml="[node]\nmin_shared_cpus = 0\n")
    ls = node.run_pod("ls", parent="/kubepods/burstable/podls")
    ls_cid = node.run_container(ls, cpu_shares=512)
    lse(node, "a")
    lse(node, "b")
    status = node.engine.status()["cpus"]
    assert status["share_pool"] == []
    assert status["ls_containers_run_on"] == [0, 1] == sorted(cpus_of(node.root, node.ccg(ls_cid)))
    assert all(a["exclusive"] is False for a in status["allocations"].values())
    assert "share pool is empty" in status["notes"][0]


def test_status_never_waits_for_the_engine_lock(make_node):
    # `koordnode status` runs on the event loop; a reconcile pass holds the engine lock in a
    # worker thread for as long as it writes. The status must come from a published snapshot.
    import threading

    node = make_node(version="v1", topology=TWO)
    pod = node.run_pod("ls", parent="/kubepods/burstable/podls")
    node.run_container(pod, cpu_shares=512)
    held, release = threading.Event(), threading.Event()

    def worker():
        with node.engine.lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert held.wait(5)
        answers = []
        reader = threading.Thread(target=lambda: answers.append(
            (node.engine.status(), node.engine.decorate(node.state.snapshot()))))
        reader.start()
        reader.join(2)
        assert answers, "status waited for the lock a worker holds"
        status, snapshot = answers[0]
        assert status["cpus"]["share_pool"] == [0, 1]
        assert snapshot["pods"][0]["applied"]
    finally:
        release.set()
        t.join()


def test_reconcile_in_a_thread_while_the_loop_churns_the_state(make_node, monkeypatch):
    # Reliability issue item 5: `dictionary changed size during iteration` in containers_of,
    # from the engine's reconcile in a worker thread while the loop added and removed
    # containers. Workers now read one immutable view; the loop publishes new ones.
    import sys
    import threading

    import koordnode.hooks.qos_engine as qos_engine

    import time

    node = make_node(version="v1", topology=TWO)
    pods = [node.run_pod(f"p{i}", parent=f"/kubepods/burstable/podp{i}") for i in range(10)]
    for pod in pods:
        node.run_container(pod, "app", cpu_shares=512)
    template = next(iter(node.state.containers.values()))
    # ~500 containers, as in the issue: records the runtime reported (no cgroup files here,
    # their writes fail and are counted, which is not what this test is about).
    for i in range(500):
        node.state.put_container(dataclasses.replace(template, container_id=f"idle{i:060d}",
                                                     sandbox_id=pods[i % 10].sandbox_id, state="exited"))
    failures: list[str] = []

    class Recorder:
        def __getattr__(self, name):
            def record(event, *args, **kwargs):
                if name in ("exception", "error"):
                    failures.append(f"{event} {sys.exc_info()[1]!r}")
            return record

    monkeypatch.setattr(qos_engine, "log", Recorder())
    stop = threading.Event()

    def reconcile_loop():
        while not stop.is_set():
            try:
                node.engine.reconcile(force=False)
            except Exception as exc:  # noqa: BLE001 - the test counts them
                failures.append(repr(exc))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    worker = threading.Thread(target=reconcile_loop)
    worker.start()
    try:
        deadline, i = time.monotonic() + 3.0, 0
        while time.monotonic() < deadline:  # the loop's churn: containers come and go
            i += 1
            cid = f"churn{i:060d}"
            node.state.put_container(dataclasses.replace(template, container_id=cid,
                                                         sandbox_id=pods[i % 10].sandbox_id))
            node.state.set_container_state(cid, "running")
            node.state.remove_container(cid)
    finally:
        stop.set()
        worker.join()
        sys.setswitchinterval(old)
    assert failures == []


# --- the idle BE group (model/be_group.py); the real thing is in test_e2e_be_group.py ------------


def test_be_group_rewrites_the_parent_of_besteffort_be_pods_and_their_containers(make_node):
    node = make_node(version="v1", be_idle_group=True)
    add_cgroup(node.root, "/kubepods/koordnode_be")  # the fake kernel's files for the group
    add_cgroup(node.root, "/kubepods/besteffort/podbe1")  # kubelet's pod cgroup
    cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="be1", uid="be1", namespace="default"),
                              linux=pb.LinuxPodSandboxConfig(cgroup_parent="/kubepods/besteffort/podbe1"))
    ctx = node.call("RunPodSandbox", pb.RunPodSandboxRequest(config=cfg))
    assert ctx.request.config.linux.cgroup_parent == "/kubepods/koordnode_be/podbe1"
    assert read_cgroup_file(node.root, "/kubepods/koordnode_be", "cpu.idle") == "1"
    assert read_cgroup_file(node.root, "/kubepods/besteffort", "cpu.idle") == "0"  # kubelet's tier
    sid = ctx.response.pod_sandbox_id
    assert node.state.pods[sid].qos_class == "BE"
    # kubelet sends CreateContainer with its own parent: it follows the sandbox.
    req = pb.CreateContainerRequest(pod_sandbox_id=sid, sandbox_config=cfg,
                                    config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app")))
    created = node.call("CreateContainer", req)
    assert created.request.sandbox_config.linux.cgroup_parent == "/kubepods/koordnode_be/podbe1"
    # A Burstable pod labelled BE and a Burstable LS pod stay where kubelet put them.
    for name, labels in (("bb", {QOS_LABEL: "BE"}), ("ls", {})):
        parent = f"/kubepods/burstable/pod{name}"
        add_cgroup(node.root, parent)
        other = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name=name, uid=name, namespace="default"),
                                    labels=labels, linux=pb.LinuxPodSandboxConfig(cgroup_parent=parent))
        assert node.call("RunPodSandbox", pb.RunPodSandboxRequest(config=other)).request.config.linux.cgroup_parent == parent


def test_a_be_pods_container_follows_the_group_when_the_qos_pre_hook_overruns(make_node):
    # The VM lane's failure: on a slow node the CreateContainer Pre hook overran its timeout,
    # the chain dropped its changes, and the container went to kubelet's besteffort tier while
    # its sandbox was in the group. Following the sandbox is an inline rewrite the chain keeps.
    node = make_node(version="v1", be_idle_group=True)
    add_cgroup(node.root, "/kubepods/koordnode_be")
    add_cgroup(node.root, "/kubepods/besteffort/podbe1")
    cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="be1", uid="be1", namespace="default"),
                              linux=pb.LinuxPodSandboxConfig(cgroup_parent="/kubepods/besteffort/podbe1"))
    sid = node.call("RunPodSandbox", pb.RunPodSandboxRequest(config=cfg)).response.pod_sandbox_id
    slow = threading.Event()
    classify = node.engine.classify

    def slow_classify(labels, cgroup_parent):
        slow.wait(5)
        return classify(labels, cgroup_parent)

    node.engine.classify = slow_classify
    chain = HookChain([QoSHook(node.engine)], timeout_s=0.05)
    for recorded in (True, False):  # the pod in koordnode's state, or found on disk (state rebuilt)
        if not recorded:
            node.state.remove_pod(sid)
            add_cgroup(node.root, "/kubepods/koordnode_be/podbe1")  # what the runtime made for the sandbox
        req = pb.CreateContainerRequest(pod_sandbox_id=sid, sandbox_config=cfg,
                                        config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app")))
        ctx = CallContext(method="CreateContainer", request=req)
        try:
            node.loop.run_until_complete(chain.run_pre(ctx))
        finally:
            slow.set()
        slow.clear()
        assert ctx.hook_failures == ["qos.pre: exceeded 50 ms"]
        assert ctx.request.sandbox_config.linux.cgroup_parent == "/kubepods/koordnode_be/podbe1"
    chain.close()


def test_be_group_is_off_for_the_systemd_driver_unless_asked(make_node):
    node = make_node(version="v2", be_idle_group=True)
    parent = "kubepods-besteffort-podbe2.slice"
    add_cgroup(node.root, slice_path(parent))
    cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="be2", uid="be2", namespace="default"),
                              linux=pb.LinuxPodSandboxConfig(cgroup_parent=parent))
    ctx = node.call("RunPodSandbox", pb.RunPodSandboxRequest(config=cfg))
    assert ctx.request.config.linux.cgroup_parent == parent


def test_be_group_in_a_dry_run_creates_nothing_and_writes_nothing(make_node):
    """Dry run ([daemon] dry_run): the request shows the move (the proxy logs it, never sends it),
    but the group is neither created nor made idle, and no pod cgroup is removed."""
    node = make_node(version="v1", be_idle_group=True)
    node.engine.executor.dry_run = True
    add_cgroup(node.root, "/kubepods/besteffort/podbe1")
    before = snapshot_tree(node.root)
    cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="be1", uid="be1", namespace="default"),
                              linux=pb.LinuxPodSandboxConfig(cgroup_parent="/kubepods/besteffort/podbe1"))
    ctx = node.call("RunPodSandbox", pb.RunPodSandboxRequest(config=cfg))
    assert ctx.request.config.linux.cgroup_parent == "/kubepods/koordnode_be/podbe1"
    assert not any("koordnode_be" in str(path) for path in node.root.rglob("*"))
    assert node.engine.executor.remove_cgroup("/kubepods/besteffort/podbe1") == []
    assert snapshot_tree(node.root) == before


def test_pod_level_resize_applies_the_class_values_to_the_pod_cgroup_at_once(make_node):
    # UpdatePodSandboxResources (CRI v1.33): kubelet resized the pod cgroup (2 CPUs = 2048
    # shares) before the call; the Post step writes the class's shares right away, not only at
    # the next reconcile pass (on main it raised a TypeError, leaving it to the reconcile).
    node = make_node(version="v1")
    pod = node.run_pod("r", parent="/kubepods/podr", labels={QOS_LABEL: "LSR"})
    write_cgroup_file(node.root, pod.cgroup, "cpu.shares", "2048")
    ctx = node.call("UpdatePodSandboxResources", pb.UpdatePodSandboxResourcesRequest(
        pod_sandbox_id=pod.sandbox_id,
        resources=pb.LinuxContainerResources(cpu_shares=2048, cpu_quota=200000, cpu_period=100000)))
    assert ctx.request.resources.cpu_shares == 2 * 65536  # the request carries the class value
    assert node.read(pod.cgroup, "cpu.shares") == str(2 * 65536)  # and the pod cgroup has it


def test_node_state_refuses_changes_from_a_worker_thread():
    # The thread rule made structural: only the thread that changes the state first (the event
    # loop's) may change it; workers read view() snapshots and hand results back.
    import threading

    from koordnode.model.state import PodRecord

    state = NodeState()
    state.put_pod(PodRecord(sandbox_id="a", uid="u", name="n", namespace="d", labels={}, annotations={},
                            cgroup_parent="/kubepods/poda"))
    errors: list[BaseException] = []

    def worker():
        try:
            state.set_pod_class("a", "LS", "worker")
        except RuntimeError as exc:
            errors.append(exc)
        state.view().pods["a"]  # reading stays fine from any thread

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert errors and "event loop" in str(errors[0])
    assert state.pods["a"].qos_class is None


# --- the periodic pass: plans reused while their inputs stay the same -----------------------------


@pytest.fixture
def counted(monkeypatch):
    """Counts of the engine's planning calls and of the executor's file reads (spies on the
    functions the engine and the executor call; nothing is timed)."""
    import koordnode.executor.cgroup_executor as cgroup_executor
    import koordnode.executor.converge as converge
    import koordnode.hooks.pod_plans as pod_plans
    import koordnode.hooks.qos_engine as qos_engine

    counts = {"plan_container": 0, "plan_pod_sandbox": 0, "reads": 0}

    def spy(module, name, key):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            counts[key] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    spy(qos_engine, "plan_container", "plan_container")  # CreateContainer's
    spy(pod_plans, "plan_container", "plan_container")  # running containers'
    spy(pod_plans, "plan_pod_sandbox", "plan_pod_sandbox")
    # The executor reads files while converging them and while looking them up.
    spy(converge, "read_file", "reads")
    spy(cgroup_executor, "read_file", "reads")
    spy(cgroup_executor, "read_file_if_same", "reads")

    def take() -> dict[str, int]:
        taken = dict(counts)
        for key in counts:
            counts[key] = 0
        return taken

    return take


def _pass_results(node: Node) -> list:
    """One reconcile pass, with the executor's results of it."""
    results: list = []
    apply = node.engine.executor.apply

    def recording(writes, **kwargs):
        out = apply(writes, **kwargs)
        results.extend(out)
        return out

    node.engine.executor.apply = recording
    try:
        node.engine.reconcile(force=False)
    finally:
        del node.engine.executor.apply
    return results


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_pass_with_nothing_changed_plans_nothing_and_reads_each_value_once(make_node, counted, version):
    node = make_node(version=version, toml='[node]\nblkio_devices = ["8:0"]\n')
    run_one_pod_per_class(node, "cgroupfs")
    node.engine.reconcile(force=False)
    node.engine.reconcile(force=False)
    counted()
    results = _pass_results(node)
    counts = counted()
    assert counts["plan_container"] == 0 and counts["plan_pod_sandbox"] == 0, counts
    assert results and all(r.status.value in ("unchanged", "skipped") for r in results), results
    # One read per value checked, and one of cgroup.procs per running container (its processes'
    # oom_score_adj, which this fake tree has none of); nothing is read for a resource this
    # kernel lacks; and no value is checked twice (the pools' cpusets are the plans' own).
    checked = sum(r.status.value == "unchanged" for r in results)
    containers = sum(1 for c in node.state.containers.values() if c.state == "running")
    assert counts["reads"] <= checked + containers, (counts, checked, containers)
    keys = [(r.write.cgroup, r.write.resource) for r in results]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    # The status still says when the values were last verified.
    before = {p["sandbox_id"]: p["verified_at"] for p in node.engine.decorate(node.state.snapshot())["pods"]}
    node.engine.reconcile(force=False)
    after = {p["sandbox_id"]: p["verified_at"] for p in node.engine.decorate(node.state.snapshot())["pods"]}
    assert all(after[sid] >= before[sid] for sid in before) and after != before


def test_an_overwrite_after_quiet_passes_is_restored_with_one_write(make_node, counted):
    node = make_node(version="v1")
    ls = node.run_pod("ls", parent="/kubepods/burstable/podls")
    ls_cid = node.run_container(ls, cpu_shares=512)
    be = node.run_pod("be", parent="/kubepods/besteffort/podbe")
    node.run_container(be, cpu_shares=2)
    for _ in range(3):
        node.engine.reconcile(force=False)
    shares = node.read(node.ccg(ls_cid), "cpu.shares")
    write_cgroup_file(node.root, node.ccg(ls_cid), "cpu.shares", "1000")  # another writer
    write_cgroup_file(node.root, be.cgroup, "cpu.idle", "1")  # koordnode's is 0 ([qos.BE] cpu_idle = 0)
    counted()
    results = _pass_results(node)
    assert counted()["plan_container"] == 0  # the plan is the same; the files are not
    written = [r for r in results if r.status.value == "written"]
    assert sorted(r.write.resource for r in written) == ["cpu.idle", "cpu.shares"]
    assert all(r.overwritten for r in written)
    assert node.read(node.ccg(ls_cid), "cpu.shares") == shares and node.read(be.cgroup, "cpu.idle") == "0"
    assert node.engine.executor.overwrites == {"cpu.idle": 1, "cpu.shares": 1}
    applied = node.status_pod(ls)["containers"][0]["applied"]
    assert any("restored after an overwrite" in line for line in applied), applied
    # The pass after: nothing to do again, and the status no longer says restored.
    assert all(r.status.value in ("unchanged", "skipped") for r in _pass_results(node))
    applied = node.status_pod(ls)["containers"][0]["applied"]
    assert not any("restored" in line for line in applied), applied


def test_a_state_change_or_a_reload_plans_again(make_node, counted):
    node = make_node(version="v1", topology=CpuTopology.describe(cores_per_numa=4, threads_per_core=1),
                     toml="pod_class_weight = true\n")
    ls = node.run_pod("ls", parent="/kubepods/burstable/podls")
    ls_cid = node.run_container(ls, cpu_shares=512)
    other = node.run_pod("other", parent="/kubepods/burstable/podother")
    other_cid = node.run_container(other, cpu_shares=256)
    node.engine.reconcile(force=False)
    counted()
    node.engine.reconcile(force=False)
    assert counted()["plan_container"] == 0

    # kubelet resizes one container: that pod alone is planned again, with the new value (by
    # the update's hooks: its request, then the pod after the runtime applied it); the pass
    # after reuses that plan.
    res = pb.LinuxContainerResources(cpu_period=100000, cpu_shares=768)
    node.call("UpdateContainerResources", pb.UpdateContainerResourcesRequest(container_id=ls_cid, linux=res))
    assert counted()["plan_container"] == 2
    node.engine.reconcile(force=False)
    assert counted()["plan_container"] == 0
    assert node.read(node.ccg(ls_cid), "cpu.shares") == "768"
    assert node.read("/kubepods/burstable/podls", "cpu.shares") == "768"  # the pod's weight follows

    # An LSE pod takes CPUs: the pools moved, the pods planned before are planned again (the
    # LSE pod's own plan, made when its container started, already saw the new pools).
    lse_pod = node.run_pod("lse", parent="/kubepods/podlse", labels={QOS_LABEL: "LSE"})
    node.run_container(lse_pod, **GUARANTEED_1CPU)
    counted()
    node.engine.reconcile(force=False)
    assert counted()["plan_container"] == 2
    assert cpus_of(node.root, node.ccg(other_cid)) == node.topology.online - cpus_of(
        node.root, node.ccg(node.state.containers_of(lse_pod.sandbox_id)[0].container_id))

    # A reload with another value for LS: planned again, and the new value is written.
    node.engine.reconcile(force=False)
    counted()
    reloaded = parse_config(f'[cgroup]\nroot = "{node.root}"\nbe_idle_group = false\n'
                            '[qos.LS]\ncpu_shares_per_cpu = 2048\n')
    node.engine.reconfigure(EngineSettings.of(reloaded))
    node.engine.reconcile(force=False)
    assert counted()["plan_container"] == 3
    assert node.read(node.ccg(other_cid), "cpu.shares") == "512"  # 2048 per CPU x 0.25 CPU


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_memory_plan_reuses_the_passes_plans_and_gives_the_same_writes(make_node, counted, version):
    """The QoS manager's memory_qos strategy asks for every pod's memory values every 10 s."""
    node = make_node(version=version)
    run_one_pod_per_class(node, "cgroupfs")
    node.engine.reconcile(force=False)
    counted()
    reused = node.engine.memory_plan()
    assert counted()["plan_container"] == 0
    node.engine.reconfigure(node.engine.settings)  # the same settings: nothing planned is kept
    fresh = node.engine.memory_plan()
    assert counted()["plan_container"] > 0
    assert reused and sorted(map(repr, reused)) == sorted(map(repr, fresh))
    # A state change of one pod: that pod's values are planned again, from the new state.
    ls_cid = next(c.container_id for c in node.state.containers.values() if c.name == "app"
                  and node.state.pods[c.sandbox_id].name == "ls")
    node.engine.reconcile(force=False)
    counted()
    res = pb.LinuxContainerResources(cpu_period=100000, cpu_shares=512, memory_limit_in_bytes=1024 * MIB,
                                     unified={"memory.min": str(256 * MIB)})
    node.call("UpdateContainerResources", pb.UpdateContainerResourcesRequest(container_id=ls_cid, linux=res))
    after = node.engine.memory_plan()
    # The request's plan, then the LS pod's two containers after the update (reused here).
    assert counted()["plan_container"] == 3
    assert after != reused


def test_the_be_groups_idleness_is_checked_once_per_pass(make_node):
    node = make_node(version="v1", be_idle_group=True)
    add_cgroup(node.root, "/kubepods/koordnode_be")
    for i in range(3):
        add_cgroup(node.root, f"/kubepods/besteffort/podbe{i}")
        cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name=f"be{i}", uid=f"be{i}", namespace="d"),
                                  linux=pb.LinuxPodSandboxConfig(cgroup_parent=f"/kubepods/besteffort/podbe{i}"))
        node.call("RunPodSandbox", pb.RunPodSandboxRequest(config=cfg))
    node.engine.reconcile(force=False)
    group = [r for r in _pass_results(node) if r.write.cgroup == "/kubepods/koordnode_be"]
    assert group == []  # idle already: nothing to write
    write_cgroup_file(node.root, "/kubepods/koordnode_be", "cpu.idle", "0")  # another writer
    write_cgroup_file(node.root, "/kubepods/koordnode_be", "cpu.shares", "1024")
    group = [r for r in _pass_results(node) if r.write.cgroup == "/kubepods/koordnode_be"]
    assert [(r.write.resource, r.status.value) for r in group] == [("cpu.idle", "written")]  # once for 3 pods
    assert read_cgroup_file(node.root, "/kubepods/koordnode_be", "cpu.idle") == "1"


def test_a_be_group_at_the_lowest_weight_is_left_as_the_qos_manager_keeps_it(make_node):
    """While LS is quiet cpu_suppress keeps the group not idle at cpu.shares 2: neither a new BE
    pod nor the reconcile pass makes it idle again (that would undo the quiet state)."""
    node = make_node(version="v1", be_idle_group=True)
    group = "/kubepods/koordnode_be"
    add_cgroup(node.root, group)
    write_cgroup_file(node.root, group, "cpu.idle", "0")
    write_cgroup_file(node.root, group, "cpu.shares", "2")
    add_cgroup(node.root, "/kubepods/besteffort/podbe1")
    cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="be1", uid="be1", namespace="d"),
                              linux=pb.LinuxPodSandboxConfig(cgroup_parent="/kubepods/besteffort/podbe1"))
    ctx = node.call("RunPodSandbox", pb.RunPodSandboxRequest(config=cfg))
    assert ctx.request.config.linux.cgroup_parent == f"{group}/podbe1"  # it gives way: pods go in
    node.engine.reconcile(force=False)
    assert (read_cgroup_file(node.root, group, "cpu.idle"), read_cgroup_file(node.root, group, "cpu.shares")) == ("0", "2")
    # At the kernel's default weight it no longer gives way: made idle at the next pass.
    write_cgroup_file(node.root, group, "cpu.shares", "1024")
    node.engine.reconcile(force=False)
    assert read_cgroup_file(node.root, group, "cpu.idle") == "1"


# --- kubelet's static CPU manager owns the cpusets --------------------------------------------
# kubelet 1.37 cm/internal_container_lifecycle_linux.go puts the CPU manager's cpuset into every
# CreateContainer (GetCPUAffinity: the container's exclusive CPUs, else the shared default set;
# empty under the "none" policy), and its reconcile (cpumanager updateContainerCPUSet) sends
# UpdateContainerResources with LinuxContainerResources{CpusetCpus} and nothing else.


def cpu_manager_update(cid: str, cpus: str) -> pb.UpdateContainerResourcesRequest:
    return pb.UpdateContainerResourcesRequest(container_id=cid, linux=pb.LinuxContainerResources(cpuset_cpus=cpus))


def test_kubelets_static_cpu_manager_owns_the_cpusets(make_node):
    node = make_node(version="v1", topology=TWO, toml='[node]\nreserved_cpus = "1"\n')
    be = node.run_pod("be", parent="/kubepods/besteffort/podbe")
    be_cid, be_ctx = node.create(be, "app", cpu_shares=2, cpuset_cpus="0-1")
    node.start(be_cid)
    # kubelet's cpuset goes on, the class's other values with it; nothing allocated.
    assert be_ctx.request.config.linux.resources.cpuset_cpus == "0-1"
    assert be_ctx.request.config.linux.resources.oom_score_adj == 1000
    cpus = node.engine.status()["cpus"]
    assert cpus["owner"] == "kubelet (static CPU manager)"
    assert "CreateContainer of default/be/app" in cpus["evidence"]
    assert any("reserved_cpus not applied" in n for n in cpus["notes"]), cpus["notes"]

    # An LSE pod: kubelet gives it CPU 1 exclusively, koordnode keeps that (its own allocator
    # would have taken CPU 0, the only one outside its reserved CPU 1).
    lse = node.run_pod("lse", parent="/kubepods/podlse", labels={QOS_LABEL: "LSE"})
    # kubelet lifts the CFS quota of a container with exclusive CPUs (DisableCPUQuotaWithExclusiveCPUs)
    lse_cid, lse_ctx = node.create(lse, "app", **{**GUARANTEED_1CPU, "cpu_quota": -1}, cpuset_cpus="1")
    node.start(lse_cid)
    forwarded = lse_ctx.request.config.linux.resources
    assert forwarded.cpuset_cpus == "1" and forwarded.oom_score_adj == -900
    assert node.read(node.ccg(lse_cid), "cpu.shares") == "262144"
    assert "koordnode.io/cpu-allocation" not in lse_ctx.request.config.annotations
    assert node.engine.pools.allocator.allocations() == {}
    # kubelet's reconcile moves BE off CPU 1: only the cpuset changes, the class values stay
    # (planned from kubelet's CreateContainer values, not from the zeros of the partial update).
    ctx = node.call("UpdateContainerResources", cpu_manager_update(be_cid, "0"))
    assert ctx.request.linux.cpuset_cpus == "0" and ctx.request.linux.oom_score_adj == 1000
    ctx = node.call("UpdateContainerResources", cpu_manager_update(lse_cid, "1"))
    assert ctx.request.linux.cpuset_cpus == "1" and ctx.request.linux.oom_score_adj == -900
    assert ctx.request.linux.cpu_shares == 0  # kubelet sent none; the class weight goes to the cgroup file
    assert node.read(node.ccg(lse_cid), "cpu.shares") == "262144"
    assert node.read(node.ccg(be_cid), "cpu.shares") == "2"
    # The passes write no cpuset: the files keep what the runtime made of kubelet's requests.
    write_cgroup_file(node.root, node.ccg(be_cid), "cpuset.cpus", "0")
    write_cgroup_file(node.root, node.ccg(lse_cid), "cpuset.cpus", "1")
    for _ in range(2):
        node.engine.reconcile(force=True)
    assert node.read(node.ccg(be_cid), "cpuset.cpus") == "0"
    assert node.read(node.ccg(lse_cid), "cpuset.cpus") == "1"
    assert node.read(node.ccg(lse_cid), "cpu.shares") == "262144"
    assert node.read(node.ccg(be_cid), "cpu.shares") == "2"
    cpus = node.engine.status()["cpus"]
    assert cpus["kubelet"] == {"lse_lsr_containers": {"default/lse/app": {"class": "LSE", "cpus": [1], "exclusive": True}},
                               "others_run_on": [0]}
    notes = node.status_pod(lse)["containers"][0]["notes"]
    assert "cpuset 1: kubelet's exclusive CPUs (static CPU manager); koordnode allocates none" in notes
    applied = node.status_pod(lse)["containers"][0]["applied"]
    assert not any(line.startswith("cpuset.") for line in applied), applied

    # A restart: kubelet still owns them (the containers' records say kubelet gave cpusets).
    again = node.restarted()
    assert again.engine.status()["cpus"]["owner"] == "kubelet (static CPU manager)"
    again.engine.reconcile(force=True)
    assert node.read(node.ccg(lse_cid), "cpuset.cpus") == "1"
    assert node.read(node.ccg(be_cid), "cpuset.cpus") == "0"
    assert node.read(node.ccg(lse_cid), "cpu.shares") == "262144"


def test_without_kubelets_cpuset_koordnode_allocates_and_a_foreign_client_does_not_take_the_cpus_back(make_node):
    node = make_node(version="v1", topology=TWO)
    lse = node.run_pod("lse", parent="/kubepods/podlse", labels={QOS_LABEL: "LSE"})
    cid, ctx = node.create(lse, "app", **GUARANTEED_1CPU)  # kubelet's "none" policy: no cpuset
    assert ctx.request.config.linux.resources.cpuset_cpus  # koordnode's allocator decides
    assert node.engine.status()["cpus"]["owner"] == "koordnode"
    assert len(node.allocations()) == 1

    # kubelet's static policy shows up (its CPU manager's first container): koordnode's
    # allocations go, kubelet's cpusets stay from now on.
    ls = node.run_pod("ls", parent="/kubepods/burstable/podls")
    ls_cid, ls_ctx = node.create(ls, "app", cpu_shares=512, cpuset_cpus="0-1")
    assert ls_ctx.request.config.linux.resources.cpuset_cpus == "0-1"
    assert node.engine.pools.allocator.allocations() == {}
    # A container created by another client (crictl) carries no cpuset: kubelet keeps them.
    other = node.run_pod("other", parent="/kubepods/burstable/podother")
    _, other_ctx = node.create(other, "app", cpu_shares=512)
    assert other_ctx.request.config.linux.resources.cpuset_cpus == ""
    cpus = node.engine.status()["cpus"]
    assert cpus["owner"] == "kubelet (static CPU manager)"
    assert any("default/other/app was created without a cpuset from kubelet" in n for n in cpus["notes"])


def test_an_lse_pod_kubelet_shares_cpus_with_is_said_not_exclusive(make_node):
    node = make_node(version="v1", topology=TWO)
    lse = node.run_pod("lse", parent="/kubepods/burstable/podlse", labels={QOS_LABEL: "LSE"})
    cid = node.run_container(lse, cpu_shares=512, cpu_quota=50000, cpuset_cpus="0-1")
    be = node.run_pod("be", parent="/kubepods/besteffort/podbe")
    node.run_container(be, cpu_shares=2, cpuset_cpus="0-1")
    notes = node.status_pod(lse)["containers"][0]["notes"]
    assert any(n.startswith("cpuset 0-1: kubelet's shared pool, not exclusive") for n in notes), notes
    view = node.engine.status()["cpus"]["kubelet"]["lse_lsr_containers"]
    assert view == {"default/lse/app": {"class": "LSE", "cpus": [0, 1], "exclusive": False}}
    assert node.engine.pools.allocator.allocations() == {} and cid


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_resize_whose_pre_hook_overran_is_learnt_and_not_undone(make_node, monkeypatch, version):
    """kubelet resizes an LS container and the QoS hook's Pre overruns its bound (under TCG in the
    VM lane its thread waited seconds for the engine): the runtime gets kubelet's request as it
    was and writes the new weight. koordnode learns kubelet's new values after the call, so its
    passes keep them instead of putting the old ones back for good."""
    node = make_node(version=version)
    ls = node.run_pod("ls", parent="/kubepods/burstable/podls")
    ls_cid = node.run_container(ls, cpu_shares=102)
    node.engine.reconcile(force=False)
    file = "cpu.weight" if version == "v2" else "cpu.shares"
    before = node.read(node.ccg(ls_cid), file)

    def overran(_req):
        raise TimeoutError("the hook's thread waited past the bound")

    monkeypatch.setattr(node.engine, "update_resources_pre", overran)
    res = pb.LinuxContainerResources(cpu_period=100000, cpu_quota=40000, cpu_shares=204)
    ctx = node.call("UpdateContainerResources", pb.UpdateContainerResourcesRequest(container_id=ls_cid, linux=res),
                    hooks_may_fail=True)
    assert ctx.facts.pre_dropped == ["qos"] and ctx.request.linux.cpu_shares == 204
    resized = node.read(node.ccg(ls_cid), file)
    assert resized != before  # the runtime wrote kubelet's new weight
    for _ in range(2):
        node.engine.reconcile(force=False)
        assert node.read(node.ccg(ls_cid), file) == resized
    assert node.engine.planner.kubelet_resources_of(node.state.view(), ls_cid).cpu_shares == 204


def test_a_pod_level_resize_whose_pre_hook_overran_is_learnt(make_node, monkeypatch):
    """The same for UpdatePodSandboxResources: kubelet's new pod values are what later plans use."""
    node = make_node(version="v1")
    pod = node.run_pod("r", parent="/kubepods/podr", labels={QOS_LABEL: "LSR"})

    def overran(_req):
        raise TimeoutError("the hook's thread waited past the bound")

    monkeypatch.setattr(node.engine, "pod_resources_pre", overran)
    resources = pb.LinuxContainerResources(cpu_shares=2048, cpu_quota=200000, cpu_period=100000)
    ctx = node.call("UpdatePodSandboxResources", pb.UpdatePodSandboxResourcesRequest(
        pod_sandbox_id=pod.sandbox_id, resources=resources), hooks_may_fail=True)
    assert ctx.facts.pre_dropped == ["qos"] and ctx.request.resources.cpu_shares == 2048
    assert node.engine.planner.pod_resources[pod.sandbox_id].cpu_shares == 2048
    node.engine.reconcile(force=False)
    assert node.read(pod.cgroup, "cpu.shares") == str(2 * 65536)  # the class value of 2 CPUs
