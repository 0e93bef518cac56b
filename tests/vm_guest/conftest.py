"""Guest fixtures: containerd with runc's systemd driver on cgroup v2, kubelet's slices, koordnode.

Runs only inside the VM lane's guest (KOORDNODE_VM_GUEST=1, set by tests/vm/guest/run.py).
"""

from __future__ import annotations

import os

import pytest

from guestlib import RECONCILE_S, GuestKoordnode, disk_dev, free_port, set_hook_timeout
from testbed.containerd_dist import cached_bin_dir
from testbed.systemd_bed import KUBEPODS_SLICE, SystemdBed, kubelet_tiers

IN_GUEST = os.environ.get("KOORDNODE_VM_GUEST") == "1"


# On the host these files are not collected: tests/test_vm_lane.py reports their guest results.
collect_ignore_glob = [] if IN_GUEST else ["test_*.py"]


# The containerd releases the session bed can run: Debian 13's own 1.7, and 2.1 (Debian forky's
# binaries, fetched on the host into /var/cache/koordnode-test, shared read-only).
CONTAINERD_SUITES = {"1.7": None, "2.1": "forky"}


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "containerd(*releases): run the test once per containerd release (default: 1.7 only)")


def pytest_generate_tests(metafunc):
    """Every test on the session bed gets its release as a session-scoped parameter, so pytest
    runs all tests of one release together and stops that bed (and its koordnode) before
    starting the next: two koordnodes never manage kubelet's tiers at once."""
    if "containerd_release" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("containerd")
    releases = marker.args if marker else ("1.7",)
    unknown = set(releases) - set(CONTAINERD_SUITES)
    if unknown:
        raise ValueError(f"{metafunc.definition.nodeid}: unknown containerd release(s) {sorted(unknown)}")
    metafunc.parametrize("containerd_release", releases, indirect=True, scope="session")


@pytest.hookimpl(trylast=True)  # after pytest's own grouping by parameter
def pytest_collection_modifyitems(items):
    """The tests without the session bed first, so a release's containerd and koordnode run only
    while its own tests do (under TCG an idle koordnode still costs), one release after the other."""
    if IN_GUEST:
        items.sort(key=lambda item: "containerd_release" in getattr(item, "fixturenames", ()))


@pytest.fixture(scope="session")
def containerd_release(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def systemd_bed(containerd_release, tmp_path_factory):
    suite = CONTAINERD_SUITES[containerd_release]
    bin_dir = None
    if suite is not None:
        bin_dir = cached_bin_dir(suite)
        assert bin_dir is not None, (f"containerd {containerd_release} ({suite}) was not fetched on the host "
                                     "(/var/cache/koordnode-test)")
    kubelet_tiers(os.cpu_count() or 1)
    bed = SystemdBed(tmp_path_factory.mktemp(f"bed-{containerd_release}"), bin_dir=bin_dir)
    bed.start()
    try:
        running = bed.version().runtime_version
        assert running.startswith(containerd_release + "."), f"wanted containerd {containerd_release}, runs {running}"
    except BaseException:
        bed.stop()
        raise
    yield bed
    bed.stop()


@pytest.fixture(scope="session")
def guest_koordnode(systemd_bed, tmp_path_factory):
    port = free_port()
    extra = (
        # These tests check BE pods in kubelet's besteffort slice; the idle BE group (on by
        # default) has its own test, test_be_group_systemd_v2.py, and so has cpu_suppress's
        # quiet state (here BE is always suppressed, as the tier's quota tests expect).
        f'[cgroup]\ndriver = "systemd"\nreconcile_interval_s = {RECONCILE_S}\nbe_idle_group_systemd = false\n'
        f'[node]\nblkio_devices = ["{disk_dev()}"]\n'
        '[strategy.cpu_suppress]\nls_quiet_percent = 0\n'
    )
    kn = GuestKoordnode(tmp_path_factory.mktemp("kn"), str(systemd_bed.socket), extra_toml=extra,
                        metrics_listen=f"127.0.0.1:{port}", kubepods="/" + KUBEPODS_SLICE)
    # A CI run's LSE container stayed on the share pool: its CreateContainer pre took 223 ms
    # under TCG (2026-12-03). These tests are about the values the hooks give.
    set_hook_timeout(kn)
    kn.metrics_port = port
    kn.start()
    yield kn
    kn.stop()
