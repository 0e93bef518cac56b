"""Keeps each pod's processes at the core-scheduling cookie its class gets
(koordnode/policy/core_sched.py), and says so for status: called by the QoS engine for every
pod it applies, at the hooks and in each reconcile pass (children inherit a cookie; a process
started by an exec gets it at the next pass)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from koordnode.config.classes import QoSConfig
from koordnode.executor.core_sched import CoreScheduling, CoreSchedResult
from koordnode.model.qos_class import QoSClass
from koordnode.policy.core_sched import Cookie, expeller_classes, in_use, pod_cookie

log = structlog.get_logger("koordnode.hooks")
RELISTS = 2  # bounded: a pod forking without pause is caught by the next reconcile pass


def keep_pod_cookie(core: CoreScheduling, qos: QoSConfig, qos_class: QoSClass,
                    pids: Callable[[], list[int]], pod: str) -> str:
    """The pod's processes (`pids()`, read only when needed) at their cookie; the pod's state
    for status, "" when its class asks for nothing."""
    cookie = pod_cookie(qos_class, qos)
    expeller = qos.for_class(qos_class).core_expeller
    asks = cookie is not Cookie.NONE or expeller
    if not asks and not core.gave_any:
        return ""  # nothing to give, nothing to take back: no syscall
    unavailable = core.unavailable
    if unavailable is not None:
        return f"unavailable: {unavailable}" if asks else ""
    result = _one_pass(core, cookie, pids())
    for _ in range(RELISTS):
        # A process forked between the listing and the tagging inherited its parent's old
        # cookie: list again until a pass finds nothing left to change.
        if result.errors or not (result.shared or result.cleared):
            break
        result = _one_pass(core, cookie, pids())
    if result.errors:
        log.warning("core_sched_cookie_not_kept", pod=pod, errors=list(result.errors[:5]))
        return f"failed for {len(result.errors)} process(es): {result.errors[0]}"
    if not asks:
        return ""
    if cookie is Cookie.NONE:
        return "on: no cookie, BE tasks kept off its cores"
    if not result.processes:
        return "on: no process running yet"
    if cookie is Cookie.POD:
        return f"on: {result.processes} process(es) share the pod's cookie"
    expellers = ", ".join(cls.value for cls in expeller_classes(qos))
    return f"on: {result.processes} process(es) share BE's cookie, kept off the cores of {expellers}"


def _one_pass(core: CoreScheduling, cookie: Cookie, processes: list[int]) -> CoreSchedResult:
    if cookie is Cookie.POD:
        return core.share(processes)
    if cookie is Cookie.SHARED:
        return core.share_group(processes)
    return core.clear(processes)


def node_status(core: CoreScheduling, qos: QoSConfig) -> dict[str, Any]:
    """`status.qos.core_sched`: the classes with a cookie per pod, the classes that keep BE off
    their cores, and whether the kernel gives cookies."""
    classes = [cls.value for cls in QoSClass if qos.for_class(cls).core_sched]
    expellers = [cls.value for cls in expeller_classes(qos)]
    if not in_use(qos):
        return {"classes": [], "expellers": [], "state": "off (no [qos.<CLASS>] core_sched nor core_expeller)"}
    unavailable = core.unavailable
    return {"classes": classes, "expellers": expellers,
            "state": "on" if unavailable is None else f"unavailable: {unavailable}"}
