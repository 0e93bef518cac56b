"""A BE pod created while BE is suppressed to its floor, beside an LS pod busy on every CPU,
starts through the real kubelet with koordnode's shipped settings ([strategy.cpu_suppress]
pod_start_cpu_percent, pod_start_lift_after_s): BE gets the allowance's quota for the start, the
group is lifted out of idle once a start has run 5 s, and it is idle at its floor again after.

Before the allowance (2026-12-02, this host, proxy mode) the same start took 22.5 s (NRI mode
6.7 s, kubelet alone 13.8 s: its besteffort tier's weight 2 starves a start as well); under the
VM lane's TCG, 5-10x slower, that is past kubelet's 2-minute runtime request timeout.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime

import pytest

from k8s_support import cg_read, control_plane, require_component, runtime_errors  # noqa: F401
from testbed.images import BUSYBOX_IMAGE_REF
from testbed.real_node import NODE_NAMES, RealNode, real_node

pytestmark = pytest.mark.e2e

BUSY_EVERY_CPU = "for i in 1 2; do (while :; do :; done) & done; wait"
FLOOR_US = 2000  # [strategy.cpu_suppress] min_quota_us, shipped
ALLOWANCE_US = 25_000  # pod_start_cpu_percent 25 of a 100 ms period, shipped
LIFT_AFTER_S = 5.0  # pod_start_lift_after_s, shipped
RUNTIME_REQUEST_TIMEOUT_S = 120  # the bed's kubelet (runtimeRequestTimeout 2m, its default)


def _pod(name: str, cls: str, command: str, cpu: str | None = None) -> dict:
    resources = {"requests": {"cpu": cpu, "memory": "32Mi"}} if cpu else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"koordinator.sh/qosClass": cls}},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "app", "image": BUSYBOX_IMAGE_REF, "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", command], "resources": resources}]}}


def _suppress(node: RealNode) -> dict:
    return node.koordnode.status()["qos_manager"]["strategies"]["cpu_suppress"]


@pytest.mark.parametrize("mode", ["proxy", "nri"])
def test_a_be_pod_starts_beside_busy_ls_while_be_is_at_its_floor(control_plane, tmp_path, mode):  # noqa: F811
    require_component("containerd")
    with real_node(tmp_path, mode=mode, control_plane=control_plane, node_name=NODE_NAMES[1]) as node:
        node.create_pod(_pod("ls-busy", "LS", BUSY_EVERY_CPU, cpu="1"))
        node.create_pod(_pod("be-busy", "BE", BUSY_EVERY_CPU))
        node.wait_running("ls-busy")
        node.wait_running("be-busy")
        group = node.kubepods + "/koordnode_be"

        def at_floor() -> bool:  # LS (and whatever else runs) leave BE no budget
            return (cg_read("cpu", group, "cpu.cfs_quota_us") == str(FLOOR_US)
                    and cg_read("cpu", group, "cpu.idle") == "1")
        node.client().wait_for("BE at its floor beside LS busy on both CPUs", at_floor, timeout=60)
        inputs = (_suppress(node).get("decision") or {}).get("inputs", {})
        print(f"{mode}: LS uses {inputs.get('ls_used_cpus')} CPUs, the rest of the node {inputs.get('system_used_cpus')}")
        starts_before = node.koordnode.status()["qos_manager"]["be_starts"]["total"]
        log_mark = node.koordnode.log_path.stat().st_size
        kubelet_mark = len(node.kubelet.log_text())

        began, began_wall = time.monotonic(), time.time()
        oldest = _OldestStart(node)
        node.create_pod(_pod("be-new", "BE", "sleep 3600"))
        try:
            pod = node.wait_running("be-new", timeout=RUNTIME_REQUEST_TIMEOUT_S)
        finally:
            oldest.stop()
        took = time.monotonic() - began
        print(f"{mode}: the longest a start was seen in flight: {oldest.max_s:.1f} s")
        print(f"{mode}: BE pod Running {took:.1f} s after its creation")
        status = pod["status"]["containerStatuses"][0]
        assert status["restartCount"] == 0
        # kubelet made one sandbox for it: no call ran out of its time and was tried again.
        sandboxes = [s for s in node.containerd_pods() if s["uid"] == pod["metadata"]["uid"]]
        assert len(sandboxes) == 1, sandboxes
        assert not [e for e in runtime_errors(node.kubelet.log_text()[kubelet_mark:]) if "deadline" in e.lower()]

        # koordnode saw the start (proxy: sandbox, create and start calls; NRI: the container)
        # and gave BE the allowance's quota for it, the group still idle; a start still running
        # after pod_start_lift_after_s (LS busy on both CPUs leaves an idle group next to
        # nothing) lifted the group out of idle at pod_start_shares, not before.
        manager = node.koordnode.status()["qos_manager"]
        assert manager["be_starts"]["total"] - starts_before >= (3 if mode == "proxy" else 1)
        with node.koordnode.log_path.open() as log:
            log.seek(log_mark)
            lines = [json.loads(line) for line in log if line.startswith("{")]
        group_writes = [(datetime.fromisoformat(e["timestamp"]).timestamp(), e["resource"], str(e["new"]))
                        for e in lines if e.get("event") == "cgroup_write" and e.get("cgroup", "").endswith("/koordnode_be")]
        print(f"{mode}: the BE group's writes:", [(round(t - began_wall, 1), r, v) for t, r, v in group_writes])
        quota_at = next((t for t, r, v in group_writes if (r, v) == ("cpu.cfs_quota_us", str(ALLOWANCE_US))), None)
        lift_at = next((t for t, r, v in group_writes if (r, v) == ("cpu.idle", "0")), None)
        assert quota_at is not None, group_writes
        if lift_at is not None:
            assert lift_at - quota_at >= LIFT_AFTER_S - 1.0, group_writes  # a tick's lateness
            assert ("cpu.shares", "64") in [(r, v) for _, r, v in group_writes], group_writes  # pod_start_shares
        # koordnode's own age of its oldest start, sampled: one seen past the lift's time plus
        # a tick (1 s) and a margin must have lifted the group; a pod Running sooner than the
        # lift's time never lifted it.
        if oldest.max_s > LIFT_AFTER_S + 2.0:
            assert lift_at is not None, group_writes
        if took < LIFT_AFTER_S - 1.0:
            assert lift_at is None, group_writes
        # And once the start is over: idle at the floor again, nothing in flight.
        node.client().wait_for("the BE group idle at its floor again", at_floor, timeout=30)
        assert node.koordnode.status()["qos_manager"]["be_starts"]["in_flight"] == 0


class _OldestStart:
    """Samples koordnode's qos_manager.be_starts.oldest_s every 0.5 s until stopped: the
    longest any start was seen in flight."""

    def __init__(self, node: RealNode) -> None:
        self.node = node
        self.max_s = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.5):
            try:
                age = self.node.koordnode.status()["qos_manager"]["be_starts"]["oldest_s"]
            except (OSError, KeyError, ValueError, RuntimeError):
                continue  # a status call that failed under load says nothing
            self.max_s = max(self.max_s, float(age))

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=10)
