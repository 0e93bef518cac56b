"""Memory protection of kubelet's cgroups above the pods (kubepods, its burstable tier).

The kernel caps a cgroup's effective memory.min / memory.low by its ancestors': with kubelet's
tiers at 0 (kubelet 1.37's default memoryReservationPolicy None) every pod's protection is void.
First the pure policy (policy/tier_memory.py), then the QoS engine on fake cgroup trees
(test_qos_engine's Node: real hook chain, fake runtime). The VM lane shows the kernel honouring
it: tests/vm_guest/test_memory_tiers_v2.py.
"""

from __future__ import annotations

import shutil

import pytest

from faketree import add_cgroup, write_cgroup_file
from koordnode.cri import api_pb2 as pb
from koordnode.executor.originals import OriginalsJournal
from koordnode.model.kernel import PAGE_SIZE
from koordnode.policy.tier_memory import ChildProtection, TierFile, decide_tier_file, plan_tier_memory
from test_qos_engine import MIB, Node

KP, BU, BE_TIER, BE_GROUP = "/kubepods", "/kubepods/burstable", "/kubepods/besteffort", "/kubepods/koordnode_be"


def child(cgroup: str, min_mib: int, low_mib: int, **kwargs) -> ChildProtection:
    return ChildProtection(cgroup, {"memory.min": min_mib * MIB, "memory.low": low_mib * MIB}, **kwargs)


def by_file(decisions):
    return {(d.cgroup, d.resource): d for d in decisions}


def mixed_children() -> dict[str, list[ChildProtection]]:
    """An LS pod (two containers summed by its plan), a BE-labelled Burstable pod (0), a pod
    koordnode does not manage (its files), a Guaranteed LSR pod; the besteffort tier and the
    BE group at 0."""
    return {
        BU: [child(f"{BU}/podls", 192, 307), child(f"{BU}/podbe", 0, 0),
             child(f"{BU}/podother", 64, 100, planned=False)],
        KP: [child(BU, 0, 0, pod=False), child(BE_TIER, 0, 0, pod=False), child(BE_GROUP, 0, 0, pod=False),
             child(f"{KP}/podlsr", 204, 256)],
    }


def zeros(*tiers: str) -> dict[tuple[str, str], int]:
    return {(t, r): 0 for t in tiers for r in ("memory.min", "memory.low")}


# --- the policy ----------------------------------------------------------------------------------


def test_cgroup_v1_gets_nothing():
    assert plan_tier_memory("v1", [KP, BU], mixed_children(), zeros(KP, BU), {}) == ()


def test_kubelets_zeros_become_the_sums_of_the_pods_below():
    got = by_file(plan_tier_memory("v2", [KP, BU], mixed_children(), zeros(KP, BU), {}))
    assert got[(BU, "memory.min")].value == (192 + 0 + 64) * MIB
    assert got[(BU, "memory.low")].value == (307 + 100) * MIB
    # kubepods: the burstable tier's decided value plus the Guaranteed pod.
    assert got[(KP, "memory.min")].value == (192 + 64 + 204) * MIB
    assert got[(KP, "memory.low")].value == (307 + 100 + 256) * MIB
    top = got[(KP, "memory.min")]
    assert top.pods == 4 and top.unplanned == 1 and top.keeper == "koordnode"
    assert top.write is not None and top.write.value == top.value
    assert top.why == (f"memory.min {460 * MIB} = Σ of 4 pods' protection (1 read from their files)"
                       " (kubelet's own: 0)")
    assert top.state == TierFile(kubelet=0, ours=460 * MIB)
    # The writes go top down (the kernel takes any order; status reads that way).
    assert [(d.cgroup, d.resource) for d in plan_tier_memory("v2", [KP, BU], mixed_children(), zeros(KP, BU), {})] \
        == [(KP, "memory.min"), (KP, "memory.low"), (BU, "memory.min"), (BU, "memory.low")]


