"""The test bed with kubelet's systemd cgroup driver on cgroup v2 (the VM lane's guest).

Pods get kubelet's systemd slice names as cgroup parents
(``kubepods-burstable-pod<uid>.slice``), containerd runs runc with ``SystemdCgroup = true``
(containers land in ``cri-containerd-<id>.scope``), and :func:`kubelet_tiers` does what
kubelet's QoS manager does at start: it creates ``kubepods.slice`` and its
``kubepods-burstable.slice`` / ``kubepods-besteffort.slice`` through systemd
(StartTransientUnit over D-Bus, as kubelet does through libcontainer), BestEffort with the
minimum CPU weight.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from .containerd_bed import CGROUP_FS_ROOT, ContainerdBed

KUBEPODS_SLICE = "kubepods.slice"
_TIER = {"guaranteed": "", "burstable": "burstable", "besteffort": "besteffort"}


def slice_path(slice_name: str) -> str:
    """``kubepods-burstable-pod1.slice`` -> ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice``."""
    stem = slice_name.removesuffix(".slice")
    parts = stem.split("-")
    return "/" + "/".join("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))


def pod_slice(qos: str, uid: str) -> str:
    key = qos.replace("-", "").replace("_", "").lower()
    if key not in _TIER:
        raise ValueError(f"unknown QoS class {qos!r}")
    tier = _TIER[key]
    escaped = uid.replace("-", "_")  # kubelet escapes dashes in the uid
    return f"kubepods-{tier}-pod{escaped}.slice" if tier else f"kubepods-pod{escaped}.slice"


# runc's systemd cgroup manager (kubelet's) starts every unit with these; without them systemd
# may switch the io (and memory) controller off again below a slice when it realizes it.
ACCOUNTING = {"CPUAccounting": ("b", "true"), "MemoryAccounting": ("b", "true"),
              "IOAccounting": ("b", "true"), "TasksAccounting": ("b", "true")}


def start_transient_slice(name: str, properties: dict[str, tuple[str, object]]) -> None:
    """Create (or update) a slice through systemd's D-Bus API, as kubelet does."""
    properties = {**ACCOUNTING, **properties}
    if _unit_active(name):
        set_properties(name, properties)
        return
    args = ["busctl", "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager", "StartTransientUnit", "ssa(sv)a(sa(sv))", name, "replace",
            str(len(properties))]
    for key, (signature, value) in properties.items():
        args += [key, signature, str(value)]
    args.append("0")
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=30)
    # StartTransientUnit only queues a job: the cgroup appears when systemd has run it (seen
    # missing when the guest's second containerd release set the tiers up again).
    cgroup = CGROUP_FS_ROOT / slice_path(name).lstrip("/")
    deadline = time.monotonic() + 60
    while not cgroup.is_dir():
        if time.monotonic() > deadline:
            raise RuntimeError(f"systemd did not create {cgroup} for {name} within 60 s")
        time.sleep(0.1)


def set_properties(unit: str, properties: dict[str, tuple[str, object]], runtime: bool = True) -> None:
    """``systemctl set-property`` (what an operator, or kubelet's update path, does)."""
    assignments = [f"{key}={'yes' if value == 'true' else value}" for key, (_sig, value) in properties.items()]
    cmd = ["systemctl", "set-property"] + (["--runtime"] if runtime else []) + [unit, *assignments]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)


def _unit_active(name: str) -> bool:
    result = subprocess.run(["systemctl", "is-active", name], capture_output=True, text=True, timeout=30)
    return result.stdout.strip() == "active"


def enable_controllers(cgroup: str) -> None:
    """What runc's libcontainer (kubelet's cgroup manager) does after creating a slice through
    systemd: every available controller enabled in cgroup.subtree_control from the root down."""
    parts = [p for p in cgroup.strip("/").split("/") if p]
    directory = CGROUP_FS_ROOT
    for part in [None, *parts[:-1]]:
        if part is not None:
            directory = directory / part
        available = (directory / "cgroup.controllers").read_text().split()
        wanted = [c for c in ("cpu", "cpuset", "io", "memory", "pids") if c in available]
        (directory / "cgroup.subtree_control").write_text(" ".join("+" + c for c in wanted))


def kubelet_tiers(ncpu: int) -> None:
    """kubelet's QoS tiers: kubepods.slice, burstable, besteffort (CPUWeight 1 = cpu.shares 2)."""
    start_transient_slice(KUBEPODS_SLICE, {"CPUWeight": ("t", 100 * ncpu if ncpu > 1 else 100)})
    start_transient_slice("kubepods-burstable.slice", {"CPUWeight": ("t", 39 * ncpu)})
    start_transient_slice("kubepods-besteffort.slice", {"CPUWeight": ("t", 1)})
    for tier in ("kubepods-burstable.slice", "kubepods-besteffort.slice"):
        enable_controllers(slice_path(tier) + "/child")


def kubelet_pod_slice(parent_slice: str, cpu_weight: int, memory_max: int | None = None) -> str:
    """kubelet creating a pod's slice before RunPodSandbox; returns its cgroup path."""
    props: dict[str, tuple[str, object]] = {"CPUWeight": ("t", cpu_weight)}
    if memory_max:
        props["MemoryMax"] = ("t", memory_max)
    start_transient_slice(parent_slice, props)
    path = slice_path(parent_slice)
    enable_controllers(path + "/child")
    return path


class SystemdBed(ContainerdBed):
    """ContainerdBed with runc's systemd driver and kubelet's slice names (cgroup v2)."""

    def __init__(self, workdir: Path, **options) -> None:
        options.setdefault("cgroup_prefix", "")
        super().__init__(workdir, systemd_cgroup=True, **options)
        self.kubepods_cgroup = "/" + KUBEPODS_SLICE

    def pod_cgroup_parent(self, qos: str, uid: str) -> str:
        if not uid or "/" in uid:
            raise ValueError(f"invalid pod uid {uid!r}")
        return pod_slice(qos, uid)

    def pod_cgroup_dir(self, cgroup_parent: str) -> Path:
        return CGROUP_FS_ROOT / slice_path(cgroup_parent).lstrip("/")

    def container_cgroup_dir(self, cgroup_parent: str, container_id: str) -> Path:
        return self.pod_cgroup_dir(cgroup_parent) / f"cri-containerd-{container_id}.scope"

    def cgroup_path(self, controller: str, cgroup: str) -> Path:  # v2: one hierarchy
        return CGROUP_FS_ROOT / cgroup.lstrip("/")

    def cleanup_cgroups(self, subtree: str | None = None) -> list[Path]:
        # Pod slices belong to systemd: stopping one kills what is left in it and removes it.
        if subtree is not None:
            subprocess.run(["systemctl", "stop", subtree], capture_output=True, timeout=30)
        return []
