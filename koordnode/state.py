"""The node's pod sandboxes and containers as koordnode knows them.

Kept current from intercepted CRI calls (see hooks/state_recorder.py) and rebuilt from the
runtime on start-up (see recovery.py), so a koordnode restart loses nothing the runtime knows.
Only the event loop thread mutates it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from koordnode.cri import api_pb2 as pb

POD_READY = "ready"
POD_NOTREADY = "notready"
CONTAINER_CREATED = "created"
CONTAINER_RUNNING = "running"
CONTAINER_EXITED = "exited"
CONTAINER_UNKNOWN = "unknown"


@dataclasses.dataclass
class PodRecord:
    sandbox_id: str
    name: str
    namespace: str
    uid: str
    labels: dict[str, str]
    annotations: dict[str, str]
    cgroup_parent: str
    state: str = POD_READY
    runtime_handler: str = ""
    qos_class: str | None = None
    qos_reason: str = ""
    source: str = "cri"  # "cri" (seen being created) or "recovered" (rebuilt at start-up)
    updated_at: float = dataclasses.field(default_factory=time.time)
    ips: tuple[str, ...] = ()
    host_network: bool = False


@dataclasses.dataclass
class ContainerRecord:
    container_id: str
    sandbox_id: str
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    resources: pb.LinuxContainerResources
    image: str = ""
    state: str = CONTAINER_CREATED
    source: str = "cri"
    updated_at: float = dataclasses.field(default_factory=time.time)


def resources_to_dict(res: pb.LinuxContainerResources) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes", "oom_score_adj",
                  "cpuset_cpus", "cpuset_mems", "memory_swap_limit_in_bytes"):
        value = getattr(res, field)
        if value:
            out[field] = value
    if res.unified:
        out["unified"] = dict(sorted(res.unified.items()))
    return out


class NodeState:
    def __init__(self) -> None:
        self.pods: dict[str, PodRecord] = {}
        self.containers: dict[str, ContainerRecord] = {}
        self.rebuilt_at: float | None = None
        self.rebuild_error: str | None = None

    # ---- queries --------------------------------------------------------------------------

    def containers_of(self, sandbox_id: str) -> list[ContainerRecord]:
        return [c for c in self.containers.values() if c.sandbox_id == sandbox_id]

    def pod_of_container(self, container_id: str) -> PodRecord | None:
        c = self.containers.get(container_id)
        return self.pods.get(c.sandbox_id) if c is not None else None

    def pod_labels_for(self, method: str, request: Any) -> dict[str, str]:
        """Labels of the pod a call is about, for the skip label; {} when unknown."""
        if method == "RunPodSandbox":
            return dict(request.config.labels)
        if method == "CreateContainer":
            return dict(request.sandbox_config.labels)
        sandbox_id = getattr(request, "pod_sandbox_id", "")
        if sandbox_id:
            pod = self.pods.get(sandbox_id)
        else:
            pod = self.pod_of_container(getattr(request, "container_id", ""))
        return dict(pod.labels) if pod is not None else {}

    # ---- changes --------------------------------------------------------------------------

    def put_pod(self, pod: PodRecord) -> None:
        self.pods[pod.sandbox_id] = pod

    def set_pod_state(self, sandbox_id: str, state: str) -> None:
        pod = self.pods.get(sandbox_id)
        if pod is not None:
            pod.state = state
            pod.updated_at = time.time()

    def remove_pod(self, sandbox_id: str) -> PodRecord | None:
        for c in self.containers_of(sandbox_id):
            del self.containers[c.container_id]
        return self.pods.pop(sandbox_id, None)

    def put_container(self, container: ContainerRecord) -> None:
        self.containers[container.container_id] = container

    def set_container_state(self, container_id: str, state: str) -> None:
        c = self.containers.get(container_id)
        if c is not None:
            c.state = state
            c.updated_at = time.time()

    def update_container_resources(self, container_id: str, res: pb.LinuxContainerResources) -> None:
        c = self.containers.get(container_id)
        if c is not None:
            c.resources.CopyFrom(res)
            c.updated_at = time.time()

    def remove_container(self, container_id: str) -> ContainerRecord | None:
        return self.containers.pop(container_id, None)

    def replace_all(self, pods: list[PodRecord], containers: list[ContainerRecord]) -> None:
        """Install a rebuilt view, keeping records the proxy saw while the rebuild ran."""
        fresh_pods = {p.sandbox_id: p for p in pods}
        fresh_containers = {c.container_id: c for c in containers}
        for sid, pod in self.pods.items():
            if pod.source == "cri" and sid not in fresh_pods:
                fresh_pods[sid] = pod
        for cid, c in self.containers.items():
            if c.source == "cri" and cid not in fresh_containers:
                fresh_containers[cid] = c
        self.pods = fresh_pods
        self.containers = fresh_containers
        self.rebuilt_at = time.time()
        self.rebuild_error = None

    # ---- views ----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        pods = []
        for pod in sorted(self.pods.values(), key=lambda p: (p.namespace, p.name, p.sandbox_id)):
            pods.append(
                {
                    "sandbox_id": pod.sandbox_id,
                    "name": pod.name,
                    "namespace": pod.namespace,
                    "uid": pod.uid,
                    "state": pod.state,
                    "qos_class": pod.qos_class,
                    "qos_reason": pod.qos_reason,
                    "cgroup_parent": pod.cgroup_parent,
                    "ips": list(pod.ips),
                    "source": pod.source,
                    "containers": [
                        {
                            "container_id": c.container_id,
                            "name": c.name,
                            "state": c.state,
                            "resources": resources_to_dict(c.resources),
                            "source": c.source,
                        }
                        for c in sorted(self.containers_of(pod.sandbox_id), key=lambda c: c.name)
                    ],
                }
            )
        return {
            "pods": pods,
            "rebuilt_at": self.rebuilt_at,
            "rebuild_error": self.rebuild_error,
        }
