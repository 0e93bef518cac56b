"""Scheduler slices (sched_attr.sched_runtime of fair tasks): the executor on a fake kernel shaped
like the kernel's (per-thread attributes, the 0.1-100 ms clamp, RT tasks), then on this host's
kernel (6.18) with real threads, the hook's status lines, doctor and the config key."""

from __future__ import annotations

import dataclasses

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from koordnode.config.classes import QoSConfig
from koordnode.config.loader import ConfigError, load_config
from koordnode.config.root import Config
from koordnode.doctor.kernel import check_sched_slice
from koordnode.doctor.report import Report
from koordnode.executor.sched_slice import (
    SCHED_IDLE,
    SCHED_NORMAL,
    SLICE_MAX_NS,
    SLICE_MIN_NS,
    SchedAttr,
    SchedSlices,
    SliceKernel,
    SliceResult,
)
from koordnode.hooks.sched_slice import keep_pod_slice
from koordnode.model.qos_class import QoSClass

SCHED_FIFO = 1
DEFAULT_NS = 1_400_000  # what this fake kernel's base slice is


class FakeSliceKernel:
    """sched_getattr / sched_setattr as the kernel keeps them: per thread a policy, nice and
    slice; a fair task's runtime is clamped to 0.1-100 ms, 0 gives the default back; a task
    not there is ESRCH. `old_kernel`: before 6.12, a fair task reports runtime 0."""

    def __init__(self, tasks: dict[int, SchedAttr], old_kernel: bool = False) -> None:
        self.tasks, self.old_kernel = tasks, old_kernel
        self.sets: list[tuple[int, SchedAttr]] = []

    def get(self, tid: int) -> SchedAttr:
        if tid == 0:
            return SchedAttr(SCHED_NORMAL, 0, 0 if self.old_kernel else DEFAULT_NS)
        if tid not in self.tasks:
            raise OSError(errno.ESRCH, "No such process")
        return self.tasks[tid]

    def set(self, tid: int, attr: SchedAttr) -> None:
        if tid not in self.tasks:
            raise OSError(errno.ESRCH, "No such process")
        runtime = min(max(attr.runtime_ns, SLICE_MIN_NS), SLICE_MAX_NS) if attr.runtime_ns else DEFAULT_NS
        self.sets.append((tid, attr))
        self.tasks[tid] = SchedAttr(attr.policy, attr.nice, runtime)


def fake_proc(tmp_path: Path, threads: dict[int, list[int]]) -> Path:
    for pid, tids in threads.items():
        for tid in tids:
            (tmp_path / str(pid) / "task" / str(tid)).mkdir(parents=True)
    return tmp_path


def test_every_fair_thread_gets_the_slice_once_keeping_its_policy_and_nice(tmp_path):
    kernel = FakeSliceKernel({
        10: SchedAttr(SCHED_NORMAL, 0, DEFAULT_NS), 11: SchedAttr(SCHED_NORMAL, 5, DEFAULT_NS),
        20: SchedAttr(SCHED_IDLE, 19, DEFAULT_NS), 30: SchedAttr(SCHED_FIFO, 0, 0),
    })
    slices = SchedSlices(kernel, fake_proc(tmp_path, {10: [10, 11], 20: [20], 30: [30], 40: [40]}))
    assert slices.unavailable is None
    result = slices.keep([10, 20, 30, 40], 100_000)
    # The RT thread is left alone; 40 exited between the listing and the call: no failure.
    assert result == SliceResult(tasks=3, changed=3, errors=())
    assert kernel.tasks[11] == SchedAttr(SCHED_NORMAL, 5, 100_000)  # its nice kept
    assert kernel.tasks[20] == SchedAttr(SCHED_IDLE, 19, 100_000)  # its policy kept
    assert kernel.tasks[30] == SchedAttr(SCHED_FIFO, 0, 0)
    # Nothing changed since: nothing set.
    kernel.sets.clear()
    assert slices.keep([10, 20], 100_000) == SliceResult(3, 0, ())
    assert kernel.sets == []


def test_zero_gives_back_only_the_slices_koordnode_gave(tmp_path):
    kernel = FakeSliceKernel({10: SchedAttr(SCHED_NORMAL, 0, DEFAULT_NS), 11: SchedAttr(SCHED_NORMAL, 0, 3_000_000)})
    slices = SchedSlices(kernel, fake_proc(tmp_path, {10: [10], 11: [11]}))
    assert not slices.gave_any
    slices.keep([10], 100_000)
    assert slices.gave_any
    # The class now asks for none: 10 gets the kernel's default back, 11's own 3 ms stays.
    assert slices.keep([10, 11], 0) == SliceResult(2, 1, ())
    assert kernel.tasks[10].runtime_ns == DEFAULT_NS and kernel.tasks[11].runtime_ns == 3_000_000


def test_a_kernel_without_slices_and_a_test_procfs_are_never_called(tmp_path):
    old = FakeSliceKernel({10: SchedAttr(SCHED_NORMAL, 0, 0)}, old_kernel=True)
    slices = SchedSlices(old, fake_proc(tmp_path, {10: [10]}))
    assert "Linux 6.12+" in (slices.unavailable or "")
    assert slices.keep([10], 100_000) == SliceResult() and old.sets == []
    # Without an injected kernel a procfs root other than /proc names no real thread.
    assert SchedSlices(procfs_root=tmp_path).unavailable == f"procfs root {tmp_path} is not /proc"


