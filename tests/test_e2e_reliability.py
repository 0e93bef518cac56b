"""Reliability against the real containerd test bed (issue 9, engine side): hostile annotations,
status while workers hold the engine lock, CPU ownership after kill -9, the share pool's floor,
backend health, `koordnode status` with a broken config file.

No kubelet here: the tests make kubelet's CRI calls themselves (RunPodSandbox, CreateContainer,
StartContainer, Stop/Remove) with kubelet's cgroup parents and resources.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from koordnode.admin.client import fetch_status
from koordnode.cri import api_pb2 as pb
from koordnode.model.cpulist import parse_cpu_list
from support.cri import Cri
from support.koordnode_runner import REPO, InProcessKoordnode, KoordnodeProcess, short_socket_dir
from test_e2e_qos import ALL_CPUS, GUARANTEED_1CPU, Pods, cg_read

pytestmark = pytest.mark.e2e

LSE = {"koordinator.sh/qosClass": "LSE"}
RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
# The annotation: 64 KiB of "0-65535" ranges (7-27 s of CPU per parse before).
HOSTILE = json.dumps({"cpuset": ",".join(["0-65535"] * ((64 * 1024 - 20) // 8))})


@pytest.fixture
def pods(containerd_bed, cri_proxy):
    p = Pods(containerd_bed, cri_proxy)
    yield p
    p.cleanup()


def wait_for(predicate, timeout_s: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(what)


def cpuset_of(sb: pb.PodSandboxConfig, cid: str) -> frozenset[int]:
    return parse_cpu_list(cg_read("cpuset", f"{sb.linux.cgroup_parent}/{cid}", "cpuset.cpus"))


def test_hostile_resource_status_pod_starts_and_other_calls_keep_answering(containerd_bed, tmp_path):
    kn = KoordnodeProcess(tmp_path / "kn", str(containerd_bed.socket)).start()
    cri = Cri(kn.listen)
    pods = Pods(containerd_bed, cri)
    latencies: list[float] = []
    stop = threading.Event()

    def version_calls():
        other = Cri(kn.listen)
        try:
            while not stop.is_set():
                started = time.perf_counter()
                other.rt.Version(pb.VersionRequest(), timeout=30)
                latencies.append(time.perf_counter() - started)
                time.sleep(0.01)
        finally:
            other.close()

    caller = threading.Thread(target=version_calls)
    try:
        kn.wait_rebuilt()
        caller.start()
        for qos in ("besteffort", "guaranteed"):
            labels = LSE if qos == "guaranteed" else None
            sb, sid, cid = pods.run(f"hostile-{qos}", qos=qos, labels=labels, annotations={RESOURCE_STATUS: HOSTILE},
                                    resources=GUARANTEED_1CPU if labels else {"cpu_shares": 2})
        stop.set()
        caller.join()
        # The container's record is published by the hooks after the call returned: wait for it.
        deadline = time.monotonic() + 20
        while True:
            pod = next(p for p in kn.status()["pods"] if p["sandbox_id"] == sid)
            if "notes" in pod["containers"][0] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        notes = " ".join(pod["containers"][0].get("notes", []))
        assert "resource-status" in notes and "longer than" in notes, notes
        # The LSE pod still got a CPU of its own (the annotation is ignored, not obeyed).
        assert len(cpuset_of(sb, cid)) == 1
        print(f"Version while hostile pods were created: {len(latencies)} calls,"
              f" max {max(latencies) * 1000:.1f} ms")
    finally:
        stop.set()
        if caller.is_alive():
            caller.join()
        pods.cleanup()
        cri.close()
        kn.stop()


def test_status_and_cri_calls_answer_while_a_worker_holds_the_engine_lock(containerd_bed, tmp_path):
    # A reconcile pass holds the engine lock in a worker thread while it writes; the status
    # handler used to wait for that lock on the event loop, and every CRI call with it.
    kn = InProcessKoordnode(tmp_path, str(containerd_bed.socket)).start()
    cri = Cri(kn.listen)
    pods = Pods(containerd_bed, cri)
    held, release = threading.Event(), threading.Event()

    def worker():
        with kn.daemon.qos.lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=worker)
    try:
        kn.wait_rebuilt()
        pods.run("ls", qos="burstable", resources={"cpu_shares": 512})
        holder.start()
        assert held.wait(5)
        started = time.monotonic()
        status = fetch_status(kn.admin, timeout_s=5)
        cri.rt.Version(pb.VersionRequest(), timeout=5)
        print(f"status + Version while the lock was held: {(time.monotonic() - started) * 1000:.1f} ms")
        assert status["pods"][0]["qos_class"] == "LS"
        assert status["qos"]["cpus"]["share_pool"] == sorted(ALL_CPUS)
    finally:
        release.set()
        if holder.is_alive():
            holder.join()
        pods.cleanup()
        cri.close()
        kn.stop()


def test_kill9_restart_rebuilds_cpu_ownership_from_the_allocators_records(containerd_bed, tmp_path):
    # The sequence: LSE pods take every CPU (floor off, as it was), one more LSE pod
    # falls back, the owners go, koordnode is killed with SIGKILL and started again.
    kn = KoordnodeProcess(tmp_path / "kn", str(containerd_bed.socket),
                          extra_toml="[node]\nmin_shared_cpus = 0\n").start()
    cri = Cri(kn.listen)
    pods = Pods(containerd_bed, cri)
    try:
        kn.wait_rebuilt()
        owners = [pods.run(f"lse{i}", qos="guaranteed", labels=LSE, resources=GUARANTEED_1CPU)
                  for i in range(len(ALL_CPUS))]
        c_sb, c_sid, c_cid = pods.run("lse-c", qos="guaranteed", labels=LSE, resources=GUARANTEED_1CPU)
        status = kn.status()
        assert len(status["qos"]["cpus"]["allocations"]) == len(ALL_CPUS)
        assert status["qos"]["cpus"]["share_pool"] == []
        for _, sid, _ in owners:
            pods.remove(sid)
        assert kn.status()["qos"]["cpus"]["allocations"] == {}
        assert kn.stop(signal.SIGKILL) == -signal.SIGKILL
        kn.start()
        after = kn.wait_rebuilt()
        assert after["qos"]["cpus"]["allocations"] == {}
        assert after["qos"]["cpus"]["share_pool"] == sorted(ALL_CPUS)
        assert cpuset_of(c_sb, c_cid) == ALL_CPUS
        # And a new LSE pod gets a CPU nobody else is on.
        sb, sid, cid = pods.run("lse-new", qos="guaranteed", labels=LSE, resources=GUARANTEED_1CPU)
        allocations = kn.status()["qos"]["cpus"]["allocations"]
        assert [set(a["cpus"]) for a in allocations.values()] == [set(cpuset_of(sb, cid))]
        assert not cpuset_of(c_sb, c_cid) & cpuset_of(sb, cid)
    finally:
        pods.cleanup()
        cri.close()
        kn.stop()


def test_kill9_during_calls_leaves_every_owner_on_its_cpus(containerd_bed, tmp_path):
    # Calls in flight when koordnode dies: the owners' CPUs must come back exactly as they were.
    kn = KoordnodeProcess(tmp_path / "kn", str(containerd_bed.socket)).start()
    cri = Cri(kn.listen)
    pods = Pods(containerd_bed, cri)
    try:
        kn.wait_rebuilt()
        lsr_sb, _, lsr_cid = pods.run("lsr", qos="guaranteed", resources=GUARANTEED_1CPU)
        fb_sb, _, fb_cid = pods.run("fallback", qos="guaranteed", labels=LSE, resources=GUARANTEED_1CPU)
        ls_sb, _, ls_cid = pods.run("ls", qos="burstable", resources={"cpu_shares": 512})
        before = kn.status()["qos"]["cpus"]["allocations"]
        assert [a["class"] for a in before.values()] == ["LSR"]
        files = {cid: cpuset_of(sb, cid) for sb, cid in ((lsr_sb, lsr_cid), (fb_sb, fb_cid), (ls_sb, ls_cid))}

        errors: list[Exception] = []

        def churn():
            try:
                for i in range(50):
                    pods.run(f"churn{i}", qos="burstable", resources={"cpu_shares": 256})
            except Exception as exc:  # the kill cuts calls off: expected
                errors.append(exc)

        churner = threading.Thread(target=churn)
        churner.start()
        time.sleep(1.0)
        kn.stop(signal.SIGKILL)
        churner.join()
        kn.start()
        after = kn.wait_rebuilt()
        wait_for(lambda: kn.status()["qos"]["cpus"]["allocations"] == before, what="allocations restored")
        time.sleep(0.5)  # the reconcile pass after the rebuild
        assert {cid: cpuset_of(sb, cid) for sb, cid in ((lsr_sb, lsr_cid), (fb_sb, fb_cid), (ls_sb, ls_cid))} == files
        assert after["qos"]["cpus"]["share_pool"] == sorted(files[ls_cid])
    finally:
        pods.cleanup()
        cri.close()
        kn.stop()


def test_exclusive_cpus_leave_one_cpu_to_the_share_pool(containerd_bed, cri_proxy, koordnode, pods):
    owners = [pods.run(f"lse{i}", qos="guaranteed", labels=LSE, resources=GUARANTEED_1CPU)
              for i in range(len(ALL_CPUS))]
    _, _, ls_cid = ls = pods.run("ls", qos="burstable", resources={"cpu_shares": 512})
    status = koordnode.status()["qos"]["cpus"]
    taken = {c for a in status["allocations"].values() for c in a["cpus"]}
    assert len(status["allocations"]) == len(ALL_CPUS) - 1
    assert all(a["exclusive"] for a in status["allocations"].values())
    assert status["share_pool"] == sorted(ALL_CPUS - taken) and status["min_shared_cpus"] == 1
    assert cpuset_of(ls[0], ls_cid) == ALL_CPUS - taken
    last_sb, _, last_cid = owners[-1]
    assert cpuset_of(last_sb, last_cid) == ALL_CPUS - taken  # fell back to the share pool


class Forwarder:
    """A unix socket in front of containerd that can go away and come back, like containerd."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.path = str(short_socket_dir() / "containerd.sock")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = None
        self.writers: set[asyncio.StreamWriter] = set()

    async def _pipe(self, reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader, writer):
        up_reader, up_writer = await asyncio.open_unix_connection(self.target)
        self.writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def up(self) -> None:
        async def start():
            self.server = await asyncio.start_unix_server(self._serve, self.path)
        asyncio.run_coroutine_threadsafe(start(), self.loop).result(5)

    def down(self) -> None:
        async def stop():
            self.server.close()
            for w in self.writers:
                w.close()
            self.writers.clear()
            Path(self.path).unlink(missing_ok=True)
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def test_backend_health_follows_containerd(containerd_bed, tmp_path):
    forwarder = Forwarder(str(containerd_bed.socket))
    forwarder.up()
    kn = KoordnodeProcess(tmp_path / "kn", forwarder.path).start()
    try:
        assert kn.wait_rebuilt()["backend_health"] == "ok"
        forwarder.down()  # containerd stops answering
        health = kn.status()["backend_health"]
        assert health.startswith("down: UNAVAILABLE"), health
        forwarder.up()
        wait_for(lambda: kn.status()["backend_health"] == "ok", what="backend ok again")
    finally:
        kn.stop()
        forwarder.down()
        forwarder.close()


