"""`koordnode doctor`: what this node offers koordnode, what it will do here, and what to fix.

Run before pointing kubelet at koordnode, and at any time. Every check reads (the kernel's
files, containerd's and kubelet's configs, containerd's Version call); the only thing it
creates is a PSI trigger, to learn whether the kernel accepts a 500 ms window, closed at once.

Each check ends OK, WARN or FAIL with what to do; the features koordnode will run on this
node are listed as active, degraded or off, with the reason. Exit code 0 (all OK), 1 (warnings),
2 (failures). Paths are parameters so that tests can point them at fake trees.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OK, WARN, FAIL = "OK", "WARN", "FAIL"
ACTIVE, DEGRADED, OFF = "active", "degraded", "off"
EXIT_CODES = {OK: 0, WARN: 1, FAIL: 2}

DEFAULT_CONTAINERD_CONFIG = "/etc/containerd/config.toml"
DEFAULT_KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
# Where kubeadm and the distributions' kubelet packages put kubelet's command-line flags.
DEFAULT_KUBELET_FLAGS = ("/var/lib/kubelet/kubeadm-flags.env", "/etc/default/kubelet",
                         "/etc/sysconfig/kubelet")
SYSCTLS = ("vm.min_free_kbytes", "vm.watermark_scale_factor")
# The QoS manager's wake-up trigger: 50 ms of stall in a 500 ms window.
PSI_PROBE = (50_000, 500_000)
V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "blkio")
V2_CONTROLLERS = ("cpu", "cpuset", "memory", "io")


@dataclass
class Check:
    name: str
    status: str
    message: str
    fix: str = ""


@dataclass
class Feature:
    name: str
    state: str
    reason: str


@dataclass
class DoctorPaths:
    cgroup_root: str = "/sys/fs/cgroup"
    procfs_root: str = "/proc"
    sysfs_root: str = "/sys"
    resctrl_root: str = "/sys/fs/resctrl"
    containerd_config: str = DEFAULT_CONTAINERD_CONFIG
    kubelet_config: str = DEFAULT_KUBELET_CONFIG
    kubelet_flags: tuple[str, ...] = DEFAULT_KUBELET_FLAGS


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    features: list[Feature] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, status: str, message: str, fix: str = "") -> Check:
        check = Check(name, status, message, fix)
        self.checks.append(check)
        return check

    def feature(self, name: str, state: str, reason: str) -> None:
        self.features.append(Feature(name, state, reason))

    @property
    def status(self) -> str:
        statuses = {c.status for c in self.checks}
        return FAIL if FAIL in statuses else WARN if WARN in statuses else OK

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "exit_code": self.exit_code,
                "checks": [asdict(c) for c in self.checks],
                "features": [asdict(f) for f in self.features], "facts": self.facts}


# ---------------------------------------------------------------------------------------------
# Reading other programs' configuration


def containerd_settings(path: str) -> dict[str, Any]:
    """The settings of containerd's config.toml that matter here (config version 2 of
    containerd 1.x and version 3 of 2.x). ``found`` False: no file (containerd's defaults)."""
    settings: dict[str, Any] = {"found": False, "path": path, "systemd_cgroup": None, "nri_disable": None,
                                "version": None, "error": None}
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        return settings
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        settings.update(found=True, error=str(err))
        return settings
    settings.update(found=True, version=data.get("version"))
    plugins = data.get("plugins", {}) if isinstance(data.get("plugins"), dict) else {}
    for cri_name in ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"):
        cri = plugins.get(cri_name, {})
        containerd = cri.get("containerd", {}) if isinstance(cri, dict) else {}
        runtimes = containerd.get("runtimes", {}) if isinstance(containerd, dict) else {}
        default = containerd.get("default_runtime_name", "runc") if isinstance(containerd, dict) else "runc"
        runtime = runtimes.get(default, {}) if isinstance(runtimes, dict) else {}
        options = runtime.get("options", {}) if isinstance(runtime, dict) else {}
        if isinstance(options, dict) and "SystemdCgroup" in options:
            settings["systemd_cgroup"] = bool(options["SystemdCgroup"])
        if isinstance(cri, dict) and "systemd_cgroup" in cri and settings["systemd_cgroup"] is None:
            settings["systemd_cgroup"] = bool(cri["systemd_cgroup"])  # the old shim's setting
    nri = plugins.get("io.containerd.nri.v1.nri")
    if isinstance(nri, dict) and "disable" in nri:
        settings["nri_disable"] = bool(nri["disable"])
    return settings


_YAML_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9]*):\s*(.*?)\s*(#.*)?$")


def kubelet_settings(config_path: str, flag_files: tuple[str, ...]) -> dict[str, Any]:
    """kubelet's cgroup driver and runtime endpoint from its config file (top-level keys of
    the KubeletConfiguration YAML) and its flags files (flags win, as in kubelet)."""
    settings: dict[str, Any] = {"config": None, "flags_file": None, "cgroup_driver": None,
                                "runtime_endpoint": None, "cpu_manager_policy": None, "full_pcpus_only": False}
    try:
        text = Path(config_path).read_text()
        settings["config"] = config_path
        for line in text.splitlines():
            match = _YAML_KEY.match(line)
            if not match:
                continue
            key, value = match.group(1), match.group(2).strip().strip("'\"")
            if key == "cgroupDriver":
                settings["cgroup_driver"] = value
            elif key == "containerRuntimeEndpoint":
                settings["runtime_endpoint"] = value
            elif key == "cpuManagerPolicy":
                settings["cpu_manager_policy"] = value
        # cpuManagerPolicyOptions is a map: its full-pcpus-only entry, in either YAML style.
        settings["full_pcpus_only"] = bool(re.search(r"full-pcpus-only['\"]?\s*:\s*['\"]?true", text))
    except (OSError, UnicodeDecodeError):
        pass
    for flags_path in flag_files:
        try:
            text = Path(flags_path).read_text()
        except (OSError, UnicodeDecodeError):
            continue
        settings["flags_file"] = flags_path
        for name, key in (("cgroup-driver", "cgroup_driver"),
                          ("container-runtime-endpoint", "runtime_endpoint"),
                          ("cpu-manager-policy", "cpu_manager_policy")):
            match = re.search(rf"--{name}[= ]([^\s\"']+)", text)
            if match:
                settings[key] = match.group(1)
    return settings


def _socket_path(endpoint: str | None) -> str | None:
    if not endpoint:
        return None
    for prefix in ("unix://", "unix:"):
        if endpoint.startswith(prefix):
            return endpoint[len(prefix):]
    return endpoint


# ---------------------------------------------------------------------------------------------
# The checks


def run_doctor(config: Any, paths: DoctorPaths | None = None, *, cri_timeout_s: float = 3.0) -> Report:
    paths = paths or DoctorPaths(cgroup_root=config.cgroup.root, procfs_root=config.procfs.root,
                                 sysfs_root=config.sysfs.root, resctrl_root=config.resctrl.root)
    report = Report()
    report.facts["config"] = config.source
    report.facts["dry_run"] = config.daemon.dry_run
    version = _check_cgroup(report, paths)
    _check_drivers(report, config, paths, version)
    runtime = _check_runtime(report, config, cri_timeout_s)
    _check_kubelet_endpoint(report, config, paths, runtime)
    _check_cpu_owner(report)
    _check_nri(report, paths, runtime)
    _check_psi(report, paths, version)
    _check_cgroup_files(report, paths, version)
    _check_core_sched(report, config)
    _check_resctrl(report, config, paths)
    _check_nftables(report, config)
    _check_sysctls(report, config, paths)
    _check_kubernetes(report, config)
    return report


def _check_kubernetes(report: Report, config: Any) -> None:
    """[kubernetes]: whether koordnode's identity reaches the API server and may read its NodeSLO."""
    kube = config.kubernetes
    if not kube.enable:
        report.feature("cluster (NodeSLO, pod facts, Eviction API, NodeMetric)", OFF,
                       "[kubernetes] enable = false: the node works from its file alone")
        return
    from koordnode.kube.agent import NODESLOS, credentials_of, node_name_of
    from koordnode.kube.client import ApiError, KubeClient, Unreachable
    from koordnode.kube.credentials import CredentialsError

    node = node_name_of(kube)
    report.facts["kubernetes_node_name"] = node
    try:
        client = KubeClient(credentials_of(kube), timeout_s=min(kube.request_timeout_s, 5.0))
    except CredentialsError as exc:
        report.feature("cluster (NodeSLO, pod facts, Eviction API, NodeMetric)", DEGRADED, str(exc))
        report.add("kubernetes", FAIL, str(exc), "fix [kubernetes] kubeconfig / service_account_dir")
        return
    server = client.credentials.server
    try:
        asyncio.run(client.get(f"{NODESLOS}/{node}"))
    except ApiError as exc:
        if exc.status == 404:
            report.feature("cluster (NodeSLO, pod facts, Eviction API, NodeMetric)", ACTIVE,
                           f"{server} answers; no NodeSLO named {node} yet (the file and defaults apply)")
            report.add("kubernetes", WARN, f"{server} answers, but there is no NodeSLO named {node}",
                       "check koord-manager runs, and that [kubernetes] node_name is the node's name in the API")
            return
        fix = ("apply packaging/koordnode-rbac.yaml and bind koordnode's identity to it"
               if exc.status in (401, 403) else "check the API server's log")
        report.feature("cluster (NodeSLO, pod facts, Eviction API, NodeMetric)", DEGRADED, f"{server}: {exc}")
        report.add("kubernetes", FAIL, f"{server} refuses reading NodeSLO {node}: {exc}", fix)
        return
    except Unreachable as exc:
        report.feature("cluster (NodeSLO, pod facts, Eviction API, NodeMetric)", DEGRADED,
                       f"API server unreachable: the daemon keeps its last good values: {exc}")
        report.add("kubernetes", WARN, f"{server} does not answer: {exc}",
                   "check the network path and the server address; CRI is not affected")
        return
    report.feature("cluster (NodeSLO, pod facts, Eviction API, NodeMetric)", ACTIVE,
                   f"{server} answers; NodeSLO {node} readable")
    report.add("kubernetes", OK, f"{server} answers as {client.credentials.source}; NodeSLO {node} readable")


def _check_cgroup(report: Report, paths: DoctorPaths) -> str | None:
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


def _check_drivers(report: Report, config: Any, paths: DoctorPaths, version: str | None) -> None:
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


def _check_runtime(report: Report, config: Any, timeout_s: float) -> dict[str, str] | None:
    backend = config.proxy.backend
    if not Path(backend).exists():
        report.feature("CRI proxy and hooks", DEGRADED, f"no containerd socket at {backend}")
        report.add("containerd", FAIL, f"no socket at {backend} ([proxy] backend)",
                   "start containerd, or set [proxy] backend to its CRI socket")
        return None
    try:
        answer = asyncio.run(_runtime_version(backend, timeout_s))
    except Exception as err:  # noqa: BLE001 - any failure is the answer
        report.feature("CRI proxy and hooks", DEGRADED, f"containerd does not answer on {backend}: "
                       "calls would fail as they do without koordnode")
        report.add("containerd", FAIL, f"{backend} does not answer CRI Version: {err}",
                   "check `systemctl status containerd` and that its CRI plugin is enabled")
        return None
    report.facts["runtime"] = answer
    report.feature("CRI proxy and hooks", ACTIVE, f"{answer['runtime_name']} {answer['runtime_version']} "
                   f"answers on {backend}")
    report.add("containerd", OK, f"{backend} answers: {answer['runtime_name']} "
               f"{answer['runtime_version']} (CRI {answer['runtime_api_version']})")
    return answer


async def _runtime_version(backend: str, timeout_s: float) -> dict[str, str]:
    from koordnode.cri import api_pb2 as pb
    from koordnode.cri.client import CriClient
    from koordnode.cri.methods import RUNTIME_SERVICE

    client = CriClient(backend)
    try:
        resp = await client.call(RUNTIME_SERVICE + "Version", pb.VersionRequest(version="v1"),
                                 pb.VersionResponse, timeout=timeout_s)
    finally:
        await client.close()
    return {"runtime_name": resp.runtime_name, "runtime_version": resp.runtime_version,
            "runtime_api_version": resp.runtime_api_version}


def _check_kubelet_endpoint(report: Report, config: Any, paths: DoctorPaths,
                            runtime: dict[str, str] | None) -> None:
    kubelet = report.facts["kubelet"]
    endpoint = kubelet["runtime_endpoint"]
    listen = config.proxy.listen
    wanted = f"unix://{listen}"
    if kubelet["config"] is None and kubelet["flags_file"] is None:
        report.add("kubelet endpoint", WARN, "kubelet's config not found; cannot tell where it "
                   "sends CRI calls", f"set containerRuntimeEndpoint: {wanted} (or "
                   f"--container-runtime-endpoint={wanted})")
        return
    source = kubelet["flags_file"] if kubelet["flags_file"] and endpoint else kubelet["config"]
    target = _socket_path(endpoint)
    if target is not None and os.path.realpath(target) == os.path.realpath(listen):
        report.add("kubelet endpoint", OK, f"kubelet talks to koordnode ({endpoint}, {source})")
    elif target is not None and os.path.realpath(target) == os.path.realpath(config.proxy.backend):
        report.add("kubelet endpoint", WARN, f"kubelet talks to containerd directly ({endpoint}): "
                   "koordnode sees no CRI call", f"point kubelet at {wanted} once koordnode runs, "
                   "then restart kubelet")
    else:
        report.add("kubelet endpoint", WARN, f"kubelet's endpoint is {endpoint or 'not set'} "
                   f"({source}), not koordnode's {wanted}", f"set it to {wanted}")


def _check_cpu_owner(report: Report) -> None:
    """Who hands out exclusive CPUs: kubelet's static CPU manager when it is on (koordnode then
    keeps kubelet's cpusets), else koordnode's allocator (docs/architecture.md, "Who owns the CPUs")."""
    kubelet = report.facts["kubelet"]
    if kubelet["config"] is None and kubelet["flags_file"] is None:
        return  # said by the endpoint check already
    policy = (kubelet["cpu_manager_policy"] or "none").lower()
    if policy != "static":
        report.add("CPU owner", OK, f"kubelet's CPU manager policy is {policy}: koordnode's allocator gives"
                   " LSE/LSR their CPUs and the other classes their pools")
    elif kubelet["full_pcpus_only"]:
        report.add("CPU owner", OK, "kubelet's CPU manager policy is static (full-pcpus-only): kubelet owns"
                   " the cpusets, koordnode keeps them and applies the classes' other values")
    else:
        report.add("CPU owner", WARN, "kubelet's CPU manager policy is static: kubelet owns the cpusets"
                   " (koordnode keeps them), and without full-pcpus-only it may give an LSE container one"
                   " SMT sibling of a core whose other sibling runs other pods",
                   'set cpuManagerPolicyOptions: {full-pcpus-only: "true"} in kubelet\'s config (LSE: whole'
                   " cores), or accept shared cores")


def _check_nri(report: Report, paths: DoctorPaths, runtime: dict[str, str] | None) -> None:
    settings = report.facts["containerd_config"]
    version = (runtime or {}).get("runtime_version", "")
    match = re.match(r"v?(\d+)\.(\d+)", version)
    major_minor = (int(match.group(1)), int(match.group(2))) if match else None
    if runtime is None:
        report.add("NRI", WARN, "unknown: containerd does not answer", "see the containerd check")
        available, why = False, "containerd not answering"
    elif major_minor is not None and major_minor < (1, 7):
        available, why = False, f"containerd {version} has no NRI (1.7 or newer)"
        report.add("NRI", OK, f"not available: {why}; koordnode runs as a CRI proxy")
    else:
        # 1.7: NRI is off unless the config enables it; 2.x: on unless disabled.
        default_on = major_minor is not None and major_minor >= (2, 0)
        disabled = settings["nri_disable"] if settings["nri_disable"] is not None else not default_on
        if disabled:
            available, why = False, f"containerd {version}: NRI disabled in {settings['path']}"
            report.add("NRI", OK, f"{why}; koordnode runs as a CRI proxy (setting "
                       "[plugins.\"io.containerd.nri.v1.nri\"] disable = false would offer NRI mode)")
        else:
            available, why = True, f"containerd {version} has NRI enabled"
            report.add("NRI", OK, f"{why}: koordnode's NRI mode ([runtime] mode = \"nri\") is "
                       "recommended here, it needs no change to kubelet's endpoint")
    report.feature("NRI mode", ACTIVE if available else OFF,
                   why if not available else f"{why}; recommended over the CRI proxy")


def _check_psi(report: Report, paths: DoctorPaths, version: str | None) -> None:
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


def _any_child(root: Path) -> Path | None:
    """A cgroup below the root (files such as cpu.idle exist only there on v2)."""
    try:
        for entry in sorted(root.iterdir()):
            if entry.is_dir() and (entry / "cgroup.procs").exists():
                return entry
    except OSError:
        pass
    return None


def _check_cgroup_files(report: Report, paths: DoctorPaths, version: str | None) -> None:
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


def _check_core_sched(report: Report, config: Any, core_sched: Any = None) -> None:
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
    if unavailable is None:
        report.add(name, OK, "PR_SCHED_CORE available" + (f"; {'; '.join(uses)}" if uses else ""))
        report.feature(feature, ACTIVE if uses else OFF,
                       "; ".join(uses) if uses else "no [qos.<CLASS>] core_sched nor core_expeller")
    elif uses:
        report.add(name, WARN, f"{', '.join(dict.fromkeys(classes + expellers))} ask for it ([qos.<CLASS>] {keys}),"
                               f" but {unavailable}",
                   "those pods run without cookies: their SMT siblings may run other pods' tasks, BE's too "
                   "(needs a CPU with SMT on and a kernel with CONFIG_SCHED_CORE)")
        report.feature(feature, DEGRADED, f"unavailable: {unavailable}")
    else:
        report.add(name, OK, f"not used (no [qos.<CLASS>] core_sched nor core_expeller); unavailable here: {unavailable}")
        report.feature(feature, OFF, f"unavailable: {unavailable}")


def _check_resctrl(report: Report, config: Any, paths: DoctorPaths) -> None:
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


def _check_nftables(report: Report, config: Any) -> None:
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


def _check_sysctls(report: Report, config: Any, paths: DoctorPaths) -> None:
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


# ---------------------------------------------------------------------------------------------
# Output


def render_text(report: Report) -> str:
    width = max((len(c.name) for c in report.checks), default=10)
    lines = []
    for check in report.checks:
        lines.append(f"{check.status:<4}  {check.name:<{width}}  {check.message}")
        if check.fix and check.status != OK:
            lines.append(f"{'':<4}  {'':<{width}}  -> {check.fix}")
    lines.append("")
    lines.append("features on this node:")
    fwidth = max((len(f.name) for f in report.features), default=10)
    for feature in report.features:
        lines.append(f"  {feature.state:<8}  {feature.name:<{fwidth}}  {feature.reason}")
    if report.facts.get("dry_run"):
        lines.append("")
        lines.append("[daemon] dry_run = true: the daemon will decide and report, not write")
    counts = {s: sum(1 for c in report.checks if c.status == s) for s in (OK, WARN, FAIL)}
    lines.append("")
    lines.append(f"{report.status}: {counts[OK]} ok, {counts[WARN]} warnings, {counts[FAIL]} failures")
    return "\n".join(lines) + "\n"
