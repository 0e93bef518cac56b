"""A real Kubernetes node: kubelet (built from k8s.io/kubernetes) registered with a real
kube-apiserver + etcd, koordnode in front of containerd 2.x (built from its Go module), pods
created through the API. Nothing of kubelet is reproduced here: its cgroup layout, QoS-tier
writes, CRI call pattern and restarts are the real ones.

The example pods are the project's QoS class examples (``tests/data/qos-class-examples.yaml``).
They ask 2.7 CPUs together and the node has 2, so they run in two rounds on one node:
SYSTEM, LSE, LS and BE first, then LSR in LSE's place.

The tests of this module share one node and run in order (each builds on the pods the
previous one left); the host is cgroup v1, kubelet's cgroupfs driver.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from k8s_support import (
    EXAMPLES,
    SHARED_EXAMPLES,
    cg_dir,
    cg_read,
    container_cgroup,
    control_plane,  # noqa: F401 - the session's API server
    example_pods,
    find_pod_cgroup,
    require_component,
    runtime_errors,
    without_gc_races,
    without_shutdown_cancels,
)
from koordnode.executor.cgroup_executor import CgroupExecutor
from koordnode.model.cpulist import parse_cpu_list
from testbed.real_node import NODE_NAMES, RealNode, real_node

pytestmark = pytest.mark.e2e

FIRST_ROUND = ("SYSTEM", "LSE", "LS", "BE")
# "cpu.shares=2 on /kubepods/koordnode_be/pod... (written)" — one entry of `applied` in koordnode status.
_APPLIED = re.compile(r"^(?P<resource>[a-z_]+\.[a-z_.]+)=(?P<value>.*) on (?P<cgroup>/\S*) \(")
# The class's cpu.shares per requested CPU (the QoS guide's weights; kubelet's is 1024).
CLASS_SHARES_PER_CPU = {"SYSTEM": 32768, "LSE": 262144, "LSR": 65536, "LS": 1024}
# kubelet's pod stats from CRI, as docs/operations.md advises next to koordnode's BE group
# (see test_kubelet_reports_stats_of_every_pod_including_the_be_group).
STATS_FROM_CRI = {"PodAndContainerStatsFromCRI": True}


@pytest.fixture(scope="module")
def node(control_plane, tmp_path_factory):  # noqa: F811
    require_component("containerd")
    with real_node(tmp_path_factory.mktemp("k8s-node"), control_plane=control_plane,
                   feature_gates=STATS_FROM_CRI) as n:
        yield n


def _pods_by_class(node: RealNode, classes) -> dict[str, dict]:
    pods = example_pods()
    return {cls: node.pod(pods[cls]["metadata"]["name"]) for cls in classes}


def _status_pod(node: RealNode, uid: str) -> dict:
    for pod in node.koordnode.status().get("pods", []):
        if pod.get("uid") == uid:
            return pod
    raise AssertionError(f"koordnode's status has no pod {uid}")


# koordnode's own lookup of the file behind a resource on this kernel (blkio.weight is
# blkio.bfq.weight here), used read-only.
_KERNEL = CgroupExecutor("/sys/fs/cgroup")


def _file_value(resource: str, cgroup: str) -> str:
    value = _KERNEL.read(cgroup, resource)
    assert value is not None, f"no file for {resource} on {cgroup}"
    return value


def _same_value(resource: str, expected: str, actual: str) -> bool:
    if resource.startswith("cpuset."):
        return parse_cpu_list(expected) == parse_cpu_list(actual)
    # BFQ's weight file reads "default 500"
    return expected.strip() == actual.strip() or actual.split() == ["default", expected.strip()]


def applied_values_hold(node: RealNode, uid: str) -> list[str]:
    """Every value koordnode says it applied to the pod and its containers, checked against
    the real file: the mismatches (empty when all hold)."""
    pod = _status_pod(node, uid)
    entries = list(pod.get("applied", []))
    for container in pod.get("containers", []):
        entries += container.get("applied", [])
    assert entries, f"koordnode applied nothing to pod {uid}: {pod}"
    wrong = []
    for entry in entries:
        match = _APPLIED.match(entry)
        assert match, f"unexpected status entry {entry!r}"
        resource, value, cgroup = match["resource"], match["value"], match["cgroup"]
        actual = _file_value(resource, cgroup)
        if not _same_value(resource, value, actual):
            wrong.append(f"{resource} on {cgroup}: koordnode applied {value}, the file holds {actual}")
    return wrong


def test_the_example_manifests_are_the_shared_ones():
    if not SHARED_EXAMPLES.exists():
        pytest.skip(f"{SHARED_EXAMPLES} is not beside this clone")
    assert EXAMPLES.read_text() == SHARED_EXAMPLES.read_text()


def test_node_is_ready_behind_koordnode(node):
    status = node.client().get(f"/api/v1/nodes/{node.name}")["status"]
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert ready["status"] == "True", ready
    assert status["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.")
    assert status["nodeInfo"]["kubeletVersion"].startswith("v1.")


def _pod_cgroups(node: RealNode, pod: dict) -> tuple[str, str]:
    """The pod cgroup its (first) container runs in, and the container's cgroup. In NRI mode a BE
    pod has two pod cgroups: kubelet's holds the sandbox, koordnode's BE group the containers."""
    uid = pod["metadata"]["uid"]
    cid = pod["status"]["containerStatuses"][0]["containerID"]
    group = f"{node.kubepods}/koordnode_be/pod{uid}"
    for pod_cg in (group, find_pod_cgroup(node.kubepods, uid)):
        if cg_dir("cpu", container_cgroup(pod_cg, cid)).is_dir():
            return pod_cg, container_cgroup(pod_cg, cid)
    raise AssertionError(f"no cgroup for container {cid} of pod {uid} under {node.kubepods}")


def check_class_values(node: RealNode, classes) -> None:
    """The class's own values in the real files (not only "what koordnode says it applied")."""
    pods = _pods_by_class(node, classes)
    cgroups = {cls: _pod_cgroups(node, pod) for cls, pod in pods.items()}
    for cls, pod in pods.items():
        pod_cg, ctr_cg = cgroups[cls]
        # what kubelet allocated to the container (a pending resize is in spec only)
        requests = pod["status"]["containerStatuses"][0].get("allocatedResources", {})
        if cls == "BE":
            # Proxy mode moves the pod, NRI mode its containers (the sandbox stays in kubelet's).
            assert "/koordnode_be/" in pod_cg, f"the BE pod's cgroup: {pod_cg}"
            assert cg_read("cpu", ctr_cg, "cpu.shares") == "2"
        else:
            kubelet_shares = _millicpu(requests["cpu"]) * 1024 // 1000  # what kubelet asks for the request
            expected = min(kubelet_shares * CLASS_SHARES_PER_CPU[cls] // 1024, 262144)
            assert int(cg_read("cpu", ctr_cg, "cpu.shares")) == expected, cls
        # What koordnode says it applied and the files agree within two reconcile passes: in NRI
        # mode a container narrowed to the share pool when an LSE pod takes its CPU gets the new
        # cpuset through the runtime, and its status record follows at the next pass.
        deadline = time.monotonic() + 25
        while (wrong := applied_values_hold(node, pod["metadata"]["uid"])) and time.monotonic() < deadline:
            time.sleep(1)
        assert not wrong, f"{cls}: {wrong}"
    if "LSE" in cgroups:
        lse_cpus = parse_cpu_list(cg_read("cpuset", cgroups["LSE"][1], "cpuset.cpus"))
        assert len(lse_cpus) == 1
        for cls in set(cgroups) - {"LSE"}:
            others = parse_cpu_list(cg_read("cpuset", cgroups[cls][1], "cpuset.cpus"))
            assert not lse_cpus & others, f"LSE's CPU {lse_cpus} is shared with {cls} ({others})"


def _millicpu(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def run_example_pods(node: RealNode, classes) -> dict[str, dict]:
    """Create the example pods of ``classes`` on the node (all at once, as a scheduler would bind
    them) and wait until each runs; the manifests by class."""
    pods = example_pods()
    for cls in classes:
        node.create_pod(pods[cls])
    for cls in classes:
        node.wait_running(pods[cls]["metadata"]["name"], timeout=120)
    return pods


def test_example_pods_run_with_their_class_values(node):
    run_example_pods(node, FIRST_ROUND)
    check_class_values(node, FIRST_ROUND)


def _container_ids(node: RealNode, classes) -> dict[str, str]:
    return {cls: pod["status"]["containerStatuses"][0]["containerID"]
            for cls, pod in _pods_by_class(node, classes).items()}


def _restarts(node: RealNode, classes) -> dict[str, int]:
    return {cls: pod["status"]["containerStatuses"][0]["restartCount"]
            for cls, pod in _pods_by_class(node, classes).items()}


def test_class_values_hold_while_kubelet_runs_and_across_its_restart(node):
    """kubelet rewrites its QoS tiers every minute and its pods' cgroups on every sync; a
    value it undoes is restored by koordnode's reconcile pass (10 s) and counted. Checked at
    the end of kubelet's first minute, then after a kubelet restart."""
    before = _container_ids(node, FIRST_ROUND)
    time.sleep(75)  # past kubelet's periodic QoS-tier update (1 min) and several pod syncs
    check_class_values(node, FIRST_ROUND)
    node.kubelet.restart()
    node.client().wait_for("node Ready after kubelet restart", node.node_ready, timeout=120)
    time.sleep(15)  # kubelet's first sync of every pod after a restart rewrites their cgroups
    check_class_values(node, FIRST_ROUND)
    assert _container_ids(node, FIRST_ROUND) == before, "kubelet's restart replaced containers"
    overwrites = node.koordnode.status()["qos"]["overwrites"]["counts"]
    print("values kubelet changed and koordnode restored:", overwrites)


def _summary_by_pod(node: RealNode, names) -> dict[str, dict]:
    """kubelet's summary once it has a CPU rate for every pod (two samples are needed)."""
    def probe():
        by_name = {p["podRef"]["name"]: p for p in node.kubelet.stats_summary()["pods"]}
        ready = all("usageNanoCores" in by_name.get(n, {}).get("cpu", {}) for n in names)
        return by_name if ready else None
    return node.client().wait_for("a CPU rate for every pod in kubelet's summary", probe, timeout=60, interval=2)


def test_kubelet_reports_stats_of_every_pod_including_the_be_group(node):
    """kubelet's summary API (what its eviction manager and metrics-server read) has CPU and
    memory for every pod and container, also for the BE pod koordnode moved into its group.

    Found with the real kubelet: with pod stats from cadvisor (kubelet's default) the moved BE
    pod has two ``pod<uid>`` cgroups, and kubelet often reports the empty one in its tier (0 bytes,
    0 CPU). With ``PodAndContainerStatsFromCRI`` (this node's kubelet, as docs/operations.md
    advises) it asks containerd, which reads the real one; koordnode's status says which."""
    pods = _pods_by_class(node, FIRST_ROUND)
    by_name = _summary_by_pod(node, [p["metadata"]["name"] for p in pods.values()])
    assert node.koordnode.status()["kubelet"] == {"pod_stats_from": "cri"}
    for cls, pod in pods.items():
        stats = by_name[pod["metadata"]["name"]]
        container = stats["containers"][0]
        assert container["memory"]["workingSetBytes"] > 0, (cls, container)
        assert "usageCoreNanoSeconds" in container["cpu"], (cls, container)
        assert stats["memory"]["workingSetBytes"] > 0, (cls, "pod-level memory", stats["memory"])
        assert stats["cpu"]["usageCoreNanoSeconds"] > 0, (cls, "pod-level cpu", stats["cpu"])
    be = by_name[pods["BE"]["metadata"]["name"]]
    # The BE pod burns a loop: kubelet must see the pod use at least what its container used (the
    # empty kubelet-made cgroup in its tier reads 0). How much it gets depends on the rest of the
    # machine (BE yields to everything), so no fixed rate.
    assert be["cpu"]["usageNanoCores"] > 0, be["cpu"]
    assert be["cpu"]["usageCoreNanoSeconds"] >= 0.9 * be["containers"][0]["cpu"]["usageCoreNanoSeconds"] > 0, be


@pytest.fixture(scope="module")
def direct_runtime_errors(control_plane, tmp_path_factory):  # noqa: F811
    """The baseline: kubelet's runtime errors on a node without koordnode, the same pods and a
    kubelet restart."""
    with real_node(tmp_path_factory.mktemp("k8s-direct"), mode="direct", control_plane=control_plane,
                   node_name=NODE_NAMES[1], namespace="direct", feature_gates=STATS_FROM_CRI) as direct:
        pods = run_example_pods(direct, FIRST_ROUND)
        _summary_by_pod(direct, [pods[cls]["metadata"]["name"] for cls in FIRST_ROUND])
        direct.kubelet.restart()
        direct.client().wait_for("node Ready after kubelet restart", direct.node_ready, timeout=120)
        time.sleep(15)
        return set(runtime_errors(direct.kubelet.log_text()))


def test_kubelet_log_has_no_runtime_errors_that_direct_lacks(node, direct_runtime_errors):
    log = without_shutdown_cancels(without_gc_races(node.kubelet.log_text()))
    errors = [e for e in runtime_errors(log) if e not in direct_runtime_errors]
    assert not errors, "\n".join(errors[:20])
    conditions = node.client().get(f"/api/v1/nodes/{node.name}")["status"]["conditions"]
    assert all("PLEG" not in c.get("message", "") for c in conditions), conditions


def _resize(node: RealNode, name: str, patch: dict) -> None:
    node.client().patch(node.pod_path(name) + "/resize", {"spec": patch}, kind="strategic")


def _resize_done(node: RealNode, name: str, cpu: str):
    def probe():
        pod = node.pod(name)
        conditions = {c["type"] for c in pod["status"].get("conditions", [])}
        if conditions & {"PodResizePending", "PodResizeInProgress"}:
            return None
        resources = pod["status"]["containerStatuses"][0].get("resources", {})
        return pod if resources.get("limits", {}).get("cpu") == cpu else None
    return node.client().wait_for(f"resize of {name} to {cpu}", probe, timeout=90)


def resize_ls_to_700m_and_check(node: RealNode) -> None:
    """The LS example pod resized through the API (500m → 700m): kubelet's status and the files
    agree, the class values are recomputed, and a reconcile pass keeps the new size."""
    ls = example_pods()["LS"]
    name, container = ls["metadata"]["name"], ls["spec"]["containers"][0]["name"]
    _resize(node, name, {"containers": [{"name": container, "resources": {
        "requests": {"cpu": "700m"}, "limits": {"cpu": "700m"}}}]})
    pod = _resize_done(node, name, "700m")
    _pod_cg, ctr_cg = _pod_cgroups(node, pod)
    assert cg_read("cpu", ctr_cg, "cpu.cfs_quota_us") == "70000"
    assert int(cg_read("cpu", ctr_cg, "cpu.shares")) == 700 * 1024 // 1000  # LS: kubelet's weight
    time.sleep(12)  # a reconcile pass (10 s) must keep the new size, not restore the old one
    check_class_values(node, FIRST_ROUND)


def test_in_place_resize_through_the_api_recomputes_the_class_values(node):
    resize_ls_to_700m_and_check(node)


def test_a_resize_kubelet_cannot_complete_is_reported_as_kubelet_reports_it(node):
    ls = example_pods()["LS"]
    name, container = ls["metadata"]["name"], ls["spec"]["containers"][0]["name"]
    _resize(node, name, {"containers": [{"name": container, "resources": {
        "requests": {"cpu": "1500m"}, "limits": {"cpu": "1500m"}}}]})  # fits the node, not beside the others

    def pending():
        conditions = {c["type"]: c for c in node.pod(name)["status"].get("conditions", [])}
        return conditions.get("PodResizePending")
    condition = node.client().wait_for("PodResizePending", pending, timeout=60)
    assert condition["reason"] == "Deferred", condition  # the API server refuses what exceeds the node
    pod = node.pod(name)
    _pod_cg, ctr_cg = _pod_cgroups(node, pod)
    assert cg_read("cpu", ctr_cg, "cpu.cfs_quota_us") == "70000"  # nothing of the refused size applied
    check_class_values(node, FIRST_ROUND)
    _resize(node, name, {"containers": [{"name": container, "resources": {
        "requests": {"cpu": "700m"}, "limits": {"cpu": "700m"}}}]})  # back to what it has
    node.client().wait_for("PodResizePending gone", lambda: not pending(), timeout=60)


POD_LEVEL = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "ls-pod-level", "labels": {"koordinator.sh/qosClass": "LS"}},
    "spec": {
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "50m", "memory": "64Mi"}},
        "containers": [{"name": "app", "image": "", "imagePullPolicy": "Never", "command": ["/bin/sleep", "3600"]}],
    },
}


