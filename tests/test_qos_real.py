"""The QoS manager on this machine's real cgroups (v1 cpu/cpuacct + the cgroup2 mount for
PSI): the BE tier quota goes down when an LS pod gets busy and comes back when it idles.
No containerd: the pods are test cgroups holding plain busy loops."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from support.host_cgroups import CGROUP, make_cgroups, remove_cgroups

from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.config.components import ManagerSettings
from koordnode.qos.manager import QoSManager
from koordnode.config.strategies import CpuSuppressConfig, StrategyConfig
from koordnode.config.qos_manager import QoSManagerConfig
from koordnode.model.state import NodeState, PodRecord

HIERARCHIES = ("cpu", "cpuacct", "unified")
CPUS = os.cpu_count() or 1
FLOOR = 2000

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all((CGROUP / h / "cgroup.procs").exists() for h in HIERARCHIES),
    reason="needs root, cgroup v1 cpu and cpuacct, and the cgroup2 unified mount",
)

LS_WORKER = r"""
import signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGUSR2})
print("ready", flush=True)
while True:
    signal.sigwait({signal.SIGUSR1})
    while signal.SIGUSR2 not in signal.sigpending():
        for _ in range(20000):
            pass
    signal.sigwait({signal.SIGUSR2})
"""


@pytest.fixture
def bed():
    prefix = f"/koordnode-test-qos-{uuid.uuid4().hex[:8]}"
    kubepods = f"{prefix}/kubepods"
    pods = {"ls": f"{kubepods}/burstable/podls", "be": f"{kubepods}/besteffort/podbe"}
    created: list[Path] = []
    procs: list[subprocess.Popen] = []
    try:
        created = make_cgroups(pods.values(), HIERARCHIES)
        (CGROUP / "cpu" / kubepods.strip("/") / "besteffort" / "cpu.shares").write_text("2")

        def spawn(code: str, pod: str) -> subprocess.Popen:
            proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
            procs.append(proc)
            for h in HIERARCHIES:
                (CGROUP / h / pods[pod].strip("/") / "cgroup.procs").write_text(str(proc.pid))
            return proc

        for _ in range(CPUS):
            spawn("while True: pass", "be")
        ls_workers = [spawn(LS_WORKER, "ls") for _ in range(CPUS + 1)]
        # SIGUSR1 kills a worker that has not blocked it yet: the test signals only ready workers
        for worker in ls_workers:
            assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
        yield kubepods, pods, ls_workers
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=10)
        remove_cgroups(created)


def _budget_follows_its_inputs(inputs: dict) -> None:
    """The decision's BE budget and target are the formula applied to the usage it measured
    (cpu_suppress with its threshold; no LS pressure curve points are crossed here unless the
    ratio says so): what koordnode decides from what it saw, whatever else loads the host."""
    raw = (inputs["node_cpus"] * inputs["threshold_percent"] / 100.0 - inputs["ls_used_cpus"]
           - max(inputs["system_used_cpus"], inputs["reserved_cpus"]))
    assert abs(inputs["budget_before_ratio_cpus"] - raw) < 0.01, inputs
    budget = max(0.0, raw) * inputs["pressure_ratio"]
    assert abs(inputs["be_budget_cpus"] - budget) < 0.01, inputs
    assert abs(inputs["target_quota_us"] - max(FLOOR, budget * inputs["period_us"])) <= 0.01 * inputs["period_us"], inputs


@pytest.mark.timeout(90)
def test_be_tier_quota_follows_a_real_ls_load(bed):
    """The BE tier's quota follows the decision, and the decision follows the LS load it
    measured: LS busy shows in `ls_used_cpus` and lowers the budget by what LS uses. Never a
    fixed figure for the idle budget: CI's own builds run beside this test (a cold run had
    1.48 of 2 CPUs of system use, so a budget of 0 was right)."""
    kubepods, pods, ls_workers = bed
    quota_file = CGROUP / "cpu" / kubepods.strip("/") / "besteffort" / "cpu.cfs_quota_us"
    state = NodeState()
    state.put_pod(PodRecord("ls", "ls", "test", "uid-ls", {}, {}, pods["ls"], qos_class="LS"))
    state.put_pod(PodRecord("be", "be", "test", "uid-be", {}, {}, pods["be"], qos_class="BE"))
    # threshold 100 %: the largest budget a busy host leaves; no quiet state (LS idle would
    # lift the quota): the quota's path
    config = ManagerSettings(StrategyConfig(cpu_suppress=CpuSuppressConfig(threshold_percent=100, ls_quiet_percent=0)),
                         QoSManagerConfig(tick_ms=200, kubepods_cgroup=kubepods))
    manager = QoSManager(config, state, CgroupExecutor(CGROUP))

    def quota() -> int:
        return int(quota_file.read_text())

    def decision_inputs() -> dict:
        return dict((manager.status()["strategies"]["cpu_suppress"]["decision"] or {}).get("inputs", {}))

    async def until(condition, timeout: float) -> dict:
        """The decision inputs once `condition(inputs)` holds."""
        started = time.monotonic()
        while True:
            inputs = decision_inputs()
            if inputs.get("target_quota_us") is not None and condition(inputs):
                return inputs
            if time.monotonic() - started > timeout:
                raise AssertionError(f"timed out; quota {quota()}, status {manager.status()['strategies']['cpu_suppress']}")
            await asyncio.sleep(0.02)

    def at_target(inputs: dict) -> bool:
        # the quota grows by at most 10 % of the node per tick and shrinks at once; a change
        # under min_change_percent (5 %) is not written
        return abs(quota() - inputs["target_quota_us"]) <= 0.06 * max(quota(), inputs["target_quota_us"])

    async def scenario() -> dict:
        stop = asyncio.Event()
        task = asyncio.create_task(manager.run(stop))
        try:
            idle = await until(lambda inputs: inputs["ls_used_cpus"] < 0.3 and at_target(inputs), 15)
            for worker in ls_workers:
                os.kill(worker.pid, signal.SIGUSR1)
            # LS busy on every CPU (one worker more than CPUs): at least 0.8 CPU of it measured,
            # and the quota at the lower target that follows from it
            busy = await until(lambda inputs: inputs["ls_used_cpus"] >= 0.8 and quota() <= inputs["target_quota_us"]
                               and at_target(inputs), 10)
            for worker in ls_workers:
                os.kill(worker.pid, signal.SIGUSR2)
            recovered = await until(lambda inputs: inputs["ls_used_cpus"] < 0.3 and at_target(inputs), 10)
            return {"idle": idle, "busy": busy, "recovered": recovered, "status": manager.status()}
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)

    result = asyncio.run(scenario())
    for phase in ("idle", "busy", "recovered"):
        _budget_follows_its_inputs(result[phase])
    status = result["status"]
    assert status["trigger_mode"].startswith(("psi-trigger", "polling"))
    assert status["strategies"]["cpu_suppress"]["last_write"]["status"] == "written"
    assert status["collector"]["errors"] == 0
