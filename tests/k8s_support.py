"""Shared pieces of the real-node tests (tests/test_k8s_*.py): the example pods, cgroup reads,
and the control plane fixture.

The example pods are ``tests/data/qos-class-examples.yaml``, a copy of the project's shared
``manifests/qos-class-examples.yaml`` (``test_k8s_node.py`` checks that the copy matches where
the shared folder is present); only the image name is replaced by the test bed's busybox.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from testbed.fixtures import skip_or_fail_in_ci
from testbed.images import BUSYBOX_IMAGE_REF
from testbed.k8s_dist import K8sDistError, component_bin
from testbed.kube_bed import KUBELET_START_MARK, ControlPlane
from testbed.real_node import NODE_NAMES

EXAMPLES = Path(__file__).with_name("data") / "qos-class-examples.yaml"
SHARED_EXAMPLES = Path(__file__).resolve().parents[2] / "shared" / "manifests" / "qos-class-examples.yaml"
CG = Path("/sys/fs/cgroup")
EXAMPLE_IMAGE = "localhost/busybox:1"


def example_pods() -> dict[str, dict[str, Any]]:
    """The example pods by class (``"SYSTEM"``, ``"LSE"``, ...), with the test bed's image."""
    pods = {}
    for doc in yaml.safe_load_all(EXAMPLES.read_text()):
        if not doc:
            continue
        doc = copy.deepcopy(doc)
        for container in doc["spec"]["containers"]:
            if container["image"] == EXAMPLE_IMAGE:
                container["image"] = BUSYBOX_IMAGE_REF
            container.setdefault("imagePullPolicy", "Never")  # the bed's images are local only
        pods[doc["metadata"]["labels"]["koordinator.sh/qosClass"]] = doc
    return pods


def require_component(name: str) -> Path:
    try:
        return component_bin(name)
    except K8sDistError as err:
        skip_or_fail_in_ci(f"real-node test bed: {err}")


def cg_read(controller: str, cgroup: str, name: str) -> str:
    return (CG / controller / cgroup.lstrip("/") / name).read_text().strip()


def cg_dir(controller: str, cgroup: str) -> Path:
    return CG / controller / cgroup.lstrip("/")


_POD_CGROUP = re.compile(r"/pod([0-9a-f-]{36})$")


def find_pod_cgroup(kubepods: str, uid: str, controller: str = "cpu") -> str:
    """The pod's cgroup wherever it is under ``kubepods`` (kubelet's tiers or koordnode's BE group)."""
    base = cg_dir(controller, kubepods)
    for path in [base / f"pod{uid}", *base.glob(f"*/pod{uid}")]:
        if path.is_dir():
            return "/" + str(path.relative_to(CG / controller))
    raise FileNotFoundError(f"no cgroup for pod {uid} under {base}")


def container_cgroups(pod_cgroup: str, controller: str = "cpu") -> Iterator[str]:
    for child in cg_dir(controller, pod_cgroup).iterdir():
        if child.is_dir() and re.fullmatch(r"[0-9a-f]{64}", child.name):
            yield f"{pod_cgroup}/{child.name}"


def container_cgroup(pod_cgroup: str, container_id: str) -> str:
    return f"{pod_cgroup}/{container_id.removeprefix('containerd://')}"


# A klog line: severity letter, date, time, thread id, file:line] message.
_KLOG = re.compile(r"^(?P<severity>[IWEF])\d{4} [\d:.]+\s+\d+ (?P<source>[\w.-]+:\d+)\] (?P<message>.*)$")
_RUNTIME_WORDS = re.compile(r"rpc error|runtime|CRI|sandbox|container", re.IGNORECASE)
_VOLATILE = re.compile(r"koordnode-test-[0-9a-f]+|kn-node-[a-z]|[0-9a-f]{64}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\d+(\.\d+)?")


# kubelet's sync loop, not ready yet: err is one reason or a bracketed list of them, and which of
# them are still pending at a given 100 ms tick after a (re)start is a matter of timing.
_NOT_READY = re.compile(r'^"Skipping pod synchronization" err="\[?(?P<reasons>.*?)\]?"$')


