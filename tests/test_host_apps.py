"""Host applications ([host_applications.<name>], NodeSLO hostApplications): processes outside
Kubernetes with a class. Their cgroups get the class's values, their CPU counts in the class's
budget and not as the system's, and the NodeMetric reports them as koordlet does.

The last test runs real busy processes in real v1 cgroups of this machine: one LS application in
a cgroup of the operator's, one BE application in Koordinator's default host-best-effort/<name>.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from support.host_cgroups import CGROUP, make_cgroups, remove_cgroups

from koordnode.config import HostAppSettings, ManagerSettings, parse_config, with_nodeslo
from koordnode.config.classes import QoSConfig
from koordnode.config.host_apps import HostApplication, host_app_cgroup
from koordnode.config.loader import ConfigError, key_sources
from koordnode.config.qos_manager import QoSManagerConfig
from koordnode.config.strategies import CpuSuppressConfig, StrategyConfig
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.hooks.host_apps import HostApplications
from koordnode.kube.nodemetric import HostAppUsage, MetricRequest, node_metric_status
from koordnode.kube.nodeslo import map_nodeslo
from koordnode.model.qos_class import QoSClass
from koordnode.model.state import NodeState, PodRecord
from koordnode.policy.class_inputs import KernelFeatures
from koordnode.policy.host_apps import plan_host_app
from koordnode.qos.manager import QoSManager
from koordnode.qos.node_usage import NodeUsageReporter

HIERARCHIES = ("cpu", "cpuacct", "memory")


V1 = KernelFeatures("v1")


def _plan(name: str, app: HostApplication, features: KernelFeatures = V1) -> dict[str, object]:
    config = QoSConfig().for_class(QoSClass(app.qos))
    return {f"{w.cgroup}/{w.resource}": w.value for w in plan_host_app(name, app, config, features)}


def test_a_be_application_in_the_default_parent_loses_to_the_pods_as_be_pods_do() -> None:
    assert host_app_cgroup("backup", HostApplication("BE")) == "/host-best-effort/backup"
    assert _plan("backup", HostApplication("BE")) == {
        "/host-best-effort/cpu.idle": 0, "/host-best-effort/cpu.shares": 2,
        "/host-best-effort/backup/cpu.idle": 0, "/host-best-effort/backup/cpu.shares": 2}
    # in a cgroup of the operator's only the application's own cgroup: its parent is theirs
    assert _plan("db", HostApplication("LS", cgroup="/system.slice/db.service/")) == {
        "/system.slice/db.service/cpu.idle": 0}
    # Anolis: group identity instead of cpu.idle, BE's -1
    assert _plan("x", HostApplication("BE", cgroup="x"), KernelFeatures("v1", group_identity=True)) == {
        "/x/cpu.bvt_warp_ns": -1, "/x/cpu.shares": 2}


def test_the_file_checks_names_and_paths() -> None:
    config = parse_config('[host_applications.nginx]\ncgroup = "system.slice/nginx.service"\n'
                          '[host_applications.backup]\nqos = "BE"\n')
    assert config.host_applications["nginx"].priority_class == "koord-prod"
    assert config.host_applications["backup"].priority_class == "koord-batch"
    for bad, message in (('[host_applications."../x"]\n', "a name of letters"),
                         ('[host_applications.x]\ncgroup = "a/../../etc"\n', "is not a cgroup directory name"),
                         ('[host_applications.x]\ncgroup = "/"\n', "not the root itself"),
                         ('[host_applications.x]\nqos = "GOLD"\n', 'expected one of "SYSTEM"')):
        with pytest.raises(ConfigError, match=message):
            parse_config(bad)


def test_the_nodeslos_host_applications_apply_and_a_bad_entry_is_left_out_and_named() -> None:
    spec = {"hostApplications": [
        {"name": "nginx", "qos": "LS", "priority": "koord-prod",
         "cgroupPath": {"base": "CgroupRoot", "parentDir": "host-latency-sensitive/", "relativePath": "nginx/"}},
        {"name": "backup", "priority": "koord-batch"},
        {"name": "../etc", "qos": "LS"},
        {"name": "inpods", "qos": "LS", "cgroupPath": {"base": "KubepodsBesteffort", "relativePath": "x"}},
        {"name": "escape", "qos": "LS", "cgroupPath": {"parentDir": "..", "relativePath": "etc"}},
    ]}
    mapping = map_nodeslo(spec)
    assert [e.split(":")[0] for e in mapping.errors] == [
        "spec.hostApplications[2].name", "spec.hostApplications[3].cgroupPath.base", "spec.hostApplications[4].cgroupPath"]
    config = with_nodeslo(parse_config('[host_applications.nginx]\nqos = "LSR"\n'), mapping.values)
    apps = config.host_applications
    assert set(apps) == {"nginx", "backup"}
    # the file's key wins, the NodeSLO's others stay
    assert (apps["nginx"].qos, apps["nginx"].cgroup) == ("LSR", "host-latency-sensitive/nginx")
    assert (apps["backup"].qos, host_app_cgroup("backup", apps["backup"])) == ("BE", "/host-best-effort/backup")
    sources = key_sources(config)
    assert sources["host_applications.nginx.qos"] == "toml" and sources["host_applications.backup.qos"] == "nodeslo"


def test_node_metric_lists_host_applications_beside_the_pods() -> None:
    status = node_metric_status(
        node_cpu_cores=1.5, node_memory_bytes=3 << 30, system_cpu_cores=0.2, system_memory_bytes=1 << 30, pods=(),
        now=datetime.datetime(2026, 12, 2, tzinfo=datetime.UTC),
        host_apps=(HostAppUsage("nginx", "LS", "koord-prod", 0.75, 256 << 20),
                   HostAppUsage("backup", "BE", "koord-batch", 0.5, 1 << 20)))
    assert status["hostApplicationMetric"] == [
        {"name": "backup", "usage": {"resources": {"cpu": "500m", "memory": str(1 << 20)}},
         "priority": "koord-batch", "qos": "BE"},
        {"name": "nginx", "usage": {"resources": {"cpu": "750m", "memory": str(256 << 20)}},
         "priority": "koord-prod", "qos": "LS"}]


# ---------------------------------------------------------------------------------------------
# real processes in real cgroups


class _Gauge:
    def set_batch_allocatable(self, cpu_cores: float | None, memory_bytes: float | None) -> None:
        pass


@pytest.fixture
def host_cgroups():
    if os.geteuid() != 0 or not all((CGROUP / h / "cgroup.procs").exists() for h in HIERARCHIES):
        pytest.skip("needs root and the cgroup v1 cpu, cpuacct and memory hierarchies")
    tag = uuid.uuid4().hex[:8]
    cgroups = {"ls": f"/koordnode-test-host-{tag}/db.service", "be": f"/host-best-effort/kn-backup-{tag}",
               "kubepods": f"/koordnode-test-host-{tag}/kubepods"}
    created: list[Path] = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        created = make_cgroups(cgroups.values(), HIERARCHIES)
        for app in ("ls", "be"):
            # memory allocated once in its cgroup (v1 does not move a process's charge with it)
            proc = subprocess.Popen([sys.executable, "-c", "import sys\nsys.stdin.readline()\n"
                                     "x = bytearray(32 << 20)\nwhile True: pass"], stdin=subprocess.PIPE)
            procs.append(proc)
            for h in HIERARCHIES:
                (CGROUP / h / cgroups[app].strip("/") / "cgroup.procs").write_text(str(proc.pid))
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        yield tag, cgroups
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
        remove_cgroups(created)


@pytest.mark.timeout(120)
def test_real_host_applications_get_their_values_and_count_in_their_class(host_cgroups) -> None:
    """Busy processes: the LS one's CPU is LS use (it lowers BE's budget), the BE one's is BE
    use, neither is the system's; their cgroups hold the class values; the NodeMetric lists them.
    Asserted from what koordnode measured, not from fixed figures: CI's builds load this host."""
    tag, cgroups = host_cgroups
    apps = {f"db-{tag}": HostApplication("LS", cgroup=cgroups["ls"].strip("/")),
            f"kn-backup-{tag}": HostApplication("BE")}
    executor = CgroupExecutor(CGROUP)
    applier = HostApplications(HostAppSettings(host_applications=apps), executor, lambda: KernelFeatures("v1"))
    original_parent_shares = (CGROUP / "cpu/host-best-effort/cpu.shares").read_text()
    try:
        applier.apply()
        status = applier.status()
        assert {name: entry["state"] for name, entry in status.items()} == dict.fromkeys(apps, "applied"), status
        be_dir = CGROUP / "cpu" / cgroups["be"].strip("/")
        assert (be_dir / "cpu.shares").read_text().strip() == "2"
        assert (be_dir.parent / "cpu.shares").read_text().strip() == "2"  # the default parent too
        assert (CGROUP / "cpu" / cgroups["ls"].strip("/") / "cpu.idle").read_text().strip() == "0"
        # a missing cgroup is reported, not created
        missing = HostApplications(HostAppSettings(host_applications={"gone": HostApplication("LS", cgroup=f"nope-{tag}")}),
                                   executor, lambda: KernelFeatures("v1"))
        missing.apply()
        assert missing.status()["gone"]["state"] == "cgroup not found"
        assert not (CGROUP / "cpu" / f"nope-{tag}").exists()

        state = NodeState()
        state.put_pod(PodRecord("p", "p", "test", "uid-p", {}, {}, cgroups["kubepods"] + "/burstable/podp", qos_class="LS"))
        settings = ManagerSettings(StrategyConfig(cpu_suppress=CpuSuppressConfig(threshold_percent=100, ls_quiet_percent=0)),
                                   QoSManagerConfig(tick_ms=1000, kubepods_cgroup=cgroups["kubepods"]),
                                   host_applications=apps)
        manager = QoSManager(settings, state, executor)
        manager.dry_run = True  # no BE quota on this host's test kubepods
        for _ in range(4):
            manager.tick()
            time.sleep(1.05)
        manager.tick()
        used = manager.host_app_used_cpus
        snap = manager.last_snapshot
        assert snap is not None and snap.node_used_cpus is not None and snap.system_used_cpus is not None
        print(f"host applications used {used}; LS {snap.ls_used_cpus:.2f}, BE {snap.be_used_cpus:.2f}, "
              f"node {snap.node_used_cpus:.2f}, system {snap.system_used_cpus:.2f} CPUs")
        ls_app, be_app = used[f"db-{tag}"], used[f"kn-backup-{tag}"]
        assert ls_app > 0.05 and be_app >= 0.0, used  # measured (BE at weight 2 may get next to nothing)
        assert snap.ls_used_cpus == pytest.approx(ls_app, abs=0.02)  # the only LS use: no LS pod runs
        assert snap.be_used_cpus == pytest.approx(be_app, abs=0.02)
        # the system's use leaves them out: node - kubepods - the applications outside it
        assert snap.system_used_cpus <= max(0.0, snap.node_used_cpus - ls_app - be_app) + 0.15
        inputs = manager.status()["strategies"]["cpu_suppress"]["decision"]["inputs"]
        assert inputs["ls_used_cpus"] == pytest.approx(ls_app, abs=0.05)  # LS in BE's budget

        reporter = NodeUsageReporter(manager, "/proc", str(CGROUP), _Gauge())
        status_metric = reporter.node_metric_status(MetricRequest(interval_s=5.0))
        assert status_metric is not None
        listed = {m["name"]: m for m in status_metric["hostApplicationMetric"]}
        assert (listed[f"db-{tag}"]["qos"], listed[f"db-{tag}"]["priority"]) == ("LS", "koord-prod")
        assert (listed[f"kn-backup-{tag}"]["qos"], listed[f"kn-backup-{tag}"]["priority"]) == ("BE", "koord-batch")
        assert int(listed[f"db-{tag}"]["usage"]["resources"]["cpu"].rstrip("m")) > 50
        assert int(listed[f"db-{tag}"]["usage"]["resources"]["memory"]) >= 32 << 20  # its bytearray
    finally:
        (CGROUP / "cpu/host-best-effort/cpu.shares").write_text(original_parent_shares)


