"""Dry run of each part that writes to the kernel, on fake trees shaped like the kernel's:
differences are reported as would_write, nothing is written. (End to end on the real test bed:
test_e2e_dry_run.py.)"""

from __future__ import annotations

from pathlib import Path

from fake_resctrl import INTEL_XEON_2S, make_resctrl
from faketree import make_cgroup_tree, make_procfs_tree, read_cgroup_file
from koordnode.cri import api_pb2 as pb
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.executor.procfs_executor import ProcfsExecutor
from koordnode.executor.write_result import WriteStatus
from koordnode.policy.plan import SysctlWrite
from koordnode.policy.plan import CgroupWrite
from koordnode.qos.resctrl_control import ResctrlController
from koordnode.config.resctrl import ResctrlClassConfig, ResctrlConfig
from koordnode.proxy.handler import message_changes
from koordnode.qos.psi import PressureWatch

POD = "/kubepods/besteffort/pod1"


def test_cgroup_executor_reports_would_write_and_writes_nothing(tmp_path: Path) -> None:
    root = make_cgroup_tree(tmp_path, "v1", cgroups=[POD], cpus="0-3")
    executor = CgroupExecutor(root, dry_run=True)
    before = read_cgroup_file(root, POD, "cpu.shares")
    results = executor.apply([CgroupWrite(POD, "cpu.shares", 2, "BE"),
                              CgroupWrite(POD, "cpuset.cpus", "2-3", "BE pool")])
    assert [r.status for r in results] == [WriteStatus.WOULD_WRITE, WriteStatus.WOULD_WRITE]
    assert results[0].old == before and results[0].new == "2" and results[0].ok
    assert read_cgroup_file(root, POD, "cpu.shares") == before
    assert read_cgroup_file(root, POD, "cpuset.cpus") == "0-3"
    # The same value already there: unchanged, in a dry run as in a real one.
    same = executor.apply([CgroupWrite(POD, "cpu.shares", int(before))], force=True)
    assert same[0].status is WriteStatus.UNCHANGED
    # Switched off (config reload): the write happens.
    executor.dry_run = False
    assert executor.apply([CgroupWrite(POD, "cpu.shares", 2)])[0].status is WriteStatus.WRITTEN
    assert read_cgroup_file(root, POD, "cpu.shares") == "2"


def test_sysctl_executor_dry_run(tmp_path: Path) -> None:
    root = make_procfs_tree(tmp_path, min_free_kbytes=67584)
    result = ProcfsExecutor(root, dry_run=True).apply([SysctlWrite("vm.min_free_kbytes", 135168)])[0]
    assert result.status is WriteStatus.WOULD_WRITE
    assert (root / "sys/vm/min_free_kbytes").read_text().strip() == "67584"


def test_resctrl_dry_run_creates_no_group_and_moves_no_thread(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, INTEL_XEON_2S)
    kernel.spawn(200, 201)
    config = ResctrlConfig(enable=True, root=str(kernel.root), procfs_root=str(procfs))
    ctl = ResctrlController(config, {"BE": ResctrlClassConfig(0, 30, mba_percent=15)},
                            threads_of=lambda cg: [200, 201], io=kernel)
    ctl.dry_run = True
    report = ctl.reconcile({"BE": ["/kubepods/besteffort/pod1/c1"]})
    assert report.supported and not report.failures
    assert not [op for op in kernel.ops if op[0] in ("mkdir", "rmdir", "write")]
    assert {(r.action, r.status) for r in report.results} >= {
        ("mkdir", WriteStatus.WOULD_WRITE), ("schemata", WriteStatus.WOULD_WRITE)}
    assert report.groups["koordnode-BE"] == "L3:0=f;1=f\nMB:0=20;1=20"
    # A real run afterwards does it all.
    ctl.dry_run = False
    ctl.reconcile({"BE": ["/kubepods/besteffort/pod1/c1"]})
    assert kernel.tasks["koordnode-BE"] == [200, 201]


def test_pressure_watch_polls_in_a_dry_run() -> None:
    watch = PressureWatch(stall_us=50_000, window_us=500_000, poll_interval_s=0.05,
                          on_wake=lambda _: None, use_triggers=False,
                          triggers_off_reason="dry run: registering a PSI trigger writes to the kernel")
    assert not watch.uses_triggers
    assert watch.mode.endswith("(dry run: registering a PSI trigger writes to the kernel)")


def test_request_differences_are_described_field_by_field() -> None:
    old = pb.CreateContainerRequest(pod_sandbox_id="p")
    old.config.linux.resources.cpu_shares = 1024
    old.config.annotations["a"] = "1"
    new = pb.CreateContainerRequest()
    new.CopyFrom(old)
    new.config.linux.resources.cpu_shares = 2
    new.config.linux.resources.cpuset_cpus = "2-3"
    new.config.annotations["k"] = "v"
    assert message_changes(old, new) == [
        "config.annotations[k]: (none) -> 'v'",
        "config.linux.resources.cpu_shares: 1024 -> 2",
        "config.linux.resources.cpuset_cpus: '' -> '2-3'",
    ]
    assert message_changes(old, old) == []


class _NoWritesNet:
    """A NetQoSExecutor stand-in for planning: interfaces and addresses; applying fails."""

    def default_route_interfaces(self) -> list[str]:
        return ["eth0"]

    def local_addresses(self) -> set[str]:
        return set()

    def route_devices(self, ips) -> dict[str, str]:
        return {}

    def owned_devices(self) -> list[str]:
        return ["eth0"]

    def apply(self, plan, *, report=None):
        raise AssertionError("a dry run must not touch tc or nftables")

    def remove_all(self, *, report=None):
        raise AssertionError("a dry run must not touch tc or nftables")


def test_network_qos_dry_run_plans_without_tc_or_nft() -> None:
    from koordnode.qos.net_control import NetQoSController
    from koordnode.config.netqos import NetQoSConfig
    from koordnode.policy.net import PodNetwork

    ctl = NetQoSController(NetQoSConfig(enable=True, interfaces=("eth0",)), executor=_NoWritesNet())
    ctl.dry_run = True
    report = ctl.reconcile([PodNetwork("s1", "default/batch", "BE", ("10.0.0.5",)),
                            PodNetwork("s2", "default/web", "LS", ("10.0.0.6",))])
    assert not report.failures
    assert report.changes[0].startswith("would set HTB qdisc 4b4e: on eth0")
    assert report.changes[-1] == "would load nftables table inet koordnode classifying 2 pod address(es)"
    assert ctl.status()["would"] == report.changes
    # Disabled: would remove what koordnode owns, removes nothing.
    ctl.update_config(NetQoSConfig(enable=False))
    assert ctl.reconcile([]).changes == ["would remove koordnode's qdisc on eth0"]
