"""`koordnode doctor`'s checks, run in order into one report."""

from __future__ import annotations

from typing import Any

from koordnode.doctor.cgroups import check_cgroup, check_cgroup_files, check_drivers
from koordnode.doctor.cluster import check_kubernetes
from koordnode.doctor.kernel import (
    check_core_sched,
    check_nftables,
    check_psi,
    check_resctrl,
    check_sched_slice,
    check_sysctls,
)
from koordnode.doctor.report import DoctorPaths, Report
from koordnode.doctor.runtime import check_cpu_owner, check_kubelet_endpoint, check_nri, check_runtime


def run_doctor(config: Any, paths: DoctorPaths | None = None, *, cri_timeout_s: float = 3.0) -> Report:
    paths = paths or DoctorPaths(cgroup_root=config.cgroup.root, procfs_root=config.procfs.root,
                                 sysfs_root=config.sysfs.root, resctrl_root=config.resctrl.root)
    report = Report()
    report.facts["config"] = config.source
    report.facts["dry_run"] = config.daemon.dry_run
    version = check_cgroup(report, paths)
    check_drivers(report, config, paths, version)
    runtime = check_runtime(report, config, cri_timeout_s)
    check_kubelet_endpoint(report, config, paths, runtime)
    check_cpu_owner(report)
    check_nri(report, paths, runtime)
    check_psi(report, paths, version)
    check_cgroup_files(report, paths, version)
    check_core_sched(report, config)
    check_sched_slice(report, config)
    check_resctrl(report, config, paths)
    check_nftables(report, config)
    check_sysctls(report, config, paths)
    check_kubernetes(report, config)
    return report
