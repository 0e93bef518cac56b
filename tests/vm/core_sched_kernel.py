"""Core scheduling on a real kernel: boot a small kernel built with CONFIG_SCHED_CORE
(scripts/core-sched-kernel.sh; Debian's kernels have it off) on the VM lane's Debian 13 root
filesystem, under TCG with SMT siblings (`-smp 4,cores=2,threads=2`), with
tests/vm/guest/core_sched_kernel.py as PID 1 instead of systemd. The guest writes each check's
outcome to core_sched.json on the results share (9p), as the lane's guest writes its junit.

Reused from the lane (tests/vm/lane.py): the cached root filesystem (a throw-away snapshot),
the dependency disk, the 9p shares of the project and the results.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

VM = Path(__file__).resolve().parent
for _path in (VM.parent.parent, VM.parent):  # run as a script: make tests/ and the project importable
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from vm.guest.core_sched_kernel import CHECKS, RESULT_FILE  # noqa: E402
from testbed.background_build import BackgroundBuildError, wait_for  # noqa: E402
from vm.lane import REPO, LaneError, build_image, deps_disk, missing_tools  # noqa: E402

SCRIPT = REPO / "scripts" / "core-sched-kernel.sh"
SMP = "4,cores=2,threads=2"  # cpu0 and cpu1 are the two hardware threads of one core
BUILD_TIMEOUT_S = 2400
BOOT_TIMEOUT_S = 900
KERNEL_BUILD_TOOLS = ("apt-get", "dpkg-deb", "gcc", "make", "flex", "bison", "bc", "xz")
# PID 1: /proc and the project, then the guest module, which mounts the rest (no systemd, no initrd).
GUEST_INIT = ("mount -t proc proc /proc; "
              "mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,ro project /project; "
              "exec /usr/bin/python3 -u /project/tests/vm/guest/core_sched_kernel.py")


def missing() -> list[str]:
    """What this machine lacks to build the kernel and boot it (scripts/install-deps.sh installs it)."""
    tools = [t for t in KERNEL_BUILD_TOOLS if shutil.which(t) is None]
    if not Path("/usr/include/libelf.h").is_file():
        tools.append("libelf-dev")
    return missing_tools() + tools


def _log(message: str) -> None:
    print(f"[core-sched-kernel {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build_kernel() -> tuple[Path, dict]:
    """The cached bzImage (built when missing) and its build.json."""
    began = time.monotonic()
    try:
        # scripts/test.sh builds it in the background; when that failed, the script below
        # tries again and says why.
        wait_for("kernel", "core-sched-kernel")
    except BackgroundBuildError as err:
        _log(str(err))
    try:
        result = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        raise LaneError(f"{SCRIPT.name}: not done after {BUILD_TIMEOUT_S} s") from err
    if result.returncode != 0:
        raise LaneError(f"{SCRIPT.name} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    if result.stderr.strip():
        _log(result.stderr.strip())
    kernel = Path(result.stdout.strip().splitlines()[-1])
    info = json.loads((kernel.parent / "build.json").read_text())
    _log(f"kernel {info['release']} ({info['source']} {info['version']}) ready in {time.monotonic() - began:.0f} s")
    return kernel, info


@dataclass
class GuestRun:
    kernel: dict
    results: dict
    console_log: Path
    seconds: float
    exit_code: int | None
    checks: dict = field(default_factory=dict)

    @property
    def console_tail(self) -> str:
        try:
            return "\n".join(self.console_log.read_text(errors="replace").splitlines()[-40:])
        except OSError:
            return "(no console log)"


def qemu_command(kernel: Path, root_disk: Path, pydeps_disk: Path, results: Path, workdir: Path) -> list[str]:
    # One TCG thread for all vCPUs (tests/vm/lane.py's _qemu_command says why not thread=multi).
    return [
        "qemu-system-x86_64", "-accel", "tcg,thread=single", "-cpu", "max", "-smp", SMP, "-m", "1024",
        "-nodefaults", "-display", "none", "-no-reboot", "-serial", f"file:{workdir / 'console.log'}",
        "-kernel", str(kernel),
        "-append", f'root=/dev/vda rw console=ttyS0 panic=-1 loglevel=4 init=/bin/sh -- -c "{GUEST_INIT}"',
        "-drive", f"file={root_disk},if=virtio,format=raw,snapshot=on",  # the cached image stays pristine
        "-drive", f"file={pydeps_disk},if=virtio,format=raw,readonly=on",  # /dev/vdb
        "-virtfs", f"local,path={REPO},mount_tag=project,security_model=none,readonly=on",
        "-virtfs", f"local,path={results},mount_tag=results,security_model=none",
    ]


def run_guest(workdir: Path, timeout_s: float = BOOT_TIMEOUT_S) -> GuestRun:
    """Build/reuse the kernel, the lane's image and dependency disk; boot; read the guest's results."""
    began = time.monotonic()
    kernel, info = build_kernel()
    image = build_image()
    pydeps = deps_disk()
    workdir.mkdir(parents=True, exist_ok=True)
    results = workdir / "results"
    shutil.rmtree(results, ignore_errors=True)
    results.mkdir()
    cmd = qemu_command(kernel, image.root_disk, pydeps, results, workdir)
    (workdir / "qemu-cmd.txt").write_text(" ".join(cmd) + "\n")
    _log(f"booting under TCG with -smp {SMP} (bound {timeout_s:.0f} s); console: {workdir / 'console.log'}")
    booted = time.monotonic()
    with open(workdir / "qemu.stderr", "w") as stderr:
        qemu = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=stderr, stderr=subprocess.STDOUT)
        try:
            exit_code: int | None = qemu.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            qemu.kill()
            qemu.wait(timeout=30)
            exit_code = None
            _log(f"guest still running after {timeout_s:.0f} s: killed")
    result_file = results / RESULT_FILE
    data = json.loads(result_file.read_text()) if result_file.is_file() else {}
    error = results / "guest-error.txt"
    if error.is_file():
        data["error"] = error.read_text(errors="replace")
    run = GuestRun(kernel=info, results=data, console_log=workdir / "console.log",
                   seconds=time.monotonic() - began, exit_code=exit_code, checks=data.get("checks", {}))
    failed = [name for name, c in run.checks.items() if not c["ok"]]
    _log(f"guest done in {time.monotonic() - booted:.0f} s ({run.seconds:.0f} s in all): "
         f"{len(run.checks) - len(failed)} checks passed, failed: {failed or 'none'}")
    return run


def main() -> int:
    """``python3 tests/vm/core_sched_kernel.py [--workdir DIR]``: build, boot, print the guest's results."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="koordnode-core-sched-"))
    try:
        run = run_guest(workdir)
    except LaneError as err:
        print(f"core-sched kernel test error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(run.results, indent=2))
    ok = run.results.get("done") and all(run.checks.get(name, {}).get("ok") for name in CHECKS)
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
