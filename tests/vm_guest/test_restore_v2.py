"""`koordnode restore` on the guest's own kernel (VM lane: cgroup v2, real sysctls).

The host test (tests/test_restore.py) covers v1 cgroups and writes the sysctls under a fake
procfs root, because vm.min_free_kbytes and vm.watermark_scale_factor are not namespaced and the
host is shared. The guest is ours: here koordnode's executors write the real vm sysctls and a
private v2 tree shaped like kubelet's (a besteffort tier that exists before koordnode, and a BE
group koordnode creates), then `koordnode restore` must put every value back and remove the
group; a second run finds nothing to do.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordnode.cli import main
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.executor.originals import OriginalsJournal
from koordnode.executor.procfs_executor import ProcfsExecutor
from koordnode.executor.write_result import WriteStatus
from koordnode.policy.plan import CgroupWrite

CG = Path("/sys/fs/cgroup")
VM = Path("/proc/sys/vm")


def _sysctl(name: str) -> str:
    return (VM / name).read_text().strip()


@pytest.fixture
def sysctls() -> Iterator[dict[str, str]]:
    """The guest's vm sysctls as they are now, written back whatever the test leaves."""
    before = {name: _sysctl(name) for name in ("min_free_kbytes", "watermark_scale_factor")}
    yield before
    for name, value in before.items():
        (VM / name).write_text(value)


@pytest.fixture
def tier() -> Iterator[str]:
    """A private v2 tree <prefix>/kubepods/besteffort with the cpu controller enabled along it,
    made before koordnode (as kubelet's is), removed afterwards."""
    prefix = f"/kn-restore-{secrets.token_hex(4)}"
    made: list[Path] = []
    # The root hands cpu down only while some unit needs it: enable it (ENOENT below otherwise).
    (CG / "cgroup.subtree_control").write_text("+cpu")
    try:
        for cgroup in (prefix, f"{prefix}/kubepods", f"{prefix}/kubepods/besteffort"):
            directory = CG / cgroup.lstrip("/")
            directory.mkdir()
            made.append(directory)
            if not cgroup.endswith("besteffort"):
                (directory / "cgroup.subtree_control").write_text("+cpu")
        yield f"{prefix}/kubepods/besteffort"
    finally:
        for directory in sorted((p for p in (CG / prefix.lstrip("/")).rglob("*") if p.is_dir()),
                                key=lambda p: len(p.parts), reverse=True):
            directory.rmdir()
        if made:
            made[0].rmdir()


def test_restore_returns_real_sysctls_and_v2_cgroups_to_their_originals(sysctls, tier, tmp_path, capsys):
    state = tmp_path / "state"
    journal = OriginalsJournal(state)
    procfs = ProcfsExecutor("/proc", originals=journal)
    min_free = int(sysctls["min_free_kbytes"])
    assert procfs.write("vm.min_free_kbytes", min_free * 2, "restore test").status is WriteStatus.WRITTEN
    assert procfs.write("vm.min_free_kbytes", min_free * 3, "restore test").ok  # koordnode's next value
    scale = int(sysctls["watermark_scale_factor"])
    assert procfs.write("vm.watermark_scale_factor", scale + 5, "restore test").ok
    assert _sysctl("min_free_kbytes") == str(min_free * 3)

    cgroups = CgroupExecutor(CG, originals=journal)
    tier_dir = CG / tier.lstrip("/")
    max_before, weight_before = (tier_dir / "cpu.max").read_text().strip(), (tier_dir / "cpu.weight").read_text().strip()
    group = tier.rsplit("/", 1)[0] + "/koordnode_be"
    cgroups.make_cgroup(group, "cpu")
    results = cgroups.apply([CgroupWrite(tier, "cpu.cfs_quota_us", 50000, "restore test"),
                             CgroupWrite(tier, "cpu.shares", 2, "restore test"),
                             CgroupWrite(group, "cpu.idle", 1, "restore test")])
    assert all(r.ok for r in results), results
    assert (tier_dir / "cpu.max").read_text().split()[0] == "50000"
    assert (tier_dir / "cpu.weight").read_text().strip() != weight_before
    assert (CG / group.lstrip("/")).is_dir()

    config = tmp_path / "koordnode.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state}"\n[admin]\nsocket = "{tmp_path / "run" / "admin.sock"}"\n'
                      f'[resctrl]\nroot = "{tmp_path}"\n')
    assert main(["restore", "--config", str(config)]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "restored" in out and "removed" in out, out
    assert _sysctl("min_free_kbytes") == sysctls["min_free_kbytes"]
    assert _sysctl("watermark_scale_factor") == sysctls["watermark_scale_factor"]
    assert (tier_dir / "cpu.max").read_text().strip() == max_before
    assert (tier_dir / "cpu.weight").read_text().strip() == weight_before
    assert not (CG / group.lstrip("/")).exists()
    assert main(["restore", "--config", str(config)]) == 0
    assert "nothing to restore" in capsys.readouterr().out
