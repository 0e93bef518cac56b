"""``[node]``: CPUs kept away from pods, SYSTEM pods' CPUs and the block devices of the blkio policy."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from koordnode.model.cpulist import CpuListError, parse_cpu_list

__all__ = ["NodeConfig"]

_DEVICE = re.compile(r"^\d+:\d+$")


@dataclass(frozen=True)
class NodeConfig:
    """[node]: CPUs kept away from pods and devices the blkio policy applies to."""

    # A CPU list string ("0-1") or a count (int: that many CPUs, lowest-numbered whole cores
    # first). "" or 0: nothing reserved. Reserved CPUs are in neither the LS nor the BE pool.
    reserved_cpus: str | int = field(default="", metadata={"doc": 'CPUs kept away from every pod pool: a CPU list ("0-1") or a count (lowest-numbered whole cores); "" = none'})
    # CPU list for SYSTEM pods; "" = they use the LS share pool.
    system_cpus: str = field(default="", metadata={"doc": 'CPU list for SYSTEM pods; "" = they use the LS share pool'})
    # Exclusive allocations never take the last CPUs of the share pool: LS, BE and fallback
    # containers need somewhere to run that is not someone else's exclusive core.
    min_shared_cpus: int = field(default=1, metadata={"doc": "CPUs the LS share pool always keeps: an LSE/LSR allocation that would leave fewer falls back to the share pool (0 = exclusive CPUs may take the whole node)", "min": 0, "max": 8192})
    # Block devices ("MAJ:MIN") for blkio throttling (BE read/write bps).
    blkio_devices: tuple[str, ...] = field(default=(), metadata={"doc": 'block devices ("MAJ:MIN") the per-class disk throttles apply to'})
    # Also set cpuset_mems to the NUMA nodes of the CPUs handed out (off: memory may come
    # from any node, which avoids OOM when the local node is full).
    cpuset_mems_follow_cpus: bool = field(default=False, metadata={"doc": "also pin memory to the NUMA nodes of the CPUs handed out"})

    def __post_init__(self) -> None:
        reserved = self.reserved_cpus
        if isinstance(reserved, bool) or not isinstance(reserved, (str, int)):
            raise ValueError(f"reserved_cpus must be a CPU list string or a count, got {reserved!r}")
        if isinstance(reserved, int) and reserved < 0:
            raise ValueError(f"reserved_cpus = {reserved}: a count must be >= 0")
        if isinstance(reserved, str):
            try:
                parse_cpu_list(reserved)
            except CpuListError as error:
                raise ValueError(f"reserved_cpus: {error}") from None
        if not isinstance(self.system_cpus, str):
            raise ValueError(f"system_cpus must be a CPU list string, got {self.system_cpus!r}")
        try:
            parse_cpu_list(self.system_cpus)
        except CpuListError as error:
            raise ValueError(f"system_cpus: {error}") from None
        if isinstance(self.min_shared_cpus, bool) or not isinstance(self.min_shared_cpus, int) \
                or not 0 <= self.min_shared_cpus <= 8192:
            raise ValueError(f"min_shared_cpus must be an integer in [0, 8192], got {self.min_shared_cpus!r}")
        devices = self.blkio_devices
        if isinstance(devices, str) or not isinstance(devices, (list, tuple)):
            raise ValueError(f'blkio_devices must be a list of "MAJ:MIN", got {devices!r}')
        for device in devices:
            if not isinstance(device, str) or not _DEVICE.match(device):
                raise ValueError(f'blkio_devices: {device!r} is not "MAJ:MIN"')
        # TOML gives a list; keep the dataclass hashable.
        object.__setattr__(self, "blkio_devices", tuple(devices))
        if not isinstance(self.cpuset_mems_follow_cpus, bool):
            raise ValueError("cpuset_mems_follow_cpus must be true or false")

    @property
    def system_cpu_set(self) -> frozenset[int]:
        return parse_cpu_list(self.system_cpus)
