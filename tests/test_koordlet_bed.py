"""koordlet in the test bed (issue #39's comparison runs on it): the real koordlet v1.8.0 on a
real node of its own (containerd 2.4, kubelet 1.37 registered with the bed's API server,
Koordinator's CRDs and koord-manager), serving its runtime hooks over NRI, or to the real
koord-runtime-proxy v1.8.0 between kubelet and containerd. It reports the node's NodeMetric, and
its hooks give a batch pod the values of its batch resources.

koordlet is built only for the koordlet benchmark (``scripts/k8s-bed.sh koordlet``): without the
build this test is skipped, in CI too (CI's cold run has no room for a cgo build of it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from k8s_support import cg_read, require_component
from kube_cluster_support import koordinator_plane
from test_k8s_node import _pod_cgroups
from test_koord_batch_node import BATCH_MEMORY_BYTES, batch_pod
from testbed.k8s_dist import K8sDistError, component_bin
from testbed.koord_bed import NAMESPACE, KoordManager
from testbed.koordlet_bed import install_koordlet_rbac, koordlet_node
from testbed.kube_bed import ControlPlane
from testbed.real_node import NODE_NAMES

from koordnode.kube.agent import NODEMETRICS
from koordnode.model.annotations import BATCH_CPU
from koordnode.model.kernel import KUBELET_SHARES_PER_CPU
from koordnode.policy.class_values import batch_cpu_quota, clamp_shares

pytestmark = pytest.mark.e2e

NODE = NODE_NAMES[2]


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, Path]]:
    try:
        component_bin("koordlet")
    except K8sDistError as err:
        pytest.skip(f"koordlet is built for the koordlet benchmark only: {err}")
    require_component("containerd")
    workdir = tmp_path_factory.mktemp("kl")
    with koordinator_plane(workdir, NODE) as cp:
        install_koordlet_rbac(cp)
        # batch-cpu from requests, not usage: koord-manager recomputes it from koordlet's
        # NodeMetric, and on a busy host usage would leave less than the test's pod asks
        colocation = {"enable": True, "metricReportIntervalSeconds": 10, "metricAggregateDurationSeconds": 10,
                      "cpuCalculatePolicy": "request"}
        cp.client().create(f"/api/v1/namespaces/{NAMESPACE}/configmaps", {
            "metadata": {"name": "slo-controller-config", "namespace": NAMESPACE},
            "data": {"colocation-config": json.dumps(colocation)}})
        with KoordManager(cp, workdir / "koord-manager"):
            yield cp, workdir


@pytest.mark.parametrize("hooks", ["nri", "runtime-proxy"])
def test_koordlet_runs_on_a_real_node_and_its_hooks_apply_batch_values(plane: tuple[ControlPlane, Path],
                                                                       hooks: str) -> None:
    cp, workdir = plane
    admin = cp.client()
    # --v=5: koordlet logs each hook call it serves (the runtime-proxy case checks they came)
    with koordlet_node(workdir / hooks, cp, NODE, runtime_proxy=hooks == "runtime-proxy",
                       koordlet_args=("--v=5",)) as node:
        reported = admin.wait_for("koordlet's NodeMetric", lambda: admin.get(f"{NODEMETRICS}/{NODE}")
                                  .get("status", {}).get("updateTime"), timeout=120)
        print(f"koordlet reported its NodeMetric at {reported}")
        # a batch pod bound by hand: batch-cpu on the node first, as koord-manager would put it
        admin.patch(f"/api/v1/nodes/{NODE}/status", {"status": {"capacity": {BATCH_CPU: "1000"},
                                                                 "allocatable": {BATCH_CPU: "1000"}}})
        pod = batch_pod("koordlet-batch", 300)
        pod["spec"].pop("schedulerName")
        node.create_pod(pod)
        running = node.wait_running("koordlet-batch", timeout=120)
        _, container = _pod_cgroups(node, running)
        deadline = time.monotonic() + 30  # koordlet's NRI hook, or its reconcile
        want = (str(clamp_shares(300 * KUBELET_SHARES_PER_CPU // 1000)), str(batch_cpu_quota(300, 100000)),
                str(BATCH_MEMORY_BYTES))
        while True:
            found = (cg_read("cpu", container, "cpu.shares"), cg_read("cpu", container, "cpu.cfs_quota_us"),
                     cg_read("memory", container, "memory.limit_in_bytes"))
            if found == want or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert found == want, f"koordlet's batch values: {found}, batch-cpu 300m wants {want}"
        if hooks == "runtime-proxy":
            assert node.runtime_proxy is not None and node.nri_socket is None
            assert "update config for /etc/runtime/hookserver.d/koordlet.json" in node.runtime_proxy.log_text()
            hook_calls = [line for line in node.koordlet.log_text().splitlines()
                          if "receive PreCreateContainerHook request" in line and "koordlet-batch" in line]
            assert hook_calls, "koordlet was not called by koord-runtime-proxy for the batch pod's container"

