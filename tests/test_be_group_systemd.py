"""The idle BE group under the systemd driver, host side (hooks/be_group.py, the engine's use of it).

systemd itself is in the VM lane (tests/vm_guest/test_be_group_systemd_v2.py: systemd 257,
containerd, runc). Here the two systemd calls are replaced by fakes shaped like systemd's
effect on the cgroup tree: `start_idle` creates the group slice's cgroup with cpu.idle = 1
(systemd >= 252 for CPUWeight=idle), `stop` removes a pod slice's cgroup. What is checked is
koordnode's side: the CRI path never waits for systemd beyond its bound, pods only go into a
group that reads idle, empty pod slices are stopped and busy ones are not.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import pytest

from faketree import add_cgroup, make_cgroup_tree, read_cgroup_file, write_cgroup_file
from koordnode.cri import api_pb2 as pb
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.model.kubelet_layout import paths_of
from koordnode.model.cpu_topology import CpuTopology
from koordnode.hooks.be_group import RECHECK_AFTER_S, RETRY_AFTER_S, SystemdBeGroup
from koordnode.periodic import prepare_be_group_once_kubelet_is_up
from test_qos_engine import Node, slice_path

GROUP_SLICE = "kubepods-koordnode_be.slice"
GROUP = "/kubepods.slice/kubepods-koordnode_be.slice"


class FakeSystemd:
    """systemctl's effect on a fake cgroup tree; `idle_value` "0" is systemd < 252."""

    def __init__(self, root: Path, *, delay_s: float = 0.0, idle_value: str = "1", fail: str | None = None,
                 then=None):
        self.root, self.delay_s, self.idle_value, self.fail = root, delay_s, idle_value, fail
        self.then = then  # called after a start: another writer acting right after koordnode
        self.started: list[str] = []
        self.stopped: list[str] = []
        self.weights: dict[str, str] = {}  # CPUWeight per slice as systemd has it
        self.memory_nodes: list[tuple[str, str]] = []  # AllowedMemoryNodes calls
        self.memory_nodes_fail: str | None = None

    def start_idle(self, slice_name: str) -> str | None:
        time.sleep(self.delay_s)
        self.started.append(slice_name)
        if self.fail:
            return self.fail
        cgroup = slice_path(slice_name)
        add_cgroup(self.root, cgroup)
        write_cgroup_file(self.root, cgroup, "cpu.idle", self.idle_value)
        self.weights[slice_name] = "idle"
        if self.then is not None:
            then, self.then = self.then, None
            then(self, slice_name)
        return None

    def set_weight(self, slice_name: str, weight: int) -> None:
        """`systemctl set-property SLICE CPUWeight=<weight>`: systemd writes cpu.idle = 0."""
        self.weights[slice_name] = str(weight)
        write_cgroup_file(self.root, slice_path(slice_name), "cpu.idle", "0")

    def cpu_weight(self, slice_name: str) -> str | None:
        return self.weights.get(slice_name, "100")

    def stop(self, slice_name: str) -> str | None:
        self.stopped.append(slice_name)
        return None

    def allow_memory_nodes(self, slice_name: str, nodes: str) -> str | None:
        """systemd writes the slice's cpuset.mems (its cpuset controller stays enabled)."""
        self.memory_nodes.append((slice_name, nodes))
        if self.memory_nodes_fail:
            return self.memory_nodes_fail
        write_cgroup_file(self.root, slice_path(slice_name), "cpuset.mems", nodes)
        return None


def group_of(root: Path, systemd: FakeSystemd, gives_way=None, **kwargs) -> SystemdBeGroup:
    def read_idle(cgroup: str) -> str | None:
        try:
            return read_cgroup_file(root, cgroup, "cpu.idle").strip()
        except FileNotFoundError:
            return None
    return SystemdBeGroup(gives_way or (lambda cgroup: read_idle(cgroup) == "1"), start_idle=systemd.start_idle, stop=systemd.stop,
                          cpu_weight=systemd.cpu_weight, allow_memory_nodes=systemd.allow_memory_nodes, **kwargs)


