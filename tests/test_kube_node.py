"""[kubernetes] on a real node: a real kubelet (registered with the test bed's kube-apiserver,
with Koordinator's CRDs and the shipped RBAC) behind koordnode, pods created through the API.

Evictions that stick: be_evict evicts through the Eviction API, a PodDisruptionBudget's refusal
is reported and the next BE pod tried, and the evicted pod is gone from the API (kubelet does
not restart it, as it would a container stopped through CRI).

The memory the eviction answers is the test's own, not the shared machine's: the guarded BE pod
holds a known amount (dd's block buffer, kept while dd blocks writing into a pipe nobody reads)
that takes node memory use a margin above the threshold, which is set a margin above what the
machine uses when the test starts. So memory is short on a quiet machine and a busy one alike,
the guarded pod (the largest BE pod) is picked first, refused by its budget, and the free pod
evicted in its stead. Should the machine's own use drop by more than the margin before the free
pod is created, another guarded hog makes up for it.
"""

from __future__ import annotations

# ruff: noqa: F811  (the `plane` fixture is imported, then requested by name)

import time
from pathlib import Path
from typing import Any

import pytest

from k8s_support import require_component
from kube_cluster_support import kubeconfig_for, plane  # noqa: F401
from testbed.kube_client import ApiError as AdminApiError
from testbed.images import BUSYBOX_IMAGE_REF
from testbed.kube_bed import ControlPlane
from testbed.real_node import NODE_NAMES, real_node

pytestmark = pytest.mark.e2e

NODE = NODE_NAMES[2]
MARGIN = 512 << 20  # bytes: the threshold above the machine's use, the hog's use above the threshold
_GIB = 1 << 30


def _meminfo() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        fields[name] = int(rest.split()[0]) * 1024
    return fields


def _memory_used_percent() -> float:
    """As koordnode measures it: MemTotal - MemAvailable."""
    fields = _meminfo()
    return 100.0 * (fields["MemTotal"] - fields["MemAvailable"]) / fields["MemTotal"]


def _hog_command(size: int) -> list[str]:
    """Hold `size` bytes: dd fills a block buffer of that size from /dev/zero and then blocks
    writing it into a pipe that sleep never reads (blocks of at most 1 GiB: one read() of
    /dev/zero returns at most 2 GiB)."""
    chunks = [min(_GIB, size - at) for at in range(0, size, _GIB)]
    return ["sh", "-c", " & ".join(f"dd if=/dev/zero bs={c} count=1 2>/dev/null | sleep 3600" for c in chunks)
            + " & wait"]


def _be_pod(name: str, app: str, command: list[str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"app": app, "koordinator.sh/qosClass": "BE"}},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "app", "image": BUSYBOX_IMAGE_REF, "imagePullPolicy": "Never",
                                     "command": command or ["sleep", "3600"]}]}}


def _gone(client: Any, name: str) -> bool:
    try:
        client.pod(name)
    except AdminApiError as err:
        return err.status == 404
    return False


