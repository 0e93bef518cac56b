"""Helpers shared by the guest tests and their conftest (importable: this directory is on sys.path)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

from dataclasses import dataclass

from koordnode.admin.client import fetch_status
from koordnode.cri import api_pb2 as pb
from support.cri import Cri, container_config, remove_pod, run_pod, sandbox_config, start_container, wait_container_state
from support.koordnode_runner import REPO, KoordnodeProcess, wait_for_socket
from testbed.systemd_bed import kubelet_pod_slice

STATUS_TIMEOUT_S = 30.0

CG = Path("/sys/fs/cgroup")
SCRATCH_DISK = "vdb"  # the VM's second virtio disk


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def disk_dev(name: str = SCRATCH_DISK) -> str:
    return Path(f"/sys/block/{name}/dev").read_text().strip()


# Functional waits, not timing checks: under TCG on a loaded host everything is several
# times slower than on hardware, so every bound is stretched by this factor.
TIME_SCALE = float(os.environ.get("KOORDNODE_VM_TIME_SCALE", "4"))


def cri_removing_its_pods(kn: KoordnodeProcess) -> Iterator[Cri]:
    """A CRI client on koordnode's socket for one test (a fixture yields from it): the sandboxes
    the test lists in ``created`` are removed after it, then the systemd units in ``slices``
    (kubelet removes a pod's slice after the pod), also when the test failed."""
    client = Cri(kn.listen)
    client.created = []
    client.slices = []
    yield client
    for sandbox_id in client.created:
        try:
            remove_pod(client, sandbox_id)
        except Exception:  # noqa: BLE001 - cleanup of a failed test
            pass
    for unit in client.slices:
        subprocess.run(["systemctl", "stop", unit], check=False, capture_output=True, timeout=60)
    client.close()


def wait_for(check, timeout_s: float, what: str, interval: float = 0.1):
    timeout_s *= TIME_SCALE
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval)


class GuestKoordnode(KoordnodeProcess):
    """`koordnode run` in the guest: under TCG its start-up (imports over 9p) takes tens of seconds."""

    metrics_port: int = 0
    START_TIMEOUT_S = 180.0

    def start(self) -> GuestKoordnode:
        log = open(self.log_path, "ab")
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-m", "koordnode", "run", "--config", str(self.config_path)],
                                     stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
        log.close()
        try:
            wait_for_socket(self.listen, self.START_TIMEOUT_S, proc=self.proc)
            wait_for_socket(self.admin, self.START_TIMEOUT_S, proc=self.proc)
        except (TimeoutError, RuntimeError) as err:
            raise RuntimeError(f"{err}; koordnode log tail:\n{self.log_text()[-3000:]}") from err
        return self

    def status(self) -> dict:
        # Under TCG a status answer right after a start, or with busy loops on both vCPUs, took
        # over the host tests' 5 s (the lane's BE-group restarts and LS-step tests, 2026-11-26).
        return fetch_status(self.admin, timeout_s=STATUS_TIMEOUT_S)

    def metrics(self) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()

    def metric(self, name: str, **labels: str) -> float:
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        prefix = f"{name}{{{want}}}" if labels else name
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith(prefix + " ") or (not labels and line.startswith(name + "{")):
                total += float(line.rsplit(" ", 1)[1])
        return total


RECONCILE_S = 3.0


# The hooks' time bound of the guest tests' koordnode without a kubelet (set_hook_timeout says why).
GUEST_HOOK_TIMEOUT_MS = 3000


def set_hook_timeout(kn: KoordnodeProcess, ms: int = GUEST_HOOK_TIMEOUT_MS) -> None:
    """Bound the guest koordnode's hooks by ``ms`` before it starts. The shipped 200 ms is for
    real machines; under TCG a hook runs over it when the guest is busy, and fail-open as
    designed the call goes on without koordnode's values (a BE pod in kubelet's slice, an LSE
    container on the share pool), which the tests about those values would read as a failure."""
    text = kn.config_path.read_text()
    assert "[proxy]\n" in text, "the runner writes [proxy] itself"
    kn.config_path.write_text(text.replace("[proxy]\n", f"[proxy]\nhook_timeout_ms = {ms}\n", 1))


def reload_config(kn: KoordnodeProcess, text: str) -> None:
    """Rewrite koordnode's config file and SIGHUP it; wait until the reload is applied."""
    before = kn.status()["config"]["last_reload"].get("at", 0)
    kn.config_path.write_text(text)
    assert kn.proc is not None
    kn.proc.send_signal(signal.SIGHUP)
    result = wait_for(lambda: (lambda r: r if r.get("at", 0) > before else None)(kn.status()["config"]["last_reload"]),
                      30, "the config reloaded", interval=0.5)
    assert result["result"] == "applied", result


@dataclass
class Pod:
    sandbox_id: str
    container_id: str
    parent: str  # kubelet's cgroup parent (slice name)
    pod_dir: Path
    container_dir: Path

    def read(self, name: str, level: str = "container") -> str:
        directory = self.container_dir if level == "container" else self.pod_dir
        return (directory / name).read_text().strip()

    def pid(self) -> int:
        return int((self.container_dir / "cgroup.procs").read_text().split()[0])


def make_pod(cri, bed, name: str, qos: str, *, labels=None, annotations=None, resources=None,
             cmd=None, kubelet_weight: int = 1, memory_max: int | None = None) -> Pod:
    """kubelet's sequence: pod slice through systemd, RunPodSandbox, CreateContainer, StartContainer."""
    uid = str(uuid.uuid4())
    parent = bed.pod_cgroup_parent(qos, uid)
    kubelet_pod_slice(parent, kubelet_weight, memory_max)
    sb = sandbox_config(bed, name, qos=qos, labels=labels, annotations=annotations, uid=uid)
    sandbox_id = run_pod(cri, sb)
    cri.created.append(sandbox_id)
    cid = start_container(cri, sandbox_id, sb, container_config(bed, "main", cmd or ["sleep", "3600"],
                                                              resources=resources))
    assert wait_container_state(cri, cid, pb.CONTAINER_RUNNING).state == pb.CONTAINER_RUNNING
    return Pod(sandbox_id, cid, parent, bed.pod_cgroup_dir(parent), bed.container_cgroup_dir(parent, cid))
