"""Core-scheduling cookies: the executor on a fake PR_SCHED_CORE shaped like the kernel's (and the
probe on this kernel), the class policy (which pods get which cookie), and the hook that keeps
them with its status lines."""

from __future__ import annotations

import dataclasses
import errno
import threading

import pytest

from support.fake_core_sched import FakeCoreKernel
from koordnode.config.classes import QoSConfig
from koordnode.config.loader import ConfigError, load_config
from koordnode.config.root import Config
from koordnode.doctor.kernel import check_core_sched
from koordnode.doctor.report import Report
from koordnode.executor.core_sched import PR_SCHED_CORE_GET, CoreSchedResult, CoreScheduling
from koordnode.hooks.core_sched import keep_pod_cookie
from koordnode.model.qos_class import QoSClass
from koordnode.policy.core_sched import Cookie, describe, expeller_classes, in_use, pod_cookie


def test_a_pods_processes_get_one_cookie_and_keep_it():
    kernel = FakeCoreKernel()
    core = CoreScheduling(kernel)
    assert core.unavailable is None
    result = core.share([10, 11, 12])
    assert result == CoreSchedResult(3, 3, ())  # the first made the cookie, the others got a copy
    assert len({kernel.cookies[pid] for pid in (10, 11, 12)}) == 1 and kernel.cookies[10]
    # koordnode's own threads keep no pod's cookie: the sharing thread has ended.
    assert kernel.threads.get(threading.get_native_id(), 0) == 0
    # Nothing new: nothing written. A process started later (an exec) joins the majority's cookie.
    kernel.calls.clear()
    assert core.share([10, 11, 12]).shared == 0
    assert {cmd for cmd, _ in kernel.calls} == {PR_SCHED_CORE_GET}
    cookie = kernel.cookies[10]
    assert core.share([10, 11, 12, 13]) == CoreSchedResult(4, 1, ())
    assert kernel.cookies[13] == cookie
    # A process that exits meanwhile is no failure.
    kernel.exited = frozenset({14})
    assert core.share([10, 14]) == CoreSchedResult(2, 0, ())


def test_a_dry_run_creates_and_shares_nothing():
    kernel = FakeCoreKernel()
    core = CoreScheduling(kernel, dry_run=True)
    assert core.share([10, 11]).shared == 0 and kernel.cookies == {}


@pytest.mark.parametrize(("error", "says"), [(errno.ENODEV, "without SMT"), (errno.EINVAL, "CONFIG_SCHED_CORE")])
def test_the_kernel_refusing_core_scheduling_is_said_once_and_nothing_is_tried(error, says):
    kernel = FakeCoreKernel(error=error)
    core = CoreScheduling(kernel)
    assert says in (core.unavailable or "")
    assert core.share([10, 11]) == CoreSchedResult(2, 0, ())


def test_this_kernel_answers_the_probe():
    """On a real kernel: either cookies work here, or the reason is one of the known ones."""
    unavailable = CoreScheduling().unavailable
    assert unavailable is None or "SMT" in unavailable or "CONFIG_SCHED_CORE" in unavailable, unavailable


def test_one_shared_cookie_lives_on_a_sleeping_thread_of_koordnode_and_reaches_every_process():
    kernel = FakeCoreKernel()
    core = CoreScheduling(kernel)
    try:
        assert core.share_group([20, 21]) == CoreSchedResult(2, 2, ())
        shared = kernel.cookies[20]
        assert shared and kernel.cookies[21] == shared and core.shared_cookie == shared
        # It is held by koordnode's anchor thread, not by the thread that called nor one that copied.
        holders = {t.name for t in threading.enumerate() if kernel.threads.get(t.native_id or 0) == shared}
        assert holders == {"koordnode-core-sched-anchor"}
        # Another pod's processes join the same cookie, one with its own cookie (given earlier) too.
        kernel.cookies[31] = 777
        assert core.share_group([30, 31]) == CoreSchedResult(2, 2, ())
        assert kernel.cookies[30] == kernel.cookies[31] == shared
        # Once every process has it, a pass only reads.
        kernel.calls.clear()
        assert core.share_group([20, 21, 30, 31]).shared == 0
        assert {cmd for cmd, _ in kernel.calls} == {PR_SCHED_CORE_GET}
        # A pod of its own never takes the shared cookie for its own (its class changed).
        assert core.share([20, 21]) == CoreSchedResult(2, 2, ())  # created on 20, copied to 21
        assert kernel.cookies[20] == kernel.cookies[21] not in (0, shared)
    finally:
        core.close()


def test_only_cookies_koordnode_gave_are_taken_back():
    kernel = FakeCoreKernel()
    core = CoreScheduling(kernel)
    try:
        assert core.clear([40]) == CoreSchedResult(1)  # nothing given yet: not even read
        assert 40 not in {pid for _, pid in kernel.calls}
        core.share_group([40, 41])
        core.share([42])
        kernel.cookies[43] = 555  # the application's own cookie
        result = core.clear([40, 41, 42, 43, 44])
        assert result == CoreSchedResult(5, 0, (), cleared=3)
        assert [kernel.cookies.get(pid, 0) for pid in (40, 41, 42, 43, 44)] == [0, 0, 0, 555, 0]
    finally:
        core.close()


