"""Guest side of the VM lane (run by koordnode-vm-lane.service as root): pytest on tests/vm_guest/.

Reads /results/request.json (pytest args, time bound), writes /results/guest.log,
/results/junit.xml, /results/facts.json (what the guest is) and /results/exit_code
last, so the host can tell "ran and failed" from "never finished". The unit powers
the VM off when this exits.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when loaded by a host test
from supervise import supervise  # noqa: E402

RESULTS = Path("/results")
PROJECT = Path("/project")
PYCACHE = "/var/cache/koordnode-vm-pyc"


def _output(*cmd: str, timeout_s: float = 30, with_stderr: bool = False) -> str:
    """A command's output (its stderr after it with `with_stderr`), or why it could not run."""
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError) as err:
        return f"({' '.join(cmd)}: {err})"
    return result.stdout + result.stderr if with_stderr else result.stdout


def _facts() -> dict:
    def out(*cmd: str) -> str:
        return _output(*cmd).strip()

    return {
        "kernel": platform.release(),
        "systemd": out("systemctl", "--version").splitlines()[0] if out("systemctl", "--version") else "",
        "cgroup_fs": out("stat", "-fc", "%T", "/sys/fs/cgroup"),
        "containerd": out("containerd", "--version"),
        "runc": out("runc", "--version").splitlines()[0] if out("runc", "--version") else "",
        "python": platform.python_version(),
        "pid1": Path("/proc/1/comm").read_text().strip(),
        "disks": sorted(p.name for p in Path("/sys/block").iterdir()),
    }


def _collect_logs(log) -> None:
    """koordnode, containerd and kubelet logs of the guest tests, for post-mortems on the host."""
    target = RESULTS / "logs"
    for path in sorted(Path("/var/tmp/pytest").rglob("*.log"))[:200]:
        if path.name not in ("koordnode.log", "containerd.log", "kubelet.log"):
            continue
        try:
            dest = target / "_".join(path.relative_to("/var/tmp/pytest").parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(path.read_bytes()[-2_000_000:])
        except OSError as err:
            print(f"could not copy {path}: {err}", file=log)


def diagnose_stuck(pid: int, log, *, sysrq: bool = True) -> None:
    """What a guest stopped by the time bound was doing: every process with its state and kernel
    wait channel, the kernel stacks of pytest's threads and of every task in uninterruptible sleep
    (a cgroup write or read blocked in the kernel ignores pytest-timeout's signal), the kernel log."""
    def run(*cmd: str) -> str:
        return _output(*cmd, timeout_s=60, with_stderr=True)

    print("--- processes (stat, kernel wait channel)", file=log)
    print(run("ps", "-eo", "pid,ppid,stat,wchan:32,etime,args", "--sort", "pid"), file=log)
    stuck = {str(pid)}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "D":
                stuck.add(proc.name)
        except (OSError, IndexError):
            continue
    for task_pid in sorted(stuck, key=int):
        for task in sorted(Path(f"/proc/{task_pid}/task").glob("*")):
            try:
                print(f"--- kernel stack of {task_pid}/{task.name}:\n{(task / 'stack').read_text()}", file=log)
            except OSError as err:
                print(f"--- kernel stack of {task_pid}/{task.name}: {err}", file=log)
    if sysrq:
        try:
            Path("/proc/sysrq-trigger").write_text("w")  # blocked tasks, into the kernel log
        except OSError as err:
            print(f"sysrq w: {err}", file=log)
    print("--- kernel log (last 300 lines)", file=log)
    print("\n".join(run("dmesg", "-T").splitlines()[-300:]), file=log)


def main() -> int:
    request = json.loads((RESULTS / "request.json").read_text())
    log = open(RESULTS / "guest.log", "w", buffering=1)  # noqa: SIM115 - the whole run
    facts = _facts()
    (RESULTS / "facts.json").write_text(json.dumps(facts, indent=2))
    print(f"koordnode VM lane guest: {json.dumps(facts)}", file=log)
    # The dependencies: the host attaches them as an ext4 image (/dev/vdc), much faster to
    # import from under TCG than the 9p share, which stays as the fallback.
    pydeps = Path("/var/lib/koordnode-vm/pydeps")
    pydeps.mkdir(parents=True, exist_ok=True)
    mounted = Path("/dev/vdc").exists() and subprocess.run(
        ["mount", "-o", "ro", "/dev/vdc", str(pydeps)], capture_output=True, timeout=60).returncode == 0
    if not mounted:
        pydeps = Path("/opt/pydeps")
    print(f"dependencies at {pydeps}", file=log)
    # The real-node bed's static binaries, shared read-only by the host when it has them
    # (tests/vm/lane.py, tag "testbedcache"); not in the image's fstab, so no image rebuild.
    testbed = Path("/var/cache/koordnode-testbed")
    testbed.mkdir(parents=True, exist_ok=True)
    mount = subprocess.run(["mount", "-t", "9p", "-o", "trans=virtio,version=9p2000.L,msize=262144,ro",
                            "testbedcache", str(testbed)], capture_output=True, text=True, timeout=60)
    print(f"testbed binaries at {testbed}: "
          f"{'mounted' if mount.returncode == 0 else 'not mounted: ' + mount.stderr.strip()}", file=log)
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": f"{pydeps}:{PROJECT}",
        # The project share and the dependencies' disk are read-only and hold no byte code for
        # the guest's CPython: without a writable cache every Python start (each `koordnode run`,
        # doctor, the tests' own) compiled every module it imports again, seconds of TCG each.
        # Compiled once per boot into the guest's disk instead (the stdlib's too, as Python then
        # reads byte code from this tree only).
        "PYTHONPYCACHEPREFIX": PYCACHE,
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "KOORDNODE_VM_GUEST": "1",
        "CI": "true",  # a missing prerequisite in the guest is a failure, not a skip
    })
    env["PYTHONPATH"] += f":{Path(__file__).resolve().parent}"  # progress_plugin
    guest_tests = PROJECT / "tests" / "vm_guest"
    # The node ids are a second boot's, after the first one's kernel crashed (tests/vm/reboot.py).
    paths = ([str(PROJECT / nodeid) for nodeid in request.get("nodeids") or []]
             or [str(guest_tests / name) for name in request.get("files", [])] or [str(guest_tests)])
    pytest_cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "progress_plugin", "-rA", "-v",
                  "-o", "junit_logging=system-out",
                  "-o", "timeout=300",  # one stuck guest test must not eat the lane's whole budget
                  *request.get("pytest_args", [])]
    # No faulthandler_timeout: its dump walks the other threads' frames from a watchdog thread
    # while they run, and CPython 3.13 died of it (SIGSEGV) after dumping a test that was only
    # slow. A test stuck where pytest-timeout's signal cannot reach it is the supervisor's.
    began = time.monotonic()
    outcome = supervise(pytest_cmd, paths, RESULTS, cwd=PROJECT, env=env, bound_s=request.get("timeout_s", 900),
                        log=log, diagnose=diagnose_stuck, basetemp=Path("/var/tmp/pytest"))
    code = outcome.exit_code
    print(f"guest pytest exit {code} after {time.monotonic() - began:.0f} s "
          f"({len(outcome.runs)} run(s): {[r.exit_code for r in outcome.runs]})", file=log)
    _collect_logs(log)
    log.close()
    (RESULTS / "exit_code").write_text(f"{code}\n")
    os.sync()
    return 0


if __name__ == "__main__":
    sys.exit(main())
