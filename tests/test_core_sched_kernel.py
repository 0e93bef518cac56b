"""Core scheduling on a real kernel with SMT siblings (issue #22): `[qos.LSE] core_sched` and
`[qos.LS] core_expeller` through koordnode's own code, checked on the kernel.

Debian's kernels are built without CONFIG_SCHED_CORE, so scripts/core-sched-kernel.sh builds a
small one from Debian's linux-source-6.12 (cached in /var/cache/koordnode-testbed); it boots
under QEMU TCG with `-smp 4,cores=2,threads=2` on the VM lane's Debian 13 root filesystem, with
tests/vm/guest/core_sched_kernel.py as PID 1 (no systemd, no containerd: pod-like cgroups with
real processes). One host test per guest check (tests/vm/README.md).

Not root, or qemu/debootstrap/the kernel build tools missing: skipped (an error under CI=true).
``KOORDNODE_VM_LANE=0`` skips it on purpose, as it skips the lane (never in CI).
"""

from __future__ import annotations

import os

import pytest

from testbed.fixtures import running_in_ci, skip_or_fail_in_ci
from vm.core_sched_kernel import BOOT_TIMEOUT_S, BUILD_TIMEOUT_S, CHECKS, GuestRun, missing, run_guest
from vm.lane import LaneError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(BUILD_TIMEOUT_S + BOOT_TIMEOUT_S + 900)]


def _unavailable(reason: str) -> None:
    skip_or_fail_in_ci(f"core-scheduling kernel test unavailable: {reason}")


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> GuestRun:
    if os.environ.get("KOORDNODE_VM_LANE", "1") == "0" and not running_in_ci():
        pytest.skip("KOORDNODE_VM_LANE=0")
    if os.geteuid() != 0:
        _unavailable("needs root (the lane's image, 9p shares)")
    if tools := missing():
        _unavailable("missing " + ", ".join(tools) + " (scripts/install-deps.sh)")
    try:
        return run_guest(tmp_path_factory.mktemp("core-sched-kernel"))
    except LaneError as err:
        pytest.fail(f"could not build or boot the core-scheduling kernel: {err}", pytrace=False)


def test_guest_booted_and_reported(guest: GuestRun) -> None:
    print(f"kernel {guest.kernel}; guest facts {guest.results.get('facts')}; {guest.seconds:.0f} s")
    assert guest.results, f"no results from the guest (qemu exit {guest.exit_code}); console:\n{guest.console_tail}"
    assert "error" not in guest.results, guest.results["error"]
    assert guest.results.get("done"), (f"the guest stopped early (qemu exit {guest.exit_code}); "
                                       f"console:\n{guest.console_tail}")
    assert guest.results["facts"]["kernel"] == guest.kernel["release"]
    assert set(guest.checks) - {"pods_started"} == set(CHECKS)


@pytest.mark.parametrize("check", CHECKS)
def test_check(guest: GuestRun, check: str) -> None:
    if check not in guest.checks:
        started = guest.checks.get("pods_started")
        why = f"the pods did not start: {started['detail']}" if started and not started["ok"] else "the guest stopped"
        pytest.fail(f"{check}: no result ({why}); console:\n{guest.console_tail}", pytrace=False)
    result = guest.checks[check]
    print(f"{check} ({result['seconds']} s): {result['detail']}")
    assert result["ok"], f"in the guest (kernel {guest.kernel['release']}):\n{result['detail']}"