def test_pod_level_resources_and_their_resize(node):
    """Pod-level resources (spec.resources) and their in-place resize: the pod cgroup follows,
    with the class values recomputed (UpdatePodSandboxResources)."""
    pod = {**POD_LEVEL, "spec": {**POD_LEVEL["spec"], "containers": [
        {**POD_LEVEL["spec"]["containers"][0], "image": example_pods()["LS"]["spec"]["containers"][0]["image"]}]}}
    node.create_pod(pod)
    created = node.wait_running("ls-pod-level", timeout=120)
    pod_cg = find_pod_cgroup(node.kubepods, created["metadata"]["uid"])
    assert cg_read("cpu", pod_cg, "cpu.cfs_quota_us") == "5000"
    assert not applied_values_hold(node, created["metadata"]["uid"])
    _resize(node, "ls-pod-level", {"resources": {"requests": {"cpu": "80m"}, "limits": {"cpu": "80m"}}})

    def resized():
        current = node.pod("ls-pod-level")
        conditions = {c["type"] for c in current["status"].get("conditions", [])}
        limits = current["status"].get("resources", {}).get("limits", {})
        return current if limits.get("cpu") == "80m" and not conditions & {"PodResizePending",
                                                                           "PodResizeInProgress"} else None
    node.client().wait_for("pod-level resize to 80m", resized, timeout=90)
    assert cg_read("cpu", pod_cg, "cpu.cfs_quota_us") == "8000"
    assert int(cg_read("cpu", pod_cg, "cpu.shares")) == 80 * 1024 // 1000
    node.client().wait_for("koordnode's values after the pod-level resize",
                           lambda: not applied_values_hold(node, created["metadata"]["uid"]), timeout=30)
    node.client().delete(node.pod_path("ls-pod-level"), grace_seconds=0)


