"""The demo tells the truth: it runs as a user runs it, and what its live view shows is checked
against the kernel's counters it reads and koordnode's own log.

The view must show BE taking the node while LS is quiet and giving way while LS is busy, read
from the cgroups koordnode really put the pods in (a BE pod lives in koordnode's BE group, not in
kubelet's besteffort tier), and the quota column must be the values koordnode wrote, on the
cgroup it wrote them to.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from testbed.containerd_bed import missing_prerequisites
from testbed.fixtures import running_in_ci

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
CG = Path("/sys/fs/cgroup")

# Long enough that the last (quiet) third lets the BE quota grow back to its target and to -1
# (10 % of the node per tick), with the view's ticks stretched on a loaded machine.
DEMO_SECONDS = 36


def logged_quota_writes(log: Path) -> list[dict]:
    writes = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "cgroup_write" and event.get("resource") in ("cpu.cfs_quota_us", "cpu.max"):
            writes.append(event)
    return writes


def outrank_the_rest_of_the_machine(bed_cgroup: str) -> None:
    """Give the demo's whole test bed (kubelet's top cgroup and all below it) the largest CPU
    weight against the rest of the machine, as if the node ran nothing else: what is checked is
    how koordnode shares the bed between LS and BE, and a neighbour's build on a shared machine
    would otherwise take the CPUs LS leaves idle (BE has the lowest weight on purpose)."""
    for path, value in ((CG / "cpu" / bed_cgroup.lstrip("/") / "cpu.shares", "262144"),
                        (CG / bed_cgroup.lstrip("/") / "cpu.weight", "10000")):
        if path.exists():
            path.write_text(value)


def test_demo_view_follows_koordnode_and_shows_be_yielding(tmp_path):
    problems = missing_prerequisites()
    if problems:
        if running_in_ci():
            pytest.fail(f"the demo cannot run: {problems}")
        pytest.skip(f"the demo cannot run: {problems}")
    # Short: containerd's sockets go under it (unix socket paths end at 104 bytes).
    work = Path(tempfile.mkdtemp(prefix="kn-demo-"))
    view = tmp_path / "view.jsonl"
    demo = subprocess.Popen(
        [sys.executable, "-m", "scripts.demo", "--seconds", str(DEMO_SECONDS), "--workdir", str(work), "--keep-logs",
         "--record", str(view)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        out = []
        assert demo.stdout is not None
        for line in demo.stdout:
            out.append(line)
            placed = re.match(r"== koordnode put LS 'web' in (\S+)/kubepods/", line)
            if placed:
                outrank_the_rest_of_the_machine(placed[1])
                break
        rest, err = demo.communicate(timeout=240)
        stdout = "".join(out) + rest
        print(stdout[-6000:])
        assert demo.returncode == 0, err[-4000:]
        writes = logged_quota_writes(work / "koordnode" / "koordnode.log")
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        shutil.rmtree(work, ignore_errors=True)
    rows = [json.loads(line) for line in view.read_text().splitlines()]
    assert len(rows) == DEMO_SECONDS

    # The pods are read where koordnode put them: BE in its group, LS in kubelet's burstable tier.
    be_cgroup, ls_cgroup, be_tier = rows[-1]["be_cgroup"], rows[-1]["ls_cgroup"], rows[-1]["be_quota_cgroup"]
    assert "/koordnode_be/pod" in be_cgroup and "/besteffort/" not in be_cgroup
    assert "/burstable/pod" in ls_cgroup
    assert be_tier.endswith("/koordnode_be") and be_cgroup.startswith(be_tier + "/")
    assert all(r["be_quota_cgroup"] == be_tier for r in rows)

    quiet = [r for r in rows if r["phase"] == "LS quiet"]
    busy = [r for r in rows if r["phase"] == "LS busy"]
    assert len(busy) >= 4 and len(quiet) >= 8
    # LS busy: once koordnode reacted (first second), BE gets almost nothing.
    settled = [r["be_cpus"] for r in busy[1:]]
    assert sum(settled) / len(settled) < 0.2, busy
    # ... while LS really was busy (how much it got depends on what else runs on the machine).
    ls_busy = sum(r["ls_cpus"] for r in busy[1:]) / len(busy[1:])
    ls_quiet = sum(r["ls_cpus"] for r in quiet[1:]) / len(quiet[1:])
    assert ls_busy > max(0.1, 3 * ls_quiet), (ls_busy, ls_quiet)

    # The quota column: what koordnode logged writing on its BE group, nothing else.
    assert writes, "koordnode logged no quota write"
    assert all(w["cgroup"] == be_tier for w in writes), writes
    logged = {"-1"} | {str(w["new"]).split()[0] for w in writes}
    shown = [r["be_quota_us"] for r in rows]
    assert set(shown) <= logged, (shown, logged)
    limited = [r["be_quota_us"] for r in rows if r["phase"] == "LS busy" and r["be_quota_us"] != "-1"]
    assert limited, f"the view showed no quota while LS was busy: {shown}"
    assert shown[-1] == "-1"  # lifted again once LS was quiet

    assert "done: no pods, cgroups, sockets or processes left" in stdout

    ncpu = os.cpu_count() or 1
    # Last, as it may be skipped. LS quiet: BE takes what is idle (one busy loop per CPU) in each
    # second in which nothing else wanted the CPUs, but the first (the loops start) and those
    # before koordnode lifted the quota again after the busy phase. Work beside the demo that the
    # bed's weight does not hold off (another bed, a VM) takes the CPUs, and then the claim
    # cannot be checked.
    free = [r for r in quiet[1:] if r["be_quota_us"] == "-1" and r["other_cpus"] is not None
            and r["other_cpus"] + r["ls_cpus"] < 0.4]
    if len(free) < 3:
        others = [round(r["other_cpus"] or 0, 2) for r in quiet]
        if running_in_ci():
            pytest.fail(f"other work used the node's CPUs while LS was quiet: {others}")
        pytest.skip(f"other work on this machine used the CPUs while LS was quiet: {others}")
    assert min(r["be_cpus"] for r in free) > (1.0 if ncpu >= 2 else 0.8), quiet
