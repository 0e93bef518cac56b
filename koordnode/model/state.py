"""The node's pod sandboxes and containers as koordnode knows them.

Kept current from intercepted CRI calls (see hooks/state_recorder.py) and rebuilt from the
runtime on start-up (see recovery.py), so a koordnode restart loses nothing the runtime knows.

Thread rule: only the event loop changes the state, and it never changes anything a reader may
hold. Records are frozen; every change publishes a new NodeView (copy-on-write maps of frozen
records), so a worker thread (hooks, reconcile, QoS ticks) takes `state.view()` once and reads
a snapshot no later change can alter, and hands back results the loop applies.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Protocol

POD_READY = "ready"
POD_NOTREADY = "notready"
CONTAINER_CREATED = "created"
CONTAINER_RUNNING = "running"
CONTAINER_EXITED = "exited"
CONTAINER_UNKNOWN = "unknown"


class RecordedResources(Protocol):
    """What the state reads of a container's resources: the CRI message
    (``LinuxContainerResources``) satisfies it. A protocol, so that the model does not
    import the wire format (cri/ sits above model/)."""

    @property
    def cpu_period(self) -> int: ...
    @property
    def cpu_quota(self) -> int: ...
    @property
    def cpu_shares(self) -> int: ...
    @property
    def memory_limit_in_bytes(self) -> int: ...
    @property
    def oom_score_adj(self) -> int: ...
    @property
    def cpuset_cpus(self) -> str: ...
    @property
    def cpuset_mems(self) -> str: ...
    @property
    def memory_swap_limit_in_bytes(self) -> int: ...
    @property
    def unified(self) -> Mapping[str, str]: ...


@dataclasses.dataclass(frozen=True)
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


@dataclasses.dataclass(frozen=True)
class ContainerRecord:
    container_id: str
    sandbox_id: str
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    resources: RecordedResources
    image: str = ""
    state: str = CONTAINER_CREATED
    source: str = "cri"
    updated_at: float = dataclasses.field(default_factory=time.time)


def resources_to_dict(res: RecordedResources) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes", "oom_score_adj",
                  "cpuset_cpus", "cpuset_mems", "memory_swap_limit_in_bytes"):
        value = getattr(res, field)
        if value:
            out[field] = value
    if res.unified:
        out["unified"] = dict(sorted(res.unified.items()))
    return out


_NO_PODS: Mapping[str, PodRecord] = MappingProxyType({})
_NO_CONTAINERS: Mapping[str, ContainerRecord] = MappingProxyType({})


@dataclasses.dataclass(frozen=True)
class NodeView:
    """One published state of the node: read-only maps of frozen records."""

    pods: Mapping[str, PodRecord] = dataclasses.field(default_factory=lambda: _NO_PODS)
    containers: Mapping[str, ContainerRecord] = dataclasses.field(default_factory=lambda: _NO_CONTAINERS)

    def containers_of(self, sandbox_id: str) -> list[ContainerRecord]:
        return [c for c in self.containers.values() if c.sandbox_id == sandbox_id]

    def pod_of_container(self, container_id: str) -> PodRecord | None:
        c = self.containers.get(container_id)
        return self.pods.get(c.sandbox_id) if c is not None else None


class NodeState:
    def __init__(self) -> None:
        self._view = NodeView()
        self.rebuilt_at: float | None = None
        self.rebuild_error: str | None = None
        # The one thread that changes this state (the event loop's): bound at the first change.
        self._owner: int | None = None

    # ---- queries (any thread: they read the current immutable view) -----------------------

    def view(self) -> NodeView:
        """The current snapshot; later changes publish a new one and leave this one as it is."""
        return self._view

    @property
    def pods(self) -> Mapping[str, PodRecord]:
        return self._view.pods

    @property
    def containers(self) -> Mapping[str, ContainerRecord]:
        return self._view.containers

    def containers_of(self, sandbox_id: str) -> list[ContainerRecord]:
        return self._view.containers_of(sandbox_id)

    def pod_of_container(self, container_id: str) -> PodRecord | None:
        return self._view.pod_of_container(container_id)

    def pod_labels_for(self, method: str, request: Any) -> dict[str, str]:
        """Labels of the pod a call is about, for the skip label; {} when unknown."""
        if method == "RunPodSandbox":
            return dict(request.config.labels)
        if method == "CreateContainer":
            return dict(request.sandbox_config.labels)
        sandbox_id = getattr(request, "pod_sandbox_id", "")
        view = self._view
        if sandbox_id:
            pod = view.pods.get(sandbox_id)
        else:
            pod = view.pod_of_container(getattr(request, "container_id", ""))
        return dict(pod.labels) if pod is not None else {}

    # ---- changes (event loop only) ----------------------------------------------------------

    def _publish(self, pods: dict[str, PodRecord] | None = None,
                 containers: dict[str, ContainerRecord] | None = None) -> None:
        self._check_owner()
        view = self._view
        self._view = NodeView(
            pods=view.pods if pods is None else MappingProxyType(pods),
            containers=view.containers if containers is None else MappingProxyType(containers),
        )

    def _check_owner(self) -> None:
        """Only the event loop changes the state; workers read view() snapshots and hand back
        results the loop records. A change from another thread is a bug: refuse it loudly."""
        me = threading.get_ident()
        if self._owner is None:
            self._owner = me
        elif self._owner != me:
            raise RuntimeError("NodeState is changed by the event loop's thread only; "
                               "a worker must return its result for the loop to record")

    def put_pod(self, pod: PodRecord) -> None:
        self._publish(pods={**self._view.pods, pod.sandbox_id: pod})

    def _replace_pod(self, sandbox_id: str, **changes: Any) -> None:
        pod = self._view.pods.get(sandbox_id)
        if pod is not None:
            self.put_pod(dataclasses.replace(pod, **changes))

    def set_pod_state(self, sandbox_id: str, state: str) -> None:
        self._replace_pod(sandbox_id, state=state, updated_at=time.time())

    def set_pod_class(self, sandbox_id: str, qos_class: str, reason: str) -> None:
        pod = self._view.pods.get(sandbox_id)
        if pod is not None and (pod.qos_class, pod.qos_reason) != (qos_class, reason):
            self._replace_pod(sandbox_id, qos_class=qos_class, qos_reason=reason)

    def set_pod_network(self, sandbox_id: str, ips: tuple[str, ...], host_network: bool) -> None:
        self._replace_pod(sandbox_id, ips=tuple(ips), host_network=host_network)

    def remove_pod(self, sandbox_id: str) -> PodRecord | None:
        view = self._view
        pod = view.pods.get(sandbox_id)
        pods = {sid: p for sid, p in view.pods.items() if sid != sandbox_id}
        containers = {cid: c for cid, c in view.containers.items() if c.sandbox_id != sandbox_id}
        self._publish(pods=pods, containers=containers)
        return pod

    def put_container(self, container: ContainerRecord) -> None:
        self._publish(containers={**self._view.containers, container.container_id: container})

    def _replace_container(self, container_id: str, **changes: Any) -> None:
        c = self._view.containers.get(container_id)
        if c is not None:
            self.put_container(dataclasses.replace(c, **changes))

    def set_container_state(self, container_id: str, state: str) -> None:
        self._replace_container(container_id, state=state, updated_at=time.time())

    def set_pod_containers_state(self, sandbox_id: str, state: str) -> None:
        view = self._view
        now = time.time()
        containers = {cid: dataclasses.replace(c, state=state, updated_at=now) if c.sandbox_id == sandbox_id else c
                      for cid, c in view.containers.items()}
        self._publish(containers=containers)

    def update_container_resources(self, container_id: str, res: RecordedResources) -> None:
        resources = copy.deepcopy(res)  # the caller's message may change later; ours never does
        self._replace_container(container_id, resources=resources, updated_at=time.time())

    def remove_container(self, container_id: str) -> ContainerRecord | None:
        view = self._view
        c = view.containers.get(container_id)
        if c is not None:
            self._publish(containers={cid: x for cid, x in view.containers.items() if cid != container_id})
        return c

    def replace_all(self, pods: list[PodRecord], containers: list[ContainerRecord]) -> None:
        """Install a rebuilt view, keeping records the proxy saw while the rebuild ran."""
        view = self._view
        fresh_pods = {p.sandbox_id: p for p in pods}
        fresh_containers = {c.container_id: c for c in containers}
        for sid, pod in view.pods.items():
            if pod.source == "cri" and sid not in fresh_pods:
                fresh_pods[sid] = pod
        for cid, c in view.containers.items():
            if c.source == "cri" and cid not in fresh_containers:
                fresh_containers[cid] = c
        self._publish(pods=fresh_pods, containers=fresh_containers)
        self.rebuilt_at = time.time()
        self.rebuild_error = None

    def install(self, pods: list[PodRecord], containers: list[ContainerRecord]) -> None:
        """Install the runtime's complete list (NRI Synchronize): nothing else is kept."""
        self._publish(pods={p.sandbox_id: p for p in pods}, containers={c.container_id: c for c in containers})
        self.rebuilt_at = time.time()
        self.rebuild_error = None

    # ---- views ----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        view = self._view
        pods = []
        for pod in sorted(view.pods.values(), key=lambda p: (p.namespace, p.name, p.sandbox_id)):
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
                        for c in sorted(view.containers_of(pod.sandbox_id), key=lambda c: c.name)
                    ],
                }
            )
        return {
            "pods": pods,
            "rebuilt_at": self.rebuilt_at,
            "rebuild_error": self.rebuild_error,
        }