def test_evictions_through_the_api_stick_and_honour_a_pdb(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
                                                          ) -> None:
    require_component("containerd")
    mem = _meminfo()
    total, used = mem["MemTotal"], mem["MemTotal"] - mem["MemAvailable"]
    threshold = round(max(10.0, 100.0 * (used + MARGIN) / total), 2)
    hog = int(threshold / 100 * total) - used + MARGIN  # use goes a margin above the threshold
    if hog > mem["MemAvailable"] // 2:
        pytest.skip(f"the hog taking memory use to {threshold:g} % would need {hog / _GIB:.1f} GiB, "
                    f"more than half of the {mem['MemAvailable'] / _GIB:.1f} GiB available")
    short = threshold + 50.0 * MARGIN / total  # half the margin above the threshold: the hog is in place
    workdir = tmp_path_factory.mktemp("kev")  # short: containerd's socket paths live under it
    kubeconfig = kubeconfig_for(plane, workdir / "identity", plane.tokens["koordnode"])
    toml = (f'[kubernetes]\nenable = true\nkubeconfig = "{kubeconfig}"\nnode_name = "{NODE}"\n'
            "evictions_per_window = 5\nbackoff_max_s = 2.0\n"
            f"[strategy.be_evict]\nenable = true\nmemory_threshold_percent = {threshold}\ncooldown_s = 3.0\n")
    admin = plane.client()
    # The budget first (a disruption controller would keep its status; none runs here).
    admin.create("/apis/policy/v1/namespaces/default/poddisruptionbudgets", {
        "metadata": {"name": "node-guarded"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "node-guarded"}}}})
    pdb = admin.get("/apis/policy/v1/namespaces/default/poddisruptionbudgets/node-guarded")
    pdb["status"] = {"observedGeneration": pdb["metadata"]["generation"], "disruptionsAllowed": 0,
                     "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}
    admin.request("PUT", "/apis/policy/v1/namespaces/default/poddisruptionbudgets/node-guarded/status", pdb)
    try:
        with real_node(workdir / "node", control_plane=plane, node_name=NODE, koordnode_toml=toml) as node:
            client = node.client()
            guarded = ["be-guarded"]
            client.create("/api/v1/namespaces/default/pods", _be_pod("be-guarded", "node-guarded", _hog_command(hog)))
            client.wait_pod_phase("be-guarded", timeout=120)
            deadline = time.monotonic() + 30
            while _memory_used_percent() < short:  # the machine's own use dropped: hog more
                if time.monotonic() > deadline:
                    assert len(guarded) < 4, f"memory use {_memory_used_percent():.1f} % stays below {short:.1f} %"
                    guarded.append(f"be-guarded-{len(guarded) + 1}")
                    client.create("/api/v1/namespaces/default/pods",
                                  _be_pod(guarded[-1], "node-guarded", _hog_command(2 * MARGIN)))
                    client.wait_pod_phase(guarded[-1], timeout=120)
                    deadline = time.monotonic() + 30
                time.sleep(0.5)
            print(f"threshold {threshold:g} %, hog {hog / _GIB:.2f} GiB in {', '.join(guarded)}, "
                  f"use {_memory_used_percent():.1f} %")
            free = client.create("/api/v1/namespaces/default/pods", _be_pod("be-free", "node-free"))
            started = time.monotonic()
            client.wait_for("be-free evicted and gone", lambda: _gone(client, "be-free"), timeout=120)
            print(f"be-free evicted through the API and gone {time.monotonic() - started:.1f} s after its creation")
            # be-guarded (the largest BE pod) is asked first, before be-free exists or in its round: refused.
            client.wait_for("the PDB's refusal", lambda: node.koordnode.status()["kubernetes"]["evictions"]["counts"]
                            .get("refused", 0) >= 1, timeout=60)
            kube = node.koordnode.status()["kubernetes"]
            evictions = kube["evictions"]
            print("evictions:", evictions["counts"], [(e["pod"], e["result"]) for e in evictions["recent"]])
            assert evictions["counts"].get("evicted") == 1, evictions
            assert [e["pod"] for e in evictions["recent"] if e["result"] == "evicted"] == ["default/be-free"], evictions
            refused = [e for e in evictions["recent"] if e["result"] == "refused"]
            assert {e["pod"] for e in refused} <= {f"default/{name}" for name in guarded}, evictions
            assert refused and all("disruption budget" in e["detail"] for e in refused), evictions
            # The guarded pod still runs; the evicted one did not come back.
            assert all(client.pod(name)["status"]["phase"] == "Running" for name in guarded)
            time.sleep(3)
            assert _gone(client, "be-free")
            assert not any(p["uid"] == free["metadata"]["uid"] and p["state"] == "ready"
                           for p in node.koordnode.status()["pods"])
    finally:
        admin.delete("/apis/policy/v1/namespaces/default/poddisruptionbudgets/node-guarded")
        for name in ("be-guarded", "be-guarded-2", "be-guarded-3", "be-guarded-4", "be-free"):
            admin.delete(f"/api/v1/namespaces/default/pods/{name}", grace_seconds=0)
