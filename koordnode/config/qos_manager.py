"""``[qos_manager]``: the QoS manager's loop (ticks, PSI and usage wake-ups, history)."""

from __future__ import annotations

from dataclasses import dataclass

from koordnode.config.fields import setting
__all__ = ["QoSManagerConfig"]


def _absolute_cgroup(value: str) -> str | None:
    if value == "":
        return None
    if not value.startswith("/") or "\0" in value or "\n" in value:
        return f"expected an absolute cgroup path such as \"/kubepods\", got {value!r}"
    if any(part == ".." for part in value.split("/")):
        return "a cgroup path cannot contain '..'"
    return None


@dataclass(frozen=True)
class QoSManagerConfig:
    tick_ms: int = setting(1000, min=50, max=60000, doc="milliseconds between two regular ticks")
    kubepods_cgroup: str = setting(
        "", check=_absolute_cgroup,
        doc='kubelet\'s top pod cgroup, e.g. "/kubepods" (cgroupfs) or "/kubepods.slice" (systemd); '
        '"": from [cgroup] driver (auto: whichever of the two exists)',
    )
    psi_triggers: bool = setting(True, doc="wake up on LS CPU pressure between ticks")
    psi_stall_us: int = setting(
        20000, min=1, max=10_000_000, doc="stall time within the window that wakes the manager, microseconds",
    )
    psi_window_us: int = setting(
        500000, min=500000, max=10_000_000,
        doc="PSI trigger window, microseconds; without CAP_SYS_RESOURCE the kernel wants a multiple of 2 s",
    )
    psi_poll_ms: int = setting(
        50, min=0, max=10000,
        doc="when the kernel refuses triggers: how often pressure is polled instead; 0 = ticks only",
    )
    usage_wake_cpu_ms: float = setting(
        10.0, min=0, max=1000,
        doc="wake up when LS pods use this much CPU time on one CPU at half a CPU or more (kernel perf "
        "events on their cgroups, no polling); 0 = off",
    )
    wake_sample_ms: int = setting(
        20, min=0, max=1000,
        doc="a tick woken by pressure first samples LS usage for this long, to see the load as it is now",
    )
    reconcile_interval_s: float = setting(
        10.0, min=1, max=3600,
        doc="seconds between passes re-asserting values that only change on events (memory, bursts)",
    )
    history_length: int = setting(300, min=2, max=100000, doc="samples kept per series (ring buffer)")

    def validate(self) -> list[str]:
        if self.psi_stall_us > self.psi_window_us:
            return ["psi_stall_us: must not exceed psi_window_us"]
        return []