@pytest.fixture
def systemd_node(tmp_path):
    nodes: list[Node] = []

    def make(systemd_kwargs: dict | None = None, *, version: str = "v2", clock=time.monotonic,
             topology: CpuTopology | None = None) -> tuple[Node, FakeSystemd]:
        node = Node(tmp_path / f"node{len(nodes)}", version=version, be_idle_group=True,
                    toml='driver = "systemd"\n', topology=topology)
        systemd = FakeSystemd(node.root, **(systemd_kwargs or {}))
        node.engine.be_group.slices = group_of(node.root, systemd, node.engine.be_group.gives_way, clock=clock)
        nodes.append(node)
        return node, systemd

    yield make
    for node in nodes:
        node.engine.be_group.slices.close()
        node.close()


def wait_until(check, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def parent_of(node: Node, pod) -> str:
    """The cgroup parent containerd got (the state records the forwarded request)."""
    return node.state.pods[pod.sandbox_id].cgroup_parent


def be_parent(uid: str) -> str:
    return f"kubepods-besteffort-pod{uid}.slice"


def test_group_slice_of_kubelets_top_slice():
    assert paths_of("systemd", "/kubepods.slice").systemd_be_group == (GROUP_SLICE, GROUP)
    assert paths_of("auto", "/custom.slice/custom-kubepods.slice").systemd_be_group == (
        "custom-kubepods-koordnode_be.slice", "/custom.slice/custom-kubepods.slice/custom-kubepods-koordnode_be.slice")
    assert paths_of("systemd", "/kubepods").systemd_be_group is None
    assert paths_of("auto", "").systemd_be_group is None
    assert paths_of("cgroupfs", "/kubepods.slice").systemd_be_group is None  # the pods are not in slices


def test_prepared_at_start_then_be_pods_move_into_the_idle_slice(systemd_node):
    node, systemd = systemd_node()
    shutil.rmtree(node.root / "kubepods.slice", ignore_errors=True)
    node.engine.adopt()  # the daemon's start, once the state is rebuilt
    time.sleep(0.2)
    assert systemd.started == []  # kubelet has not made kubepods.slice yet: nothing is started
    add_cgroup(node.root, "/kubepods.slice")
    node.engine.reconcile()  # the next pass finds it
    wait_until(lambda: systemd.started == [GROUP_SLICE] and not node.engine.be_group.slices._pending)
    pod = node.run_pod("batch", parent=be_parent("u1"))
    assert parent_of(node, pod) == "kubepods-koordnode_be-podu1.slice"
    # Ready and made idle by this process: the CRI path asks systemd nothing more.
    node.run_pod("batch2", parent=be_parent("u2"))
    assert systemd.started == [GROUP_SLICE]
    # systemd rewrites a pod slice's cpu.idle at each realization: only the group's is koordnode's.
    add_cgroup(node.root, slice_path(parent_of(node, pod)))
    node.engine.reconcile()
    assert read_cgroup_file(node.root, slice_path(parent_of(node, pod)), "cpu.idle").strip() == "0"
    assert read_cgroup_file(node.root, GROUP, "cpu.idle").strip() == "1"
    # Burstable pods stay in kubelet's slices.
    ls = node.run_pod("web", parent="kubepods-burstable-podu3.slice")
    assert parent_of(node, ls) == "kubepods-burstable-podu3.slice"


def test_prepared_as_soon_as_kubelet_makes_its_top_slice_without_waiting_for_a_pass(systemd_node):
    """koordnode starts before kubelet, whose first pods follow its start at once: the daemon
    looks for kubepods.slice once a second (periodic.prepare_be_group_once_kubelet_is_up) and
    hands the group slice to systemd then, not at the next reconcile pass (seconds later, after
    the first BE pod's RunPodSandbox had to wait for systemd past its bound: VM lane, TCG)."""
    node, systemd = systemd_node({"delay_s": 0.3})
    shutil.rmtree(node.root / "kubepods.slice", ignore_errors=True)
    engine = node.engine
    assert engine.prepare_be_group_once_kubelet_is_up() is False  # kubelet not up: asked again later
    assert systemd.started == []

    async def kubelet_starts_then_first_be_pod() -> float:
        watch = asyncio.ensure_future(prepare_be_group_once_kubelet_is_up(engine, every_s=0.05))
        await asyncio.sleep(0.2)
        assert not watch.done()
        add_cgroup(node.root, "/kubepods.slice")
        began = time.monotonic()
        await asyncio.wait_for(watch, 2.0)  # done once kubelet's slice is seen: no polling after
        return began

    began = asyncio.run(kubelet_starts_then_first_be_pod())
    wait_until(lambda: systemd.started == [GROUP_SLICE] and not engine.be_group.slices._pending)
    assert time.monotonic() - began < 2.0
    # The first BE pod finds the group idle: moved, and systemd is not asked again.
    pod = node.run_pod("batch", parent=be_parent("u1"))
    assert parent_of(node, pod) == "kubepods-koordnode_be-podu1.slice"
    assert engine.prepare_be_group_once_kubelet_is_up() is True
    assert systemd.started == [GROUP_SLICE]


def test_nothing_to_wait_for_without_a_systemd_group(tmp_path):
    """cgroupfs driver (the group is a directory the hook makes), the option off, dry run: the
    watch ends at once and starts nothing."""
    for toml, dry_run in (('driver = "cgroupfs"\n', False), ('driver = "systemd"\nbe_idle_group_systemd = false\n', False),
                          ('driver = "systemd"\n', True)):
        node = Node(tmp_path / f"n{len(list(tmp_path.iterdir()))}", version="v2", be_idle_group=True, toml=toml)
        node.engine.be_group.executor = CgroupExecutor(node.root, dry_run=dry_run)
        systemd = FakeSystemd(node.root)
        node.engine.be_group.slices = group_of(node.root, systemd, node.engine.be_group.gives_way)
        try:
            assert node.engine.prepare_be_group_once_kubelet_is_up() is True, toml
            time.sleep(0.05)
            assert systemd.started == [], toml
        finally:
            node.engine.be_group.slices.close()
            node.close()


def test_a_slow_systemd_never_holds_the_call_beyond_its_bound(systemd_node):
    node, systemd = systemd_node({"delay_s": 1.0})
    started = time.monotonic()
    pod = node.run_pod("batch", parent=be_parent("u1"))
    took = time.monotonic() - started
    # hook_timeout_ms 200: at most half of it waiting for systemd; the pod stays where kubelet put it.
    assert took < 0.9, took
    assert parent_of(node, pod) == be_parent("u1")
    assert any("being made idle" in note for note in node.engine.notes), node.engine.notes
    deadline = time.monotonic() + 5
    while systemd.started != [GROUP_SLICE] and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)
    later = node.run_pod("batch2", parent=be_parent("u2"))
    assert parent_of(node, later) == "kubepods-koordnode_be-podu2.slice"


