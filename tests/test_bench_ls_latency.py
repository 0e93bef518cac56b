"""bench/ls_latency.py's idle-latency hold: the PM QoS request it keeps during a run."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest

from bench import ls_latency
from bench.ls_latency import CPU_DMA_LATENCY, IdleLatencyHold, cpuidle_description, describe_idle

CPUS = Path("/sys/devices/system/cpu")


def _current_request_us() -> int:
    # Reading the device gives the effective CPU latency constraint, a binary s32 in us.
    with open(CPU_DMA_LATENCY, "rb") as f:
        return struct.unpack("=i", f.read(4))[0]


def _deep_state_entries() -> int:
    """Entries into idle states with a non-zero exit latency, all CPUs together."""
    total = 0
    for state in CPUS.glob("cpu[0-9]*/cpuidle/state[0-9]*"):
        if int((state / "latency").read_text()) > 0:
            total += int((state / "usage").read_text())
    return total


def test_a_hold_that_cannot_be_taken_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setattr(ls_latency, "CPU_DMA_LATENCY", tmp_path / "missing")
    with pytest.raises(SystemExit) as info:
        with IdleLatencyHold():
            pass
    assert "--no-idle-latency-hold" in str(info.value)
    assert "cannot hold" in str(info.value)


def test_the_header_names_the_hold_and_the_idle_states():
    idle = {"driver": "haltpoll", "governor": "haltpoll", "guest_halt_poll_ns": "0",
            "states": [{"name": "POLL", "exit_latency_us": 0, "disabled": False},
                       {"name": "haltpoll idle", "exit_latency_us": 1, "disabled": False}]}
    held = describe_idle(idle, True)
    assert "driver haltpoll" in held and "POLL (exit 0 us), haltpoll idle (exit 1 us)" in held
    assert f"held {CPU_DMA_LATENCY} = 0 us" in held
    assert "NOT held" in describe_idle(idle, False)


@pytest.mark.skipif(os.geteuid() != 0 or not CPU_DMA_LATENCY.exists(), reason="needs root and PM QoS")
def test_while_held_idle_cpus_stay_out_of_states_with_exit_latency():
    """Real kernel: with the request at 0 us the cpuidle governor may only pick 0-latency
    states (POLL), so no CPU enters a state with an exit latency while the hold lasts."""
    if not any(s["exit_latency_us"] for s in cpuidle_description()["states"]):
        pytest.skip("no idle state with an exit latency on this machine")
    with IdleLatencyHold():
        assert _current_request_us() == 0
        before = _deep_state_entries()
        time.sleep(0.3)  # the test's CPUs idle meanwhile
        assert _deep_state_entries() == before
