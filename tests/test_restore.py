"""Originals of node-level targets (executor/originals.py) and `koordnode restore`.

Real cgroups: private cgroups /koordnode-test-<random>/kubepods/... in this host's v1 cpu and
cpuset hierarchies (root only), removed afterwards; the executors and restore use the real
root /sys/fs/cgroup. Sysctls: vm.min_free_kbytes and vm.watermark_scale_factor are not
namespaced (no private namespace isolates them), so they are written under a configured
[procfs] root, the way the daemon is pointed at procfs. tc and nftables: a network namespace
this test creates and deletes. Hostile state files: restore must refuse what leads outside
its configured roots and leave everything outside them as it was.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordnode.cli import main
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.executor.procfs_executor import ProcfsExecutor
from koordnode.executor.write_result import WriteStatus
from koordnode.executor.netqos import NetQoSExecutor
from koordnode.executor.originals import OriginalsError, OriginalsJournal
from koordnode.executor.paths import CgroupVersion, detect_cgroup_version
from koordnode.executor.restore import RestoreRoots, restore
from koordnode.policy.net import HtbClass, HtbTree, NetPlan
from koordnode.policy.plan import CgroupWrite

CGROUP = Path("/sys/fs/cgroup")

real_v1 = pytest.mark.skipif(
    os.geteuid() != 0 or not (CGROUP / "cpu").is_dir() or not (CGROUP / "cpuset").is_dir()
    or detect_cgroup_version(CGROUP) is not CgroupVersion.V1,
    reason="needs root and cgroup v1 cpu and cpuset hierarchies at /sys/fs/cgroup",
)


def _journal(tmp_path: Path) -> OriginalsJournal:
    return OriginalsJournal(tmp_path / "state")


def _state(tmp_path: Path) -> Path:
    return tmp_path / "state" / "originals.json"


def _write_state(tmp_path: Path, originals: list[dict[str, object]]) -> Path:
    path = _state(tmp_path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": 1, "originals": originals}))
    path.chmod(0o600)
    return path


# --- the journal ---------------------------------------------------------------------------------


def test_the_first_original_wins_and_is_on_disk_at_once(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    assert journal.keep("sysctl", "/proc", "vm.min_free_kbytes", "67584\n")
    # koordnode's own value later: never replaces the original, in memory or on disk.
    assert not journal.keep("sysctl", "/proc", "vm.min_free_kbytes", "90112")
    on_disk = json.loads(_state(tmp_path).read_text())
    assert [(e["target"], e["value"]) for e in on_disk["originals"]] == [("vm.min_free_kbytes", "67584")]
    assert not OriginalsJournal(tmp_path / "state").keep("sysctl", "/proc", "vm.min_free_kbytes", "1")
    assert oct(_state(tmp_path).stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "state").stat().st_mode & 0o777) == "0o700"
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["originals.json"]  # no temp file left
    journal.forget([("sysctl", "/proc", "vm.min_free_kbytes")])
    assert not _state(tmp_path).exists()


@pytest.mark.parametrize(("content", "mode", "expected"), [
    ("{not json", 0o600, "invalid JSON"),
    ('{"format": 2, "originals": []}', 0o600, "not a koordnode originals file"),
    ('[1, 2]', 0o600, "not a koordnode originals file"),
    ('{"format": 1, "originals": [{"kind": "shell", "root": "/", "target": "x", "value": "y"}]}', 0o600,
     "unknown kind"),
    ('{"format": 1, "originals": [{"kind": "sysctl", "root": "/proc", "target": 7, "value": "1"}]}', 0o600,
     "target is int"),
    ('{"format": 1, "originals": [{"kind": "sysctl", "root": "/proc", "target": "a\\u0000b", "value": "1"}]}',
     0o600, "NUL"),
    ('{"format": 1, "originals": []}', 0o666, "writable by others"),
])
def test_a_corrupt_or_untrusted_state_file_is_refused(tmp_path: Path, content: str, mode: int, expected: str) -> None:
    path = _state(tmp_path)
    path.parent.mkdir(mode=0o700)
    path.write_text(content)
    path.chmod(mode)
    journal = _journal(tmp_path)
    with pytest.raises(OriginalsError, match=expected):
        journal.entries()
    with pytest.raises(OriginalsError, match=expected):  # nothing is recorded over it either
        journal.keep("sysctl", "/proc", "vm.min_free_kbytes", "1")
    assert path.read_text() == content


def test_a_symlinked_or_huge_state_file_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"format": 1, "originals": []}')
    (tmp_path / "state").mkdir(mode=0o700)
    _state(tmp_path).symlink_to(elsewhere)
    with pytest.raises(OriginalsError, match="symbolic link"):
        _journal(tmp_path).entries()
    _state(tmp_path).unlink()
    _state(tmp_path).write_text(" " * (5 << 20))
    _state(tmp_path).chmod(0o600)
    with pytest.raises(OriginalsError, match="bytes"):
        _journal(tmp_path).entries()


def test_restore_reports_a_corrupt_state_file_and_touches_nothing(tmp_path: Path, capsys) -> None:
    _write_state(tmp_path, [])
    _state(tmp_path).write_text("{garbage")
    config = _config(tmp_path, cgroup_root=str(tmp_path))
    assert main(["restore", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "invalid JSON" in err and "nothing was restored" in err
    assert _state(tmp_path).read_text() == "{garbage"


# --- sysctls under a configured procfs root --------------------------------------------------------


def _procfs(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    (root / "sys" / "vm").mkdir(parents=True)
    (root / "sys" / "vm" / "min_free_kbytes").write_text("67584\n")
    (root / "sys" / "vm" / "watermark_scale_factor").write_text("10\n")
    return root


def test_sysctls_go_back_to_their_originals(tmp_path: Path) -> None:
    procfs = _procfs(tmp_path)
    journal = _journal(tmp_path)
    executor = ProcfsExecutor(procfs, originals=journal)
    assert executor.write("vm.min_free_kbytes", 135168, "test").status is WriteStatus.WRITTEN
    assert executor.write("vm.min_free_kbytes", 270336, "test").status is WriteStatus.WRITTEN
    assert executor.write("vm.watermark_scale_factor", 10, "test").status is WriteStatus.UNCHANGED
    # Only what was written has an original; the first one.
    assert [(e.target, e.value) for e in journal.entries()] == [("vm.min_free_kbytes", "67584")]

    dry = restore(journal, RestoreRoots(procfs=str(procfs)), dry_run=True)
    assert [a.outcome for a in dry.actions] == ["would restore"]
    assert (procfs / "sys/vm/min_free_kbytes").read_text().strip() == "270336"

    report = restore(journal, RestoreRoots(procfs=str(procfs)))
    assert report.ok and [a.outcome for a in report.actions] == ["restored"], report.text()
    assert (procfs / "sys/vm/min_free_kbytes").read_text().strip() == "67584"
    assert journal.entries() == [] and not _state(tmp_path).exists()
    # The next run keeps a fresh original (the node's value now).
    executor.write("vm.min_free_kbytes", 1024, "test")
    assert [(e.target, e.value) for e in journal.entries()] == [("vm.min_free_kbytes", "67584")]


def test_no_write_without_its_original(tmp_path: Path) -> None:
    """A node-level write whose original cannot be kept is not made: koordnode could not undo it."""
    procfs = _procfs(tmp_path)
    (tmp_path / "state").write_text("a file where the state directory should be")
    executor = ProcfsExecutor(procfs, originals=_journal(tmp_path))
    result = executor.write("vm.min_free_kbytes", 135168, "test")
    assert result.status is WriteStatus.FAILED and "original could not be kept" in result.detail
    assert (procfs / "sys/vm/min_free_kbytes").read_text().strip() == "67584"


# --- real cgroups -----------------------------------------------------------------------------------


@pytest.fixture
def kubepods() -> Iterator[str]:
    """A private kubelet-like tree in the real cpu and cpuset hierarchies: <prefix>/kubepods with
    the besteffort tier and one BE pod; everything below the prefix is removed afterwards."""
    prefix = f"/koordnode-test-{secrets.token_hex(4)}"
    kubepods = f"{prefix}/kubepods"
    try:
        for controller in ("cpu", "cpuset"):
            for cgroup in (prefix, kubepods, f"{kubepods}/besteffort", f"{kubepods}/besteffort/podbe1"):
                directory = CGROUP / controller / cgroup.lstrip("/")
                directory.mkdir()
                if controller == "cpuset":  # a fresh v1 cpuset is empty: the parent's sets
                    for name in ("cpuset.mems", "cpuset.cpus"):
                        (directory / name).write_text((directory.parent / name).read_text().strip())
        yield kubepods
    finally:
        for controller in ("cpu", "cpuset"):
            top = CGROUP / controller / prefix.lstrip("/")
            for directory in sorted((p for p in [top, *top.rglob("*")] if p.is_dir()),
                                    key=lambda p: len(p.parts), reverse=True):
                directory.rmdir()


def _read(controller: str, cgroup: str, name: str) -> str:
    return (CGROUP / controller / cgroup.lstrip("/") / name).read_text().strip()


def _config(tmp_path: Path, *, cgroup_root: str = "/sys/fs/cgroup", procfs: Path | None = None,
            extra: str = "") -> Path:
    path = tmp_path / "koordnode.toml"
    path.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
        f'[admin]\nsocket = "{tmp_path / "run" / "admin.sock"}"\n'
        f'[cgroup]\nroot = "{cgroup_root}"\n'
        f'[procfs]\nroot = "{procfs or tmp_path}"\n'
        f'[resctrl]\nroot = "{tmp_path}"\n' + extra)
    return path


@real_v1
def test_koordnode_restore_returns_real_cgroups_to_their_originals(kubepods: str, tmp_path: Path, capsys) -> None:
    tier, pod = f"{kubepods}/besteffort", f"{kubepods}/besteffort/podbe1"
    group = f"{kubepods}/koordnode_be"
    cpus_before = _read("cpuset", tier, "cpuset.cpus")
    shares_before = _read("cpu", pod, "cpu.shares")
    journal = _journal(tmp_path)
    executor = CgroupExecutor(CGROUP, originals=journal)

    def w(cgroup: str, resource: str, value: str | int) -> CgroupWrite:
        return CgroupWrite(cgroup, resource, value, "restore test")

    # What cpu_suppress and the BE group do: the tier's quota and cpuset, an idle group of its own.
    executor.make_cgroup(group, "cpu")
    results = executor.apply([w(tier, "cpu.cfs_quota_us", 50000), w(tier, "cpuset.cpus", "0"),
                              w(group, "cpu.idle", 1) if (CGROUP / "cpu" / group.lstrip("/") / "cpu.idle").exists()
                              else w(group, "cpu.shares", 2),
                              w(pod, "cpu.shares", 2), w(pod, "cpuset.cpus", "0")])  # a pod's: no original
    assert all(r.ok for r in results), results
    executor.apply([w(tier, "cpu.cfs_quota_us", 20000)])  # koordnode's next value: not an original
    assert _read("cpu", tier, "cpu.cfs_quota_us") == "20000" and _read("cpuset", tier, "cpuset.cpus") == "0"

    kept = {(e.kind, e.target): e.value for e in journal.entries()}
    assert any(kind == "cgroup_file" and target.endswith(f"{kubepods}/besteffort/cpu.cfs_quota_us") and value == "-1"
               for (kind, target), value in kept.items())
    assert any(kind == "cgroup_file" and target.endswith("besteffort/cpuset.cpus") and value == cpus_before
               for (kind, target), value in kept.items())
    assert any(kind == "cgroup_dir" and target.endswith("kubepods/koordnode_be") and value is None
               for (kind, target), value in kept.items())
    assert not any("podbe1" in target for _, target in kept)

    config = _config(tmp_path)
    assert main(["restore", "--dry-run", "--config", str(config)]) == 0
    listed = capsys.readouterr().out
    assert "dry run: nothing changed" in listed and "would remove" in listed and "'20000' -> '-1'" in listed
    assert _read("cpu", tier, "cpu.cfs_quota_us") == "20000"

    assert main(["restore", "--config", str(config)]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "restored" in out and "removed" in out
    assert _read("cpu", tier, "cpu.cfs_quota_us") == "-1"
    assert _read("cpuset", tier, "cpuset.cpus") == cpus_before
    assert not (CGROUP / "cpu" / group.lstrip("/")).exists()
    assert _read("cpu", pod, "cpu.shares") == "2" != shares_before  # the pod's value stays (its pod's)
    assert not _state(tmp_path).exists()
    assert main(["restore", "--config", str(config)]) == 0
    assert "nothing to restore" in capsys.readouterr().out


@real_v1
def test_cpusets_narrow_back_children_first(kubepods: str, tmp_path: Path) -> None:
    """Originals narrower than koordnode's sets: the parent cannot narrow while its child holds
    more (v1), so restore retries it once the child is back."""
    tier, pod = f"{kubepods}/besteffort", f"{kubepods}/besteffort/podbe1"
    if len(_read("cpuset", kubepods, "cpuset.cpus").replace("-", ",").split(",")) < 2:
        pytest.skip("needs two CPUs")
    for cgroup in (pod, tier, kubepods):  # the node as koordnode found it: everything on CPU 0
        (CGROUP / "cpuset" / cgroup.lstrip("/") / "cpuset.cpus").write_text("0")
    journal = _journal(tmp_path)
    executor = CgroupExecutor(CGROUP, originals=journal)
    results = executor.apply([CgroupWrite(kubepods, "cpuset.cpus", "0-1", "t"), CgroupWrite(tier, "cpuset.cpus", "0-1", "t")])
    assert all(r.status is WriteStatus.WRITTEN for r in results), results
    report = restore(journal, RestoreRoots(cgroup=str(CGROUP)))
    assert report.ok, report.text()
    assert _read("cpuset", kubepods, "cpuset.cpus") == "0" and _read("cpuset", tier, "cpuset.cpus") == "0"


@real_v1
def test_restore_refuses_while_koordnode_runs(tmp_path: Path, capsys) -> None:
    from koordnode.nodelock import NodeLock, lock_path

    config = _config(tmp_path)
    lock = NodeLock(lock_path(str(tmp_path / "run" / "admin.sock")))
    lock.acquire("proxy", "/run/koordnode.sock")
    try:
        assert main(["restore", "--config", str(config)]) == 1
        assert "stop it first" in capsys.readouterr().err
        assert main(["restore", "--dry-run", "--config", str(config)]) == 0  # listing is fine
    finally:
        lock.release()


@real_v1
def test_a_created_cgroup_that_holds_processes_stays_and_its_entry_too(kubepods: str, tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    executor = CgroupExecutor(CGROUP, originals=journal)
    group = f"{kubepods}/koordnode_be"
    executor.make_cgroup(group, "cpu")
    child = CGROUP / "cpu" / group.lstrip("/") / "podx"
    child.mkdir()  # a BE pod still in the group
    report = restore(journal, RestoreRoots(cgroup=str(CGROUP)))
    assert not report.ok and [a.outcome for a in report.actions] == ["failed"]
    assert "child cgroups" in report.actions[0].detail
    assert len(journal.entries()) == 1  # kept for the next restore
    child.rmdir()
    assert restore(journal, RestoreRoots(cgroup=str(CGROUP))).ok
    assert not (CGROUP / "cpu" / group.lstrip("/")).exists()


# --- hostile state files ----------------------------------------------------------------------------


def test_a_hostile_state_file_writes_nothing_outside_the_roots(tmp_path: Path, capsys) -> None:
    cgroup_root = tmp_path / "cgroup"
    pod_dir = cgroup_root / "cpu" / "kubepods"
    pod_dir.mkdir(parents=True)
    (pod_dir / "cpu.cfs_quota_us").write_text("50000\n")
    (pod_dir / "cpu.shares").write_text("2\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "cpu.cfs_quota_us"
    victim.write_text("precious\n")
    (outside / "empty-dir").mkdir()
    (outside / "cgroup.procs").write_text("")
    (cgroup_root / "cpu" / "escape").symlink_to(outside)
    procfs = _procfs(tmp_path)
    root = str(cgroup_root)
    hostile = [
        {"kind": "cgroup_file", "root": root, "target": "cpu/../../outside/cpu.cfs_quota_us", "value": "1"},
        {"kind": "cgroup_file", "root": root, "target": "cpu/escape/cpu.cfs_quota_us", "value": "1"},
        {"kind": "cgroup_file", "root": root, "target": "cpu/kubepods/release_agent", "value": "/tmp/x"},
        {"kind": "cgroup_file", "root": root, "target": "cpu/kubepods/cpu.shares", "value": "1\n2"},
        {"kind": "cgroup_file", "root": str(outside), "target": "cpu.cfs_quota_us", "value": "1"},
        {"kind": "cgroup_dir", "root": root, "target": "cpu/escape/empty-dir", "value": None},
        {"kind": "cgroup_dir", "root": root, "target": "cpu", "value": None},
        {"kind": "sysctl", "root": str(procfs), "target": "kernel.core_pattern", "value": "|/tmp/x"},
        {"kind": "sysctl", "root": str(procfs), "target": "vm.min_free_kbytes", "value": "not a number"},
        {"kind": "sysctl", "root": "/proc", "target": "vm.min_free_kbytes", "value": "1"},
        {"kind": "resctrl_group", "root": str(tmp_path), "target": "../outside", "value": None},
        {"kind": "resctrl_group", "root": str(tmp_path), "target": "info", "value": None},
        {"kind": "resctrl_group", "root": str(tmp_path), "target": "koordnode-x/../../outside", "value": None},
        {"kind": "resctrl_schemata", "root": str(tmp_path), "target": "koordnode-/../x", "value": "L3:0=f"},
        {"kind": "resctrl_group", "root": str(tmp_path), "target": "foreign-group", "value": None},
        {"kind": "nft_table", "root": "", "target": "inet filter", "value": None},
        {"kind": "tc_root", "root": "", "target": "../eth0", "value": "none"},
        {"kind": "tc_root", "root": "other-netns", "target": "eth0", "value": "none"},
        # The one honest entry: done, and only it leaves the file.
        {"kind": "cgroup_file", "root": root, "target": "cpu/kubepods/cpu.cfs_quota_us", "value": "-1"},
    ]
    _write_state(tmp_path, hostile)
    config = _config(tmp_path, cgroup_root=root, procfs=procfs)
    assert main(["restore", "--json", "--config", str(config)]) == 1
    report = json.loads(capsys.readouterr().out)
    outcomes = [a["outcome"] for a in report["actions"]]
    assert outcomes.count("restored") == 1 and outcomes.count("skipped") == len(hostile) - 1, report
    assert victim.read_text() == "precious\n" and (outside / "empty-dir").is_dir()
    assert (pod_dir / "cpu.cfs_quota_us").read_text() == "-1\n" and (pod_dir / "cpu.shares").read_text() == "2\n"
    assert (procfs / "sys/vm/min_free_kbytes").read_text() == "67584\n"
    assert (cgroup_root / "cpu").is_dir()
    left = json.loads(_state(tmp_path).read_text())["originals"]
    assert len(left) == len(hostile) - 1  # refused entries stay for the operator to look at


# --- tc and nftables in a network namespace -----------------------------------------------------------


@pytest.fixture
def netns() -> Iterator[str]:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nft"):
        pytest.skip("needs root, iproute2 and nftables")
    name = f"kn-restore-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "add", "up0", "type", "veth", "peer", "name", "up1"], check=True)
        for device in ("up0", "up1"):
            subprocess.run(["ip", "-n", name, "link", "set", device, "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _root_qdisc(ns: str, device: str = "up0") -> str:
    out = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", device, "root"], check=True,
                         capture_output=True, text=True).stdout
    return out.split()[1] if out.strip() else ""


def test_qdiscs_and_the_nft_table_koordnode_created_are_removed(netns: str, tmp_path: Path) -> None:
    # A root qdisc someone installed (pfifo: what this test kernel offers besides htb).
    subprocess.run(["tc", "-n", netns, "qdisc", "replace", "dev", "up0", "root", "handle", "77:", "pfifo"], check=True)
    up1_before = _root_qdisc(netns, "up1")  # the kernel's default for a veth
    journal = _journal(tmp_path)
    executor = NetQoSExecutor(netns=netns, originals=journal)
    plan = NetPlan(trees=(HtbTree("up0", 2, (HtbClass(1, 0, 100_000_000, 100_000_000, 0, "root"),
                                            HtbClass(2, 1, 10_000_000, 100_000_000, 1, "BE")), "uplink"),
                          HtbTree("up1", 1, (HtbClass(1, 0, 50_000_000, 50_000_000, 0, "root"),), "uplink")),
                   uplinks=("up0", "up1"), egress4=(), egress6=(), ingress4=(), ingress6=())
    report = executor.apply(plan)
    assert not report.failures, report.failures
    assert _root_qdisc(netns) == "htb" and _root_qdisc(netns, "up1") == "htb"
    kept = {(e.kind, e.target): e.value for e in journal.entries()}
    assert kept[("tc_root", "up0")] == "pfifo 77:" and kept[("nft_table", "inet koordnode")] is None

    restored = restore(journal, RestoreRoots(netns=netns))
    assert restored.ok, restored.text()
    assert _root_qdisc(netns) == "pfifo"  # installed again (default parameters)
    assert _root_qdisc(netns, "up1") == up1_before  # the kernel's default is back (ours gone, its classes with it)
    listed = subprocess.run(["ip", "netns", "exec", netns, "nft", "list", "tables"], check=True,
                            capture_output=True, text=True).stdout
    assert "koordnode" not in listed
    assert journal.entries() == []


# --- [daemon] restore_on_stop ------------------------------------------------------------------------


@pytest.mark.parametrize(("restore_on_stop", "dry_run"), [(True, False), (False, False), (True, True)])
def test_restore_on_stop(tmp_path: Path, restore_on_stop: bool, dry_run: bool) -> None:
    """The daemon's executors keep originals in [daemon] state_dir; a clean stop restores them
    only with restore_on_stop (and not in a dry run, which changed nothing)."""
    import asyncio

    from faketree import make_cgroup_tree
    from koordnode.config import parse_config
    from koordnode.daemon import Daemon

    root = make_cgroup_tree(tmp_path / "tree", "v1", False, ["/kubepods/besteffort"])
    procfs = _procfs(tmp_path)
    sock = tmp_path / "s"
    sock.mkdir()
    daemon = Daemon(parse_config(
        f'[proxy]\nlisten = "{sock}/k.sock"\n[admin]\nsocket = "{sock}/a.sock"\n'
        f'[cgroup]\nroot = "{root}"\n[procfs]\nroot = "{procfs}"\n'
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nrestore_on_stop = {str(restore_on_stop).lower()}\n'))
    assert daemon.qos is not None and daemon.qos_manager is not None
    quota = root / "cpu" / "kubepods" / "besteffort" / "cpu.cfs_quota_us"
    before = quota.read_text().strip()
    # The executors the engine and the manager write through (cpu_suppress, memory_qos).
    daemon.qos.executor.apply([CgroupWrite("/kubepods/besteffort", "cpu.cfs_quota_us", 5000, "test")])
    daemon.qos_manager._procfs().write("vm.min_free_kbytes", 135168, "test")
    assert quota.read_text().strip() == "5000"
    assert {e.kind for e in OriginalsJournal(tmp_path / "state").entries()} == {"cgroup_file", "sysctl"}
    daemon.running_config.set_dry_run(dry_run)

    asyncio.run(daemon.stop())
    restored = restore_on_stop and not dry_run
    assert (quota.read_text().strip() == before) is restored
    assert ((procfs / "sys/vm/min_free_kbytes").read_text().strip() == "67584") is restored
    assert _state(tmp_path).exists() is not restored