def test_a_slice_systemd_does_not_make_idle_keeps_be_pods_in_kubelets_tier(systemd_node):
    node, systemd = systemd_node({"idle_value": "0"})  # systemd < 252: CPUWeight=idle not mapped
    node.engine.be_group.slices.prepare(GROUP_SLICE, GROUP).result(5)
    pod = node.run_pod("batch", parent=be_parent("u1"))
    assert parent_of(node, pod) == be_parent("u1")
    assert any("252" in note for note in node.engine.notes), node.engine.notes
    node.engine.reconcile()  # publishes the status
    assert any("not idle" in note and "252" in note for note in node.engine.status()["notes"])
    # No systemctl per pod after a failure: the next attempt waits RETRY_AFTER_S.
    node.run_pod("batch2", parent=be_parent("u2"))
    assert systemd.started == [GROUP_SLICE]


def test_retry_after_a_failure(tmp_path):
    (tmp_path / "cgroup.controllers").parent.mkdir(exist_ok=True)
    now = [1000.0]
    systemd = FakeSystemd(tmp_path, fail="systemd is not running (no /run/systemd/system)")
    group = SystemdBeGroup(lambda cgroup: False, start_idle=systemd.start_idle, stop=systemd.stop,
                           clock=lambda: now[0])
    try:
        assert "not running" in group.ready(GROUP_SLICE, GROUP, 1.0)
        assert "not running" in group.ready(GROUP_SLICE, GROUP, 1.0)
        group.check(GROUP_SLICE, GROUP)
        assert len(systemd.started) == 1
        now[0] += RETRY_AFTER_S + 1
        group.ready(GROUP_SLICE, GROUP, 1.0)
        assert len(systemd.started) == 2
    finally:
        group.close()