def test_kubelets_larger_tiered_reservation_is_left_alone_and_its_missing_burstable_min_filled():
    # TieredReservation: kubepods min = Σ requests of Guaranteed + Burstable, low and the tier's
    # low = Σ Burstable requests; the tier's min never written (0).
    current = {(KP, "memory.min"): 1024 * MIB, (KP, "memory.low"): 768 * MIB,
               (BU, "memory.min"): 0, (BU, "memory.low"): 512 * MIB}
    got = by_file(plan_tier_memory("v2", [KP, BU], mixed_children(), current, {}))
    assert got[(KP, "memory.min")].write is None and got[(KP, "memory.min")].keeper == "kubelet"
    assert got[(KP, "memory.min")].state == TierFile(kubelet=1024 * MIB, ours=None)
    assert "left to kubelet" in got[(KP, "memory.min")].why
    assert got[(BU, "memory.low")].write is None  # 512 MiB ≥ 407 MiB
    # kubepods low: the tier's 512 (kubelet's, larger than its pods' sum) + the Guaranteed pod's 256.
    assert got[(KP, "memory.low")].value == (512 + 256) * MIB and got[(KP, "memory.low")].write is None
    assert got[(BU, "memory.min")].write is not None and got[(BU, "memory.min")].value == 256 * MIB


def test_a_larger_sum_is_kept_over_kubelets_and_raised_again_after_kubelet_lowers_it():
    children = [child(f"{BU}/podlse", 300, 360)]
    first = decide_tier_file(BU, "memory.low", children, 200 * MIB, None)
    assert first.write is not None and first.value == 360 * MIB and first.kubelet == 200 * MIB
    # Next pass: the file holds koordnode's value; kubelet's own is remembered, nothing written.
    second = decide_tier_file(BU, "memory.low", children, 360 * MIB, first.state)
    assert second.write is None and second.kubelet == 200 * MIB and second.keeper == "koordnode"
    # kubelet's minute write lowers it (to a new Σ requests): raised again, kubelet's value learnt.
    third = decide_tier_file(BU, "memory.low", children, 250 * MIB, second.state)
    assert third.write is not None and third.value == 360 * MIB and third.kubelet == 250 * MIB


def test_when_the_sum_drops_below_kubelets_value_the_file_goes_back_to_kubelets():
    big = decide_tier_file(KP, "memory.min", [child(f"{KP}/poda", 300, 0)], 100 * MIB, None)
    assert big.value == 300 * MIB
    small = decide_tier_file(KP, "memory.min", [child(f"{KP}/poda", 50, 0)], 300 * MIB, big.state)
    assert small.write is not None and small.value == 100 * MIB  # kubelet's own, not 50
    assert small.state.ours is None and small.keeper == "kubelet"
    # The pods gone and kubelet's value 0 (policy None): koordnode's sum goes with them.
    none = decide_tier_file(KP, "memory.min", [], 300 * MIB, TierFile(kubelet=0, ours=300 * MIB))
    assert none.write is not None and none.value == 0


def test_values_are_compared_in_whole_pages_as_the_kernel_keeps_them():
    children = [child(f"{BU}/poda", 0, 0), ChildProtection(f"{BU}/podb", {"memory.low": 214748364})]
    first = decide_tier_file(BU, "memory.low", children, 0, None)
    assert first.value == 214745088 and first.write is not None  # rounded down to the page
    # The kernel's rounded value is koordnode's own: nothing written again, not taken for kubelet's.
    again = decide_tier_file(BU, "memory.low", children, 214745088, first.state)
    assert again.write is None and again.kubelet == 0


def test_a_tier_file_not_there_is_left_out():
    current = zeros(KP)
    got = plan_tier_memory("v2", [KP, BU], mixed_children(), current, {})
    assert {d.cgroup for d in got} == {KP}
    # the burstable tier then counts as its children said nothing about it: its file (0 here)
    assert by_file(got)[(KP, "memory.min")].value == 204 * MIB


# --- the engine on fake trees --------------------------------------------------------------------


@pytest.fixture
def make_node(tmp_path):
    nodes: list[Node] = []

    def make(**kwargs) -> Node:
        node = Node(tmp_path / f"node{len(nodes)}", **kwargs)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.close()


def _ls(node, name: str, request_mib: int, parent: str | None = None, labels=None):
    pod = node.run_pod(name, parent=parent or f"/kubepods/burstable/pod{name}", labels=labels)
    cid = node.run_container(pod, cpu_shares=512, memory_limit_in_bytes=1024 * MIB,
                             unified={"memory.min": str(request_mib * MIB)})
    return pod, cid


def pg(n: int) -> int:
    """In whole pages, as the kernel keeps memory.min / memory.low (the fake tree does not round)."""
    return n - n % PAGE_SIZE


def _tier(node, cgroup: str) -> dict[str, int]:
    return {r: int(node.read(cgroup, r)) for r in ("memory.min", "memory.low")}


