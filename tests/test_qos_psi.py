"""PSI triggers: registration and wake-up for real on this machine's cgroup2 pressure files,
the refusal of sub-2 s windows without CAP_SYS_RESOURCE, and the polling fallback."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from support.fakeproc import format_pressure
from koordnode.qos.psi import MODE_TRIGGER, PressureWatch, PsiTrigger, TriggerFileMissing, TriggerRefused

UNIFIED = Path("/sys/fs/cgroup/unified")
CAP_SYS_RESOURCE = 24


def _has_cap_sys_resource() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    return False


def _psi_root() -> Path | None:
    if os.geteuid() != 0:
        return None
    if (UNIFIED / "cgroup.procs").exists() and (UNIFIED / "cpu.pressure").exists():
        return UNIFIED
    if Path("/sys/fs/cgroup/cgroup.controllers").exists() and Path("/sys/fs/cgroup/cpu.pressure").exists():
        return Path("/sys/fs/cgroup")
    return None


PSI_ROOT = _psi_root()
needs_psi = pytest.mark.skipif(PSI_ROOT is None, reason="needs root and a cgroup2 mount with PSI")
# Unprivileged triggers need a window that is a multiple of 2 s, and the kernel evaluates
# them every 2 s: a wake-up takes 2-4 s.
WINDOW_US = 2_000_000
STALL_US = 100_000


@pytest.fixture
def pressured_cgroup():
    """A cgroup2 cgroup (the hybrid `unified` mount here) holding more busy loops than CPUs."""
    assert PSI_ROOT is not None
    path = PSI_ROOT / f"koordnode-test-psi-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    procs: list[subprocess.Popen] = []

    def start_pressure() -> None:
        for _ in range(2 * (os.cpu_count() or 1) + 1):
            proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            procs.append(proc)
            (path / "cgroup.procs").write_text(str(proc.pid))

    try:
        yield path, start_pressure
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while True:
            try:
                path.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


@needs_psi
@pytest.mark.skipif(_has_cap_sys_resource(), reason="with CAP_SYS_RESOURCE any window >= 500 ms is accepted")
def test_sub_two_second_window_is_refused_without_cap_sys_resource():
    with pytest.raises(TriggerRefused):
        PsiTrigger("/proc/pressure/cpu", 50_000, 500_000)


def test_trigger_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError):
        PsiTrigger("/proc/pressure/cpu", 600_000, 500_000)
    with pytest.raises(ValueError):
        PsiTrigger("/proc/pressure/cpu", 1, 2_000_000, kind="half")
    with pytest.raises(TriggerFileMissing):
        PsiTrigger(str(tmp_path / "nope" / "cpu.pressure"), STALL_US, WINDOW_US)


@needs_psi
@pytest.mark.timeout(30)
def test_real_trigger_fires_under_cpu_pressure(pressured_cgroup):
    path, start_pressure = pressured_cgroup
    trigger = PsiTrigger(str(path / "cpu.pressure"), STALL_US, WINDOW_US)
    try:
        assert trigger.wait(0) is False  # no pressure yet
        start_pressure()
        started = time.monotonic()
        assert trigger.wait(10.0), "no PSI event within 10 s of saturating the cgroup"
        assert time.monotonic() - started < 10.0
    finally:
        trigger.close()


@needs_psi
@pytest.mark.timeout(30)
def test_pressure_watch_wakes_the_event_loop(pressured_cgroup):
    path, start_pressure = pressured_cgroup

    async def scenario() -> tuple[str, dict]:
        woke: asyncio.Queue[str] = asyncio.Queue()
        watch = PressureWatch(stall_us=STALL_US, window_us=WINDOW_US, poll_interval_s=0.1,
                              on_wake=woke.put_nowait)
        watch.set_targets({"ls": str(path / "cpu.pressure"), "gone": str(path / "nope" / "cpu.pressure")})
        watch.start()
        try:
            assert watch.mode == MODE_TRIGGER
            assert watch.status()["armed"] == ["ls"]
            assert "gone" in watch.status()["missing"]
            start_pressure()
            target = await asyncio.wait_for(woke.get(), 10.0)
            return target, watch.status()
        finally:
            watch.stop()

    target, status = asyncio.run(scenario())
    assert target == "ls"
    assert status["wakeups"] >= 1 and status["last_wake"]["target"] == "ls"


@needs_psi
@pytest.mark.timeout(30)
def test_trigger_on_a_removed_cgroup_is_disarmed():
    assert PSI_ROOT is not None
    path = PSI_ROOT / f"koordnode-test-psi-{uuid.uuid4().hex[:8]}"
    path.mkdir()

    async def scenario() -> dict:
        watch = PressureWatch(stall_us=STALL_US, window_us=WINDOW_US, poll_interval_s=0.1, on_wake=lambda _: None)
        watch.set_targets({"pod": str(path / "cpu.pressure")})
        watch.start()
        try:
            assert watch.status()["armed"] == ["pod"]
            path.rmdir()
            for _ in range(100):
                await asyncio.sleep(0.02)
                if not watch.status()["armed"]:
                    break
            return watch.status()
        finally:
            watch.stop()

    try:
        status = asyncio.run(scenario())
    finally:
        if path.exists():
            path.rmdir()
    assert status["armed"] == [] and status["wakeups"] == 0
    assert "went away" in status["missing"]["pod"]


@needs_psi
@pytest.mark.skipif(_has_cap_sys_resource(), reason="with CAP_SYS_RESOURCE the trigger is accepted")
def test_refused_trigger_falls_back_to_polling_and_says_why():
    async def scenario() -> dict:
        watch = PressureWatch(stall_us=50_000, window_us=500_000, poll_interval_s=0.05, on_wake=lambda _: None)
        watch.set_targets({"node": "/proc/pressure/cpu"})
        watch.start()
        try:
            await asyncio.sleep(0.12)  # a couple of polling rounds run
            return watch.status()
        finally:
            watch.stop()

    status = asyncio.run(scenario())
    assert status["mode"].startswith("polling (EINVAL")
    assert "CAP_SYS_RESOURCE" in status["mode"]
    assert status["armed"] == ["node"] and status["poll_interval_ms"] == 50


def test_polling_fires_on_stall_growth_once_per_window(tmp_path):
    pressure = tmp_path / "cpu.pressure"
    pressure.write_text(format_pressure(0))
    now = [0.0]
    fired: list[str] = []
    watch = PressureWatch(stall_us=50_000, window_us=500_000, poll_interval_s=0.1, on_wake=fired.append,
                          use_triggers=False, clock=lambda: now[0])
    watch.set_targets({"ls": str(pressure)})
    watch.start(asyncio.new_event_loop())
    try:
        assert watch.mode.startswith("polling (PSI triggers disabled")

        def poll(at: float, total: int) -> list[str]:
            now[0] = at
            pressure.write_text(format_pressure(total))
            return watch.poll_once()

        assert poll(0.0, 0) == []
        assert poll(0.1, 20_000) == []  # 20 ms stalled in 100 ms: below 50 ms
        assert poll(0.2, 60_000) == ["ls"]  # 60 ms within the window
        assert poll(0.3, 200_000) == []  # still pressed, but at most once per window
        assert poll(0.71, 400_000) == ["ls"]  # a window later
        assert poll(1.5, 400_000) == []  # calm
        assert fired == ["ls", "ls"] and watch.wakeups == 2
    finally:
        loop = watch._loop
        watch.stop()
        loop.close()


def test_a_plain_file_is_not_taken_for_a_pressure_file(tmp_path):
    fake = tmp_path / "cpu.pressure"
    fake.write_text(format_pressure(5))
    with pytest.raises(TriggerRefused) as refused:
        PsiTrigger(str(fake), STALL_US, WINDOW_US)
    assert "not a kernel pressure file" in str(refused.value)
    assert fake.read_text() == format_pressure(5)  # nothing written into it