def test_an_operators_cpu_weight_right_after_koordnodes_call_is_not_taken_for_an_old_systemd(tmp_path):
    """`systemctl set-property kubepods-koordnode_be.slice CPUWeight=100` landing between
    koordnode's CPUWeight=idle and its look at cpu.idle (seen in the VM lane): not systemd < 252,
    so no back-off; the next reconcile check makes the group idle through systemd again (a
    back-off would leave systemd's CPUWeight at 100 while the pass's own cpu.idle write hides it)."""
    now = [1000.0]
    root = make_cgroup_tree(tmp_path / "cg", version="v2")
    systemd = FakeSystemd(root, then=lambda fake, name: fake.set_weight(name, 100))
    group = group_of(root, systemd, clock=lambda: now[0])
    try:
        problem = group.prepare(GROUP_SLICE, GROUP).result(5)
        assert problem is not None and "another writer" in problem and "252" not in problem, problem
        group.check(GROUP_SLICE, GROUP)  # the next pass, within RETRY_AFTER_S
        wait_until(lambda: len(systemd.started) == 2 and GROUP_SLICE not in group.problems)
        assert systemd.cpu_weight(GROUP_SLICE) == "idle"
        assert read_cgroup_file(root, GROUP, "cpu.idle").strip() == "1"
    finally:
        group.close()


def test_removed_pods_slices_are_stopped_once_empty(systemd_node):
    node, systemd = systemd_node()
    node.engine.be_group.slices.prepare(GROUP_SLICE, GROUP).result(5)
    pod = node.run_pod("batch", parent=be_parent("u1"))
    moved = parent_of(node, pod)
    add_cgroup(node.root, slice_path(moved) + "/cri-containerd-abc.scope")  # systemd + runc's doing
    # A scope still inside (the sandbox not gone yet): the slice is not stopped.
    node.engine.remove_be_pod_cgroup(moved)
    time.sleep(0.2)
    assert systemd.stopped == []
    shutil.rmtree(node.root / (slice_path(moved) + "/cri-containerd-abc.scope").lstrip("/"))  # the scope stopped
    node.remove_pod(pod)
    deadline = time.monotonic() + 5
    while not systemd.stopped and time.monotonic() < deadline:
        time.sleep(0.02)
    assert systemd.stopped == [moved]


def test_reconcile_stops_leftover_pod_slices_and_reasserts_the_group(systemd_node):
    node, systemd = systemd_node()
    node.engine.be_group.slices.prepare(GROUP_SLICE, GROUP).result(5)
    live = node.run_pod("batch", parent=be_parent("live"))
    add_cgroup(node.root, slice_path(parent_of(node, live)))
    # Left by pods removed while koordnode was down: one empty, one with a scope still inside.
    empty, busy = "kubepods-koordnode_be-podgone1.slice", "kubepods-koordnode_be-podgone2.slice"
    add_cgroup(node.root, slice_path(empty))
    add_cgroup(node.root, slice_path(busy) + "/cri-containerd-x.scope")
    old = time.time() - 3600
    for name in (empty, busy, parent_of(node, live)):
        os.utime(node.root / slice_path(name).lstrip("/"), (old, old))
    # systemd lost the group's property (e.g. the drop-in removed, then daemon-reload).
    write_cgroup_file(node.root, GROUP, "cpu.idle", "0")
    node.engine.reconcile()
    deadline = time.monotonic() + 5
    while (len(systemd.started) < 2 or not systemd.stopped) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)
    assert systemd.stopped == [empty]
    assert systemd.started == [GROUP_SLICE, GROUP_SLICE]
    assert read_cgroup_file(node.root, GROUP, "cpu.idle").strip() == "1"



