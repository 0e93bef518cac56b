"""The doctor's report: checks (OK, WARN, FAIL with a fix), features (active, degraded, off),
facts; its exit code and its text."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

OK, WARN, FAIL = "OK", "WARN", "FAIL"
ACTIVE, DEGRADED, OFF = "active", "degraded", "off"
EXIT_CODES = {OK: 0, WARN: 1, FAIL: 2}

DEFAULT_CONTAINERD_CONFIG = "/etc/containerd/config.toml"
DEFAULT_KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
# Where kubeadm and the distributions' kubelet packages put kubelet's command-line flags.
DEFAULT_KUBELET_FLAGS = ("/var/lib/kubelet/kubeadm-flags.env", "/etc/default/kubelet",
                         "/etc/sysconfig/kubelet")


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
