"""The runtime checks: containerd answers CRI, kubelet's endpoint, who owns the CPUs, NRI."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

from koordnode.doctor.node_configs import socket_path
from koordnode.doctor.report import ACTIVE, DEGRADED, FAIL, OFF, OK, WARN, DoctorPaths, Report


def check_runtime(report: Report, config: Any, timeout_s: float) -> dict[str, str] | None:
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


def check_kubelet_endpoint(report: Report, config: Any, paths: DoctorPaths,
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
    target = socket_path(endpoint)
    if target is not None and os.path.realpath(target) == os.path.realpath(listen):
        report.add("kubelet endpoint", OK, f"kubelet talks to koordnode ({endpoint}, {source})")
    elif target is not None and os.path.realpath(target) == os.path.realpath(config.proxy.backend):
        report.add("kubelet endpoint", WARN, f"kubelet talks to containerd directly ({endpoint}): "
                   "koordnode sees no CRI call", f"point kubelet at {wanted} once koordnode runs, "
                   "then restart kubelet")
    else:
        report.add("kubelet endpoint", WARN, f"kubelet's endpoint is {endpoint or 'not set'} "
                   f"({source}), not koordnode's {wanted}", f"set it to {wanted}")


def check_cpu_owner(report: Report) -> None:
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


def check_nri(report: Report, paths: DoctorPaths, runtime: dict[str, str] | None) -> None:
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
