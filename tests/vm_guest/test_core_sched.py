"""Core scheduling on the lane's kernel: `[qos.LSE] core_sched` gives each LSE pod one
PR_SCHED_CORE cookie, `[qos.LS] core_expeller` gives every BE task one shared cookie and leaves LS
untagged, where the kernel can (SMT siblings and CONFIG_SCHED_CORE); status and doctor say why not
where it cannot. The lane boots `-smp 2` (no siblings) by default; `python3 tests/vm/lane.py --smp
4,cores=2,threads=2 -- -k test_core_sched` gives the guest siblings (tests/vm/README.md).
Debian's kernels (trixie's 6.12, trixie-backports' 7.3, forky's and sid's 7.2; amd64, cloud and
rt flavours) are built without CONFIG_SCHED_CORE: there the cookie test is skipped with that
reason, and the unavailable path is what runs. Cookies on a real kernel that gives them are
tests/test_core_sched_kernel.py's (no containerd there, so not this test's pods): a small kernel
built with CONFIG_SCHED_CORE (scripts/core-sched-kernel.sh) boots on this image without
systemd, and koordnode's executor, policy and hook tag pod-like cgroups' processes there, checked
on the kernel, its enforcement (busy loops on SMT siblings) included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from guestlib import cri_removing_its_pods, RECONCILE_S, make_pod, reload_config, wait_for
from koordnode.executor.core_sched import CoreScheduling

QOS_LABEL = "koordinator.sh/qosClass"
GUARANTEED_1CPU = {"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000, "memory_limit_in_bytes": 64 << 20}
BURSTABLE = {"cpu_shares": 256, "cpu_period": 100000, "memory_limit_in_bytes": 64 << 20}
UNAVAILABLE = CoreScheduling().unavailable
CONFIG = "[qos.LSE]\ncore_sched = true\n[qos.LS]\ncore_expeller = true\n"


@pytest.fixture
def cri(guest_koordnode):
    yield from cri_removing_its_pods(guest_koordnode)


@pytest.fixture
def core_sched_config(guest_koordnode):
    """koordnode with LSE's own cookies and LS expelling BE for the test, its own config again after."""
    original = guest_koordnode.config_path.read_text()
    reload_config(guest_koordnode, original + CONFIG)
    yield guest_koordnode
    reload_config(guest_koordnode, original)


def pod_state(kn, pod) -> str | None:
    return next(p for p in kn.status()["pods"] if p["sandbox_id"] == pod.sandbox_id).get("core_sched")


def smt_siblings() -> str:
    """cpu0's hardware threads as the guest kernel sees them ("0-1" with -smp 4,cores=2,threads=2)."""
    try:
        return Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list").read_text().strip()
    except OSError:
        return "?"


@pytest.mark.skipif(UNAVAILABLE is None, reason="this kernel gives cookies: the other test runs")
def test_status_and_doctor_say_why_core_sched_is_unavailable(systemd_bed, core_sched_config, cri):
    kn = core_sched_config
    siblings = smt_siblings()
    print(f"cpu0's SMT siblings: {siblings}; core scheduling: {UNAVAILABLE}")
    if "-" in siblings or "," in siblings:  # siblings: the kernel can only lack CONFIG_SCHED_CORE
        assert "CONFIG_SCHED_CORE" in UNAVAILABLE, UNAVAILABLE
    lse = make_pod(cri, systemd_bed, "exclusive", "guaranteed", labels={QOS_LABEL: "LSE"}, resources=GUARANTEED_1CPU)
    be = make_pod(cri, systemd_bed, "batch", "besteffort", labels={QOS_LABEL: "BE"})
    for pod in (lse, be):
        state = wait_for(lambda pod=pod: pod_state(kn, pod), RECONCILE_S + 10, "the pod's core_sched state")
        assert state == f"unavailable: {UNAVAILABLE}"
    assert kn.status()["qos"]["core_sched"] == {"classes": ["LSE"], "expellers": ["LS"],
                                                "state": f"unavailable: {UNAVAILABLE}"}
    doctor = subprocess.run([sys.executable, "-m", "koordnode", "doctor", "--json", "--config", str(kn.config_path)],
                            capture_output=True, text=True, timeout=120)
    check = next(c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "core scheduling")
    assert check["status"] == "WARN" and UNAVAILABLE in check["message"], check
    assert "core_sched and core_expeller" in check["message"], check


def pids_running(marker: str) -> list[int]:
    """The processes whose command line holds `marker` (each pod runs sleeps of its own length)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no cookies on this kernel: {UNAVAILABLE}")
def test_lse_pods_get_a_cookie_each_be_one_shared_and_ls_none(systemd_bed, core_sched_config, cri):
    kn = core_sched_config
    core = CoreScheduling()
    # Two processes per pod (a shell and its sleep), each pod a sleep length of its own.
    pods = {name: (3600 + i, make_pod(cri, systemd_bed, name, qos, labels={QOS_LABEL: cls}, resources=res,
                                      cmd=["sh", "-c", f"sleep {3600 + i} & sleep {3600 + i}"]))
            for i, (name, qos, cls, res) in enumerate([
                ("exclusive-0", "guaranteed", "LSE", GUARANTEED_1CPU), ("exclusive-1", "guaranteed", "LSE", GUARANTEED_1CPU),
                ("batch-0", "besteffort", "BE", None), ("batch-1", "besteffort", "BE", None),
                ("online", "burstable", "LS", BURSTABLE)])}

    def cookies() -> dict[str, set[int]] | None:
        found = {}
        for name, (seconds, _) in pods.items():
            pids = pids_running(f"sleep {seconds}")
            if len(pids) < 2:
                return None
            found[name] = {core.cookie(pid) for pid in pids}
        return found

    def settled() -> dict[str, set[int]] | None:
        found = cookies()
        if found is None or any(len(c) != 1 for c in found.values()):
            return None
        lse = [next(iter(found[f"exclusive-{i}"])) for i in range(2)]
        be = [next(iter(found[f"batch-{i}"])) for i in range(2)]
        ok = (0 not in lse and lse[0] != lse[1] and be[0] == be[1] != 0 and be[0] not in lse
              and found["online"] == {0})
        return found if ok else None

    wait_for(settled, RECONCILE_S + 20, "one cookie per LSE pod, one for all BE tasks, none for LS")
    # Nothing else tagged: the node's own processes, containerd, koordnode's main thread.
    for pid in (1, os.getpid(), kn.proc.pid):
        assert core.cookie(pid) == 0, pid
    status = {p["sandbox_id"]: p for p in kn.status()["pods"]}
    for name, (_, pod) in pods.items():
        line = status[pod.sandbox_id]["core_sched"]
        assert line.startswith("on: "), (name, line)
    assert kn.status()["qos"]["core_sched"] == {"classes": ["LSE"], "expellers": ["LS"], "state": "on"}
