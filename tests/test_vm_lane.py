"""The VM lane from the host: boot the Debian 13 guest once per session, report each guest test.

The guest (systemd as PID 1, cgroup v2 only, containerd 1.7 from Debian 13) runs pytest on
tests/vm_guest/; every test function found there becomes one test here, passing, failing
or skipping as it did in the guest, with the guest's message. See tests/vm/README.md.

Not root, or qemu/debootstrap missing: skipped (an error under CI=true).
``KOORDNODE_VM_LANE=0`` skips the lane on purpose (a developer's quick run; never in CI).
"""

from __future__ import annotations

import ast
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from testbed.fixtures import running_in_ci, skip_or_fail_in_ci
from vm import reboot
from vm.lane import LaneError, LaneResult, guest_shards, missing_tools, run_lane

GUEST_TESTS = Path(__file__).resolve().parent / "vm_guest"
LANE_TIMEOUT_S = float(os.environ.get("KOORDNODE_VM_TIMEOUT_S", "3000"))

# The lane's own budget bounds it; pytest-timeout (600 s per test, fixture set-up included)
# must not cut the session fixture that boots the VM.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(LANE_TIMEOUT_S + 300)]


def _containerd_releases(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The releases of a ``@pytest.mark.containerd("1.7", "2.1")`` decorator (tests/vm_guest/conftest.py)."""
    for decorator in node.decorator_list:
        if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                and decorator.func.attr == "containerd"):
            return [arg.value for arg in decorator.args if isinstance(arg, ast.Constant)]
    return []


def guest_test_ids() -> list[str]:
    """``file.py::test_name`` of every top-level test function in tests/vm_guest/ (static, no import);
    ``file.py::test_name[2.1]`` per release for a test that runs on several containerd releases."""
    ids = []
    for path in sorted(GUEST_TESTS.glob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                releases = _containerd_releases(node)
                ids += [f"{path.name}::{node.name}[{r}]" for r in releases] or [f"{path.name}::{node.name}"]
    return ids


def _name_matches(name: str, func: str) -> bool:
    """A guest test's name against ``func`` (any parameters) or ``func[param]`` (exactly)."""
    return name == func if "[" in func else name.split("[")[0] == func


def _unavailable(reason: str) -> None:
    skip_or_fail_in_ci(f"VM lane unavailable: {reason}")


@pytest.fixture(scope="session")
def vm_lanes(tmp_path_factory: pytest.TempPathFactory) -> list[LaneResult]:
    """One result per VM: the guest tests run split over two VMs at once (tests/vm/lane.py)."""
    if os.environ.get("KOORDNODE_VM_LANE", "1") == "0" and not running_in_ci():
        pytest.skip("KOORDNODE_VM_LANE=0")
    if os.geteuid() != 0:
        _unavailable("needs root (debootstrap, 9p shares)")
    if missing := missing_tools():
        _unavailable("missing " + ", ".join(missing) + " (scripts/install-deps.sh)")
    try:
        return run_lane(tmp_path_factory.mktemp("vm-lane"), timeout_s=LANE_TIMEOUT_S, shards=guest_shards())
    except LaneError as err:
        pytest.fail(f"VM lane could not run: {err}", pytrace=False)


def _cases(result: LaneResult) -> list[ET.Element]:
    if result.junit is None:
        return []
    return list(ET.parse(result.junit).getroot().iter("testcase"))


def _case_matches(case: ET.Element, test_id: str) -> bool:
    file_name, func = test_id.split("::")
    module = file_name.removesuffix(".py")
    return case.get("classname", "").split(".")[-1] == module and _name_matches(case.get("name", ""), func)


def test_guest_ran_and_reported(vm_lanes: list[LaneResult]) -> None:
    known = guest_test_ids()
    for vm_lane in vm_lanes:
        print(f"{vm_lane.summary}, files {list(vm_lane.files) or 'all'}")
        print(f"guest: {vm_lane.facts}")
        runs = vm_lane.results_dir / "runs.json"  # more than one: a guest pytest died (supervise.py)
        if runs.is_file():
            print(f"guest pytest runs: {runs.read_text()}")
        for crash in vm_lane.crashes:  # an earlier boot's; its unfinished tests ran in a new one (vm/reboot.py)
            print(f"GUEST KERNEL CRASHED in an earlier boot (its tests without a result ran again):\n{crash}")
    for vm_lane in vm_lanes:
        which = f"the guest running {list(vm_lane.files) or 'every file'}"
        assert not vm_lane.kernel_panic, (
            f"{which}: the guest kernel crashed:\n{reboot.crash_report(vm_lane.console_log)}")
        assert vm_lane.exit_code is not None, (
            f"{which} never reported (console: {vm_lane.console_log}):\n{_tail(vm_lane.console_log)}"
        )
        assert vm_lane.junit is not None, f"{which}: no junit; guest log:\n{vm_lane.guest_log[-4000:]}"
        strays = [f"{c.get('classname')}::{c.get('name')}" for c in _cases(vm_lane)
                  if not any(_case_matches(c, test_id) for test_id in known)]
        assert not strays, f"{which}: guest results this host test does not know: {strays}"
        assert vm_lane.exit_code in (0, 1), f"{which}: guest pytest exit {vm_lane.exit_code}:\n{vm_lane.guest_log[-4000:]}"


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no console log)"


def _progress(result: LaneResult, guest_test: str) -> list[dict]:
    """Results the guest wrote test by test (tests/vm_guest/conftest.py), for a run without junit."""
    path = result.results_dir / "progress.jsonl"
    if not path.is_file():
        return []
    file_name, func = guest_test.split("::")
    entries = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        node_file, _, node_name = entry.get("nodeid", "").partition("::")
        if "outcome" not in entry or (entry.get("when") == "teardown" and entry["outcome"] == "passed"):
            continue  # a test's start, or the end of one (tests/vm/guest/progress_plugin.py)
        if node_file.endswith("/" + file_name) and _name_matches(node_name, func):
            entries.append(entry)
    return entries


