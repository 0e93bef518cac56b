"""Reading other programs' configuration: containerd's config.toml, kubelet's config and flags."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any


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


def socket_path(endpoint: str | None) -> str | None:
    if not endpoint:
        return None
    for prefix in ("unix://", "unix:"):
        if endpoint.startswith(prefix):
            return endpoint[len(prefix):]
    return endpoint