def test_the_hook_says_what_each_pod_got(tmp_path):
    kernel = FakeSliceKernel({10: SchedAttr(SCHED_NORMAL, 0, DEFAULT_NS)})
    slices = SchedSlices(kernel, fake_proc(tmp_path, {10: [10]}))
    qos = QoSConfig()
    listed: list[int] = []

    def pids() -> list[int]:
        listed.append(1)
        return [10]

    # LS asks for none and nothing was given: not even the pod's processes are listed.
    assert keep_pod_slice(slices, qos, QoSClass.LS, pids, "pod-ls") == "" and listed == []
    assert keep_pod_slice(slices, qos, QoSClass.BE, pids, "pod-be") == "100 us for 1 thread(s)"
    assert keep_pod_slice(slices, qos, QoSClass.BE, lambda: [], "pod-new") == "100 us: no thread running yet"
    # A pod of a class without a slice is not listed either once BE pods hold one: only the
    # pods given one can have one to take back.
    listed.clear()
    assert keep_pod_slice(slices, qos, QoSClass.LS, pids, "pod-ls") == "" and listed == []
    # BE asks for none now (a reload): the pod that got one gets the default back, once.
    no_slice = QoSConfig(BE=dataclasses.replace(qos.BE, sched_slice_us=0))
    assert keep_pod_slice(slices, no_slice, QoSClass.BE, pids, "pod-be") == "" and listed == [1]
    assert kernel.tasks[10].runtime_ns == DEFAULT_NS
    assert keep_pod_slice(slices, no_slice, QoSClass.BE, pids, "pod-be") == "" and listed == [1]
    old = SchedSlices(FakeSliceKernel({}, old_kernel=True), tmp_path)
    assert keep_pod_slice(old, qos, QoSClass.BE, pids, "pod-be").startswith("unavailable: the kernel has no")


def test_the_config_takes_zero_or_the_kernels_range(tmp_path):
    assert QoSConfig().BE.sched_slice_us == 100 and QoSConfig().LS.sched_slice_us == 0
    path = tmp_path / "koordnode.toml"
    path.write_text("[qos.LS]\nsched_slice_us = 3000\n")
    assert load_config(path).qos.LS.sched_slice_us == 3000
    for bad in (50, 100001, -1):
        path.write_text(f"[qos.BE]\nsched_slice_us = {bad}\n")
        with pytest.raises(ConfigError, match="sched_slice_us"):
            load_config(path)


def test_doctor_says_which_classes_ask_and_warns_when_the_kernel_has_none(tmp_path):
    report = Report()
    check_sched_slice(report, Config(), SchedSlices(FakeSliceKernel({}), tmp_path))
    check = next(c for c in report.checks if c.name == "scheduler slices")
    assert (check.status, check.message) == ("OK", "per-task slices available; BE 100 us")
    report = Report()
    check_sched_slice(report, Config(), SchedSlices(FakeSliceKernel({}, old_kernel=True), tmp_path))
    check = next(c for c in report.checks if c.name == "scheduler slices")
    assert check.status == "WARN" and check.message.startswith("BE 100 us asked ([qos.<CLASS>] sched_slice_us), but")


# --- this host's kernel --------------------------------------------------------------------

def _slice_of(tid: int) -> int:
    for line in Path(f"/proc/{tid}/sched").read_text().splitlines():
        if line.startswith("se.slice"):
            return int(line.split(":")[1])
    raise AssertionError(f"no se.slice in /proc/{tid}/sched")


THREADS = r"""
import os, sys, threading, time
os.nice(3)
for _ in range(2):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("ready", flush=True)
sys.stdin.readline()  # then fork a child: it inherits the slice
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
time.sleep(60)
"""


@pytest.fixture
def real_slices() -> SchedSlices:
    slices = SchedSlices()
    if slices.unavailable is not None:
        pytest.skip(f"this kernel: {slices.unavailable}")
    return slices


def test_a_real_process_threads_and_later_children_keep_the_slice(real_slices):
    proc = subprocess.Popen([sys.executable, "-c", THREADS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    children: list[int] = []
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
        assert len(tids) == 3
        default = _slice_of(proc.pid)
        assert default != 100_000
        result = real_slices.keep([proc.pid], 100_000)
        assert result == SliceResult(3, 3, ()), result
        assert {tid: _slice_of(tid) for tid in tids} == dict.fromkeys(tids, 100_000)
        assert SliceKernel().get(proc.pid) == SchedAttr(SCHED_NORMAL, 3, 100_000)  # its nice kept
        proc.stdin.write("fork\n")
        proc.stdin.flush()
        child = int(proc.stdout.readline())
        children.append(child)
        assert _slice_of(child) == 100_000  # inherited: no pass needed
        # Given back when the class asks for none any more.
        assert real_slices.keep([proc.pid, child], 0).changed == 4
        assert _slice_of(child) == default and _slice_of(proc.pid) == default
    finally:
        for child in children:
            os.kill(child, signal.SIGKILL)
        proc.kill()
        proc.wait(timeout=10)
