"""Fake kernel trees for tests: cgroup v1 / v2 / Anolis hierarchies and a procfs.

Laid out like the kernel's (file names as a v1 host such as the test machine shows them,
and as upstream cgroup v2 and Anolis / Alibaba Cloud Linux kernels add), with the
kernel's initial values ("max 100000", "max", "default 100", 9223372036854771712...).
Files are plain files, so they hold whatever was last written: no kernel validation.
v1 child cpusets start with the tree's cpus/mems (as kubelet/runc leave them); v2 child
cpuset.cpus/mems start empty (inherit), like the kernel's.

    root = make_cgroup_tree(tmp_path, version="v1", anolis=False,
                            cgroups=["/kubepods/besteffort/pod123"])
    CgroupExecutor(root).apply([...])
    read_cgroup_file(root, "/kubepods/besteffort/pod123", "cpu.shares")

Import as `from faketree import ...` (tests/ is on sys.path under pytest).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

V1_UNLIMITED = "9223372036854771712"
_PSI = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
_MARKER = ".faketree.json"

# Files every v1 hierarchy has in every cgroup / only in its root.
_V1_COMMON = {"cgroup.clone_children": "0", "cgroup.procs": "", "notify_on_release": "0", "tasks": ""}
_V1_ROOT_ONLY = {"cgroup.sane_behavior": "0", "release_agent": ""}

_V1_CONTROLLERS: dict[str, dict[str, str]] = {
    "cpu": {
        "cpu.cfs_burst_us": "0",
        "cpu.cfs_period_us": "100000",
        "cpu.cfs_quota_us": "-1",
        "cpu.idle": "0",
        "cpu.rt_period_us": "1000000",
        "cpu.rt_runtime_us": "0",
        "cpu.shares": "1024",
        "cpu.stat": "nr_periods 0\nnr_throttled 0\nthrottled_time 0\nnr_bursts 0\nburst_time 0",
        "cpu.stat.local": "throttled_time 0",
    },
    "cpuacct": {
        "cpuacct.stat": "user 0\nsystem 0",
        "cpuacct.usage": "0",
        "cpuacct.usage_all": "cpu user system\n0 0 0\n1 0 0",
        "cpuacct.usage_percpu": "0 0 ",
        "cpuacct.usage_percpu_sys": "0 0 ",
        "cpuacct.usage_percpu_user": "0 0 ",
        "cpuacct.usage_sys": "0",
        "cpuacct.usage_user": "0",
    },
    "cpuset": {
        "cpuset.cpu_exclusive": "0",
        "cpuset.cpus": "{cpus}",
        "cpuset.effective_cpus": "{cpus}",
        "cpuset.effective_mems": "{mems}",
        "cpuset.mem_exclusive": "0",
        "cpuset.mem_hardwall": "0",
        "cpuset.memory_migrate": "0",
        "cpuset.memory_pressure": "0",
        "cpuset.memory_spread_page": "0",
        "cpuset.memory_spread_slab": "0",
        "cpuset.mems": "{mems}",
        "cpuset.sched_load_balance": "1",
        "cpuset.sched_relax_domain_level": "-1",
    },
    "memory": {
        "cgroup.event_control": "",
        "memory.failcnt": "0",
        "memory.force_empty": "",
        "memory.kmem.failcnt": "0",
        "memory.kmem.limit_in_bytes": V1_UNLIMITED,
        "memory.kmem.max_usage_in_bytes": "0",
        "memory.kmem.slabinfo": "",
        "memory.kmem.tcp.failcnt": "0",
        "memory.kmem.tcp.limit_in_bytes": V1_UNLIMITED,
        "memory.kmem.tcp.max_usage_in_bytes": "0",
        "memory.kmem.tcp.usage_in_bytes": "0",
        "memory.kmem.usage_in_bytes": "0",
        "memory.limit_in_bytes": V1_UNLIMITED,
        "memory.max_usage_in_bytes": "0",
        "memory.memsw.failcnt": "0",
        "memory.memsw.limit_in_bytes": V1_UNLIMITED,
        "memory.memsw.max_usage_in_bytes": "0",
        "memory.memsw.usage_in_bytes": "0",
        "memory.move_charge_at_immigrate": "0",
        "memory.numa_stat": "total=0 N0=0\nfile=0 N0=0\nanon=0 N0=0\nunevictable=0 N0=0",
        "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0",
        "memory.pressure_level": "",
        "memory.soft_limit_in_bytes": V1_UNLIMITED,
        "memory.stat": "cache 0\nrss 0\nrss_huge 0\nshmem 0\nmapped_file 0\nswap 0\npgpgin 0\npgpgout 0",
        "memory.swappiness": "60",
        "memory.usage_in_bytes": "0",
        "memory.use_hierarchy": "1",
    },
    "blkio": {
        "blkio.bfq.io_service_bytes": "Total 0",
        "blkio.bfq.io_service_bytes_recursive": "Total 0",
        "blkio.bfq.io_serviced": "Total 0",
        "blkio.bfq.io_serviced_recursive": "Total 0",
        "blkio.reset_stats": "",
        "blkio.throttle.io_service_bytes": "Total 0",
        "blkio.throttle.io_service_bytes_recursive": "Total 0",
        "blkio.throttle.io_serviced": "Total 0",
        "blkio.throttle.io_serviced_recursive": "Total 0",
        "blkio.throttle.read_bps_device": "",
        "blkio.throttle.read_iops_device": "",
        "blkio.throttle.write_bps_device": "",
        "blkio.throttle.write_iops_device": "",
    },
    "pids": {"pids.current": "0"},
}
# Present below the root only.
_V1_CHILD_ONLY: dict[str, dict[str, str]] = {
    "blkio": {"blkio.bfq.weight": "100", "blkio.bfq.weight_device": "default 100"},
    "pids": {"pids.events": "max 0", "pids.max": "max", "pids.peak": "0"},
}
_V1_ANOLIS: dict[str, dict[str, str]] = {
    "cpu": {"cpu.bvt_warp_ns": "0"},
    "memory": {"memory.min": "0", "memory.low": "0", "memory.high": "max"},
}
_V1_ANOLIS_CHILD_ONLY: dict[str, dict[str, str]] = {
    "memory": {
        "memory.wmark_ratio": "0",
        "memory.wmark_scale_factor": "50",
        "memory.wmark_min_adj": "0",
        "memory.wmark_high": V1_UNLIMITED,
        "memory.wmark_low": V1_UNLIMITED,
    },
}
# Hierarchies mounted on the test machine that we never write, created empty for realism.
_V1_OTHER = ("devices", "freezer", "systemd")

_V2_CONTROLLERS = "cpuset cpu io memory hugetlb pids"
_V2_ROOT = {
    "cgroup.controllers": _V2_CONTROLLERS,
    "cgroup.subtree_control": _V2_CONTROLLERS,
    "cgroup.max.depth": "max",
    "cgroup.max.descendants": "max",
    "cgroup.pressure": "1",
    "cgroup.procs": "",
    "cgroup.stat": "nr_descendants 0\nnr_dying_descendants 0",
    "cgroup.threads": "",
    "cpu.pressure": _PSI,
    "cpu.stat": "usage_usec 0\nuser_usec 0\nsystem_usec 0",
    "cpuset.cpus.effective": "{cpus}",
    "cpuset.mems.effective": "{mems}",
    "io.pressure": _PSI,
    "io.stat": "",
    "memory.numa_stat": "anon N0=0\nfile N0=0",
    "memory.pressure": _PSI,
    "memory.stat": "anon 0\nfile 0",
}
_V2_CHILD = {
    "cgroup.controllers": _V2_CONTROLLERS,
    "cgroup.subtree_control": "",
    "cgroup.events": "populated 0\nfrozen 0",
    "cgroup.freeze": "0",
    "cgroup.kill": "",
    "cgroup.max.depth": "max",
    "cgroup.max.descendants": "max",
    "cgroup.pressure": "1",
    "cgroup.procs": "",
    "cgroup.stat": "nr_descendants 0\nnr_dying_descendants 0",
    "cgroup.threads": "",
    "cgroup.type": "domain",
    "cpu.idle": "0",
    "cpu.max": "max 100000",
    "cpu.max.burst": "0",
    "cpu.pressure": _PSI,
    "cpu.stat": "usage_usec 0\nuser_usec 0\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0",
    "cpu.weight": "100",
    "cpu.weight.nice": "0",
    "cpuset.cpus": "",
    "cpuset.cpus.effective": "{cpus}",
    "cpuset.cpus.partition": "member",
    "cpuset.mems": "",
    "cpuset.mems.effective": "{mems}",
    "io.max": "",
    "io.pressure": _PSI,
    "io.stat": "",
    "io.weight": "default 100",
    "memory.current": "0",
    "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0",
    "memory.high": "max",
    "memory.low": "0",
    "memory.max": "max",
    "memory.min": "0",
    "memory.oom.group": "0",
    "memory.peak": "0",
    "memory.pressure": _PSI,
    "memory.stat": "anon 0\nfile 0",
    "memory.swap.current": "0",
    "memory.swap.max": "max",
    "pids.current": "0",
    "pids.max": "max",
}
_V2_ANOLIS_CHILD = {
    "cpu.bvt_warp_ns": "0",
    "memory.wmark_ratio": "0",
    "memory.wmark_scale_factor": "50",
    "memory.wmark_min_adj": "0",
    "memory.wmark_high": V1_UNLIMITED,
    "memory.wmark_low": V1_UNLIMITED,
}
# v1 file-name prefixes -> controller hierarchy (for cgroup_file without an explicit controller).
_PREFIX_CONTROLLER = {"cpu": "cpu", "cpuacct": "cpuacct", "cpuset": "cpuset", "memory": "memory",
                      "blkio": "blkio", "pids": "pids"}


def _fill(directory: Path, files: dict[str, str], cpus: str, mems: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        (directory / name).write_text(value.replace("{cpus}", cpus).replace("{mems}", mems))


def _options(root: Path) -> dict:
    return json.loads((root / _MARKER).read_text())


def _v1_dir(root: Path, controller: str) -> str:
    options = _options(root)
    if options["combined_cpu_cpuacct"] and controller in ("cpu", "cpuacct"):
        return "cpu,cpuacct"
    return controller


def make_cgroup_tree(
    tmp_path: Path,
    version: str = "v1",
    anolis: bool = False,
    cgroups: Iterable[str] = (),
    *,
    cpus: str = "0-3",
    mems: str = "0",
    combined_cpu_cpuacct: bool = False,
) -> Path:
    """Create a cgroup root under tmp_path and return it (pass it as the executor's root).

    v1: one directory per controller (cpu and cpuacct separate like the test machine, or a
    combined `cpu,cpuacct` with `cpu` / `cpuacct` symlinks), plus `unified` with PSI files.
    v2: one unified hierarchy. `anolis` adds Anolis files (cpu.bvt_warp_ns, memory.wmark_*,
    and on v1 memory.min/low/high). Every given cgroup is created with its ancestors.
    """
    if version not in ("v1", "v2"):
        raise ValueError(f"version must be 'v1' or 'v2', not {version!r}")
    root = Path(tmp_path) / "cgroup"
    root.mkdir(parents=True, exist_ok=True)
    (root / _MARKER).write_text(json.dumps({
        "version": version, "anolis": anolis, "cpus": cpus, "mems": mems,
        "combined_cpu_cpuacct": combined_cpu_cpuacct,
    }))
    if version == "v1":
        for controller, files in _V1_CONTROLLERS.items():
            directory = root / _v1_dir(root, controller)
            root_files = {**_V1_COMMON, **_V1_ROOT_ONLY, **files}
            if anolis:
                root_files.update(_V1_ANOLIS.get(controller, {}))
            _fill(directory, root_files, cpus, mems)
        if combined_cpu_cpuacct:
            for name in ("cpu", "cpuacct"):
                (root / name).symlink_to("cpu,cpuacct")
        for other in _V1_OTHER:
            _fill(root / other, {**_V1_COMMON, **_V1_ROOT_ONLY}, cpus, mems)
        # The hybrid cgroup2 mount carrying PSI on this kind of host.
        _fill(root / "unified", {
            "cgroup.controllers": "", "cgroup.subtree_control": "", "cgroup.procs": "",
            "cpu.pressure": _PSI, "io.pressure": _PSI, "memory.pressure": _PSI,
        }, cpus, mems)
    else:
        root_files = dict(_V2_ROOT)
        _fill(root, root_files, cpus, mems)
    for cgroup in cgroups:
        add_cgroup(root, cgroup)
    return root


def add_cgroup(root: Path, cgroup: str) -> None:
    """Create `cgroup` (and missing ancestors) in every hierarchy of a fake tree."""
    options = _options(root)
    parts = [part for part in cgroup.split("/") if part]
    cpus, mems = options["cpus"], options["mems"]
    for depth in range(1, len(parts) + 1):
        relative = "/".join(parts[:depth])
        if options["version"] == "v1":
            for controller, files in _V1_CONTROLLERS.items():
                directory = root / _v1_dir(root, controller) / relative
                if directory.is_dir():
                    continue
                child_files = {**_V1_COMMON, **files, **_V1_CHILD_ONLY.get(controller, {})}
                if options["anolis"]:
                    child_files.update(_V1_ANOLIS.get(controller, {}))
                    child_files.update(_V1_ANOLIS_CHILD_ONLY.get(controller, {}))
                _fill(directory, child_files, cpus, mems)
            for other in _V1_OTHER:
                if not (root / other / relative).is_dir():
                    _fill(root / other / relative, _V1_COMMON, cpus, mems)
        else:
            directory = root / relative
            if directory.is_dir():
                continue
            child_files = dict(_V2_CHILD)
            if options["anolis"]:
                child_files.update(_V2_ANOLIS_CHILD)
            _fill(directory, child_files, cpus, mems)


def cgroup_file(root: Path, cgroup: str, filename: str, controller: str | None = None) -> Path:
    """Path of a file in a fake tree. On v1 the controller defaults from the file name
    ("cpu.shares" -> cpu); pass it for shared names like "tasks" or "cgroup.procs"."""
    options = _options(root)
    relative = cgroup.strip("/")
    if options["version"] == "v2":
        return root / relative / filename
    if controller is None:
        prefix = filename.split(".", 1)[0]
        controller = _PREFIX_CONTROLLER.get(prefix, "cpu")
    return root / _v1_dir(root, controller) / relative / filename


def read_cgroup_file(root: Path, cgroup: str, filename: str, controller: str | None = None) -> str:
    return cgroup_file(root, cgroup, filename, controller).read_text().strip()


def write_cgroup_file(root: Path, cgroup: str, filename: str, value: str, controller: str | None = None) -> None:
    """Set a file as if kubelet or an operator had written it."""
    cgroup_file(root, cgroup, filename, controller).write_text(value)


def remove_cgroup_file(root: Path, cgroup: str, filename: str, controller: str | None = None) -> None:
    """Simulate a kernel without this file."""
    cgroup_file(root, cgroup, filename, controller).unlink()


def make_procfs_tree(tmp_path: Path, *, min_free_kbytes: int = 67584, watermark_scale_factor: int = 10) -> Path:
    """A procfs root with the vm sysctls the executor writes."""
    root = Path(tmp_path) / "proc"
    vm = root / "sys" / "vm"
    vm.mkdir(parents=True, exist_ok=True)
    (vm / "min_free_kbytes").write_text(f"{min_free_kbytes}\n")
    (vm / "watermark_scale_factor").write_text(f"{watermark_scale_factor}\n")
    return root
