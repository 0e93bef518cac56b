"""Guest side of the core-scheduling kernel test (tests/test_core_sched_kernel.py): PID 1 of a
small kernel built with CONFIG_SCHED_CORE (scripts/core-sched-kernel.sh), booted on the VM
lane's Debian 13 root filesystem with SMT siblings and no systemd nor containerd.

The kernel command line's `init=/bin/sh -- -c "..."` mounts /proc and the project share and
execs this file. It mounts the rest (sysfs, cgroup v2, tmpfs, the results share, the
dependency disk), makes pod-like cgroups holding real processes, drives koordnode's own
core-scheduling code (executor, policy and the hook that keeps each pod at its cookie) and
checks on the kernel what it did. Each check's outcome goes to /results/core_sched.json as it
finishes; then the guest reboots, which ends qemu (-no-reboot).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

RESULTS = Path("/results")
RESULT_FILE = "core_sched.json"
PYDEPS = Path("/var/lib/koordnode-vm/pydeps")
CGROUP_ROOT = Path("/sys/fs/cgroup")
PODS = "kubepods"
CONFIG = "[qos.LSE]\ncore_sched = true\n[qos.LS]\ncore_expeller = true\n"
# The checks, in the order they run; the host test reports one result for each.
CHECKS = (
    "kernel_gives_cookies",
    "lse_pods_own_cookies",
    "be_tasks_share_one_cookie",
    "ls_and_node_untagged",
    "later_processes_get_the_pod_cookie",
    "status_says_on",
    "doctor_says_available",
    "siblings_apart_with_different_cookies",
    "siblings_together_with_one_cookie",
    "siblings_together_untagged",
    "be_kept_off_ls_siblings",
)
MEASURE_S = 4.0
# Busy loops pinned to the two hardware threads of one core: with different cookies the kernel
# never runs them at once (about one CPU between them), with the same or no cookie both run
# (about two). Wide margins: TCG's timing is rough.
APART_BELOW, TOGETHER_ABOVE = 1.4, 1.6
RB_AUTOBOOT = 0x01234567
HOUSEKEEPING_CPUS = {2, 3}  # the other core


class Guest:
    def __init__(self) -> None:
        self.results: dict = {"facts": {}, "checks": {}, "done": False}
        self.children: list[subprocess.Popen] = []

    # ---------------------------------------------------------------- plumbing

    def save(self) -> None:
        tmp = RESULTS / (RESULT_FILE + ".tmp")
        tmp.write_text(json.dumps(self.results, indent=2))
        os.replace(tmp, RESULTS / RESULT_FILE)

    def check(self, name: str, body: Callable[[], str]) -> None:
        began = time.monotonic()
        try:
            detail, ok = body(), True
        except AssertionError as err:
            detail, ok = f"{err}", False
        except Exception:  # noqa: BLE001 - reported to the host, which fails the check
            detail, ok = traceback.format_exc(limit=6), False
        self.results["checks"][name] = {"ok": ok, "detail": detail, "seconds": round(time.monotonic() - began, 1)}
        print(f"core-sched guest: {name}: {'ok' if ok else 'FAILED'}: {detail}", flush=True)
        self.save()

    def spawn(self, script: str, cgroup: str | None = None, cpu: int | None = None) -> int:
        """A shell running `script`, started from this (untagged) main thread, in `cgroup` when
        this returns."""
        procs = CGROUP_ROOT / cgroup / "cgroup.procs" if cgroup is not None else None
        if procs is not None:
            # The shell also joins the pod itself before it forks anything: moved only from here,
            # a child it had forked by then stayed behind (seen: a pod left with one process).
            script = f"echo $$ > {procs} || exit 1\n{script}"
        proc = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.DEVNULL)
        self.children.append(proc)
        if cpu is not None:
            os.sched_setaffinity(proc.pid, {cpu})
        if procs is not None:
            procs.write_text(f"{proc.pid}\n")
        return proc.pid

    def stop(self, pids: list[int]) -> None:
        for proc in self.children:
            if proc.pid in pids and proc.poll() is None:
                proc.kill()
                proc.wait()

    # ---------------------------------------------------------------- the pods

    def setup(self) -> None:
        from koordnode.config.loader import parse_config
        from koordnode.executor.cgroup_executor import CgroupExecutor
        from koordnode.executor.core_sched import CoreScheduling

        self.config = parse_config(CONFIG, "core-sched-kernel")
        self.qos = self.config.qos
        self.core = CoreScheduling()
        self.cgroups = CgroupExecutor(CGROUP_ROOT)
        (CGROUP_ROOT / "cgroup.subtree_control").write_text("+cpu\n")
        (CGROUP_ROOT / PODS).mkdir(exist_ok=True)
        (CGROUP_ROOT / PODS / "cgroup.subtree_control").write_text("+cpu\n")
        self.pods: dict[str, tuple[str, str]] = {}  # name -> (class, cgroup)
        for name, cls in (("lse-0", "LSE"), ("lse-1", "LSE"), ("be-0", "BE"), ("be-1", "BE"), ("ls-0", "LS")):
            cgroup = f"{PODS}/pod-{name}"
            (CGROUP_ROOT / cgroup).mkdir(exist_ok=True)
            self.pods[name] = (cls, cgroup)

    def keep(self, name: str) -> str:
        """One pass of the hook over the pod (what the QoS engine does at its hooks and each reconcile)."""
        from koordnode.hooks.core_sched import keep_pod_cookie
        from koordnode.model.qos_class import QoSClass

        cls, cgroup = self.pods[name]
        return keep_pod_cookie(self.core, self.qos, QoSClass(cls), lambda: self.cgroups.read_pids(cgroup) or [],
                               cgroup)

    def cookies(self, name: str) -> dict[int, int]:
        found = {}
        for pid in self.cgroups.read_pids(self.pods[name][1]) or []:
            try:
                found[pid] = self.core.cookie(pid)
            except OSError:
                continue  # exited meanwhile
        return found

    def one_cookie(self, name: str) -> int:
        found = self.cookies(name)
        assert len(found) >= 2, f"{name}: expected the pod's processes, found {found}"
        values = set(found.values())
        assert len(values) == 1, f"{name}: its processes have several cookies: {found}"
        return values.pop()

    # ---------------------------------------------------------------- checks

    def kernel_gives_cookies(self) -> str:
        siblings = Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list").read_text().strip()
        self.results["facts"]["cpu0_siblings"] = siblings
        assert siblings == "0-1", f"cpu0's SMT siblings are {siblings!r}, not 0-1"
        unavailable = self.core.unavailable
        assert unavailable is None, f"the kernel gives no cookies: {unavailable}"
        return f"PR_SCHED_CORE answers; cpu0's siblings {siblings}"

    def start_pods(self) -> None:
        """Two processes per pod (a shell and a sleep); each LSE shell forks one more on request."""
        self.fifos = {}
        for name in self.pods:
            fifo = Path(f"/tmp/fork-{name}")
            os.mkfifo(fifo)
            self.fifos[name] = fifo
            # The shell waits on its fifo, then forks one more sleep (a child of a tagged task).
            self.spawn(f"sleep 3600 & read line < {fifo}; sleep 3601 & wait", self.pods[name][1])
        deadline = time.monotonic() + 60
        while any(len(self.cgroups.read_pids(cgroup) or []) < 2 for _, cgroup in self.pods.values()):
            assert time.monotonic() < deadline, {name: self.cgroups.read_pids(c) for name, (_, c) in self.pods.items()}
            time.sleep(0.2)
        self.lines = {name: self.keep(name) for name in self.pods}
        self.results["facts"]["status_lines"] = self.lines

    def lse_pods_own_cookies(self) -> str:
        lse = [self.one_cookie("lse-0"), self.one_cookie("lse-1")]
        assert 0 not in lse, f"an LSE pod is untagged: {lse}"
        assert lse[0] != lse[1], f"the two LSE pods share a cookie: {lse}"
        return f"lse-0 {lse[0]:#x}, lse-1 {lse[1]:#x} ({self.cookies('lse-0')}, {self.cookies('lse-1')})"

    def be_tasks_share_one_cookie(self) -> str:
        be = [self.one_cookie("be-0"), self.one_cookie("be-1")]
        lse = {self.one_cookie("lse-0"), self.one_cookie("lse-1")}
        assert be[0] == be[1] != 0, f"the BE pods' cookies: {be}"
        assert be[0] not in lse, f"BE's cookie is an LSE pod's: {be[0]:#x}"
        assert be[0] == self.core.shared_cookie, (be[0], self.core.shared_cookie)
        return f"be-0 and be-1 both {be[0]:#x} (the shared cookie)"

    def ls_and_node_untagged(self) -> str:
        assert set(self.cookies("ls-0").values()) == {0}, f"LS pod tagged: {self.cookies('ls-0')}"
        node = self.spawn("sleep 3602")  # a process of the node, outside the pods
        time.sleep(0.5)
        tagged = {}
        in_pods = {pid for _, cgroup in self.pods.values() for pid in self.cgroups.read_pids(cgroup) or []}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in in_pods:
                continue
            pid = int(entry.name)
            try:
                for tid in os.listdir(f"/proc/{pid}/task"):
                    if (cookie := self.core.cookie(int(tid))) != 0:
                        tagged[int(tid)] = cookie
            except OSError:
                continue
        anchor = self.core._anchor.tid if self.core._anchor is not None else None
        tagged.pop(anchor, None)  # koordnode's sleeping thread holding BE's cookie
        assert not tagged, f"tasks outside the pods with a cookie: {tagged}"
        assert self.core.cookie(node) == 0 and self.core.cookie(1) == 0
        return f"LS pod {self.cookies('ls-0')}, the node's processes and koordnode's threads untagged " \
               f"(but the anchor thread {anchor})"

    def later_processes_get_the_pod_cookie(self) -> str:
        lse = self.one_cookie("lse-0")
        # Forked by a tagged process of the pod: the kernel copies the cookie to the child.
        self.fifos["lse-0"].write_text("go\n")
        deadline = time.monotonic() + 30
        while not any(_cmdline(pid) == "sleep 3601" for pid in self.cookies("lse-0")):
            assert time.monotonic() < deadline, "the pod's shell forked no child"
            time.sleep(0.2)
        forked = self.one_cookie("lse-0")
        assert forked == lse, f"a child forked in the pod: {self.cookies('lse-0')}"
        # Started from outside (what `kubectl exec` does: runc's process is untagged), moved in.
        joined = self.spawn("sleep 3603", self.pods["lse-0"][1])
        joined_be = self.spawn("sleep 3604", self.pods["be-0"][1])
        before = (self.core.cookie(joined), self.core.cookie(joined_be))
        assert before == (0, 0), f"untagged before the pass: {before}"
        lines = self.keep("lse-0"), self.keep("be-0")
        after = (self.core.cookie(joined), self.core.cookie(joined_be))
        assert after == (lse, self.core.shared_cookie), f"after the hook's pass: {after}, {lines}"
        assert self.one_cookie("lse-0") == lse
        return f"forked child and joined process at the pod's {lse:#x}; BE's joined at the shared cookie; {lines}"

    def status_says_on(self) -> str:
        from koordnode.hooks.core_sched import node_status

        status = node_status(self.core, self.qos)
        assert status == {"classes": ["LSE"], "expellers": ["LS"], "state": "on"}, status
        lines = self.lines
        assert lines["lse-0"] == lines["lse-1"] == "on: 2 process(es) share the pod's cookie", lines
        assert lines["be-0"] == lines["be-1"] == "on: 2 process(es) share BE's cookie, kept off the cores of LS", lines
        assert lines["ls-0"] == "on: no cookie, BE tasks kept off its cores", lines
        return f"status.qos.core_sched {status}; pods {lines}"

    def doctor_says_available(self) -> str:
        config = Path("/tmp/koordnode.toml")
        config.write_text(CONFIG)
        doctor = subprocess.run([sys.executable, "-m", "koordnode", "doctor", "--json", "--config", str(config)],
                                capture_output=True, text=True, timeout=240)
        report = json.loads(doctor.stdout)
        check = next(c for c in report["checks"] if c["name"] == "core scheduling")
        assert check["status"] == "OK", check
        assert check["message"] == "PR_SCHED_CORE available; a cookie per pod of LSE; BE kept off the cores of LS", check
        assert report["facts"]["core_sched"]["unavailable"] is None, report["facts"]["core_sched"]
        return f"{check['status']}: {check['message']}"

    # ---------------------------------------------------------------- the kernel enforces it

    def _cpu_time_s(self, pid: int) -> float:
        """Time the task ran, by the kernel's own accounting (schedstat: ns on the CPU)."""
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9

    def _pair(self, pods: tuple[str | None, str | None]) -> tuple[float, str]:
        """Busy loops on cpu0 and cpu1 (siblings) in `pods` (None: the node, untagged), each at the
        cookie the hook gives; the CPUs both used together over MEASURE_S."""
        pids = [self.spawn("while :; do :; done", self.pods[name][1] if name else None, cpu)
                for cpu, name in enumerate(pods)]
        try:
            for name in dict.fromkeys(p for p in pods if p):
                self.keep(name)
            cookies = [self.core.cookie(pid) for pid in pids]
            time.sleep(0.5)
            scanned, others = time.monotonic(), _all_tasks_run_s()
            began, start = time.monotonic(), [self._cpu_time_s(pid) for pid in pids]
            time.sleep(MEASURE_S)
            wall, end = time.monotonic() - began, [self._cpu_time_s(pid) for pid in pids]
            busy = _busiest(others, _all_tasks_run_s(), time.monotonic() - scanned, exclude=set(pids))
        finally:
            self.stop(pids)
        used = [(e - s) / wall for s, e in zip(start, end, strict=True)]
        detail = (f"cookies {[f'{c:#x}' for c in cookies]}: {sum(used):.2f} CPUs "
                  f"({used[0]:.2f} + {used[1]:.2f} over {wall:.1f} s); the busiest other tasks: {busy or 'none'}")
        self.results["facts"].setdefault("pairs", {})[f"{pods[0]}+{pods[1]}"] = detail
        return sum(used), detail

    def siblings_apart_with_different_cookies(self) -> str:
        used, detail = self._pair(("lse-0", "lse-1"))
        assert used < APART_BELOW, f"two LSE pods ran on one core's siblings at once: {detail}"
        return detail

    def siblings_together_with_one_cookie(self) -> str:
        used, detail = self._pair(("lse-0", "lse-0"))
        assert used > TOGETHER_ABOVE, f"one pod's two tasks did not run side by side: {detail}"
        return detail

    def siblings_together_untagged(self) -> str:
        used, detail = self._pair((None, None))
        assert used > TOGETHER_ABOVE, f"two untagged tasks did not run side by side: {detail}"
        return detail

    def be_kept_off_ls_siblings(self) -> str:
        used, detail = self._pair(("be-0", "ls-0"))
        assert used < APART_BELOW, f"a BE task ran beside an LS (expeller) task: {detail}"
        return detail

    def run(self) -> None:
        # Nothing of this test on the measured core (cpu0 and cpu1): its threads and children
        # inherit cpu2-3, the busy loops are pinned to cpu0 or cpu1 explicitly.
        os.sched_setaffinity(0, HOUSEKEEPING_CPUS)
        self.results["facts"].update(kernel=platform.release(), python=platform.python_version(),
                                     cpus=os.cpu_count())
        self.save()
        self.setup()
        for name in CHECKS:
            if name == "lse_pods_own_cookies":
                self.check("pods_started", lambda: (self.start_pods(), "")[1])
                if not self.results["checks"]["pods_started"]["ok"]:
                    break
            self.check(name, getattr(self, name))
        self.results["done"] = True
        self.save()