def test_a_group_slice_at_the_lowest_weight_is_not_made_idle_again(systemd_node):
    """While LS is quiet the QoS manager's cpu_suppress writes the group's cpu.idle 0 and
    cpu.weight 1 directly: that gives way too, so neither the reconcile pass nor a new BE pod
    asks systemd to make it idle again (which would undo the quiet state)."""
    node, systemd = systemd_node()
    node.engine.be_group.slices.prepare(GROUP_SLICE, GROUP).result(5)
    write_cgroup_file(node.root, GROUP, "cpu.idle", "0")
    write_cgroup_file(node.root, GROUP, "cpu.weight", "1")
    node.engine.reconcile()
    pod = node.run_pod("batch", parent=be_parent("q1"))
    assert parent_of(node, pod) == "kubepods-koordnode_be-podq1.slice"
    time.sleep(0.2)
    assert systemd.started == [GROUP_SLICE]
    assert (read_cgroup_file(node.root, GROUP, "cpu.idle").strip(),
            read_cgroup_file(node.root, GROUP, "cpu.weight").strip()) == ("0", "1")
    # At systemd's default weight it gives way no more: the next pass makes it idle again.
    write_cgroup_file(node.root, GROUP, "cpu.weight", "100")
    node.engine.reconcile()
    wait_until(lambda: systemd.started == [GROUP_SLICE, GROUP_SLICE])


def test_kubelets_expanded_slice_parent_moves_into_the_group_the_same_way(systemd_node):
    """The real kubelet's systemd driver sends the pod slice expanded into its path (its
    CgroupName.ToSystemd), not the bare slice name the hand-made bed sends: found by
    tests/vm_guest/test_real_kubelet_v2.py, where the BE pod stayed in kubelet's slice."""
    node, systemd = systemd_node()
    add_cgroup(node.root, "/kubepods.slice")
    node.engine.adopt()
    wait_until(lambda: systemd.started == [GROUP_SLICE] and not node.engine.be_group.slices._pending)
    kubelet = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu1.slice"
    pod = node.run_pod("batch", parent=kubelet)
    moved = "/kubepods.slice/kubepods-koordnode_be.slice/kubepods-koordnode_be-podu1.slice"
    assert parent_of(node, pod) == moved
    assert systemd.started == [GROUP_SLICE]
    # Guaranteed and Burstable pods (expanded too) stay where kubelet put them.
    ls = node.run_pod("web", parent="/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu3.slice")
    assert parent_of(node, ls) == "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu3.slice"