@pytest.mark.timeout(120)
def test_the_daemon_applies_and_reports_a_host_application(host_cgroups, containerd_bed, tmp_path) -> None:
    """`koordnode run` with [host_applications.<name>]: the cgroup gets BE's values at start (not
    only at the first reconcile interval) and `koordnode status` reports it with the CPUs it used."""
    from support.koordnode_runner import KoordnodeProcess

    tag, cgroups = host_cgroups
    name = f"backup-{tag}"
    toml = f'[host_applications.{name}]\nqos = "BE"\ncgroup = "{cgroups["ls"].strip("/")}"\n'
    koordnode = KoordnodeProcess(tmp_path / "kn", str(containerd_bed.socket), extra_toml=toml,
                                 kubepods=containerd_bed.kubepods_cgroup).start(timeout_s=90)  # two busy loops beside it
    try:
        deadline = time.monotonic() + 30
        while True:
            entry = koordnode.status().get("host_applications", {}).get(name, {})
            if entry.get("state") == "applied" and "used_cpus" in entry or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        print(f"koordnode status: {entry}")
        assert entry.get("state") == "applied" and entry["qos"] == "BE", entry
        assert entry["used_cpus"] >= 0.0
        assert (CGROUP / "cpu" / cgroups["ls"].strip("/") / "cpu.shares").read_text().strip() == "2"
    finally:
        koordnode.stop()
