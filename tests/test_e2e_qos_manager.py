"""The QoS manager on the test bed: the BE tier's quota follows the LS pods' load."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from koordnode.cri import api_pb2 as pb
import socket
import urllib.request

from support.cri import Cri, container_config, remove_pod, run_pod, sandbox_config, start_container
from support.koordnode_runner import KoordnodeProcess
from support.kubelet_tiers import prepare_qos_tiers

pytestmark = pytest.mark.e2e

CG = Path("/sys/fs/cgroup")


def be_group_file(kubepods: str, name: str) -> int:
    # BestEffort pods run in koordnode's BE group, whose quota and idle flag the manager sets.
    return int((CG / "cpu" / kubepods.lstrip("/") / "koordnode_be" / name).read_text())


def be_quota(kubepods: str) -> int:
    return be_group_file(kubepods, "cpu.cfs_quota_us")


def wait_quota(kubepods: str, predicate, timeout_s: float) -> list[int]:
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen.append(be_quota(kubepods))
        if predicate(seen[-1]):
            return seen
        time.sleep(0.1)
    raise AssertionError(f"BE tier quota never satisfied the condition; seen {seen[-20:]}")


def wait_group(kubepods: str, wanted: tuple[int, int, int], timeout_s: float) -> list[tuple[int, int, int]]:
    """Wait for the group's (quota, cpu.idle, cpu.shares); what was seen on the way."""
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen.append(tuple(be_group_file(kubepods, name) for name in ("cpu.cfs_quota_us", "cpu.idle", "cpu.shares")))
        if seen[-1] == wanted:
            return seen
        time.sleep(0.1)
    raise AssertionError(f"BE group never reached {wanted}; seen {seen[-20:]}")


def be_quota_metric(port: int) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    line = next(line for line in body.splitlines() if line.startswith("koordnode_be_cpu_quota_cores "))
    return float(line.split()[1])


def quota_writes(log_path: Path) -> list[tuple[int, int, str]]:
    """(old, new, reason) of each BE group cfs_quota_us write koordnode logged, in order."""
    writes = []
    for line in log_path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "cgroup_write" and str(event.get("path", "")).endswith("koordnode_be/cpu.cfs_quota_us"):
            writes.append((int(event["old"]), int(event["new"]), str(event.get("reason", ""))))
    return writes


def test_be_tier_quota_goes_down_when_ls_gets_busy_and_comes_back(containerd_bed, tmp_path):
    bed = containerd_bed
    kubepods = bed.kubepods_cgroup
    prepare_qos_tiers(kubepods)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    koordnode = KoordnodeProcess(tmp_path / "kn", str(bed.socket), kubepods=kubepods,
                                 metrics_listen=f"127.0.0.1:{port}").start()
    cri = Cri(koordnode.listen)
    pods = []
    try:
        be_sb = sandbox_config(bed, "batch", qos="besteffort")
        pods.append(run_pod(cri, be_sb))
        start_container(cri, pods[-1], be_sb, container_config(bed, "burn", ["sh", "-c", "while :; do :; done"]))
        ls_sb = sandbox_config(bed, "web", qos="burstable", labels={"koordinator.sh/qosClass": "LS"})
        pods.append(run_pod(cri, ls_sb))
        ls_cid = start_container(cri, pods[-1], ls_sb, container_config(
            bed, "web", ["sleep", "3600"], resources={"cpu_shares": 2048}))

        # Quiet LS: BE unthrottled, the group not idle at the lowest weight (made idle, shares
        # read 3, when the first BE pod came).
        wait_group(kubepods, (-1, 0, 2), 15)
        started = time.monotonic()
        # Two busy loops for 8 s, detached from the exec's output so ExecSync returns at once.
        busy = "timeout 8 sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 &"
        cri.rt.ExecSync(pb.ExecSyncRequest(container_id=ls_cid, cmd=["sh", "-c", f"{busy} {busy} exit 0"],
                                           timeout=5), timeout=10)
        wait_quota(kubepods, lambda q: 0 < q <= 2000, 5)
        reaction = time.monotonic() - started
        assert be_group_file(kubepods, "cpu.idle") == 1  # suppressed: the group is idle too
        assert 0 <= be_quota_metric(port) <= 0.05  # the gauge follows: 2000 us per 100000 us period
        # The LS load ends after 8 s; the quota grows back (at most 10% of the node per tick)
        # and is lifted at its target.
        wait_group(kubepods, (-1, 0, 2), 30)
        # Back up by at most 10 % of the node (20000 us of 2 CPUs) per tick, then lifted once LS
        # is quiet. How many steps depends on what else the machine runs (the budget is what LS
        # and the system leave): a busy machine's budget can be within one step of the floor.
        writes = quota_writes(koordnode.log_path)
        floor = max(i for i, (_, new, _) in enumerate(writes) if new == 2000)
        recovery = writes[floor + 1:]
        assert recovery and recovery[-1][1] == -1 and "LS quiet" in recovery[-1][2], recovery
        for old, new, reason in recovery[:-1]:
            assert old < new <= old + 20000 + 200, (old, new, reason)  # the growth limit (+ rounding)
        status = koordnode.status()["qos_manager"]
        suppress = status["strategies"]["cpu_suppress"]
        assert suppress["last_write"]  # explained: inputs, decision, value written and when
        print(f"BE quota floor reached {reaction:.2f} s after the LS step, mode {status['trigger_mode']}")
        assert reaction < 3
    finally:
        for sid in pods:
            remove_pod(cri, sid)
        cri.close()
        koordnode.stop()
