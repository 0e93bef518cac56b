"""The cgroup/procfs executor: the only code that writes to the kernel.

Policy builds lists of CgroupWrite (koordnode.policy.plan); CgroupExecutor applies them.
"""

from koordnode.executor.executor import CgroupExecutor, ProcfsExecutor, WriteResult, WriteStatus
from koordnode.policy.plan import SysctlWrite
from koordnode.executor.paths import (
    CgroupDriver,
    CgroupRootError,
    CgroupVersion,
    UnsafePathError,
    container_cgroup_path,
    detect_cgroup_version,
    pod_cgroup_path,
)
from koordnode.policy.plan import CgroupWrite
from koordnode.executor.resources import (
    RESOURCES,
    InvalidValueError,
    UnknownResourceError,
    shares_to_weight,
)

__all__ = [
    "RESOURCES",
    "CgroupDriver",
    "CgroupExecutor",
    "CgroupRootError",
    "CgroupVersion",
    "CgroupWrite",
    "InvalidValueError",
    "ProcfsExecutor",
    "SysctlWrite",
    "UnknownResourceError",
    "UnsafePathError",
    "WriteResult",
    "WriteStatus",
    "container_cgroup_path",
    "detect_cgroup_version",
    "pod_cgroup_path",
    "shares_to_weight",
]