def _status_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "koordnode", "status", *args], capture_output=True, text=True,
                          cwd=str(REPO), timeout=30)


def test_status_works_while_the_config_file_is_broken(containerd_bed, tmp_path):
    kn = KoordnodeProcess(tmp_path / "kn", str(containerd_bed.socket)).start()
    try:
        kn.wait_rebuilt()
        good = kn.config_path.read_text()
        # Valid TOML, invalid config: the file's [admin] socket is still used.
        kn.config_path.write_text(good + "\n[cgroup]\nreconcile_interval_s = -5\n")
        done = _status_cli("--config", str(kn.config_path), "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["listen"] == kn.listen
        assert "config file has errors" in done.stderr and f"[admin] socket of {kn.config_path}" in done.stderr
        # Not even TOML: the [admin] table's socket line is still found.
        kn.config_path.write_text("[proxy\nlisten = \n" + good[good.index("[admin]"):])
        done = _status_cli("--config", str(kn.config_path))
        assert done.returncode == 0, done.stderr
        assert f"listen  {kn.listen}" in done.stdout
        # Nothing readable: the built-in default is named, and --socket reaches the daemon.
        kn.config_path.write_text("garbage ===\n")
        done = _status_cli("--config", str(kn.config_path))
        assert "built-in default" in done.stderr
        done = _status_cli("--config", str(kn.config_path), "--socket", kn.admin, "--json")
        assert done.returncode == 0 and json.loads(done.stdout)["listen"] == kn.listen
    finally:
        kn.stop()