def test_a_stopped_sandbox_leaves_the_pod_slice_to_the_pods_next_sandbox(systemd_node):
    """kubelet stops a pod's sandbox and starts its next one in the same slice (the pod's uid
    names it): only RemovePodSandbox stops the slice, and a stop whose slice is in use again by
    the time the worker runs is dropped. Found by the real kubelet in the VM lane (a BE pod
    recreated again and again: each stop killed the next sandbox)."""
    node, systemd = systemd_node()
    node.engine.be_group.slices.prepare(GROUP_SLICE, GROUP).result(5)
    old = node.run_pod("batch", parent=be_parent("u1"))
    moved = parent_of(node, old)
    add_cgroup(node.root, slice_path(moved))  # systemd's, empty once the sandbox stopped
    node.call("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=old.sandbox_id))
    time.sleep(0.2)
    assert systemd.stopped == []  # stopped only: kubelet may start the next sandbox right away
    new = node.run_pod("batch", parent=be_parent("u1"))
    assert parent_of(node, new) == moved
    node.remove_pod(old)  # kubelet's GC removes the old sandbox: the slice holds the new one
    time.sleep(0.3)
    assert systemd.stopped == []


# kubelet's own pod slice of a moved pod (found by the real kubelet in the VM lane: it killed the
# BE pod each time systemd dropped cpuset from its empty slice, tests/vm_guest/test_real_kubelet_v2.py)

KUBELET_SLICE = "kubepods-besteffort-podu1.slice"
KUBELET_PARENT = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu1.slice"


def run_be_pod(node: Node):
    """kubelet makes its pod slice (expanded into its path, as the real kubelet sends it), then RunPodSandbox."""
    return node.run_pod("batch", parent=KUBELET_PARENT, pod_cgroup=KUBELET_PARENT)


def test_kubelets_empty_pod_slice_of_a_moved_pod_is_given_a_property_that_needs_cpuset(systemd_node):
    node, systemd = systemd_node(topology=CpuTopology.describe(numa_per_socket=2, cores_per_numa=2))
    node.engine.be_group.slices.prepare(GROUP_SLICE, GROUP).result(5)
    pod = run_be_pod(node)
    assert parent_of(node, pod) == "/kubepods.slice/kubepods-koordnode_be.slice/kubepods-koordnode_be-podu1.slice"
    wait_until(lambda: systemd.memory_nodes)
    # Every memory node of the machine (the fake topology has two NUMA nodes): a no-op on an
    # empty slice, but systemd then keeps cpuset enabled for it.
    assert systemd.memory_nodes == [(KUBELET_SLICE, "0-1")]
    assert read_cgroup_file(node.root, KUBELET_PARENT, "cpuset.mems") == "0-1"
    # Pods that stay in kubelet's slices have containers there: nothing to keep.
    node.run_pod("web", parent="/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu2.slice")
    node.run_pod("other", parent="kubepods-besteffort-podu3.slice", labels={"koordinator.sh/qosClass": "LS"})
    time.sleep(0.2)
    assert systemd.memory_nodes == [(KUBELET_SLICE, "0-1")]


def test_the_reconcile_pass_gives_the_property_again_when_kubelets_slice_lost_it(systemd_node):
    """kubelet made its slice again (after a kill), or a koordnode before this one moved the
    pod: the slice's own cpuset.mems is empty, and the pass asks systemd again (at most every
    RECHECK_AFTER_S); a pass that finds it in place asks nothing."""
    now = [1000.0]
    node, systemd = systemd_node(clock=lambda: now[0])
    node.engine.be_group.slices.prepare(GROUP_SLICE, GROUP).result(5)
    run_be_pod(node)
    wait_until(lambda: systemd.memory_nodes)
    node.engine.reconcile()
    time.sleep(0.2)
    assert len(systemd.memory_nodes) == 1
    write_cgroup_file(node.root, KUBELET_PARENT, "cpuset.mems", "")
    node.engine.reconcile()
    time.sleep(0.2)
    assert len(systemd.memory_nodes) == 1, "asked again before RECHECK_AFTER_S"
    now[0] += RECHECK_AFTER_S
    node.engine.reconcile()
    wait_until(lambda: len(systemd.memory_nodes) == 2)
    assert read_cgroup_file(node.root, KUBELET_PARENT, "cpuset.mems") == "0"  # one memory node here


def test_a_failed_property_call_is_a_status_note_and_is_retried_later(systemd_node):
    now = [1000.0]
    node, systemd = systemd_node(clock=lambda: now[0])
    systemd.memory_nodes_fail = "systemctl set-property: Unknown assignment: AllowedMemoryNodes=0"
    node.engine.be_group.slices.prepare(GROUP_SLICE, GROUP).result(5)
    pod = run_be_pod(node)
    wait_until(lambda: KUBELET_SLICE in node.engine.be_group.slices.problems)
    assert parent_of(node, pod).endswith("kubepods-koordnode_be-podu1.slice")  # moved all the same
    notes = node.engine.status()["notes"]
    assert any("AllowedMemoryNodes" in note and KUBELET_SLICE in note for note in notes), notes
    node.engine.reconcile()
    time.sleep(0.2)
    assert len(systemd.memory_nodes) == 1, "retried before RECHECK_AFTER_S"
    systemd.memory_nodes_fail = None
    now[0] += RECHECK_AFTER_S  # not RETRY_AFTER_S: kubelet would kill the pod meanwhile
    node.engine.reconcile()
    wait_until(lambda: KUBELET_SLICE not in node.engine.be_group.slices.problems and len(systemd.memory_nodes) == 2)


def test_no_property_on_cgroup_v1_nor_in_dry_run(systemd_node):
    """cgroup v1: kubelet checks that its pod cgroup exists in each hierarchy, which systemd does
    not undo (and AllowedMemoryNodes is v2 only); dry run changes nothing."""
    node, systemd = systemd_node(version="v1")
    node.engine.be_group.slices.prepare(GROUP_SLICE, GROUP).result(5)
    run_be_pod(node)
    node.engine.reconcile()
    dry, dry_systemd = systemd_node()
    dry.engine.be_group.slices.prepare(GROUP_SLICE, GROUP).result(5)
    dry.engine.executor.dry_run = True
    run_be_pod(dry)
    time.sleep(0.3)
    assert systemd.memory_nodes == [] and dry_systemd.memory_nodes == []


def test_a_removed_pod_forgets_kubelets_slice(systemd_node):
    node, systemd = systemd_node()
    node.engine.be_group.slices.prepare(GROUP_SLICE, GROUP).result(5)
    pod = run_be_pod(node)
    wait_until(lambda: systemd.memory_nodes)
    node.remove_pod(pod)
    assert KUBELET_SLICE not in node.engine.be_group.slices._cpuset_kept
    # The pod's uid comes again (a static pod re-added): its new slice gets the property again.
    run_be_pod(node)
    wait_until(lambda: len(systemd.memory_nodes) == 2)


def test_a_controller_systemd_dropped_before_the_property_arrived_is_enabled_again_at_once(systemd_node):
    """In the VM lane a busy systemd took minutes to take the property (systemctl timed out)
    and dropped cpuset from kubelet's tier meanwhile: the pass enables it again in the tier's
    cgroup.subtree_control itself (as kubelet's cgroup library does), and asks for the property."""
    now = [1000.0]
    node, systemd = systemd_node(clock=lambda: now[0])
    systemd.memory_nodes_fail = "systemctl set-property ...: timed out after 15.0 seconds"
    node.engine.be_group.slices.prepare(GROUP_SLICE, GROUP).result(5)
    run_be_pod(node)
    wait_until(lambda: KUBELET_SLICE in node.engine.be_group.slices.problems)
    tier = KUBELET_PARENT.rsplit("/", 1)[0]
    write_cgroup_file(node.root, tier, "cgroup.subtree_control", "cpu io memory hugetlb pids")
    write_cgroup_file(node.root, KUBELET_PARENT, "cgroup.controllers", "cpu io memory hugetlb pids")
    node.engine.reconcile()
    assert read_cgroup_file(node.root, tier, "cgroup.subtree_control") == "+cpuset"
    systemd.memory_nodes_fail = None
    now[0] += RECHECK_AFTER_S
    node.engine.reconcile()
    wait_until(lambda: len(systemd.memory_nodes) == 2 and KUBELET_SLICE not in node.engine.be_group.slices.problems)


def test_a_controller_dropped_when_a_scope_started_is_enabled_again_right_after_the_call(systemd_node):
    """runc starting the sandbox's or a container's scope makes systemd realize kubelet's tier
    too; before the property is in place that drops cpuset, and kubelet syncs the pod soon after
    a container started: koordnode checks right after RunPodSandbox and StartContainer."""
    node, systemd = systemd_node()
    systemd.memory_nodes_fail = "systemctl set-property ...: timed out after 15.0 seconds"
    node.engine.be_group.slices.prepare(GROUP_SLICE, GROUP).result(5)
    tier = KUBELET_PARENT.rsplit("/", 1)[0]
    # The sandbox's scope: checked right after RunPodSandbox (no container yet).
    add_cgroup(node.root, KUBELET_PARENT)
    write_cgroup_file(node.root, tier, "cgroup.subtree_control", "cpu io memory hugetlb pids")
    write_cgroup_file(node.root, KUBELET_PARENT, "cgroup.controllers", "cpu io memory hugetlb pids")
    pod = run_be_pod(node)
    assert read_cgroup_file(node.root, tier, "cgroup.subtree_control") == "+cpuset"
    write_cgroup_file(node.root, tier, "cgroup.subtree_control", "cpu io memory hugetlb pids")
    write_cgroup_file(node.root, KUBELET_PARENT, "cgroup.controllers", "cpu io memory hugetlb pids")
    node.run_container(pod, "app")  # no reconcile pass in between
    assert read_cgroup_file(node.root, tier, "cgroup.subtree_control") == "+cpuset"
    # All in place: the check after the call writes nothing.
    write_cgroup_file(node.root, tier, "cgroup.subtree_control", "cpuset cpu io memory hugetlb pids")
    write_cgroup_file(node.root, KUBELET_PARENT, "cgroup.controllers", "cpuset cpu io memory hugetlb pids")
    node.run_container(pod, "second")
    assert read_cgroup_file(node.root, tier, "cgroup.subtree_control") == "cpuset cpu io memory hugetlb pids"
