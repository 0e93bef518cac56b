"""containerd 2.1 (Debian forky's binaries, from the host's cache) with the systemd driver on cgroup v2.

The QoS checks the 1.7 tests make, in short, against the other major release: pods in
kubelet's slices, per-class values in the v2 files through koordnode.
"""

from __future__ import annotations

from pathlib import Path

from guestlib import GuestKoordnode, free_port, make_pod, wait_for
from koordnode.executor.resources import shares_to_weight
from support.cri import Cri, remove_pod
from testbed.containerd_dist import cached_bin_dir
from testbed.systemd_bed import KUBEPODS_SLICE, SystemdBed, kubelet_tiers


def test_containerd_21_with_the_systemd_driver(tmp_path: Path) -> None:
    bin_dir = cached_bin_dir("forky")
    assert bin_dir is not None, "containerd 2.1 was not fetched on the host (/var/cache/koordnode-test)"
    kubelet_tiers(2)
    bed = SystemdBed(tmp_path / "bed", bin_dir=bin_dir)
    bed.start()
    # Its own QoS manager would fight the session koordnode over the BE tier: off here.
    extra = '[cgroup]\ndriver = "systemd"\nreconcile_interval_s = 3.0\nbe_idle_group_systemd = false\n[strategy.cpu_suppress]\nenable = false\n'
    kn = GuestKoordnode(tmp_path / "kn", str(bed.socket), extra_toml=extra, kubepods="/" + KUBEPODS_SLICE,
                        metrics_listen=f"127.0.0.1:{free_port()}")
    created: list[str] = []
    try:
        assert bed.version().runtime_version.startswith("2.1"), bed.version()
        assert "version = 3" in bed.config_path.read_text()
        kn.start()
        cri = Cri(kn.listen)
        cri.created = created
        request = 64 << 20
        ls = make_pod(cri, bed, "web21", "burstable", labels={"koordinator.sh/qosClass": "LS"}, kubelet_weight=39,
                      resources={"cpu_shares": 1024, "memory_limit_in_bytes": 2 * request,
                                 "unified": {"memory.low": str(request)}})
        be = make_pod(cri, bed, "batch21", "besteffort", resources={"cpu_shares": 2})
        assert ls.container_dir.name == f"cri-containerd-{ls.container_id}.scope" and ls.container_dir.is_dir()
        wait_for(lambda: be.read("cpu.idle", "pod") == "1" and ls.read("memory.min") != "0", 20, "koordnode's values")
        assert ls.read("cpu.weight") == str(shares_to_weight(1024))
        assert abs(int(ls.read("memory.min")) - request // 2) < 4096
        assert be.read("cpu.weight") == str(shares_to_weight(2))
        assert Path(f"/proc/{be.pid()}/oom_score_adj").read_text().strip() == "1000"
        for sandbox_id in created:
            remove_pod(cri, sandbox_id)
        cri.close()
    finally:
        kn.stop()
        bed.stop()
