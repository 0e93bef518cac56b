"""CPU set allocator: exclusive cores, NUMA, reservation, scheduler choice, release, restore, fallback."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from koordnode.model.cpu_topology import CpuTopology
from koordnode.policy.cpuset import CpusetAllocator, reserved_cpus_from_config
from koordnode.model.qos_class import QoSClass

BIG = CpuTopology.describe(sockets=2, numa_per_socket=2, cores_per_numa=8, threads_per_core=2)  # 64 CPUs
SMALL = CpuTopology.describe(sockets=1, numa_per_socket=1, cores_per_numa=4, threads_per_core=2)  # 8 CPUs


def whole_cores(topology: CpuTopology, cpus: frozenset[int]) -> bool:
    return all(topology.siblings(cpu) <= cpus for cpu in cpus)


def test_lse_gets_whole_cores_on_one_numa_node() -> None:
    allocator = CpusetAllocator(BIG)
    decision = allocator.allocate("a", QoSClass.LSE, 4)
    assert decision.exclusive and not decision.fallback
    assert len(decision.cpus) == 4
    assert whole_cores(BIG, decision.cpus)
    assert len(BIG.numa_nodes_of(decision.cpus)) == 1
    assert decision.mems == BIG.numa_nodes_of(decision.cpus)
    assert "LSE" in decision.reason


def test_lse_odd_request_rounds_up_to_whole_cores() -> None:
    decision = CpusetAllocator(BIG).allocate("a", QoSClass.LSE, 3)
    assert len(decision.cpus) == 4 and whole_cores(BIG, decision.cpus)


def test_two_lse_owners_get_disjoint_cores_and_pools_shrink_then_grow() -> None:
    allocator = CpusetAllocator(SMALL)
    first = allocator.allocate("a", QoSClass.LSE, 2)
    second = allocator.allocate("b", QoSClass.LSE, 2)
    assert not first.cpus & second.cpus
    assert allocator.share_pool() == SMALL.online - first.cpus - second.cpus
    assert allocator.be_pool() == allocator.share_pool()
    version = allocator.version
    assert allocator.release("a") == first.cpus
    assert allocator.version == version + 1
    assert allocator.share_pool() == SMALL.online - second.cpus
    assert allocator.release("a") == frozenset()
    assert allocator.version == version + 1
    allocator.release("b")
    assert allocator.share_pool() == SMALL.online


def test_numa_best_fit_keeps_big_blocks_free() -> None:
    allocator = CpusetAllocator(BIG)
    # Node 0 has 16 CPUs; take 12 of them so node 0 is the tightest fit for 4.
    allocator.allocate("big", QoSClass.LSE, 12)
    node = BIG.numa_nodes_of(allocator.allocation_of("big").cpus)
    assert len(node) == 1
    small = allocator.allocate("small", QoSClass.LSE, 4)
    assert BIG.numa_nodes_of(small.cpus) == node


def test_request_larger_than_a_numa_node_stays_on_one_socket() -> None:
    decision = CpusetAllocator(BIG).allocate("a", QoSClass.LSE, 24)
    assert len(decision.cpus) == 24
    sockets = {BIG.by_cpu[cpu].socket for cpu in decision.cpus}
    assert len(sockets) == 1


def test_request_larger_than_a_socket_spreads() -> None:
    decision = CpusetAllocator(BIG).allocate("a", QoSClass.LSE, 40)
    assert len(decision.cpus) == 40 and whole_cores(BIG, decision.cpus)


def test_lse_never_uses_a_half_taken_core() -> None:
    allocator = CpusetAllocator(SMALL)
    lsr = allocator.allocate("r", QoSClass.LSR, 1)  # splits core 0
    assert len(lsr.cpus) == 1
    lse = allocator.allocate("e", QoSClass.LSE, 6)
    assert len(lse.cpus) == 6 and not lse.cpus & SMALL.siblings(next(iter(lsr.cpus)))
    # No more whole cores: fallback, though one CPU is still free.
    assert allocator.free_cpus() and allocator.allocate("f", QoSClass.LSE, 1).fallback


def test_lsr_packs_whole_cores_then_reuses_split_cores() -> None:
    allocator = CpusetAllocator(SMALL)
    first = allocator.allocate("a", QoSClass.LSR, 3)
    assert len(first.cpus) == 3
    second = allocator.allocate("b", QoSClass.LSR, 1)
    # The leftover sibling of the split core is used before splitting another core.
    split_core = [cpus for cpus in SMALL.cores.values() if len(cpus & first.cpus) == 1][0]
    assert second.cpus == split_core - first.cpus


def test_lsr_cores_are_in_the_be_pool_but_not_the_share_pool() -> None:
    allocator = CpusetAllocator(SMALL, reserved={0, 4})
    lsr = allocator.allocate("r", QoSClass.LSR, 2)
    lse = allocator.allocate("e", QoSClass.LSE, 2)
    assert allocator.share_pool() == SMALL.online - {0, 4} - lsr.cpus - lse.cpus
    assert allocator.be_pool() == SMALL.online - {0, 4} - lse.cpus
    assert allocator.pool_for(QoSClass.LS).cpus == allocator.share_pool()
    assert allocator.pool_for(QoSClass.BE).cpus == allocator.be_pool()
    assert allocator.allocate("x", QoSClass.LS, 2).cpus == allocator.share_pool()
    assert not allocator.allocate("x", QoSClass.BE, 2).exclusive


def test_reserved_cpus_are_never_allocated() -> None:
    allocator = CpusetAllocator(SMALL, reserved={0, 4})
    decision = allocator.allocate("a", QoSClass.LSE, 6)
    assert not decision.cpus & {0, 4} and len(decision.cpus) == 6
    assert allocator.allocate("b", QoSClass.LSR, 1).fallback


def test_system_pool() -> None:
    assert CpusetAllocator(SMALL, system_cpus={0}).pool_for(QoSClass.SYSTEM).cpus == {0}
    allocator = CpusetAllocator(SMALL)
    assert allocator.pool_for(QoSClass.SYSTEM).cpus == allocator.share_pool()


def test_fallback_when_not_enough_free_cores() -> None:
    allocator = CpusetAllocator(SMALL)
    allocator.allocate("a", QoSClass.LSE, 6)
    decision = allocator.allocate("b", QoSClass.LSE, 4)
    assert decision.fallback and not decision.exclusive
    assert decision.cpus == allocator.share_pool()
    assert "falling back to the share pool" in decision.reason and "4 CPUs wanted" in decision.reason
    assert allocator.allocation_of("b") is None


def test_no_integer_request_falls_back() -> None:
    decision = CpusetAllocator(SMALL).allocate("a", QoSClass.LSR, 0)
    assert decision.fallback and "no whole-CPU request" in decision.reason


def test_pools_are_never_empty() -> None:
    allocator = CpusetAllocator(SMALL, reserved={0, 4})
    allocator.allocate("a", QoSClass.LSE, 6)
    assert allocator.share_pool() == frozenset()
    decision = allocator.pool_for(QoSClass.LS)
    assert decision.cpus and "empty" in decision.reason
    allocator2 = CpusetAllocator(SMALL)
    allocator2.allocate("a", QoSClass.LSE, 8)
    assert allocator2.pool_for(QoSClass.BE).cpus == SMALL.online


def test_allocate_is_idempotent_per_owner() -> None:
    allocator = CpusetAllocator(SMALL)
    first = allocator.allocate("a", QoSClass.LSE, 2)
    version = allocator.version
    again = allocator.allocate("a", QoSClass.LSE, 4)
    assert again.cpus == first.cpus and "already holds" in again.reason
    assert allocator.version == version


def test_scheduler_cpuset_is_honoured() -> None:
    allocator = CpusetAllocator(SMALL)
    decision = allocator.allocate("pod", QoSClass.LSR, 2, preferred={2, 3})
    assert decision.cpus == {2, 3} and "scheduler" in decision.reason
    assert allocator.allocation_of("pod").source == "scheduler"


@pytest.mark.parametrize(
    ("preferred", "why"),
    [({99}, "not online"), ({0}, "node-reserved"), ({1}, "held by other"), (set(), "empty")],
)
def test_bad_scheduler_cpuset_is_refused(preferred: set[int], why: str) -> None:
    allocator = CpusetAllocator(SMALL, reserved={0})
    allocator.allocate("other", QoSClass.LSR, 1, preferred={1})
    decision = allocator.allocate("pod", QoSClass.LSR, 2, preferred=preferred)
    assert why in decision.reason
    # Allocated by the allocator instead, without touching anyone else's CPUs.
    assert decision.exclusive and len(decision.cpus) == 2
    assert not decision.cpus & {0, 1}


def test_restore_and_conflicts() -> None:
    allocator = CpusetAllocator(SMALL, reserved={0})
    assert allocator.restore("a", QoSClass.LSE, {1, 5}).accepted
    assert allocator.restore("a", QoSClass.LSE, {1, 5}).accepted  # same again: fine
    refused = allocator.restore("b", QoSClass.LSR, {5, 6})
    assert not refused.accepted and "held by a" in refused.reason
    assert allocator.allocation_of("b") is None
    assert not allocator.restore("a", QoSClass.LSE, {2}).accepted
    assert not allocator.restore("c", QoSClass.LSR, {0}).accepted  # reserved
    assert not allocator.restore("d", QoSClass.LSR, {42}).accepted  # offline
    assert not allocator.restore("e", QoSClass.LS, {2}).accepted  # not an owning class
    assert allocator.allocation_of("a").source == "restored"
    # Later allocations avoid restored CPUs.
    assert not allocator.allocate("f", QoSClass.LSE, 4).cpus & {1, 5}


def test_reserved_cpus_from_config() -> None:
    # Count: lowest-numbered whole cores first (x86 numbering: core 0 = CPUs 0 and 4).
    assert reserved_cpus_from_config(2, SMALL) == (frozenset({0, 4}), [])
    assert reserved_cpus_from_config(3, SMALL)[0] == {0, 4, 1}
    assert reserved_cpus_from_config(0, SMALL) == (frozenset(), [])
    cpus, notes = reserved_cpus_from_config(100, SMALL)
    assert cpus == SMALL.online and notes
    assert reserved_cpus_from_config("0-1", SMALL) == (frozenset({0, 1}), [])
    cpus, notes = reserved_cpus_from_config("0,99", SMALL)
    assert cpus == {0} and "99" in notes[0]
    cpus, notes = reserved_cpus_from_config("bad", SMALL)
    assert cpus == frozenset() and notes
    assert reserved_cpus_from_config(True, SMALL)[0] == frozenset()  # type: ignore[arg-type]


class AllocatorMachine(RuleBasedStateMachine):
    """Random allocate/release/restore sequences: a CPU is never owned twice."""

    topology = CpuTopology.describe(
        sockets=2, numa_per_socket=1, cores_per_numa=3, threads_per_core=2, offline=[11]
    )
    reserved = frozenset({0})

    def __init__(self) -> None:
        super().__init__()
        self.allocator = CpusetAllocator(self.topology, reserved=self.reserved)

    owners = st.sampled_from([f"o{i}" for i in range(6)])
    classes = st.sampled_from(list(QoSClass))

    @rule(
        owner=owners,
        qos_class=classes,
        n=st.integers(min_value=-1, max_value=8),
        preferred=st.none() | st.sets(st.integers(min_value=0, max_value=13), max_size=4),
    )
    def allocate(self, owner: str, qos_class: QoSClass, n: int, preferred: set[int] | None) -> None:
        version = self.allocator.version
        decision = self.allocator.allocate(owner, qos_class, n, preferred)
        assert decision.cpus
        assert decision.cpus <= self.topology.online
        if decision.exclusive:
            assert self.allocator.allocation_of(owner).cpus == decision.cpus
            newly_allocated = self.allocator.version != version
            if newly_allocated and self.allocator.allocation_of(owner).source == "allocated":
                assert len(decision.cpus) >= n
                if qos_class is QoSClass.LSE:
                    assert whole_cores(self.topology, decision.cpus)

    @rule(owner=owners)
    def release(self, owner: str) -> None:
        self.allocator.release(owner)

    @rule(owner=owners, cpus=st.sets(st.integers(min_value=0, max_value=13), min_size=1, max_size=4))
    def restore(self, owner: str, cpus: set[int]) -> None:
        self.allocator.restore(owner, QoSClass.LSR, cpus)

    @invariant()
    def never_handed_out_twice(self) -> None:
        seen: set[int] = set()
        for allocation in self.allocator.allocations().values():
            assert not allocation.cpus & seen
            assert not allocation.cpus & self.reserved
            assert allocation.cpus <= self.topology.online
            seen |= allocation.cpus
        assert not self.allocator.share_pool() & seen
        assert not self.allocator.be_pool() & self.reserved
        lse = {
            c for a in self.allocator.allocations().values() if a.qos_class is QoSClass.LSE for c in a.cpus
        }
        assert not self.allocator.be_pool() & lse


AllocatorMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
TestAllocatorProperties = AllocatorMachine.TestCase