def test_a_dry_run_makes_no_shared_cookie():
    kernel = FakeCoreKernel()
    core = CoreScheduling(kernel, dry_run=True)
    assert core.share_group([50]).shared == 0 and kernel.cookies == {} and core.shared_cookie == 0


# --- the class policy -----------------------------------------------------------------------------

def _qos(**classes: dict) -> QoSConfig:
    defaults = QoSConfig()
    return dataclasses.replace(defaults, **{name: dataclasses.replace(getattr(defaults, name), **values)
                                            for name, values in classes.items()})


def test_no_key_no_cookie():
    qos = QoSConfig()
    assert {pod_cookie(cls, qos) for cls in QoSClass} == {Cookie.NONE} and not in_use(qos)


def test_expellers_stay_untagged_and_be_shares_one_cookie_with_the_classes_that_do_not_expel():
    qos = _qos(LSE=dict(core_sched=True, core_expeller=True), LSR=dict(core_expeller=True))
    assert expeller_classes(qos) == (QoSClass.LSE, QoSClass.LSR)
    assert {cls: pod_cookie(cls, qos) for cls in QoSClass} == {
        QoSClass.SYSTEM: Cookie.NONE,  # never tagged, like the node's own processes
        QoSClass.LSE: Cookie.POD,  # its own cookie wins: nothing shares its cores
        QoSClass.LSR: Cookie.NONE,
        QoSClass.LS: Cookie.SHARED,  # does not expel BE: shares its cookie
        QoSClass.BE: Cookie.SHARED,
    }
    assert describe(QoSClass.BE, qos) == "BE's shared cookie (kept off the cores of LSE, LSR)"


def test_core_sched_alone_gives_no_shared_cookie():
    qos = _qos(LSE=dict(core_sched=True))
    assert pod_cookie(QoSClass.BE, qos) is Cookie.NONE and pod_cookie(QoSClass.LSE, qos) is Cookie.POD


@pytest.mark.parametrize("name", ["SYSTEM", "BE"])
def test_system_and_be_cannot_expel(name):
    with pytest.raises(ValueError, match="core_expeller"):
        _qos(**{name: dict(core_expeller=True)})


def test_the_config_file_takes_core_expeller(tmp_path):
    path = tmp_path / "koordnode.toml"
    path.write_text("[qos.LS]\ncore_expeller = true\n")
    assert load_config(path).qos.LS.core_expeller is True
    path.write_text("[qos.BE]\ncore_expeller = true\n")
    with pytest.raises(ConfigError, match="core_expeller"):
        load_config(path)


def test_a_process_forked_while_the_hook_tags_the_pod_is_tagged_by_the_same_call():
    """The pod's listing is read, then a process forks (inheriting no cookie yet), then the
    pod is tagged: the hook lists again until nothing is left to change."""
    kernel = FakeCoreKernel()
    core = CoreScheduling(kernel)
    listings = iter([[10, 11], [10, 11, 12], [10, 11, 12]])
    line = keep_pod_cookie(core, _qos(LSE=dict(core_sched=True)), QoSClass.LSE, lambda: next(listings), "pod-a")
    assert kernel.cookies[12] == kernel.cookies[10] != 0
    assert line == "on: 3 process(es) share the pod's cookie"
    # Bounded: a pod that forks on every listing is left to the next reconcile pass.
    forking = iter([[20], [20, 21], [20, 21, 22], [20, 21, 22, 23]])
    keep_pod_cookie(core, _qos(LSE=dict(core_sched=True)), QoSClass.LSE, lambda: next(forking), "pod-b")
    assert kernel.cookies.get(23, 0) == 0 and kernel.cookies[22] == kernel.cookies[20]


# --- doctor ------------------------------------------------------------------------------------------

def test_doctor_warns_when_a_class_asks_and_the_kernel_refuses():
    config = Config(qos=_qos(LS=dict(core_expeller=True)))
    report = Report()
    check_core_sched(report, config, CoreScheduling(FakeCoreKernel(error=errno.EINVAL)))
    check = next(c for c in report.checks if c.name == "core scheduling")
    assert check.status == "WARN" and "LS ask for it ([qos.<CLASS>] core_expeller)" in check.message
    assert "CONFIG_SCHED_CORE" in check.message
    assert report.facts["core_sched"]["expellers"] == ["LS"]
    report = Report()
    check_core_sched(report, config, CoreScheduling(FakeCoreKernel()))
    check = next(c for c in report.checks if c.name == "core scheduling")
    assert check.status == "OK" and check.message == "PR_SCHED_CORE available; BE kept off the cores of LS"