@pytest.mark.parametrize("guest_test", guest_test_ids())
def test_guest(vm_lanes: list[LaneResult], guest_test: str) -> None:
    file_name = guest_test.split("::")[0]
    vm_lane = next((lane for lane in vm_lanes if lane.ran(file_name)), None)
    if vm_lane is None:
        pytest.fail(f"no guest ran {file_name} (shards: {[list(lane.files) for lane in vm_lanes]})", pytrace=False)
    cases = [c for c in _cases(vm_lane) if _case_matches(c, guest_test)]
    if not cases and vm_lane.junit is None:
        entries = _progress(vm_lane, guest_test)
        for entry in entries:
            if entry.get("stdout"):
                print(entry["stdout"])
        failed = [e for e in entries if e["outcome"] == "failed"]
        if failed:
            pytest.fail("in the VM (run cut short, from the progress log):\n"
                        + "\n\n".join(e.get("message", "") for e in failed), pytrace=False)
        if entries and all(e["outcome"] == "skipped" for e in entries):
            pytest.skip("in the VM: " + entries[0].get("message", ""))
        if entries:
            return
    if not cases:
        pytest.fail(f"{guest_test} has no result from the guest (exit {vm_lane.exit_code}); guest log tail:\n"
                    f"{vm_lane.guest_log[-3000:]}", pytrace=False)
    failures, skips = [], []
    for case in cases:
        for kind in ("failure", "error"):
            for element in case.findall(kind):
                failures.append(f"{case.get('name')}: {element.get('message', '')}\n{(element.text or '')[-3000:]}")
        for element in case.findall("skipped"):
            skips.append(f"{case.get('name')}: {element.get('message', '')}")
        for element in case.findall("system-out"):
            if element.text:
                print(element.text[-3000:])
    if failures:
        pytest.fail(f"in the VM ({vm_lane.accel.upper()}):\n" + "\n\n".join(failures), pytrace=False)
    if skips and len(skips) == len(cases):
        pytest.skip("in the VM: " + "; ".join(skips))


def test_guest_tests_on_several_containerd_releases_are_reported_per_release() -> None:
    """No VM: the static mapping from guest results to host tests (one per release of a
    ``containerd(...)``-marked guest test, one for any other test and its parameters)."""
    ids = guest_test_ids()
    marked = "test_qos_systemd_v2.py::test_be_tier_cpu_max_is_suppressed"
    assert f"{marked}[1.7]" in ids and f"{marked}[2.1]" in ids and marked not in ids
    assert "test_platform.py::test_second_virtio_disk_is_a_real_block_device" in ids

    def case(name: str) -> ET.Element:
        return ET.Element("testcase", classname="tests.vm_guest.test_qos_systemd_v2", name=name)

    assert _case_matches(case("test_be_tier_cpu_max_is_suppressed[2.1]"), f"{marked}[2.1]")
    assert not _case_matches(case("test_be_tier_cpu_max_is_suppressed[1.7]"), f"{marked}[2.1]")
    unmarked = "test_qos_systemd_v2.py::test_system_class_values_in_the_v2_files"
    assert _case_matches(case("test_system_class_values_in_the_v2_files[1.7]"), unmarked)


def test_the_shards_cover_every_guest_file_once_and_keep_the_session_bed_together(tmp_path: Path) -> None:
    """No VM: every guest test file runs in exactly one VM, a new file lands in the second, and
    the files on the session bed (containerd_release) share one VM, so no two koordnodes of the
    same release run in different guests' halves of a release group."""
    shards = guest_shards()
    files = sorted(path.name for path in GUEST_TESTS.glob("test_*.py"))
    assert len(shards) == 2
    assert sorted(name for shard in shards for name in shard) == files
    on_the_bed = {path.name for path in GUEST_TESTS.glob("test_*.py")
                  if re.search(r"def test_\w+\([^)]*\bsystemd_bed\b", path.read_text())}
    assert on_the_bed and all(sum(name in shard for name in on_the_bed) in (0, len(on_the_bed)) for shard in shards), \
        (on_the_bed, shards)
    for name in ("test_platform.py", "test_a_new_one.py"):
        (tmp_path / name).write_text("")
    assert guest_shards(tmp_path) == [("test_platform.py",), ("test_a_new_one.py",)]


def test_a_stopped_guest_says_what_pytest_was_doing_in_the_kernel() -> None:
    """No VM: the guest's diagnosis of a pytest stopped by the bound (tests/vm/guest/run.py) on
    a process of this host: its line in the process list, the kernel stack of each thread."""
    if os.geteuid() != 0:
        pytest.skip("kernel stacks (/proc/PID/task/TID/stack) need root")
    import importlib.util
    import io
    import subprocess

    spec = importlib.util.spec_from_file_location("guest_run", Path(__file__).parent / "vm" / "guest" / "run.py")
    assert spec and spec.loader
    guest_run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guest_run)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        out = io.StringIO()
        guest_run.diagnose_stuck(sleeper.pid, out, sysrq=False)
    finally:
        sleeper.kill()
        sleeper.wait()
    text = out.getvalue()
    assert re.search(rf"^\s*{sleeper.pid}\s+\d+\s+S\S*\s+\S+.*sleep 60$", text, re.M), text[:3000]
    stack = text.split(f"--- kernel stack of {sleeper.pid}/{sleeper.pid}:", 1)
    assert len(stack) == 2 and "nanosleep" in stack[1].split("---")[0], text[-3000:]
    assert "--- kernel log" in text