def test_kubelet_reports_the_resources_it_allocated_not_the_class_weights(node):
    """kubelet derives a container's reported CPU request (``status.containerStatuses[].resources``)
    from the cpu_shares the runtime reports in ContainerStatus. Found with the real kubelet:
    with the class weight in the CRI request containerd stores, the API showed the SYSTEM pod
    asking 6375m (its 200m × 32) and the LSE pod 256 CPUs."""
    for cls, pod in _pods_by_class(node, FIRST_ROUND).items():
        status = pod["status"]["containerStatuses"][0]
        allocated = status.get("allocatedResources", {})
        reported = status.get("resources", {}).get("requests", {})
        assert {k: reported.get(k) for k in allocated} == allocated, (cls, reported, allocated)


def _sandboxes_per_pod(node: RealNode) -> dict[str, int]:
    """Ready sandboxes in containerd per pod uid (a pod duplicated by a retried RunPodSandbox has two)."""
    counts: dict[str, int] = {}
    for sandbox in node.containerd_pods():
        if sandbox["state"] == "SANDBOX_READY":
            counts[sandbox["uid"]] = counts.get(sandbox["uid"], 0) + 1
    return counts


def _one_sandbox_each(node: RealNode, classes) -> None:
    counts = _sandboxes_per_pod(node)
    for cls, pod in _pods_by_class(node, classes).items():
        assert counts.get(pod["metadata"]["uid"]) == 1, (cls, counts)