def runtime_errors(kubelet_log: str) -> list[str]:
    """kubelet's error lines about the runtime (CRI calls, sandboxes, containers), with ids,
    uids and numbers blanked so that the same error of two runs compares equal; a sync loop
    not ready yet gives one entry per reason it names."""
    found = []
    for line in kubelet_log.splitlines():
        match = _KLOG.match(line)
        if match and match["severity"] in "EF" and _RUNTIME_WORDS.search(match["message"]):
            message = _VOLATILE.sub("#", match["message"])
            not_ready = _NOT_READY.match(message)
            if not_ready:
                found += [f"{match['source']}] Skipping pod synchronization: {reason.strip()}"
                          for reason in not_ready["reasons"].split(", ")]
            else:
                found.append(f"{match['source']}] {message}")
    return list(dict.fromkeys(found))


_GC_STATUS_MISS = re.compile(
    r'kuberuntime_gc\.go:\d+\] "Error getting ContainerStatus for containerID" containerID="([0-9a-f]{64})"'
    r'|"DeleteContainer returned error" containerID=\{"Type":"containerd","ID":"([0-9a-f]{64})"')


def without_gc_races(kubelet_log: str) -> str:
    """The log without the ContainerStatus NotFound errors kubelet met cleaning up a container
    already removed between its list and its status call: its container GC at a restart ("Error
    getting ContainerStatus") and its deleter of a dead pod's containers ("DeleteContainer
    returned error") log the same id right after. kubelet's own races, which a direct node meets
    too when the timing falls that way (seen in a proxy node's log on 2026-12-02, not in direct's
    that run); koordnode answers these calls with containerd's own NotFound."""
    raced = {cid for pair in _GC_STATUS_MISS.findall(kubelet_log) for cid in pair if cid}
    return "\n".join(line for line in kubelet_log.splitlines()
                     if not ("ContainerStatus from runtime service failed" in line and "NotFound" in line
                             and any(cid in line for cid in raced)))


_KLOG_TIME = re.compile(r"^[IWEF]\d{4} (\d\d):(\d\d):(\d\d\.\d+) ")
_SHUTDOWN_WINDOW_S = 2.0


def _klog_seconds(line: str) -> float | None:
    match = _KLOG_TIME.match(line)
    return None if match is None else int(match[1]) * 3600 + int(match[2]) * 60 + float(match[3])


def without_shutdown_cancels(kubelet_log: str) -> str:
    """The log without the CRI calls kubelet itself cancelled as it stopped for a restart: its
    PLEG relist in flight at the signal ends "code = Canceled desc = context canceled" (a call that
    ran too long ends DeadlineExceeded instead, and stays). Only the lines within
    _SHUTDOWN_WINDOW_S of the last line a stopped kubelet wrote are dropped; the kubelet still
    running keeps all of its lines. Seen on a proxy node in CI on 2026-12-03, where a relist
    through koordnode was in flight at the restart; a direct node meets it when the timing falls
    that way."""
    runs = kubelet_log.split(KUBELET_START_MARK)
    kept = []
    for index, run in enumerate(runs):
        lines = run.splitlines(keepends=True)
        still_running = index == len(runs) - 1
        end = None if still_running else next((t for t in map(_klog_seconds, reversed(lines)) if t is not None), None)
        if end is not None:
            lines = [line for line in lines
                     if not ("code = Canceled desc = context canceled" in line
                             and (t := _klog_seconds(line)) is not None and 0 <= end - t <= _SHUTDOWN_WINDOW_S)]
        kept.append("".join(lines))
    return KUBELET_START_MARK.join(kept)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver for the whole session, with node identities for ``NODE_NAMES``."""
    require_component("kubernetes")
    require_component("etcd")
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"), node_names=NODE_NAMES).start()
    try:
        yield plane
    finally:
        plane.stop()
