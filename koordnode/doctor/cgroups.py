"""The cgroup checks: the hierarchy and its controllers, the drivers of containerd, kubelet and
koordnode, and the files the classes' values need."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from koordnode.doctor.node_configs import containerd_settings, kubelet_settings
from koordnode.doctor.report import ACTIVE, DEGRADED, FAIL, OK, WARN, DoctorPaths, Report

V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "blkio")
V2_CONTROLLERS = ("cpu", "cpuset", "memory", "io")


def check_cgroup(report: Report, paths: DoctorPaths) -> str | None:
    root = Path(paths.cgroup_root)
    if (root / "cgroup.controllers").is_file():
        controllers = (root / "cgroup.controllers").read_text().split()
        missing = [c for c in V2_CONTROLLERS if c not in controllers]
        report.facts["cgroup_version"] = "v2"
        if missing:
            report.add("cgroup", FAIL, f"cgroup v2 at {root}, controllers missing: {', '.join(missing)}",
                       "enable them (cgroup_enable= on the kernel command line) or use another kernel")
        elif not os.access(root, os.W_OK):
            report.add("cgroup", FAIL, f"cgroup v2 at {root} is not writable",
                       "run koordnode as root, outside a read-only container mount")
        else:
            report.add("cgroup", OK, f"cgroup v2 at {root} (controllers: {' '.join(controllers)})")
        return "v2"
    present = [c for c in V1_CONTROLLERS if (root / c).is_dir()]
    if not present:
        report.add("cgroup", FAIL, f"no cgroup hierarchy under {root}",
                   "mount cgroup2 (or the v1 controllers) there, or set [cgroup] root")
        return None
    report.facts["cgroup_version"] = "v1"
    missing = [c for c in V1_CONTROLLERS if c not in present]
    unwritable = [c for c in present if not os.access(root / c, os.W_OK)]
    if missing or unwritable:
        report.add("cgroup", FAIL, f"cgroup v1 at {root}: missing {missing or 'none'}, "
                   f"not writable {unwritable or 'none'}",
                   "mount the missing v1 controllers writable, or run koordnode as root")
    else:
        report.add("cgroup", OK, f"cgroup v1 at {root} ({', '.join(present)} mounted and writable)")
    return "v1"


def check_drivers(report: Report, config: Any, paths: DoctorPaths, version: str | None) -> None:
    containerd = containerd_settings(paths.containerd_config)
    kubelet = kubelet_settings(paths.kubelet_config, paths.kubelet_flags)
    report.facts["containerd_config"] = containerd
    report.facts["kubelet"] = kubelet
    if containerd["error"]:
        report.add("containerd config", FAIL, f"{containerd['path']}: {containerd['error']}",
                   "fix the file: containerd will not start with it either")
    runtime_driver = None
    if containerd["found"] and not containerd["error"]:
        runtime_driver = "systemd" if containerd["systemd_cgroup"] else "cgroupfs"
    elif not containerd["found"]:
        runtime_driver = "cgroupfs"  # containerd's default (SystemdCgroup = false)
    kubelet_driver = kubelet["cgroup_driver"]
    if kubelet["config"] is None and kubelet["flags_file"] is None:
        kubelet_driver = None
    elif kubelet_driver is None:
        kubelet_driver = "cgroupfs"  # kubelet's default
    ours = config.cgroup.driver
    where = f"containerd {runtime_driver or '?'} ({paths.containerd_config}" + \
        ("" if containerd["found"] else ", not found: containerd's default") + ")"
    where += f", kubelet {kubelet_driver or '?'}"
    where += f", koordnode {ours}"
    if runtime_driver and kubelet_driver and runtime_driver != kubelet_driver:
        report.add("cgroup driver", FAIL, f"containerd and kubelet disagree: {where}",
                   "set the same driver in both (containerd: SystemdCgroup in the runc options; "
                   "kubelet: cgroupDriver), systemd is the usual choice with systemd as init")
    elif ours != "auto" and ours != (kubelet_driver or runtime_driver):
        report.add("cgroup driver", FAIL, f"koordnode's [cgroup] driver differs: {where}",
                   f"set [cgroup] driver = \"{kubelet_driver or runtime_driver}\" or \"auto\"")
    elif kubelet_driver is None:
        report.add("cgroup driver", WARN, f"{where}; kubelet's config not found "
                   f"({paths.kubelet_config}, {', '.join(paths.kubelet_flags)})",
                   "check that kubelet's cgroupDriver is the same as containerd's")
    else:
        report.add("cgroup driver", OK, where)
    if version == "v2" and (kubelet_driver or runtime_driver) == "cgroupfs" and _systemd_is_init(paths):
        report.add("cgroup driver on v2", WARN, "cgroupfs driver on a cgroup v2 node run by systemd",
                   "Kubernetes recommends the systemd driver with cgroup v2")


def _systemd_is_init(paths: DoctorPaths) -> bool:
    try:
        return Path(paths.procfs_root, "1", "comm").read_text().strip() == "systemd"
    except OSError:
        return False


def _any_child(root: Path) -> Path | None:
    """A cgroup below the root (files such as cpu.idle exist only there on v2)."""
    try:
        for entry in sorted(root.iterdir()):
            if entry.is_dir() and (entry / "cgroup.procs").exists():
                return entry
    except OSError:
        pass
    return None


def check_cgroup_files(report: Report, paths: DoctorPaths, version: str | None) -> None:
    root = Path(paths.cgroup_root)
    if version is None:
        return
    if version == "v2":
        child = _any_child(root) or root
        cpu_dir = io_dir = mem_dir = child
    else:
        cpu_dir, io_dir, mem_dir = root / "cpu", root / "blkio", root / "memory"
    has = {
        "cpu.idle": (cpu_dir / "cpu.idle").exists(),
        "burst": (cpu_dir / ("cpu.max.burst" if version == "v2" else "cpu.cfs_burst_us")).exists(),
        "io": (io_dir / "io.max").exists() if version == "v2"
        else (io_dir / "blkio.throttle.read_bps_device").exists(),
        "bvt": (cpu_dir / "cpu.bvt_warp_ns").exists(),
        "memory": version == "v2" and (mem_dir / "memory.min").exists(),
    }
    report.facts["cgroup_files"] = has
    burst_file = "cpu.max.burst" if version == "v2" else "cpu.cfs_burst_us"
    io_file = "io.max" if version == "v2" else "blkio.throttle.*"
    if has["cpu.idle"] or has["bvt"]:
        which = "cpu.idle" if has["cpu.idle"] else "cpu.bvt_warp_ns"
        report.add("BE CPU priority", OK, f"{which} present" + (" (group identity)" if has["bvt"] else ""))
        report.feature("BE CPU priority", ACTIVE, f"BE pods get {which}")
    else:
        report.add("BE CPU priority", WARN, "neither cpu.idle (kernel >= 5.15) nor cpu.bvt_warp_ns "
                   "(group identity, Anolis) present", "use a newer kernel: BE pods then get only "
                   "the minimum cpu shares")
        report.feature("BE CPU priority", DEGRADED, "minimum cpu shares only")
    report.add("group identity", OK, "cpu.bvt_warp_ns present" if has["bvt"]
               else "cpu.bvt_warp_ns absent (not an Anolis kernel): cpu.idle is used")
    if has["burst"]:
        report.add("CPU burst", OK, f"{burst_file} present")
        report.feature("cpu_burst strategy", ACTIVE, f"{burst_file}")
    else:
        report.add("CPU burst", WARN, f"{burst_file} absent (kernel >= 5.14 has it)",
                   "cpu_burst can only scale quotas here; a newer kernel gives real bursts")
        report.feature("cpu_burst strategy", DEGRADED, f"no {burst_file}: quota scaling only")
    if has["io"]:
        report.add("disk throttles", OK, f"{io_file} present")
        report.feature("BE disk throttles", ACTIVE, io_file)
    else:
        report.add("disk throttles", WARN, f"{io_file} absent", "enable the io (v2) / blkio (v1) "
                   "controller for BE disk limits")
        report.feature("BE disk throttles", DEGRADED, f"no {io_file}")
    if version == "v2" and has["memory"]:
        report.feature("pod memory protection", ACTIVE, "memory.min / memory.low / memory.high")
    else:
        report.feature("pod memory protection", DEGRADED,
                       "cgroup v1 has no memory.min/low/high: skipped, limits only" if version == "v1"
                       else "memory.min absent")
