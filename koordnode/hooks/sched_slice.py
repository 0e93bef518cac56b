"""Keeps each pod's threads at its class's EEVDF slice (`[qos.<CLASS>] sched_slice_us`, BE's
the kernel's shortest; koordnode/executor/sched_slice.py says why), and says so for status:
called by the QoS engine for every pod it applies, at the hooks and in each reconcile pass
(children inherit a slice; a process started by an exec gets it at the next pass)."""

from __future__ import annotations

from collections.abc import Callable

import structlog

from koordnode.config.classes import QoSConfig
from koordnode.executor.sched_slice import SchedSlices
from koordnode.model.qos_class import QoSClass

log = structlog.get_logger("koordnode.hooks")


def keep_pod_slice(slices: SchedSlices, qos: QoSConfig, qos_class: QoSClass, pids: Callable[[], list[int]],
                   pod: str) -> str:
    """The pod's threads (of `pids()`, read only when needed) at the class's slice; the pod's
    state for status, "" when its class asks for none. `pod`: its cgroup."""
    slice_us = qos.for_class(qos_class).sched_slice_us
    if not slice_us and not slices.may_hold(pod):
        return ""  # nothing to give, nothing to take back: no system call
    unavailable = slices.unavailable
    if unavailable is not None:
        return f"unavailable: {unavailable}" if slice_us else ""
    result = slices.keep(pids(), slice_us * 1000, pod)
    if result.errors:
        log.warning("sched_slice_not_kept", pod=pod, errors=list(result.errors[:5]))
        return f"failed for {len(result.errors)} thread(s): {result.errors[0]}"
    if not slice_us:
        return ""
    if not result.tasks:
        return f"{slice_us} us: no thread running yet"
    return f"{slice_us} us for {result.tasks} thread(s)"
