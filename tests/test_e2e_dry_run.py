"""Dry run end to end: a real `koordnode run` with [daemon] dry_run = true in front of the test
bed's containerd decides everything (status, logs, metrics say "would write"), while the real
cgroup v1 files and the requests containerd receives stay exactly as the client made them.

No kubelet here: the CRI calls are kubelet's (RunPodSandbox with a QoS cgroup parent,
CreateContainer with the resources kubelet computes, StartContainer), made with our stubs.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from koordnode.cri import api_pb2 as pb
from support.cri import Cri, container_config, remove_pod, run_pod, sandbox_config, start_container
from support.koordnode_runner import KoordnodeProcess
from support.kubelet_tiers import prepare_qos_tiers

pytestmark = pytest.mark.e2e

CG = Path("/sys/fs/cgroup")
KUBELET_RESOURCES_ANNOTATION = "koordnode.io/kubelet-resources"


def cg_read(controller: str, cgroup: str, name: str) -> str:
    return (CG / controller / cgroup.lstrip("/") / name).read_text().strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def runtime_view(cri: Cri, cid: str) -> tuple[dict, dict]:
    """What containerd recorded for the container: its CRI annotations and its OCI spec."""
    resp = cri.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True))
    info = json.loads(resp.info["info"])
    return dict(resp.status.annotations), info["runtimeSpec"]


def tier_files(kubepods: str) -> dict[str, str]:
    files = {}
    for tier in ("besteffort", "burstable"):
        for name in ("cpu.cfs_quota_us", "cpu.shares"):
            files[f"{tier}/{name}"] = cg_read("cpu", f"{kubepods}/{tier}", name)
    return files


def by_name_of(status: dict) -> dict[str, dict]:
    return {p["name"]: p for p in status["pods"]}


def test_dry_run_decides_everything_and_changes_nothing(containerd_bed, tmp_path):
    bed = containerd_bed
    kubepods = bed.kubepods_cgroup
    prepare_qos_tiers(kubepods)
    tiers_before = tier_files(kubepods)
    port = free_port()
    koordnode = KoordnodeProcess(
        tmp_path / "kn", str(bed.socket), kubepods=kubepods, metrics_listen=f"127.0.0.1:{port}",
        extra_toml='[daemon]\ndry_run = true\n',
    ).start()
    cri = Cri(koordnode.listen)
    sandboxes = []
    try:
        koordnode.wait_rebuilt()
        # A Burstable pod labelled BE (a real run: cpu.shares 512 -> 2 on container and pod,
        # oom_score_adj 1000) and a Guaranteed one (LSR: shares x64, exclusive cpuset).
        be_sb = sandbox_config(bed, "batch", qos="burstable", labels={"koordinator.sh/qosClass": "BE"})
        lsr_sb = sandbox_config(bed, "svc", qos="guaranteed")
        created = {}
        for sb, resources in (
            (be_sb, {"cpu_shares": 512, "oom_score_adj": 500}),
            (lsr_sb, {"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000,
                      "memory_limit_in_bytes": 256 << 20, "oom_score_adj": -997}),
        ):
            sid = run_pod(cri, sb)
            sandboxes.append(sid)
            cfg = container_config(bed, "app", ["sleep", "3600"], resources=resources,
                                   annotations={"kubelet.example/owner": "test"})
            cid = start_container(cri, sid, sb, cfg)
            created[sb.metadata.name] = (sb.linux.cgroup_parent, cid, resources)
        time.sleep(1.5)  # post hooks, QoS manager ticks
        status = koordnode.status()

        # --- the kernel: every value is the one containerd set from the client's request ------
        for name, (parent, cid, resources) in created.items():
            ccg = f"{parent}/{cid}"
            assert cg_read("cpu", ccg, "cpu.shares") == str(resources["cpu_shares"]), name
            assert cg_read("cpu", parent, "cpu.idle") == "0", name
            assert cg_read("cpuset", ccg, "cpuset.cpus") == cg_read("cpuset", "", "cpuset.cpus"), name
        assert tier_files(kubepods) == tiers_before  # no BE tier quota, no shares change

        # --- containerd: the requests arrived as sent -------------------------------------------
        for name, (_parent, cid, resources) in created.items():
            annotations, spec = runtime_view(cri, cid)
            assert KUBELET_RESOURCES_ANNOTATION not in annotations, name
            assert annotations.get("kubelet.example/owner") == "test", name
            cpu = spec["linux"]["resources"]["cpu"]
            assert cpu["shares"] == resources["cpu_shares"], name
            assert cpu.get("cpus", "") == "", name  # no cpuset in the request
            # The bed's containerd raises negative values to its own (restrict_oom_score_adj).
            assert spec["process"]["oomScoreAdj"] == max(resources["oom_score_adj"], 0), name

        # --- decided and reported as in a real run, marked "would write" ------------------------
        assert status["dry_run"]["enabled"] is True
        assert status["dry_run"]["requests_forwarded_unchanged"] >= 2
        # The last CreateContainer (the LSR pod) and what it would have become; the class weight
        # is never part of a request (containerd reports it back to kubelet): a file write.
        changes = status["dry_run"]["last_request_changes"]["CreateContainer"]
        assert "config.linux.resources.oom_score_adj: -997 -> -700" in changes
        assert not any(c.startswith("config.linux.resources.cpu_shares") for c in changes), changes
        lsr_parent, lsr_cid, _ = created["svc"]
        assert any(a.startswith(f"cpu.shares=65536 on {lsr_parent}/{lsr_cid} (") and "would_write" in a
                   for a in by_name_of(status)["svc"]["containers"][0]["applied"])
        by_name = by_name_of(status)
        assert by_name["batch"]["qos_class"] == "BE"
        assert by_name["svc"]["qos_class"] == "LSR"
        be_parent = created["batch"][0]
        assert any(a.startswith(f"cpu.shares=2 on {be_parent} (") and "would_write" in a
                   for a in by_name["batch"]["applied"]), by_name["batch"]["applied"]
        # What koordnode recorded for the container is what containerd got.
        assert by_name["batch"]["containers"][0]["resources"]["cpu_shares"] == 512
        assert "dry run" in status["qos_manager"]["trigger_mode"]  # no PSI trigger registered
        log = koordnode.log_text()
        assert "cgroup_write_dry_run" in log and "would write" in log
        assert "the hooks would have changed it" in log
        assert "config.linux.resources.oom_score_adj: 500 -> 1000" in log  # the BE pod's request
        assert '"event": "cgroup_write"' not in log  # not a single real write

        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "koordnode_dry_run 1.0" in metrics
        assert 'outcome="would_write"' in metrics
        assert 'outcome="written"' not in metrics
        assert "koordnode_dry_run_unchanged_requests_total" in metrics
    finally:
        for sid in sandboxes:
            try:
                remove_pod(cri, sid)
            except Exception:
                pass
        cri.close()
        koordnode.stop()


def test_switching_dry_run_off_by_reload_applies_the_decisions(containerd_bed, tmp_path):
    """The roll-out path: dry run, then `systemctl reload` with dry_run = false."""
    bed = containerd_bed
    koordnode = KoordnodeProcess(tmp_path / "kn", str(bed.socket), extra_toml="[daemon]\ndry_run = true\n").start()
    cri = Cri(koordnode.listen)
    sid = None
    try:
        koordnode.wait_rebuilt()
        sb = sandbox_config(bed, "batch", qos="burstable", labels={"koordinator.sh/qosClass": "BE"})
        sid = run_pod(cri, sb)
        cid = start_container(cri, sid, sb, container_config(bed, "app", ["sleep", "3600"],
                                                             resources={"cpu_shares": 512}))
        time.sleep(0.5)
        parent = sb.linux.cgroup_parent
        assert cg_read("cpu", parent, "cpu.shares") != "2"
        assert cg_read("cpu", f"{parent}/{cid}", "cpu.shares") == "512"
        text = koordnode.config_path.read_text().replace("dry_run = true", "dry_run = false")
        koordnode.config_path.write_text(text)
        koordnode.proc.send_signal(1)  # SIGHUP
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and cg_read("cpu", parent, "cpu.shares") != "2":
            time.sleep(0.1)
        assert cg_read("cpu", parent, "cpu.shares") == "2"  # the reconcile pass after the reload: BE's weight
        assert cg_read("cpu", parent, "cpu.idle") == "0"  # [qos.BE] cpu_idle = 0
        assert cg_read("cpu", f"{parent}/{cid}", "cpu.shares") == "2"
        assert koordnode.status()["dry_run"]["enabled"] is False
    finally:
        if sid:
            try:
                remove_pod(cri, sid)
            except Exception:
                pass
        cri.close()
        koordnode.stop()
