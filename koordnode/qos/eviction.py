"""BE evictions the QoS manager asks for: through the Eviction API when [kubernetes] is on
(PodDisruptionBudgets honoured; a refused pod is reported and the next BE pod tried), else, or
when the API server does not answer, the container stopped through the runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import structlog

from koordnode.model.pod_facts import PodFacts
from koordnode.model.state import POD_READY, NodeState

if TYPE_CHECKING:
    from koordnode.kube.agent import ClusterLink

log = structlog.get_logger("koordnode")


class ContainerStopper(Protocol):
    """The runtime (cri.client.RuntimeBackend)."""

    async def stop_container(self, container_id: str, timeout_s: int) -> None: ...


class EvictionCounter(Protocol):
    """Where evictions are counted (metrics.Metrics)."""

    def record_eviction(self, reason: str, count: int = 1) -> None: ...


class BeEviction:
    """The QoS manager's `evict` (on the event loop)."""

    def __init__(self, state: NodeState, runtime: ContainerStopper, counter: EvictionCounter,
                 cluster: ClusterLink | None = None) -> None:
        self._state = state
        self._runtime = runtime
        self._metrics = counter
        self.cluster = cluster  # set by the daemon once the cluster link exists (made after the QoS side)
        self.dry_run = False

    def facts_of(self, sandbox_id: str) -> PodFacts | None:
        """A pod as the API server has it (None: unknown, or no [kubernetes])."""
        pod = self._state.pods.get(sandbox_id)
        return self.cluster.facts_of(pod.uid) if self.cluster is not None and pod is not None else None

    def priority_of(self, sandbox_id: str) -> int | None:
        """A pod's priority as the API server has it (None: unknown, or no [kubernetes])."""
        facts = self.facts_of(sandbox_id)
        return facts.priority if facts is not None else None

    async def __call__(self, container_id: str, reason: str) -> None:
        if self.dry_run:  # the QoS manager does not call this in a dry run; a last guard
            log.warning("dry_run_would_evict_be_container", container_id=container_id, reason=reason)
            return
        if self.cluster is not None:
            from koordnode.kube.client import Unreachable

            targets = self._eviction_targets(container_id)
            if targets:
                try:
                    result, _ = await self.cluster.evict(targets, reason)
                except Unreachable as exc:
                    log.warning("eviction_api_unreachable", detail="stopping the container through the runtime",
                                error=str(exc))
                else:
                    if result == "evicted":
                        self._metrics.record_eviction(reason)
                    return
        log.warning("evicting_be_container", container_id=container_id, reason=reason)
        self._metrics.record_eviction(reason)
        await self._runtime.stop_container(container_id, 10)

    def _eviction_targets(self, container_id: str) -> list[Any]:
        """The container's pod first, then the other BE pods on the node (lowest priority first),
        for the Eviction API to try in turn."""
        from koordnode.kube.agent import EvictTarget

        first = self._state.pod_of_container(container_id)
        if first is None or not first.uid:
            return []
        others = [p for p in list(self._state.pods.values())
                  if p.sandbox_id != first.sandbox_id and p.state == POD_READY and p.qos_class == "BE" and p.uid]
        others.sort(key=lambda p: (self.priority_of(p.sandbox_id) or 0, p.namespace, p.name))
        return [EvictTarget(p.namespace, p.name, p.uid) for p in [first, *others]]