def _extra_pod(name: str) -> dict:
    ls = example_pods()["LS"]
    container = {**ls["spec"]["containers"][0], "resources": {"requests": {"cpu": "100m", "memory": "32Mi"},
                                                              "limits": {"cpu": "100m", "memory": "32Mi"}}}
    return {**ls, "metadata": {"name": name, "labels": ls["metadata"]["labels"]},
            "spec": {**ls["spec"], "containers": [container]}}


@pytest.mark.parametrize("how", ["restart", "kill -9"])
def test_koordnode_restart_loses_and_duplicates_no_pod(node, how):
    """koordnode goes away while kubelet creates a pod: kubelet's calls fail and it retries;
    once koordnode is back the pod runs, once, with its class values, and nothing else moved."""
    before = _container_ids(node, FIRST_ROUND)
    name = f"ls-during-{how.replace(' ', '').replace('-', '')}"
    node.koordnode.stop(signal.SIGKILL if how == "kill -9" else signal.SIGTERM)
    node.create_pod(_extra_pod(name))
    time.sleep(5)  # kubelet tries, and fails, to reach its runtime
    node.koordnode.start()
    created = node.wait_running(name, timeout=180)
    assert _container_ids(node, FIRST_ROUND) == before
    assert _restarts(node, FIRST_ROUND) == {cls: 0 for cls in FIRST_ROUND}
    _one_sandbox_each(node, FIRST_ROUND)
    assert _sandboxes_per_pod(node)[created["metadata"]["uid"]] == 1
    node.client().wait_for("koordnode's values on every pod after its restart",
                           lambda: not any(applied_values_hold(node, p["metadata"]["uid"])
                                           for p in (*_pods_by_class(node, FIRST_ROUND).values(), created)),
                           timeout=60, interval=2)
    check_class_values(node, FIRST_ROUND)
    node.client().delete(node.pod_path(name), grace_seconds=0)


