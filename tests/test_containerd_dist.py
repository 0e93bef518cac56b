"""containerd 2.1 (forky) and 1.7 (trixie) fetched from the configured Debian mirror, run as test beds.

The parsing tests run anywhere; the fetch/bed tests need root and the mirror (they
fetch once into /var/cache/koordnode-test and reuse it).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from koordnode.cri import api_pb2 as pb
from support.cri import Cri, container_config, remove_pod, run_pod, sandbox_config, start_container, wait_container_state
from testbed.containerd_bed import ContainerdBed
from testbed.containerd_dist import (
    DistError,
    containerd_bin_dir,
    containerd_version,
    debian_mirror,
    system_apt_sources,
)


def test_mirror_is_read_from_deb822_and_one_line_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "other.sources").write_text(
        "Types: deb\nURIs: https://vendor.example/apt\nSuites: nodistro\nComponents: main\n"
    )
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://mirror.test/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\n"
        "Types: deb deb-src\nURIs: http://mirror.test/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main contrib\nSigned-By: /usr/share/keyrings/k.gpg\n"
    )
    paths = (tmp_path / "sources.list", tmp_path / "sources.list.d")
    mirror = debian_mirror(paths)
    assert mirror.uri == "http://mirror.test/debian"
    assert mirror.signed_by == "/usr/share/keyrings/k.gpg"

    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text(
        "# deb http://old.test/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://one.test/debian/ bookworm main\n"
    )
    assert debian_mirror(paths).uri == "http://one.test/debian/"
    assert len(system_apt_sources(paths)) == 2


def test_no_debian_mirror_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text("deb http://deb.vendor.test/apt stable main\n")
    with pytest.raises(DistError, match="no Debian archive mirror"):
        debian_mirror((tmp_path / "sources.list",))


def test_unknown_suite_is_refused() -> None:
    with pytest.raises(DistError, match="unknown suite"):
        containerd_bin_dir("sid; rm -rf /")


def _bin_dir_or_skip(suite: str) -> Path:
    try:
        return containerd_bin_dir(suite)
    except DistError as err:
        pytest.skip(f"containerd of {suite} unavailable: {err}")


def _system_containerd() -> str:
    return subprocess.run(["dpkg-query", "-W", "-f=${Version}", "containerd"], capture_output=True, text=True).stdout


@pytest.mark.e2e
@pytest.mark.parametrize("suite, release", [("forky", "2.1."), ("trixie", "1.7.")])
def test_fetched_release_runs_pods_and_leaves_the_system_containerd_alone(
    suite: str, release: str, tmp_path: Path
) -> None:
    system_before = _system_containerd()
    bin_dir = _bin_dir_or_skip(suite)
    assert containerd_version(bin_dir).startswith(release)
    began = time.monotonic()
    assert containerd_bin_dir(suite) == bin_dir and time.monotonic() - began < 1, "second call comes from the cache"
    assert _system_containerd() == system_before, "the system's containerd package is untouched"

    nri_socket = tmp_path / "nri.sock"
    with ContainerdBed(tmp_path / "bed", bin_dir=bin_dir, nri_socket=nri_socket) as bed:
        assert bed.version().runtime_version.startswith(release)
        assert nri_socket.is_socket(), "NRI enabled on the caller's private socket"
        if bed.containerd_major >= 2:
            assert "version = 3" in bed.config_path.read_text()
        cri = Cri(bed.address)
        try:
            cfg = sandbox_config(bed, "dist-probe", qos="besteffort")
            pod = run_pod(cri, cfg)
            cid = start_container(cri, pod, cfg, container_config(bed, "main", ["sleep", "60"],
                                                                  resources={"cpu_shares": 2}))
            assert wait_container_state(cri, cid, pb.CONTAINER_RUNNING).state == pb.CONTAINER_RUNNING
            assert (bed.cgroup_path("cpu", f"{cfg.linux.cgroup_parent}/{cid}") / "cpu.shares").read_text().strip() == "2"
            remove_pod(cri, pod)
        finally:
            cri.close()


@pytest.mark.e2e
def test_nri_stays_off_without_a_socket(tmp_path: Path) -> None:
    bin_dir = _bin_dir_or_skip("forky")
    with ContainerdBed(tmp_path / "bed", bin_dir=bin_dir) as bed:
        text = bed.config_path.read_text()
        nri = text.split("'io.containerd.nri.v1.nri']", 1)[1]
        assert "disable = true" in nri.split("[", 1)[0]
        assert "NRI interface is disabled by configuration" in bed.log_path.read_text()
