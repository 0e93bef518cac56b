"""Which core-scheduling cookie a pod's tasks get. Pure: no I/O.

The kernel runs two tasks on SMT siblings of one core at the same time only when they have the
same PR_SCHED_CORE cookie (untagged tasks: cookie 0). Two keys make the groups:

* ``[qos.<CLASS>] core_sched``: each pod of the class has a cookie of its own (an LSE pod owns
  its cores: no other pod's task, nor untagged work, on their siblings);
* ``[qos.<CLASS>] core_expeller`` (Koordinator's ``coreExpeller``: the expeller pods' tasks and
  the others never share a core): BE tasks get one cookie of their own, shared with the pods of
  the classes without core_expeller, so they never run beside the expellers' tasks. The
  expellers stay untagged, beside the node's own processes and SYSTEM pods (which are never
  tagged): the cost of the separation falls on BE, whose sibling runs only BE (or idles).
"""

from __future__ import annotations

from enum import Enum

from koordnode.config.classes import QoSConfig
from koordnode.model.qos_class import QoSClass


class Cookie(Enum):
    NONE = "none"  # untagged: not touched, or cleared of a cookie koordnode gave
    POD = "pod"  # a cookie of the pod's own
    SHARED = "shared"  # the one cookie of BE and the classes without core_expeller


def expeller_classes(qos: QoSConfig) -> tuple[QoSClass, ...]:
    return tuple(cls for cls in QoSClass if qos.for_class(cls).core_expeller)


def pod_cookie(qos_class: QoSClass, qos: QoSConfig) -> Cookie:
    """The cookie a pod of `qos_class` gets."""
    if qos.for_class(qos_class).core_sched:
        return Cookie.POD
    if qos_class is QoSClass.SYSTEM or not expeller_classes(qos):
        return Cookie.NONE
    if qos.for_class(qos_class).core_expeller:
        return Cookie.NONE
    return Cookie.SHARED


def in_use(qos: QoSConfig) -> bool:
    """Whether any class asks for cookies."""
    return any(qos.for_class(cls).core_sched or qos.for_class(cls).core_expeller for cls in QoSClass)


def describe(qos_class: QoSClass, qos: QoSConfig) -> str:
    """What the class's pods get, for status lines."""
    cookie = pod_cookie(qos_class, qos)
    expellers = ", ".join(cls.value for cls in expeller_classes(qos))
    if cookie is Cookie.POD:
        return "the pod's own cookie"
    if cookie is Cookie.SHARED:
        return f"BE's shared cookie (kept off the cores of {expellers})"
    if qos.for_class(qos_class).core_expeller:
        return "no cookie, BE kept off its cores"
    return ""
