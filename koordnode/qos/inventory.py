"""What the QoS manager works on: the node's running pods and containers, with their QoS
class and cgroup paths, as an immutable snapshot of NodeState (the view types are the
strategies', policy/strategies/base.py).

Built on the event loop thread (the only one touching NodeState), then handed to the tick,
which may run in a worker thread. Pure apart from reading the NodeState passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from koordnode.executor.paths import UnsafePathError, container_cgroup_path, pod_cgroup_path
from koordnode.executor.resources import InvalidValueError, parse_cpu_list
from koordnode.model.annotations import parse_pod_annotations
from koordnode.model.qos_class import (
    DEFAULT_KUBE_QOS_MAPPING,
    KubeQoS,
    QoSClass,
    pod_qos_class,
)
from koordnode.policy.strategies.base import ContainerView, Inventory, PodView
from koordnode.model.state import CONTAINER_RUNNING, POD_READY, ContainerRecord, NodeState, NodeView, PodRecord

PRIORITY_LABEL = "koordinator.sh/priority"
__all__ = ["InventoryBuilder", "build_inventory"]


def _priority(labels: Mapping[str, str]) -> int:
    try:
        return int(labels.get(PRIORITY_LABEL, "0"))
    except ValueError:
        return 0


def _cpuset(text: str) -> frozenset[int] | None:
    if not text:
        return None
    try:
        return parse_cpu_list(text)
    except InvalidValueError:
        return None


class InventoryBuilder:
    """Builds inventories, remembering the per-pod and per-container work (class resolution,
    annotation parsing, cgroup paths) between calls: a pod's labels and cgroup parent never
    change, and a container's resources change only with an updated record."""

    def __init__(self, mapping: Mapping[KubeQoS, QoSClass] = DEFAULT_KUBE_QOS_MAPPING,
                 driver: str = "auto") -> None:
        self.mapping = mapping
        self.driver = driver  # the KubeletLayout's driver: the cgroup paths are the engine's
        self._pods: dict[str, tuple[tuple[object, ...], tuple[str, QoSClass, str, int, Any] | str]] = {}
        self._containers: dict[str, tuple[tuple[object, ...], ContainerView | str]] = {}
        # The last inventory and the NodeView it was built from: NodeState publishes a new
        # view on every change, so while it is the same object nothing needs rebuilding.
        self._last: tuple[NodeView, Inventory] | None = None

    def set_mapping(self, mapping: Mapping[KubeQoS, QoSClass]) -> None:
        if mapping != self.mapping:
            self.mapping = mapping
            self._pods.clear()
            self._last = None

    def set_driver(self, driver: str) -> None:
        if driver != self.driver:
            self.driver = driver
            self._pods.clear()
            self._containers.clear()
            self._last = None

    def _pod(self, pod: PodRecord) -> tuple[str, QoSClass, str, int, Any] | str:
        key = (pod.cgroup_parent, pod.qos_class, pod.updated_at)
        cached = self._pods.get(pod.sandbox_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        label = f"{pod.namespace}/{pod.name}"
        try:
            cgroup = pod_cgroup_path(pod.cgroup_parent, self.driver)
        except UnsafePathError as err:
            value: tuple[str, QoSClass, str, int, Any] | str = f"{label}: {err}"
        else:
            qos = pod_qos_class(pod.qos_class, pod.labels, pod.cgroup_parent, self.mapping)
            annotations = parse_pod_annotations(pod.annotations) if qos is QoSClass.BE else None
            value = (label, qos, cgroup, _priority(pod.labels), annotations)
        self._pods[pod.sandbox_id] = (key, value)
        return value

    def _container(self, c: ContainerRecord, cgroup_parent: str, label: str, annotations: Any) -> ContainerView | str:
        key = (cgroup_parent, c.updated_at, id(annotations))
        cached = self._containers.get(c.container_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            path = container_cgroup_path(cgroup_parent, c.container_id, self.driver)
        except UnsafePathError as err:
            value: ContainerView | str = f"{label}/{c.name}: {err}"
        else:
            res = c.resources
            batch = annotations.batch_resources(c.name) if annotations is not None else None
            value = ContainerView(
                container_id=c.container_id,
                name=c.name,
                cgroup=path,
                cpu_quota_us=res.cpu_quota if res.cpu_quota > 0 else 0,
                cpu_period_us=res.cpu_period or 100_000,
                cpuset=_cpuset(res.cpuset_cpus),
                batch_cpu_milli=batch.cpu_request_milli if batch is not None else None,
                memory_limit_bytes=max(res.memory_limit_in_bytes, 0),
            )
        self._containers[c.container_id] = (key, value)
        return value

    def build(self, state: NodeState) -> Inventory:
        view = state.view()
        last = self._last
        if last is not None and last[0] is view:
            return last[1]
        inventory = self._build(view)
        self._last = (view, inventory)
        return inventory

    def _build(self, state: NodeView) -> Inventory:
        pods: list[PodView] = []
        skipped: list[str] = []
        by_pod: dict[str, list[ContainerRecord]] = {}
        for c in state.containers.values():
            if c.state == CONTAINER_RUNNING:
                by_pod.setdefault(c.sandbox_id, []).append(c)
        live_containers: set[str] = set()
        for pod in state.pods.values():
            if pod.state != POD_READY:
                continue
            info = self._pod(pod)
            if isinstance(info, str):
                skipped.append(info)
                continue
            label, qos, cgroup, priority, annotations = info
            containers = []
            for c in by_pod.get(pod.sandbox_id, ()):
                live_containers.add(c.container_id)
                view = self._container(c, pod.cgroup_parent, label, annotations)
                if isinstance(view, str):
                    skipped.append(view)
                else:
                    containers.append(view)
            pods.append(PodView(pod.sandbox_id, label, qos, cgroup, priority, tuple(containers)))
        for gone in [sid for sid in self._pods if sid not in state.pods]:
            del self._pods[gone]
        for gone in [cid for cid in self._containers if cid not in live_containers]:
            del self._containers[gone]
        return Inventory(tuple(pods), tuple(skipped))


def build_inventory(state: NodeState, mapping: Mapping[KubeQoS, QoSClass] = DEFAULT_KUBE_QOS_MAPPING,
                    driver: str = "auto") -> Inventory:
    """One-off inventory (no caching)."""
    return InventoryBuilder(mapping, driver).build(state)