def test_containerd_restart(node):
    before = _container_ids(node, FIRST_ROUND)
    node.containerd.restart_containerd()
    node.client().wait_for("node Ready after containerd restart", node.node_ready, timeout=120)
    node.create_pod(_extra_pod("ls-after-containerd-restart"))
    node.wait_running("ls-after-containerd-restart", timeout=120)
    assert _container_ids(node, FIRST_ROUND) == before
    check_class_values(node, FIRST_ROUND)
    node.client().delete(node.pod_path("ls-after-containerd-restart"), grace_seconds=0)


def test_second_round_lsr_in_place_of_lse(node):
    """The other example pod: LSR takes the CPUs LSE gave back, and keeps them across a kubelet restart."""
    pods = example_pods()
    client = node.client()
    client.delete(node.pod_path(pods['LSE']['metadata']['name']), grace_seconds=0)
    client.wait_for("LSE pod gone", lambda: not client.exists(
        node.pod_path(pods['LSE']['metadata']['name'])), timeout=90)
    node.create_pod(pods["LSR"])
    node.wait_running(pods["LSR"]["metadata"]["name"], timeout=120)
    second_round = ("SYSTEM", "LSR", "LS", "BE")
    check_class_values(node, second_round)
    node.kubelet.restart()
    client.wait_for("node Ready after kubelet restart", node.node_ready, timeout=120)
    time.sleep(15)
    check_class_values(node, second_round)