def _all_tasks_run_s() -> dict[tuple[int, int], tuple[float, int, str]]:
    """Every task's run time (s), last CPU and name: what else ran while the busy loops did."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/task/[0-9]*/stat"):
        try:
            text = stat.read_text()
            run = int((stat.parent / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError):
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        found[(int(stat.parent.parent.parent.name), int(stat.parent.name))] = (run, int(fields[36]), name)
    return found


def _busiest(before: dict, after: dict, wall: float, exclude: set[int]) -> list[str]:
    used = []
    for key, (run, cpu, name) in after.items():
        if key[0] in exclude or key not in before:
            continue
        share = (run - before[key][0]) / wall
        if share >= 0.05:
            used.append((share, f"{name}[{key[1]}]@cpu{cpu} {share:.2f}"))
    return [text for _, text in sorted(used, reverse=True)[:4]]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _mount(kind: str, source: str, target: str, options: str = "") -> None:
    Path(target).mkdir(parents=True, exist_ok=True)
    cmd = ["mount", "-t", kind, *(["-o", options] if options else []), source, target]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)


def boot() -> None:
    """What systemd would have done: the file systems this test needs."""
    _mount("sysfs", "sysfs", "/sys")
    _mount("cgroup2", "cgroup2", str(CGROUP_ROOT))
    for target in ("/tmp", "/run", "/dev/shm"):
        _mount("tmpfs", "tmpfs", target)
    _mount("9p", "results", str(RESULTS), "trans=virtio,version=9p2000.L,msize=262144,rw")
    _mount("ext4", "/dev/vdb", str(PYDEPS), "ro")
    os.environ.update(PYTHONPATH=f"{PYDEPS}:/project", PYTHONDONTWRITEBYTECODE="1", HOME="/root",
                      PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    sys.path[:0] = [str(PYDEPS), "/project"]


def main() -> None:
    try:
        boot()
        Guest().run()
    except BaseException:  # noqa: BLE001 - PID 1: report, then power off whatever happened
        traceback.print_exc()
        try:
            (RESULTS / "guest-error.txt").write_text(traceback.format_exc())
        except OSError:
            pass
    finally:
        os.sync()
        ctypes.CDLL(None, use_errno=True).reboot(RB_AUTOBOOT)  # qemu -no-reboot: ends the VM


if __name__ == "__main__":
    main()
