"""`koordnode doctor` against this machine's real things where it has them: the test bed's
containerd (its socket and config file), the host's cgroup v1, its PSI files and sysctls; fake
trees shaped like the kernel's where the host cannot show it (cgroup v2, resctrl). kubelet does
not exist here: its config file and flags file are written as kubeadm writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fake_resctrl import INTEL_XEON_2S, make_resctrl
from faketree import make_cgroup_tree, make_procfs_tree
from koordnode import cli
from koordnode.doctor.kernel import check_resctrl
from koordnode.doctor.node_configs import containerd_settings, kubelet_settings
from koordnode.doctor.report import DoctorPaths, Report, render_text
from koordnode.doctor.run import run_doctor
from koordnode.doctor.runtime import check_cpu_owner, check_nri
from koordnode.config import parse_config



def by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def features(report: dict) -> dict[str, dict]:
    return {f["name"]: f for f in report["features"]}


def kubelet_files(tmp_path: Path, *, endpoint: str, driver: str = "cgroupfs",
                  flags: str | None = None) -> tuple[Path, Path]:
    config = tmp_path / "kubelet-config.yaml"
    config.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                      f"cgroupDriver: {driver}\ncontainerRuntimeEndpoint: \"{endpoint}\"\n"
                      "evictionHard:\n  memory.available: 100Mi\n")
    flags_file = tmp_path / "kubeadm-flags.env"
    flags_file.write_text(f'KUBELET_KUBEADM_ARGS="{flags}"\n' if flags else "")
    return config, flags_file


def run_cli(capsys, *args: str) -> tuple[int, dict]:
    code = cli.main(["doctor", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture
def bed_config(containerd_bed, tmp_path: Path) -> tuple[Path, str]:
    listen = str(tmp_path / "kn.sock")
    path = tmp_path / "koordnode.toml"
    path.write_text(f'[proxy]\nlisten = "{listen}"\nbackend = "{containerd_bed.socket}"\n')
    return path, listen


def test_doctor_on_the_real_test_bed(containerd_bed, bed_config, tmp_path: Path, capsys) -> None:
    config, listen = bed_config
    kubelet, flags = kubelet_files(tmp_path, endpoint=f"unix://{listen}")
    code, report = run_cli(capsys, "--config", str(config),
                           "--containerd-config", str(containerd_bed.config_path),
                           "--kubelet-config", str(kubelet), "--kubelet-flags", str(flags))
    checks = by_name(report)
    assert checks["cgroup"]["status"] == "OK" and "cgroup v1" in checks["cgroup"]["message"]
    assert checks["cgroup driver"]["status"] == "OK"
    assert "containerd cgroupfs" in checks["cgroup driver"]["message"]
    assert checks["containerd"]["status"] == "OK"
    assert "containerd 1.6." in checks["containerd"]["message"] or "v1.6." in checks["containerd"]["message"]
    assert checks["kubelet endpoint"]["status"] == "OK"
    assert checks["NRI"]["status"] == "OK" and "no NRI" in checks["NRI"]["message"]
    # This kernel has PSI, and refuses 500 ms windows (the machine's known limit).
    assert checks["PSI"]["status"] in ("OK", "WARN")
    assert checks["BE CPU priority"]["status"] == "OK"  # cpu.idle on kernel 6.18, v1
    assert checks["sysctls"]["status"] == "OK"
    feats = features(report)
    assert feats["CRI proxy and hooks"]["state"] == "active"
    assert feats["pod memory protection"]["state"] == "degraded"  # v1: no memory.min
    assert feats["NRI mode"]["state"] == "off"
    assert feats["resctrl (L3/MB per class)"]["state"] == "off"
    # Exit code follows the worst line.
    worst = {c["status"] for c in report["checks"]}
    assert code == (2 if "FAIL" in worst else 1 if "WARN" in worst else 0) == report["exit_code"]
    assert "FAIL" not in worst


def test_doctor_finds_the_mistakes_operators_make(containerd_bed, bed_config, tmp_path: Path, capsys) -> None:
    config, listen = bed_config
    # kubelet still pointed at containerd, with the systemd driver while containerd uses cgroupfs.
    kubelet, flags = kubelet_files(tmp_path, endpoint=f"unix://{containerd_bed.socket}", driver="systemd")
    code, report = run_cli(capsys, "--config", str(config),
                           "--containerd-config", str(containerd_bed.config_path),
                           "--kubelet-config", str(kubelet), "--kubelet-flags", str(flags))
    checks = by_name(report)
    assert code == 2
    assert checks["cgroup driver"]["status"] == "FAIL"
    assert "disagree" in checks["cgroup driver"]["message"]
    assert checks["kubelet endpoint"]["status"] == "WARN"
    assert "talks to containerd directly" in checks["kubelet endpoint"]["message"]
    assert f"unix://{listen}" in checks["kubelet endpoint"]["fix"]

    # Flags win over the config file, as in kubelet.
    kubelet, flags = kubelet_files(tmp_path, endpoint=f"unix://{containerd_bed.socket}", driver="systemd",
                                   flags=f"--container-runtime-endpoint=unix://{listen} --cgroup-driver=cgroupfs")
    code, report = run_cli(capsys, "--config", str(config),
                           "--containerd-config", str(containerd_bed.config_path),
                           "--kubelet-config", str(kubelet), "--kubelet-flags", str(flags))
    assert by_name(report)["kubelet endpoint"]["status"] == "OK"
    assert by_name(report)["cgroup driver"]["status"] == "OK"


def test_doctor_without_containerd_fails_and_says_what_to_do(tmp_path: Path, capsys) -> None:
    config = tmp_path / "k.toml"
    config.write_text(f'[proxy]\nbackend = "{tmp_path / "nothing.sock"}"\nlisten = "{tmp_path / "kn.sock"}"\n')
    code = cli.main(["doctor", "--config", str(config), "--containerd-config", str(tmp_path / "none.toml"),
                     "--kubelet-config", str(tmp_path / "none.yaml"), "--kubelet-flags", str(tmp_path / "none")])
    text = capsys.readouterr().out
    assert code == 2
    assert f"FAIL  containerd        no socket at {tmp_path / 'nothing.sock'}" in text
    assert "-> start containerd" in text
    assert "features on this node:" in text
    assert text.rstrip().splitlines()[-1].startswith("FAIL: ")


def test_doctor_rejects_a_bad_config(tmp_path: Path, capsys) -> None:
    config = tmp_path / "k.toml"
    config.write_text("[proxy]\nlistn = 1\n")
    assert cli.main(["doctor", "--config", str(config)]) == 2
    assert "proxy.listn: unknown key" in capsys.readouterr().err


def _v2_paths(tmp_path: Path, **kw) -> DoctorPaths:
    root = make_cgroup_tree(tmp_path, "v2", cgroups=["/kubepods"])
    procfs = make_procfs_tree(tmp_path)
    return DoctorPaths(cgroup_root=str(root), procfs_root=str(procfs), **kw)


def test_cgroup_v2_tree(tmp_path: Path) -> None:
    config = parse_config(f'[proxy]\nbackend = "{tmp_path / "x.sock"}"\n')
    paths = _v2_paths(tmp_path, containerd_config=str(tmp_path / "none"),
                      kubelet_config=str(tmp_path / "none"), kubelet_flags=())
    report = run_doctor(config, paths).as_dict()
    checks, feats = by_name(report), features(report)
    assert checks["cgroup"]["status"] == "OK" and "cgroup v2" in checks["cgroup"]["message"]
    assert checks["CPU burst"]["message"] == "cpu.max.burst present"
    assert checks["disk throttles"]["message"] == "io.max present"
    assert feats["pod memory protection"]["state"] == "active"
    assert checks["PSI"]["status"] == "WARN"  # the fake procfs has no pressure files
    assert feats["pressure wake-ups"]["state"] == "degraded"


def test_nri_detection_from_containerd_config(tmp_path: Path) -> None:
    paths = DoctorPaths(containerd_config=str(tmp_path / "config.toml"))

    def nri(version: str, config_text: str | None) -> tuple[str, str]:
        if config_text is None:
            Path(paths.containerd_config).unlink(missing_ok=True)
        else:
            Path(paths.containerd_config).write_text(config_text)
        report = Report()
        report.facts["containerd_config"] = containerd_settings(paths.containerd_config)
        check_nri(report, paths, {"runtime_version": version})
        return report.checks[0].message, report.features[0].state

    enabled_17 = 'version = 2\n[plugins."io.containerd.nri.v1.nri"]\n  disable = false\n'
    assert nri("v1.6.20", enabled_17)[1] == "off"  # 1.6 has no NRI whatever the file says
    message, state = nri("1.7.24", enabled_17)
    assert state == "active" and '[runtime] mode = "nri"' in message
    assert nri("1.7.24", None)[1] == "off"  # 1.7 default: disabled
    assert nri("2.1.4", None)[1] == "active"  # 2.x default: enabled
    assert nri("2.1.4", 'version = 3\n[plugins."io.containerd.nri.v1.nri"]\ndisable = true\n')[1] == "off"


def test_containerd_driver_from_config_versions_2_and_3(tmp_path: Path) -> None:
    v2 = tmp_path / "v2.toml"
    v2.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
                  "SystemdCgroup = true\n")
    v3 = tmp_path / "v3.toml"
    v3.write_text('version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]\n'
                  "SystemdCgroup = true\n")
    assert containerd_settings(str(v2))["systemd_cgroup"] is True
    assert containerd_settings(str(v3))["systemd_cgroup"] is True
    bad = tmp_path / "bad.toml"
    bad.write_text("version = [\n")
    assert containerd_settings(str(bad))["error"]


def test_resctrl_on_a_fake_xeon(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, INTEL_XEON_2S)
    (procfs / "mounts").write_text(f"resctrl {kernel.root} resctrl rw,relatime 0 0\n")
    config = parse_config(f'[resctrl]\nenable = true\nroot = "{kernel.root}"\n')
    paths = DoctorPaths(procfs_root=str(procfs), resctrl_root=str(kernel.root))
    report = Report()
    check_resctrl(report, config, paths)
    assert report.checks[0].status == "OK"
    assert report.checks[0].message.startswith(f"resctrl at {kernel.root}: intel, L3 (11 ways), MB")
    assert report.features[0].state == "active"
    # Mounted with mba_MBps: koordnode's percentages would be read as MB/s.
    (procfs / "mounts").write_text(f"resctrl {kernel.root} resctrl rw,mba_MBps 0 0\n")
    report = Report()
    check_resctrl(report, config, paths)
    assert report.checks[0].status == "WARN" and "mba_MBps" in report.checks[0].message
    # Enabled where nothing is mounted.
    config = parse_config(f'[resctrl]\nenable = true\nroot = "{tmp_path / "nowhere"}"\n')
    report = Report()
    check_resctrl(report, config, DoctorPaths(procfs_root=str(procfs),
                                                             resctrl_root=str(tmp_path / "nowhere")))
    assert report.checks[0].status == "WARN"  # the fake CPU has RDT: mount it
    assert report.checks[0].fix == "mount -t resctrl resctrl /sys/fs/resctrl"
    assert report.features[0].state == "degraded"


def test_exit_code_is_the_worst_line() -> None:
    report = Report()
    report.add("a", "OK", "fine")
    assert report.exit_code == 0
    report.add("b", "WARN", "hm", "do x")
    assert report.exit_code == 1
    report.add("c", "FAIL", "no", "do y")
    assert report.exit_code == 2
    assert "-> do y" in render_text(report)


@pytest.mark.parametrize("config_text, flags, status, says", [
    ("cgroupDriver: systemd\n", "", "OK", "policy is none: koordnode's allocator"),
    ('cpuManagerPolicy: static\ncpuManagerPolicyOptions:\n  full-pcpus-only: "true"\n', "", "OK",
     "static (full-pcpus-only): kubelet owns the cpusets"),
    ("cpuManagerPolicy: none\n", "--cpu-manager-policy=static", "WARN", "kubelet owns the cpusets"),
])
def test_cpu_owner_from_kubelets_cpu_manager_policy(tmp_path: Path, config_text, flags, status, says) -> None:
    """kubelet's static CPU manager owns the cpusets (docs/architecture.md, "Who owns the CPUs"); without
    full-pcpus-only it may split a core, which LSE promises not to."""
    config = tmp_path / "kubelet-config.yaml"
    config.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n" + config_text)
    flags_file = tmp_path / "kubeadm-flags.env"
    flags_file.write_text(f'KUBELET_KUBEADM_ARGS="{flags}"\n')
    report = Report()
    report.facts["kubelet"] = kubelet_settings(str(config), (str(flags_file),))
    check_cpu_owner(report)
    check = by_name(report.as_dict())["CPU owner"]
    assert check["status"] == status and says in check["message"], check
    if status == "WARN":
        assert "full-pcpus-only" in check["fix"]
