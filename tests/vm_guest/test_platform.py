"""The guest is the platform the VM lane claims: systemd PID 1, cgroup v2 only, containerd 1.7, a second disk."""

from __future__ import annotations

import subprocess
from pathlib import Path


def test_systemd_is_pid1_and_cgroup_v2_is_the_only_hierarchy() -> None:
    assert Path("/proc/1/comm").read_text().strip() == "systemd"
    mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
    assert [m[1] for m in mounts if m[2] == "cgroup2"] == ["/sys/fs/cgroup"]
    assert not [m for m in mounts if m[2] == "cgroup"], "no cgroup v1 hierarchy mounted"
    controllers = Path("/sys/fs/cgroup/cgroup.controllers").read_text().split()
    assert {"cpu", "cpuset", "memory", "io", "pids"} <= set(controllers)
    assert Path("/sys/fs/cgroup/cpu.pressure").is_file()


def test_containerd_17_runc_and_cni_are_installed() -> None:
    out = subprocess.run(["containerd", "--version"], capture_output=True, text=True, check=True).stdout
    assert " 1.7." in out or "v1.7." in out, out
    subprocess.run(["runc", "--version"], check=True, capture_output=True)
    assert Path("/usr/lib/cni/bridge").is_file()
    assert Path("/bin/busybox").is_file()


def test_second_virtio_disk_is_a_real_block_device() -> None:
    assert Path("/sys/block/vdb").is_dir()
    major_minor = Path("/sys/block/vdb/dev").read_text().strip()
    assert major_minor.split(":")[0] != "0"
