"""Core scheduling on a real kernel: `[qos.LSE] core_sched` gives each LSE pod one PR_SCHED_CORE
cookie where the kernel can (SMT siblings and CONFIG_SCHED_CORE), and status and doctor say why
not where it cannot. The lane boots `-smp 2` (no siblings) by default; `python3 tests/vm/lane.py
--smp 4,cores=2,threads=2 -- -k test_core_sched` gives the guest siblings (tests/vm/README.md).
Debian 13's kernel (6.12) is built without CONFIG_SCHED_CORE: there the cookie test is skipped
with that reason, and the unavailable path is what runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from guestlib import RECONCILE_S, make_pod, reload_config, wait_for
from koordnode.executor.core_sched import CoreScheduling
from support.cri import Cri, remove_pod

QOS_LABEL = "koordinator.sh/qosClass"
GUARANTEED_1CPU = {"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000, "memory_limit_in_bytes": 64 << 20}
UNAVAILABLE = CoreScheduling().unavailable


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


@pytest.fixture
def lse_core_sched(guest_koordnode):
    """koordnode with `[qos.LSE] core_sched = true` for the test, its own config again after."""
    original = guest_koordnode.config_path.read_text()
    reload_config(guest_koordnode, original + "[qos.LSE]\ncore_sched = true\n")
    yield guest_koordnode
    reload_config(guest_koordnode, original)


@pytest.mark.skipif(UNAVAILABLE is None, reason="this kernel gives cookies: the other test runs")
def test_status_and_doctor_say_why_core_sched_is_unavailable(systemd_bed, lse_core_sched, cri):
    kn = lse_core_sched
    pod = make_pod(cri, systemd_bed, "exclusive", "guaranteed", labels={QOS_LABEL: "LSE"},
                   resources=GUARANTEED_1CPU)
    state = wait_for(lambda: next(p for p in kn.status()["pods"] if p["sandbox_id"] == pod.sandbox_id)
                     .get("core_sched"), RECONCILE_S + 10, "the pod's core_sched state")
    assert state == f"unavailable: {UNAVAILABLE}"
    assert kn.status()["qos"]["core_sched"] == {"classes": ["LSE"], "state": f"unavailable: {UNAVAILABLE}"}
    doctor = subprocess.run([sys.executable, "-m", "koordnode", "doctor", "--json", "--config", str(kn.config_path)],
                            capture_output=True, text=True, timeout=120)
    check = next(c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "core scheduling")
    assert check["status"] == "WARN" and UNAVAILABLE in check["message"], check


@pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no cookies on this kernel: {UNAVAILABLE}")
def test_lse_pods_get_one_core_sched_cookie_each(systemd_bed, lse_core_sched, cri):
    kn = lse_core_sched
    core = CoreScheduling()
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
    status = {p["sandbox_id"]: p for p in kn.status()["pods"]}
    for pod in pods:
        assert status[pod.sandbox_id]["core_sched"].startswith("on: "), status[pod.sandbox_id]
    assert kn.status()["qos"]["core_sched"] == {"classes": ["LSE"], "state": "on"}
