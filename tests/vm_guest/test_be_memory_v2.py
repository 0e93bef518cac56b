"""[strategy.be_memory] on real cgroup v2 files (VM lane guest, systemd driver): the BE tier's
memory.high / memory.max at the BE budget and a BE pod without a limit's memory.high, and a BE
pod allocating past the budget held there while an LS pod keeps its page cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from guestlib import cri_removing_its_pods, RECONCILE_S, make_pod, reload_config, wait_for
from koordnode.cri import api_pb2 as pb

CG = Path("/sys/fs/cgroup")
# The guest's koordnode keeps BE pods in kubelet's besteffort slice (be_idle_group_systemd = false).
BE_TIER = CG / "kubepods.slice" / "kubepods-besteffort.slice"
MIB = 1 << 20
PAGE = 4096
QOS_LABEL = "koordinator.sh/qosClass"


@pytest.fixture
def cri(guest_koordnode):
    yield from cri_removing_its_pods(guest_koordnode)


@pytest.fixture
def small_budget(guest_koordnode):
    """The budget at a 200 MiB floor (1% of the guest's memory is less than its system uses)."""
    original = guest_koordnode.config_path.read_text()
    reload_config(guest_koordnode, original + "[strategy.be_memory]\nbudget_percent = 1\nmin_budget_mib = 200\n")
    yield guest_koordnode
    reload_config(guest_koordnode, original)


def file_cache_bytes(pod_dir: Path) -> int:
    stat = dict(line.split() for line in (pod_dir / "memory.stat").read_text().splitlines())
    return int(stat["file"])


def test_a_be_pod_past_the_budget_is_held_at_it_and_ls_keeps_its_page_cache(systemd_bed, small_budget, cri):
    kn = small_budget
    budget = 200 * MIB
    ls = make_pod(cri, systemd_bed, "cache", "burstable", labels={QOS_LABEL: "LS"}, resources={"cpu_shares": 512},
                  cmd=["sh", "-c", "dd if=/dev/zero of=/cache.bin bs=1M count=32 && sleep 3600"])
    wait_for(lambda: file_cache_bytes(ls.pod_dir) >= 32 * MIB, 60, "the LS pod's page cache")
    cache_before = file_cache_bytes(ls.pod_dir)
    be = make_pod(cri, systemd_bed, "batch", "besteffort", resources={"cpu_shares": 2})
    # systemd sets the slice's memory.max back when it starts the BE pod's scope: the manager restores it.
    wait_for(lambda: (BE_TIER / "memory.max").read_text().strip() == str(budget), RECONCILE_S + 15,
             "the BE tier's cap")
    assert (BE_TIER / "memory.high").read_text().strip() == str(budget)
    pod_high = budget * 70 // 100 // PAGE * PAGE
    wait_for(lambda: be.read("memory.high", "pod") == str(pod_high), RECONCILE_S + 10, "the BE pod's memory.high")
    def events() -> dict[str, int]:
        return {k: int(v) for k, v in (line.split() for line in (BE_TIER / "memory.events").read_text().splitlines())}

    before = events()
    reply = cri.rt.ExecSync(pb.ExecSyncRequest(
        container_id=be.container_id, cmd=["dd", "if=/dev/zero", "of=/dev/null", "bs=300M", "count=2"], timeout=120),
        timeout=180)
    assert reply.exit_code != 0, reply  # killed inside the BE tier, not by the node
    after = events()
    assert after["max"] > before["max"] and after["oom_kill"] > before["oom_kill"], (before, after)
    assert file_cache_bytes(ls.pod_dir) >= cache_before * 0.95
    pod = next(p for p in kn.status()["pods"] if p["sandbox_id"] == be.sandbox_id)
    assert pod["be_memory_bound"] == {"memory.high": budget * 70 // 100, "budget_bytes": budget}
