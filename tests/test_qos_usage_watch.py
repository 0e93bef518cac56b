"""UsageWatch on real perf events bound to a real cgroup (the cgroup2 mount: v2, or `unified` on v1)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from koordnode.qos.collect import Collector
from koordnode.qos.usage_watch import UsageWatch

CG = Path("/sys/fs/cgroup")


def _perf_dir(cgroup: str) -> str | None:
    return Collector("/proc", str(CG)).perf_cgroup_dir(cgroup)


@pytest.fixture
def cgroup():
    if os.geteuid() != 0:
        pytest.skip("needs root")
    name = f"/koordnode-usage-test-{uuid.uuid4().hex[:8]}"
    directory = _perf_dir(name)
    if directory is None:
        pytest.skip("no hierarchy for perf cgroup events")
    Path(directory).mkdir()
    yield directory
    deadline = time.monotonic() + 5
    while True:
        try:
            Path(directory).rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _spawn_in(directory: str, code: str) -> tuple[subprocess.Popen, float]:
    """A process whose `code` starts 0.5 s after it was spawned, moved into `directory` once
    the interpreter's own start-up (a burst of CPU) is over. Returns it and when `code` starts."""
    spawned = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(0.5)\n{code}"])
    time.sleep(0.35)
    Path(directory, "cgroup.procs").write_text(str(proc.pid))
    return proc, spawned + 0.5


async def _watch(directory: str, seconds: float, code: str | None) -> tuple[list[tuple[float, str]], UsageWatch, float]:
    loop = asyncio.get_running_loop()
    wakes: list[tuple[float, str]] = []
    proc, started = _spawn_in(directory, code) if code else (None, time.monotonic())
    watch = UsageWatch(period_ns=10_000_000, min_rate=0.1, on_wake=lambda n: wakes.append((time.monotonic(), n)))
    watch.start(loop)
    watch.set_targets({"ls": directory})
    if "perf-events" not in watch.mode:
        watch.stop()
        pytest.skip(f"perf cgroup events unavailable: {watch.mode}")
    try:
        await asyncio.sleep(seconds)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        watch.stop()
    return wakes, watch, started


def test_a_busy_cgroup_wakes_once_until_rearmed(cgroup):
    wakes, watch, started = asyncio.run(_watch(cgroup, 1.5, "while True: pass"))
    assert [name for _, name in wakes] == ["ls"], wakes  # one wake, then the events rest
    # 10 ms of CPU at ~1 CPU: well under a tick; generous bound for a loaded machine.
    assert wakes[0][0] - started < 1.0, wakes[0][0] - started
    assert watch.status()["wakeups"] == 1


def test_an_idle_or_lightly_used_cgroup_does_not_wake(cgroup):
    # ~1% of a CPU (0.2 ms of work every 20 ms), under the 10% rate the tests use (min_rate 0.1:
    # a busy loop on this shared 2-CPU machine may get well under the 0.5 CPU of the default).
    light = "import time\nwhile True:\n    t = time.perf_counter()\n    while time.perf_counter() - t < 0.0002: pass\n    time.sleep(0.02)"
    wakes, watch, _ = asyncio.run(_watch(cgroup, 2.0, light))
    assert wakes == []


def test_rearm_after_a_wake_sees_the_next_step(cgroup):
    async def run() -> list:
        loop = asyncio.get_running_loop()
        wakes: list[str] = []
        proc, _ = _spawn_in(cgroup, "while True: pass")
        watch = UsageWatch(period_ns=10_000_000, min_rate=0.1, on_wake=wakes.append)
        watch.start(loop)
        watch.set_targets({"ls": cgroup})
        if "perf-events" not in watch.mode:
            watch.stop()
            pytest.skip(f"perf cgroup events unavailable: {watch.mode}")
        try:
            await asyncio.sleep(0.8)
            watch.rearm()  # the tick after the wake
            await asyncio.sleep(0.8)
        finally:
            proc.kill()
            proc.wait()
            watch.stop()
        return wakes

    assert asyncio.run(run()) == ["ls", "ls"]


def test_missing_cgroup_is_reported_not_raised():
    async def run() -> dict:
        watch = UsageWatch(period_ns=10_000_000, min_rate=0.5, on_wake=lambda n: None)
        watch.start(asyncio.get_running_loop())
        watch.set_targets({"gone": "/sys/fs/cgroup/unified/koordnode-no-such-cgroup"})
        status = watch.status()
        watch.stop()
        return status

    status = asyncio.run(run())
    assert "gone" in status["missing"]


def test_disabled_by_configuration():
    watch = UsageWatch(period_ns=0, min_rate=0.5, on_wake=lambda n: None)
    assert watch.mode.startswith("off") and not watch.active


def test_event_budget_is_bounded():
    from koordnode.qos.usage_watch import MAX_EVENTS

    async def run() -> dict:
        # More CPUs than the budget allows for even one cgroup: nothing is opened, it is said.
        watch = UsageWatch(period_ns=10_000_000, min_rate=0.5, on_wake=lambda n: None,
                           cpus=list(range(MAX_EVENTS + 1)))
        watch.start(asyncio.get_running_loop())
        watch.set_targets({"ls": "/sys/fs/cgroup"})
        status = watch.status()
        watch.stop()
        return status

    status = asyncio.run(run())
    assert "not watched" in status["missing"]["ls"] and status["armed"] == []


def test_rearm_touches_only_the_events_a_wake_disabled(cgroup, monkeypatch):
    """After a tick, only events a wake disabled need re-arming: with none, rearm() makes no
    system call (before: a reset per event per tick); after a wake it re-enables them."""
    import koordnode.executor.perf_events as perf_events  # the ioctls are made there
    import koordnode.qos.usage_watch as usage_watch

    ioctls: list[int] = []
    real_ioctl = perf_events.fcntl.ioctl

    def counting(fd, request, arg=0):  # noqa: ANN001, ANN202 - a spy on the real ioctl
        ioctls.append(request)
        return real_ioctl(fd, request, arg)

    async def run() -> tuple[list[int], list[int], bool, list[str]]:
        loop = asyncio.get_running_loop()
        wakes: list[str] = []
        watch = UsageWatch(period_ns=10_000_000, min_rate=0.1, on_wake=wakes.append)
        watch.start(loop)
        watch.set_targets({"ls": cgroup})
        if "perf-events" not in watch.mode:
            watch.stop()
            pytest.skip(f"perf cgroup events unavailable: {watch.mode}")
        monkeypatch.setattr(perf_events.fcntl, "ioctl", counting)
        proc = None
        try:
            assert not watch.needs_rearm
            watch.rearm()  # a tick with no wake before it
            idle_ioctls = list(ioctls)
            proc, _ = _spawn_in(cgroup, "while True: pass")
            for _ in range(100):
                await asyncio.sleep(0.02)
                if wakes:
                    break
            needed = watch.needs_rearm
            ioctls.clear()
            watch.rearm()
            return idle_ioctls, list(ioctls), needed and not watch.needs_rearm, wakes
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()
            watch.stop()

    idle_ioctls, after_wake, needed, wakes = asyncio.run(run())
    assert idle_ioctls == []
    assert wakes == ["ls"] and needed
    cpus = len(usage_watch.online_cpus())
    assert after_wake.count(perf_events._IOC_ENABLE) == cpus  # every event of the woken cgroup