def _memory_pod(name: str, cls: str, hold_mb: int, request: str | None, after_s: int = 0) -> dict:
    """A pod holding ``hold_mb`` MB in a shell variable after ``after_s`` seconds (the bed's busybox has no stress tool)."""
    resources = {"requests": {"memory": request}} if request else {}
    script = f'sleep {after_s}; x=$(head -c {hold_mb * 1_000_000} /dev/zero | tr "\\0" a); echo held; sleep 3600'
    image = example_pods()["LS"]["spec"]["containers"][0]["image"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"koordinator.sh/qosClass": cls}},
            "spec": {"restartPolicy": "Never", "containers": [
                {"name": "hold", "image": image, "imagePullPolicy": "Never",
                 "command": ["/bin/sh", "-c", script], "resources": resources}]}}


def _growing_memory_pod(name: str, cls: str, step_mb: int, steps: int, after_s: int = 0) -> dict:
    """A pod adding a process holding ``step_mb`` MB every second, ``steps`` times."""
    pod = _memory_pod(name, cls, 0, None)
    # `; true`: a subshell's last command is exec'd, which would drop the variable with the shell.
    hold = f'x=$(head -c {step_mb * 1_000_000} /dev/zero | tr "\\0" a); sleep 3600; true'
    pod["spec"]["containers"][0]["command"][2] = (
        f"sleep {after_s}; for i in $(seq {steps}); do ( {hold} ) & sleep 1; done; echo held; wait")
    return pod


