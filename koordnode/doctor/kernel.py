"""The kernel feature checks: PSI, core scheduling, resctrl, nftables, the vm sysctls."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from koordnode.doctor.report import ACTIVE, DEGRADED, FAIL, OFF, OK, WARN, DoctorPaths, Report

SYSCTLS = ("vm.min_free_kbytes", "vm.watermark_scale_factor")
# The QoS manager's wake-up trigger: 50 ms of stall in a 500 ms window.
PSI_PROBE = (50_000, 500_000)


def check_psi(report: Report, paths: DoctorPaths, version: str | None) -> None:
    from koordnode.qos.psi import PsiTrigger, TriggerFileMissing, TriggerRefused, describe_refusal

    cpu = Path(paths.procfs_root, "pressure", "cpu")
    if not cpu.is_file():
        report.add("PSI", WARN, f"no {cpu}: the kernel has PSI off (psi=0) or lacks it",
                   "boot with psi=1 (CONFIG_PSI): without it cpu_suppress reacts on ticks only "
                   "and the strategies see no pressure")
        report.feature("pressure wake-ups", DEGRADED, "no PSI: QoS manager ticks only")
        return
    stall, window = PSI_PROBE
    try:
        trigger = PsiTrigger(str(cpu), stall, window)
    except (TriggerRefused, TriggerFileMissing, OSError) as err:
        reason = describe_refusal(err, window)
        report.add("PSI", WARN, f"PSI present; a {window // 1000} ms trigger is refused ({reason})",
                   "nothing to do: koordnode polls the pressure totals every 50 ms instead "
                   "([qos_manager] psi_poll_ms)")
        report.feature("pressure wake-ups", DEGRADED, f"polling every 50 ms: {reason}")
        return
    trigger.close()
    report.add("PSI", OK, f"PSI present; {window // 1000} ms triggers accepted on {cpu}")
    report.feature("pressure wake-ups", ACTIVE, "PSI triggers")


def check_core_sched(report: Report, config: Any, core_sched: Any = None) -> None:
    """Whether the kernel gives core-scheduling cookies (asked of this process: a read-only
    PR_SCHED_CORE_GET), and whether a class asks for them (core_sched, core_expeller)."""
    from koordnode.executor.core_sched import CoreScheduling
    from koordnode.model.qos_class import QoSClass

    classes = [cls.value for cls in QoSClass if config.qos.for_class(cls).core_sched]
    expellers = [cls.value for cls in QoSClass if config.qos.for_class(cls).core_expeller]
    unavailable = (core_sched or CoreScheduling()).unavailable
    report.facts["core_sched"] = {"classes": classes, "expellers": expellers, "unavailable": unavailable}
    name, feature = "core scheduling", "core scheduling (SMT)"
    uses = ([f"a cookie per pod of {', '.join(classes)}"] if classes else []) + (
        [f"BE kept off the cores of {', '.join(expellers)}"] if expellers else [])
    keys = " and ".join(k for k, on in (("core_sched", classes), ("core_expeller", expellers)) if on)
    _kernel_feature(report, name, feature, unavailable, "; ".join(uses), available="PR_SCHED_CORE available",
                    unused="no [qos.<CLASS>] core_sched nor core_expeller",
                    asked=f"{', '.join(dict.fromkeys(classes + expellers))} ask for it ([qos.<CLASS>] {keys})",
                    fix="those pods run without cookies: their SMT siblings may run other pods' tasks, BE's too "
                        "(needs a CPU with SMT on and a kernel with CONFIG_SCHED_CORE)")


def _kernel_feature(report: Report, name: str, feature: str, unavailable: str | None, uses: str, *,
                    available: str, unused: str, asked: str, fix: str) -> None:
    """One check and one feature line for a kernel facility some classes may ask for (`uses`:
    what they ask, "" when none does)."""
    if unavailable is None:
        report.add(name, OK, available + (f"; {uses}" if uses else ""))
        report.feature(feature, ACTIVE if uses else OFF, uses or unused)
    elif uses:
        report.add(name, WARN, f"{asked}, but {unavailable}", fix)
        report.feature(feature, DEGRADED, f"unavailable: {unavailable}")
    else:
        report.add(name, OK, f"not used ({unused}); unavailable here: {unavailable}")
        report.feature(feature, OFF, f"unavailable: {unavailable}")


def check_sched_slice(report: Report, config: Any, slices: Any = None) -> None:
    """Whether the kernel keeps a slice per task (asked of this process: a read-only
    sched_getattr), and which classes ask for one (sched_slice_us)."""
    from koordnode.executor.sched_slice import SchedSlices
    from koordnode.model.qos_class import QoSClass

    asking = {cls.value: config.qos.for_class(cls).sched_slice_us for cls in QoSClass
              if config.qos.for_class(cls).sched_slice_us}
    unavailable = (slices or SchedSlices()).unavailable
    report.facts["sched_slice"] = {"classes_us": asking, "unavailable": unavailable}
    name, feature = "scheduler slices", "short BE slices (EEVDF)"
    uses = ", ".join(f"{cls} {value} us" for cls, value in asking.items())
    _kernel_feature(report, name, feature, unavailable, uses, available="per-task slices available",
                    unused="no [qos.<CLASS>] sched_slice_us", asked=f"{uses} asked ([qos.<CLASS>] sched_slice_us)",
                    fix="those tasks keep the kernel's slice: a BE task the kernel picks while LS waits may keep "
                        "the CPU until the next tick (needs Linux 6.12+)")


def check_resctrl(report: Report, config: Any, paths: DoctorPaths) -> None:
    from koordnode.executor.resctrl import ResctrlUnsupported, detect_resctrl

    enabled = config.resctrl.enable
    flags = _cpu_flags(paths.procfs_root)
    hw = sorted(flags & {"rdt_a", "cat_l3", "cdp_l3", "mba"})
    try:
        info = detect_resctrl(paths.resctrl_root, paths.procfs_root, config.resctrl.vendor)
    except ResctrlUnsupported as err:
        reason = str(err)
        if enabled:
            report.add("resctrl", FAIL if not hw else WARN, f"[resctrl] enable = true but: {reason}",
                       "mount -t resctrl resctrl /sys/fs/resctrl" if hw
                       else "this CPU has no RDT: set [resctrl] enable = false")
            report.feature("resctrl (L3/MB per class)", DEGRADED, reason)
        else:
            report.add("resctrl", OK, f"off ([resctrl] enable = false); {reason}"
                       + (f"; CPU flags: {' '.join(hw)}" if hw else ""))
            report.feature("resctrl (L3/MB per class)", OFF, "[resctrl] enable = false")
        return
    mba_mbps = "mba_MBps" in _mount_options(paths.procfs_root, paths.resctrl_root)
    parts = [info.vendor.value] + [f"{name} ({bin(c.cbm_mask).count('1')} ways)"
                                   for name, c in info.caches.items()]
    if info.mb is not None:
        parts.append("MB")
    message = f"resctrl at {paths.resctrl_root}: {', '.join(parts)}, {info.num_closids} CLOSIDs"
    if mba_mbps:
        report.add("resctrl", WARN, message + "; mounted with mba_MBps",
                   "koordnode writes MB as percent: remount without -o mba_MBps")
    else:
        report.add("resctrl", OK, message)
    report.feature("resctrl (L3/MB per class)", ACTIVE if enabled else OFF,
                   message if enabled else "[resctrl] enable = false (available: " + ", ".join(parts) + ")")


def _cpu_flags(procfs_root: str) -> frozenset[str]:
    try:
        for line in Path(procfs_root, "cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def _mount_options(procfs_root: str, mountpoint: str) -> set[str]:
    try:
        for line in Path(procfs_root, "mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 4 and fields[1] == mountpoint:
                return set(fields[3].split(","))
    except OSError:
        pass
    return set()


def check_nftables(report: Report, config: Any) -> None:
    enabled = config.net.enable
    nft = shutil.which("nft")
    if nft is None:
        status = WARN if enabled else OK
        report.add("nftables", status, "nft not installed" + ("" if enabled else " ([net] is off)"),
                   "apt-get install nftables / dnf install nftables" if enabled else "")
        report.feature("network QoS (tc + nftables)", DEGRADED if enabled else OFF,
                       "nft missing" if enabled else "[net] enable = false")
        return
    try:
        done = subprocess.run([nft, "list", "tables"], capture_output=True, text=True, timeout=10)
        ok, detail = done.returncode == 0, done.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as err:
        ok, detail = False, str(err)
    if ok:
        report.add("nftables", OK, f"{nft} works")
    else:
        report.add("nftables", WARN if enabled else OK, f"{nft} fails: {detail}",
                   "run as root with CAP_NET_ADMIN; load nf_tables" if enabled else "")
    state = (ACTIVE if ok else DEGRADED) if enabled else OFF
    report.feature("network QoS (tc + nftables)", state,
                   "[net] enable = false" if not enabled else ("tc + nftables" if ok else detail))


def check_sysctls(report: Report, config: Any, paths: DoctorPaths) -> None:
    problems, values = [], {}
    for name in SYSCTLS:
        path = Path(paths.procfs_root, "sys", *name.split("."))
        try:
            values[name] = path.read_text().strip()
        except OSError as err:
            problems.append(f"{name}: {err.strerror}")
            continue
        if not os.access(path, os.W_OK):
            problems.append(f"{name}: not writable")
    shown = ", ".join(f"{k} = {v}" for k, v in values.items())
    if problems:
        report.add("sysctls", WARN, "; ".join(problems), "run koordnode as root on the host "
                   "(not in a container with a read-only /proc/sys)")
        report.feature("node memory watermarks", DEGRADED, "; ".join(problems))
    else:
        report.add("sysctls", OK, f"writable: {shown}")
        report.feature("node memory watermarks", ACTIVE, "vm sysctls writable (written only when "
                       "[strategy.memory_qos] sets them)")
