"""Core scheduling on a real kernel with SMT siblings: LSE pods with `[qos.LSE] core_sched` get one
PR_SCHED_CORE cookie each. Needs a guest CPU with threads per core > 1: the lane boots
`-smp 2` by default (no siblings: skipped, with the reason); run it with
`python3 -m vm.lane --smp 4,cores=2,threads=2 -k test_core_sched` (tests/vm/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from guestlib import RECONCILE_S, make_pod, reload_config, wait_for
from koordnode.executor.process import CoreScheduling
from support.cri import Cri, remove_pod

QOS_LABEL = "koordinator.sh/qosClass"
GUARANTEED_1CPU = {"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000, "memory_limit_in_bytes": 64 << 20}


def _smt_siblings() -> bool:
    siblings = Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
    return siblings.is_file() and any(sep in siblings.read_text() for sep in ",-")


pytestmark = pytest.mark.skipif(not _smt_siblings(), reason="the guest CPU has no SMT siblings (lane booted "
                                "without threads per core > 1: --smp 4,cores=2,threads=2)")


@pytest.fixture
def cri(guest_koordnode):
    client = Cri(guest_koordnode.listen)
    client.created = []
    yield client
    for sandbox_id in client.created:
        try:
            remove_pod(client, sandbox_id)
        except Exception:  # noqa: BLE001 - cleanup of a failed test
            pass
    client.close()


def test_lse_pods_get_one_core_sched_cookie_each(systemd_bed, guest_koordnode, cri):
    core = CoreScheduling()
    assert core.unavailable is None, core.unavailable  # SMT siblings and CONFIG_SCHED_CORE
    original = guest_koordnode.config_path.read_text()
    reload_config(guest_koordnode, original + "[qos.LSE]\ncore_sched = true\n")
    try:
        # Two processes per pod (a shell and its sleep), two pods.
        cmd = ["sh", "-c", "sleep 3600 & sleep 3600"]
        pods = [make_pod(cri, systemd_bed, f"exclusive-{i}", "guaranteed", labels={QOS_LABEL: "LSE"},
                         resources=GUARANTEED_1CPU, cmd=cmd) for i in range(2)]

        def cookies(pod) -> list[int]:
            pids = [int(pid) for pid in pod.read("cgroup.procs").split()]
            return [core.cookie(pid) for pid in pids] if len(pids) >= 2 else []

        def one_cookie_each() -> list[int] | None:
            found = [set(cookies(pod)) for pod in pods]
            ok = all(len(c) == 1 and 0 not in c for c in found) and found[0] != found[1]
            return [next(iter(c)) for c in found] if ok else None

        wait_for(one_cookie_each, RECONCILE_S + 10, "one cookie per LSE pod")
        status = {p["sandbox_id"]: p for p in guest_koordnode.status()["pods"]}
        for pod in pods:
            assert status[pod.sandbox_id]["core_sched"].startswith("on: "), status[pod.sandbox_id]
        assert guest_koordnode.status()["qos"]["core_sched"] == {"classes": ["LSE"], "state": "on"}
    finally:
        reload_config(guest_koordnode, original)