def _available_mib() -> tuple[int, int]:
    """Memory available now: the kernel's MemAvailable and kubelet's reckoning on cgroup v1
    (capacity minus the root memory cgroup's working set: usage less inactive file pages)."""
    meminfo = {line.split(":")[0]: int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()}
    kernel = meminfo["MemAvailable"] // 1024
    root = Path("/sys/fs/cgroup/memory")
    if not (root / "memory.usage_in_bytes").exists():
        return kernel, kernel
    stat = dict(line.split() for line in (root / "memory.stat").read_text().splitlines())
    working_set = int((root / "memory.usage_in_bytes").read_text()) - int(stat.get("total_inactive_file", 0))
    return kernel, meminfo["MemTotal"] // 1024 - working_set // (1 << 20)


def test_kubelet_evicts_the_be_pod_in_koordnodes_group_first(control_plane, tmp_path_factory):  # noqa: F811
    """kubelet's eviction manager under memory pressure ranks pods by their use above their
    request: a BE pod holding hundreds of MB in koordnode's group must go before a Burstable LS
    pod 30 MB above its request. (Were kubelet to read the BE pod's empty kubelet-made cgroup, it
    would rank it at 0 bytes and evict the LS pod first.) A node of its own: its eviction
    threshold is set 400 MiB below the memory available at its start (the lower of the kernel's
    and kubelet's own reckoning), and the BE pod grows by 100 MB a second once both pods run, so
    the pressure comes however the node's memory drifts meanwhile (a fixed 700 MB once missed it)."""
    available = min(_available_mib())
    with real_node(tmp_path_factory.mktemp("k8s-evict"), control_plane=control_plane, node_name=NODE_NAMES[2],
                   namespace="evict", feature_gates=STATS_FROM_CRI,
                   kubelet_config={"evictionHard": {"memory.available": f"{available - 400}Mi"},
                                   "evictionPressureTransitionPeriod": "10s"}) as node:
        client = node.client()
        node.create_pod(_memory_pod("ls-over-request", "LS", 40, "10Mi"))
        client.wait_for("ls-over-request holds its memory",
                        lambda: "held" in node.kubelet.container_log("ls-over-request", "hold", node.namespace), timeout=120)
        node.create_pod(_growing_memory_pod("be-hog", "BE", step_mb=100, steps=30, after_s=5))
        node.wait_running("be-hog", timeout=120)
        assert "/koordnode_be/" in find_pod_cgroup(node.kubepods, node.pod("be-hog")["metadata"]["uid"])

        def first_evicted():
            for name in ("be-hog", "ls-over-request"):
                if node.pod(name)["status"].get("reason") == "Evicted":
                    return name
            return None
        assert client.wait_for("kubelet's first eviction", first_evicted, timeout=120, interval=1) == "be-hog"