def test_engine_keeps_the_tiers_at_the_sums_through_creation_removal_and_reconcile(make_node, tmp_path):
    node = make_node(version="v2")
    journal = OriginalsJournal(tmp_path / "state")
    node.engine.executor.originals = journal
    ls, _ = _ls(node, "ls", 256)  # LS: min 50 %, low 80 % of the request
    lsr = node.run_pod("lsr", parent="/kubepods/podlsr")  # Guaranteed: LSR, min 80 %, low 100 % of 256 MiB
    node.run_container(lsr, cpu_shares=1024, cpu_quota=100000, memory_limit_in_bytes=256 * MIB)
    be = node.run_pod("be", parent="/kubepods/besteffort/podbe")
    node.run_container(be, cpu_shares=2)
    ls_min, ls_low = 128 * MIB, 256 * MIB * 80 // 100
    lsr_min, lsr_low = 256 * MIB * 80 // 100, 256 * MIB
    assert _tier(node, ls.cgroup) == {"memory.min": ls_min, "memory.low": ls_low}
    assert _tier(node, "/kubepods/burstable") == {"memory.min": ls_min, "memory.low": pg(ls_low)}
    assert _tier(node, "/kubepods") == {"memory.min": pg(ls_min + lsr_min), "memory.low": pg(pg(ls_low) + lsr_low)}
    assert _tier(node, "/kubepods/besteffort") == {"memory.min": 0, "memory.low": 0}  # BE: none

    # A pod koordnode does not manage (skipped, another runtime's) counts with its files.
    add_cgroup(node.root, "/kubepods/burstable/podforeign")
    write_cgroup_file(node.root, "/kubepods/burstable/podforeign", "memory.min", str(64 * MIB))
    node.engine.reconcile(force=False)
    assert _tier(node, "/kubepods/burstable")["memory.min"] == ls_min + 64 * MIB
    assert _tier(node, "/kubepods")["memory.min"] == pg(ls_min + 64 * MIB + lsr_min)

    status = node.engine.status()["memory_tiers"]
    top = status["/kubepods"]["memory.min"]
    assert top["value"] == pg(ls_min + 64 * MIB + lsr_min) and top["kubelet"] == 0 and top["kept_by"] == "koordnode"
    assert top["why"].startswith(f"memory.min {top['value']} = Σ of 3 pods' protection (1 read from their files)")

    # The tier files' originals are journalled for `koordnode restore`.
    targets = {e.target for e in journal.entries() if e.kind == "cgroup_file"}
    assert {"kubepods/memory.min", "kubepods/memory.low", "kubepods/burstable/memory.min",
            "kubepods/burstable/memory.low"} <= targets
    assert all(e.value == "0" for e in journal.entries() if e.target.endswith(("memory.min", "memory.low")))

    # The LS pod removed (kubelet removes its cgroup): its share goes from the tiers.
    node.call("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=ls.sandbox_id))
    node.remove_pod(ls)
    shutil.rmtree(node.root / ls.cgroup.strip("/"))
    node.engine.reconcile(force=False)
    assert _tier(node, "/kubepods/burstable") == {"memory.min": 64 * MIB, "memory.low": 0}
    assert _tier(node, "/kubepods")["memory.min"] == pg(64 * MIB + lsr_min)


def test_kubelets_tiered_reservation_is_never_lowered_and_a_smaller_one_is_raised_and_counted(make_node):
    node = make_node(version="v2")
    ls, _ = _ls(node, "ls", 256)
    ls_min, ls_low = 128 * MIB, 256 * MIB * 80 // 100
    # kubelet's TieredReservation pass: kubepods min/low and the tier's low = Σ requests (256 MiB).
    for cgroup, resource in (("/kubepods", "memory.min"), ("/kubepods", "memory.low"),
                             ("/kubepods/burstable", "memory.low")):
        write_cgroup_file(node.root, cgroup, resource, str(256 * MIB))
    before = dict(node.engine.status()["overwrites"]["counts"])
    node.engine.reconcile(force=False)
    assert _tier(node, "/kubepods") == {"memory.min": 256 * MIB, "memory.low": 256 * MIB}  # kubelet's stays
    assert _tier(node, "/kubepods/burstable") == {"memory.min": ls_min, "memory.low": 256 * MIB}
    tiers = node.engine.status()["memory_tiers"]
    assert tiers["/kubepods"]["memory.min"]["kept_by"] == "kubelet"
    assert tiers["/kubepods/burstable"]["memory.min"]["kept_by"] == "koordnode"
    # kubelet hands a file koordnode had left to it: no overwrite was counted for it.
    assert node.engine.status()["overwrites"]["counts"].get("memory.low", 0) == before.get("memory.low", 0)

    # A second pod takes koordnode's burstable low above kubelet's (stale) value; kubelet's next
    # minute lowers it again: the next pass raises it and counts the overwrite.
    _ls(node, "ls2", 256)
    assert _tier(node, "/kubepods/burstable")["memory.low"] == pg(2 * ls_low)
    write_cgroup_file(node.root, "/kubepods/burstable", "memory.low", str(300 * MIB))
    node.engine.reconcile(force=False)
    assert _tier(node, "/kubepods/burstable")["memory.low"] == pg(2 * ls_low)
    counts = node.engine.status()["overwrites"]["counts"]
    assert counts.get("memory.low", 0) >= before.get("memory.low", 0) + 1
    assert node.engine.status()["memory_tiers"]["/kubepods/burstable"]["memory.low"]["kubelet"] == 300 * MIB


def test_memory_qos_off_for_a_class_counts_the_pods_file(make_node):
    node = make_node(version="v2", toml="[qos.LS]\nmemory_qos = false\n")
    ls, _ = _ls(node, "ls", 256)
    write_cgroup_file(node.root, ls.cgroup, "memory.low", str(10 * MIB))  # kubelet's Memory QoS, say
    node.engine.reconcile(force=False)
    assert _tier(node, "/kubepods/burstable") == {"memory.min": 0, "memory.low": 10 * MIB}


def test_systemd_slices_carry_the_sums(make_node):
    node = make_node(version="v2")
    ls, _ = _ls(node, "ls", 256, parent="kubepods-burstable-podls.slice")
    tier = "/kubepods.slice/kubepods-burstable.slice"
    assert ls.cgroup == f"{tier}/kubepods-burstable-podls.slice"
    assert _tier(node, tier) == {"memory.min": 128 * MIB, "memory.low": pg(256 * MIB * 80 // 100)}
    assert _tier(node, "/kubepods.slice") == _tier(node, tier)
    # systemd re-applies its own 0 when kubelet sets the slice's unit properties: restored, counted.
    write_cgroup_file(node.root, "/kubepods.slice", "memory.min", "0")
    before = node.engine.status()["overwrites"]["counts"].get("memory.min", 0)
    node.engine.reconcile(force=False)
    assert _tier(node, "/kubepods.slice")["memory.min"] == 128 * MIB
    assert node.engine.status()["overwrites"]["counts"]["memory.min"] == before + 1


@pytest.mark.parametrize("dry_run", [False, True])
def test_v1_writes_no_tier_and_a_dry_run_writes_nothing(make_node, dry_run):
    if dry_run:
        node = make_node(version="v2")
        node.engine.executor.dry_run = True
        _ls(node, "ls", 256)
        assert _tier(node, "/kubepods") == {"memory.min": 0, "memory.low": 0}
        assert node.engine.status()["memory_tiers"]["/kubepods"]["memory.min"]["value"] == 128 * MIB
        return
    node = make_node(version="v1")
    _ls(node, "ls", 256)
    assert node.engine.status()["memory_tiers"] == {}


def test_a_restart_does_not_take_koordnodes_own_value_for_kubelets(make_node, tmp_path):
    node = make_node(version="v2")
    node.engine.executor.originals = OriginalsJournal(tmp_path / "state")
    ls, _ = _ls(node, "ls", 256)
    assert _tier(node, "/kubepods")["memory.min"] == 128 * MIB
    again = node.restarted()
    again.engine.executor.originals = OriginalsJournal(tmp_path / "state")
    again.engine.tiers.files.clear()
    # The pod leaves while koordnode is away; kubelet (policy None) never writes the tiers.
    again.state.remove_pod(ls.sandbox_id)
    shutil.rmtree(again.root / ls.cgroup.strip("/"))
    again.engine.reconcile(force=False)
    assert _tier(again, "/kubepods")["memory.min"] == 0  # not kept at koordnode's stale 128 MiB


def test_koordnode_restore_puts_kubelets_tier_values_back(make_node, tmp_path):
    from koordnode.executor.restore import RestoreRoots, restore

    node = make_node(version="v2")
    journal = OriginalsJournal(tmp_path / "state")
    node.engine.executor.originals = journal
    _ls(node, "ls", 256)
    assert _tier(node, "/kubepods/burstable")["memory.min"] == 128 * MIB
    report = restore(journal, RestoreRoots(cgroup=str(node.root), procfs=str(tmp_path / "no-proc")))
    assert report.ok, report.as_dict()
    assert _tier(node, "/kubepods") == _tier(node, "/kubepods/burstable") == {"memory.min": 0, "memory.low": 0}
