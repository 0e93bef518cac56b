"""[kubernetes] on a real node: a real kubelet (registered with the test bed's kube-apiserver,
with Koordinator's CRDs and the shipped RBAC) behind koordnode, pods created through the API.

Evictions that stick: be_evict evicts through the Eviction API, a PodDisruptionBudget's refusal
is reported and the next BE pod tried, and the evicted pod is gone from the API (kubelet does
not restart it, as it would a container stopped through CRI). The memory threshold is set below
what the shared test machine uses already, so the eviction needs no memory hog.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from k8s_support import require_component
from kube_cluster_support import kubeconfig_for
from testbed.kube_client import ApiError as AdminApiError
from testbed.images import BUSYBOX_IMAGE_REF
from testbed.kube_bed import ControlPlane
from testbed.real_node import NODE_NAMES, real_node

pytestmark = pytest.mark.e2e

NODE = NODE_NAMES[2]


def _memory_used_percent() -> float:
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        fields[name] = int(rest.split()[0])
    return 100.0 * (fields["MemTotal"] - fields["MemAvailable"]) / fields["MemTotal"]


def _be_pod(name: str, app: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"app": app, "koordinator.sh/qosClass": "BE"}},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "app", "image": BUSYBOX_IMAGE_REF, "imagePullPolicy": "Never",
                                     "command": ["sleep", "3600"]}]}}


def _gone(client: Any, name: str) -> bool:
    try:
        client.pod(name)
    except AdminApiError as err:
        return err.status == 404
    return False


def test_evictions_through_the_api_stick_and_honour_a_pdb(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
                                                          ) -> None:
    require_component("containerd")
    used = _memory_used_percent()
    if used < 12:
        pytest.skip(f"the machine uses {used:.0f} % of its memory; the test needs 12 % to evict without a hog")
    threshold = max(10.0, used - 5)
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
            client.create("/api/v1/namespaces/default/pods", _be_pod("be-guarded", "node-guarded"))
            client.wait_pod_phase("be-guarded", timeout=120)
            free = client.create("/api/v1/namespaces/default/pods", _be_pod("be-free", "node-free"))
            started = time.monotonic()
            client.wait_for("be-free evicted and gone", lambda: _gone(client, "be-free"), timeout=120)
            print(f"be-free evicted through the API and gone {time.monotonic() - started:.1f} s after its creation")
            # be-guarded is asked too, in the same round (before be-free) or the next: refused.
            client.wait_for("the PDB's refusal", lambda: node.koordnode.status()["kubernetes"]["evictions"]["counts"]
                            .get("refused", 0) >= 1, timeout=60)
            kube = node.koordnode.status()["kubernetes"]
            assert kube["evictions"]["counts"].get("evicted") == 1, kube["evictions"]
            refused = [e for e in kube["evictions"]["recent"] if e["result"] == "refused"]
            assert refused[0]["pod"] == "default/be-guarded" and "disruption budget" in refused[0]["detail"]
            # The guarded pod still runs; the evicted one did not come back.
            assert client.pod("be-guarded")["status"]["phase"] == "Running"
            time.sleep(3)
            assert _gone(client, "be-free")
            assert not any(p["uid"] == free["metadata"]["uid"] and p["state"] == "ready"
                           for p in node.koordnode.status()["pods"])
    finally:
        admin.delete("/apis/policy/v1/namespaces/default/poddisruptionbudgets/node-guarded")
        for name in ("be-guarded", "be-free"):
            admin.delete(f"/api/v1/namespaces/default/pods/{name}", grace_seconds=0)
