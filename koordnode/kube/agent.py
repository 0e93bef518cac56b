"""koordnode in a cluster ([kubernetes] enable): the watches, evictions and the NodeMetric report.

The ClusterLink owns the API client and three loops: the NodeSLO watch (fleet configuration,
handed to the daemon, which applies it below the local file the way SIGHUP applies a file), the
watch of the pods bound to this node (facts for the QoS engine), and the NodeMetric report. None
of them is on the CRI path: when the API server is away they back off and the node keeps its
last good values; status says so.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import structlog

from koordnode.config.kubernetes import KubernetesConfig, check_node_name
from koordnode.config.loader import ConfigError
from koordnode.kube.client import ApiError, KubeClient
from koordnode.kube.credentials import Credentials
from koordnode.kube.nodemetric import MetricRequest, metric_request, new_node_metric
from koordnode.kube.nodeslo import NodeSloMapping, map_nodeslo
from koordnode.kube.pods import pod_facts_of
from koordnode.kube.reflector import Reflector, repeat_with_backoff
from koordnode.kube.reservation import RESERVATION_ANNOTATION, NodeReservation, reservation_of
from koordnode.kube.topology import TopologyFacts
from koordnode.kube.topology_report import TopologyReporter
from koordnode.model.pod_facts import PodFacts

__all__ = ["ClusterLink", "EvictTarget", "EvictionRefused", "NODEMETRICS", "NODESLOS", "node_name_of"]

log = structlog.get_logger("koordnode.kube")

NODESLOS = "/apis/slo.koordinator.sh/v1alpha1/nodeslos"
NODEMETRICS = "/apis/slo.koordinator.sh/v1alpha1/nodemetrics"
PODS = "/api/v1/pods"
NODES = "/api/v1/nodes"
RESERVATION_SOURCE = f"Node annotation {RESERVATION_ANNOTATION}"
# An accepted eviction's pod counts as terminating this long even before the watch shows it.
EVICTED_MEMORY_S = 600.0


def node_name_of(config: KubernetesConfig, environ: Mapping[str, str] = os.environ) -> str:
    """[kubernetes] node_name, else $NODE_NAME (a DaemonSet's pod gets it from the downward API:
    its host name is the pod's), else the host name in lower case (kubelet's default)."""
    if config.node_name:
        return config.node_name
    from_env = environ.get("NODE_NAME", "")
    if from_env:
        problem = check_node_name(from_env)
        if problem:
            raise ValueError(f"$NODE_NAME: {problem}")
        return from_env
    return socket.gethostname().lower()


def credentials_of(config: KubernetesConfig) -> Credentials:
    if config.kubeconfig:
        return Credentials.from_kubeconfig(config.kubeconfig)
    return Credentials.in_cluster(config.service_account_dir)


@dataclass(frozen=True)
class EvictTarget:
    namespace: str
    name: str
    uid: str


class EvictionRefused(Exception):
    """Every candidate was refused (PodDisruptionBudget) or the window's limit is reached."""


# The daemon's side: apply a NodeSLO's table (None: no NodeSLO) or raise ConfigError.
ApplyNodeSlo = Callable[[dict[str, Any] | None], Awaitable[None]]


class ClusterLink:
    def __init__(self, config: KubernetesConfig, *, apply_nodeslo: ApplyNodeSlo,
                 on_pod_facts: Callable[[], None],
                 node_metric_status: Callable[[MetricRequest], dict[str, Any] | None],
                 memory_total_bytes: Callable[[], int | None] = lambda: None,
                 node_topology: Callable[[], TopologyFacts | None] = lambda: None,
                 observe: Callable[[str, str], None] = lambda kind, result: None,
                 client: KubeClient | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        """`observe(kind, result)`: ("nodeslo", "applied" | "refused") and ("eviction", result),
        for the metrics (which live above this layer)."""
        self.config = config
        self.node_name = node_name_of(config)
        self.client = client or KubeClient(credentials_of(config), timeout_s=config.request_timeout_s,
                                           max_response_bytes=config.max_response_bytes)
        self._apply_nodeslo = apply_nodeslo
        self._on_pod_facts = on_pod_facts
        self._node_metric_status = node_metric_status
        self._memory_total = memory_total_bytes
        self._clock = clock
        self._observe = observe
        self.facts: dict[str, PodFacts] = {}  # pod UID -> facts
        self.fact_problems: list[str] = []
        self.nodeslo_status: dict[str, Any] = {"state": "none seen yet"}
        self._nodeslo_obj: dict[str, Any] | None = None
        self.reservation = NodeReservation()  # the Node's node.koordinator.sh/reservation
        self._nodeslo_lock = asyncio.Lock()
        self._nodeslo_rv: str | None = None
        self._evictions: list[float] = []  # when each counted eviction was accepted
        self._evicted: dict[str, float] = {}  # pod UID -> when its eviction was accepted
        # One eviction at a time: the QoS manager runs a round's evictions as concurrent tasks, and
        # a pod one of them is asking about (or has just evicted) must be seen as terminating by
        # the others, and the window's limit counted, before they ask the API server.
        self._evict_lock = asyncio.Lock()
        self.eviction_counts: dict[str, int] = {}
        self.recent_evictions: list[dict[str, Any]] = []
        self.node_metric: dict[str, Any] = {"state": "not reported yet"}
        self.topology = TopologyReporter(self.client, self.node_name, node_topology, config.backoff_max_s)
        self._tasks: set[asyncio.Task[Any]] = set()
        selector = quote(self.node_name, safe="")
        self.nodeslo_watch = Reflector(
            self.client, NODESLOS, field_selector=f"metadata.name={selector}", on_change=self._nodeslo_changed,
            name="nodeslo", watch_timeout_s=config.watch_timeout_s, backoff_max_s=config.backoff_max_s, max_objects=1)
        self.pod_watch = Reflector(
            self.client, PODS, field_selector=f"spec.nodeName={selector}", on_change=self._pods_changed,
            name="pods", watch_timeout_s=config.watch_timeout_s, backoff_max_s=config.backoff_max_s,
            transform=self._pod_transform)
        self.node_watch = Reflector(
            self.client, NODES, field_selector=f"metadata.name={selector}", on_change=self._node_changed,
            name="node", watch_timeout_s=config.watch_timeout_s, backoff_max_s=config.backoff_max_s, max_objects=1,
            transform=reservation_of)

    # ---- loops ---------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        loops = []
        if self.config.nodeslo:
            loops.append(self.nodeslo_watch.run(stop))
        if self.config.pod_facts:
            loops.append(self.pod_watch.run(stop))
        if self.config.node_reservation:
            loops.append(self.node_watch.run(stop))
        if self.config.node_metric:
            loops.append(self._report_loop(stop))
        if self.config.node_topology:
            loops.append(self.topology.run(stop))
        await asyncio.gather(*loops)

    # ---- NodeSLO -------------------------------------------------------------------------------

    def _nodeslo_changed(self, store: Mapping[str, Any]) -> None:
        obj = store.get(self.node_name)
        meta = obj.get("metadata", {}) if isinstance(obj, dict) else {}
        version = str(meta.get("resourceVersion", "")) if obj is not None else None
        if obj is not None and version == self._nodeslo_rv:
            return  # a relist of the same object
        self._nodeslo_rv = version
        self._nodeslo_obj = obj
        self._spawn(self._take_nodeslo(obj, version))

    def _spawn(self, job: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _node_changed(self, store: Mapping[str, Any]) -> None:
        """The Node's reservation changed: the NodeSLO's values are applied again with it."""
        reservation = store.get(self.node_name) or NodeReservation()
        if reservation == self.reservation:
            return  # the Node changed elsewhere (its status, other annotations)
        self.reservation = reservation
        if reservation.problems:
            log.warning("node_reservation_in_part", node=self.node_name, problems=list(reservation.problems))
        self._spawn(self._take_nodeslo(self._nodeslo_obj, self._nodeslo_rv))

    async def _take_nodeslo(self, obj: dict[str, Any] | None, version: str | None) -> None:
        async with self._nodeslo_lock:  # in the order they were seen
            now = time.time()
            if obj is None:
                mapping = NodeSloMapping()
            else:
                mapping = map_nodeslo(obj.get("spec"), self._memory_total())
            reservation = self.reservation
            for key, value in reservation.values.items():
                mapping.put(key, value, RESERVATION_SOURCE)
            values: dict[str, Any] | None = mapping.values if obj is not None or reservation.values else None
            # A field koordnode cannot take (a wrong type, out of its range, a contradiction) is
            # left out and named; the rest applies. Only a spec that is not an object, or an
            # error no NodeSLO field explains, refuses the version whole.
            not_applied = list(mapping.errors)
            errors = [e for e in mapping.errors if not e.startswith("spec.")]
            if not errors:
                not_applied_now, errors = await self._apply_in_part(values, mapping)
                not_applied += not_applied_now
            if errors:
                log.error("nodeslo_refused", detail="keeping the last good NodeSLO", node=self.node_name,
                          resource_version=version, errors=errors)
                self.nodeslo_status = {**self.nodeslo_status, "last_refused": {
                    "resource_version": version, "at": now, "errors": errors}}
                self.nodeslo_status["refused_total"] = self.nodeslo_status.get("refused_total", 0) + 1
                self._observe("nodeslo", "refused")
                return
            self._observe("nodeslo", "applied")
            if not_applied:
                log.warning("nodeslo_applied_in_part", node=self.node_name, resource_version=version,
                            keys=len(mapping.fields), not_applied=not_applied)
            else:
                log.info("nodeslo_applied", node=self.node_name, resource_version=version,
                         keys=len(mapping.fields), ignored=len(mapping.ignored))
            state = "applied in part" if not_applied else "applied"
            if obj is None:
                state = ("no NodeSLO for this node: the Node's reservation " + state + " below the local file"
                         if reservation.values else "no NodeSLO for this node: local file and defaults")
            self.nodeslo_status = {
                "state": state,
                "resource_version": version, "applied_at": now, "keys": dict(mapping.fields),
                "not_applied": not_applied, "ignored": list(mapping.ignored),
                "refused_total": self.nodeslo_status.get("refused_total", 0),
                **({"last_refused": self.nodeslo_status["last_refused"]} if "last_refused" in self.nodeslo_status
                   else {}),
            }

    async def _apply_in_part(self, values: dict[str, Any] | None,
                             mapping: NodeSloMapping) -> tuple[list[str], list[str]]:
        """Apply `values`, leaving out each key the config refuses that came from the NodeSLO:
        (what was left out, with why; the errors that refuse it whole, empty when applied)."""
        left_out: list[str] = []
        for _ in range(_MAX_APPLY_ROUNDS):
            try:
                await self._apply_nodeslo(values)
                return left_out, []
            except ConfigError as exc:
                named = [_name_spec_field(e, mapping) for e in exc.errors]
                keys = [e.partition(": ")[0] for e in exc.errors]
                if values is None or not all(key in mapping.fields for key in keys):
                    return left_out, named
                for key in keys:
                    _drop_key(values, key)
                left_out += named
            except Exception as exc:  # applying failed midway: report it like a refusal
                log.exception("nodeslo_apply_failed", node=self.node_name)
                return left_out, [f"applying failed: {exc!r}"]
        return left_out, ["the NodeSLO's values still did not validate after leaving out: " + "; ".join(left_out)]

    # ---- pod facts -----------------------------------------------------------------------------

    def _pod_transform(self, obj: dict[str, Any]) -> Any:
        facts, problems = pod_facts_of(obj)
        if problems:
            self.fact_problems = (self.fact_problems + problems)[-10:]
        return facts

    def _pods_changed(self, store: Mapping[str, Any]) -> None:
        fresh: dict[str, PodFacts] = {}
        for facts in store.values():
            if isinstance(facts, PodFacts):
                old = self.facts.get(facts.uid)
                # The same object when nothing changed: the engine compares facts by identity.
                fresh[facts.uid] = old if old == facts else facts
        changed = fresh.keys() != self.facts.keys() or any(fresh[u] is not self.facts[u] for u in fresh)
        self.facts = fresh
        if changed:
            self._on_pod_facts()

    def facts_of(self, uid: str) -> PodFacts | None:
        return self.facts.get(uid)

    def decorate(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        """Add what the API server says of each pod of a NodeState snapshot (`koordnode status`)."""
        for pod in snapshot.get("pods", []):
            facts = self.facts_of(pod.get("uid", ""))
            pod["api"] = "not known to the API server (planned from CRI alone)" if facts is None else {
                "memory_requests": dict(facts.memory_requests), "priority": facts.priority,
                "priority_class": facts.priority_class, "owners": list(facts.owners),
                "terminating": facts.terminating}
        return snapshot

    # ---- evictions -----------------------------------------------------------------------------

    def _terminating(self, uid: str) -> bool:
        now = self._clock()
        self._evicted = {u: at for u, at in self._evicted.items() if now - at < EVICTED_MEMORY_S}
        facts = self.facts.get(uid)
        return uid in self._evicted or (facts is not None and facts.terminating)

    def _count(self, result: str, target: EvictTarget, reason: str, detail: str = "") -> None:
        self.eviction_counts[result] = self.eviction_counts.get(result, 0) + 1
        self._observe("eviction", result)
        self.recent_evictions = (self.recent_evictions + [{
            "pod": f"{target.namespace}/{target.name}", "uid": target.uid, "result": result,
            "reason": reason, "detail": detail, "at": time.time()}])[-20:]

    async def evict(self, candidates: Sequence[EvictTarget], reason: str) -> tuple[str, EvictTarget]:
        """Ask the Eviction API to evict the first candidate it accepts; a PodDisruptionBudget's
        refusal (429) is reported and the next one tried. Returns ("evicted" | "already
        terminating" | "gone", pod). A pod already terminating is not evicted or counted again.
        EvictionRefused when none was accepted or the window's limit is reached; Unreachable
        when the API server does not answer (the caller stops the container through CRI then).
        Calls are taken one at a time (see _evict_lock)."""
        if not candidates:
            raise EvictionRefused("no candidate")
        async with self._evict_lock:
            return await self._evict_one(candidates, reason)

    async def _evict_one(self, candidates: Sequence[EvictTarget], reason: str) -> tuple[str, EvictTarget]:
        if self._terminating(candidates[0].uid):  # e.g. a second container of a pod being evicted
            self._count("already_terminating", candidates[0], reason)
            return "already terminating", candidates[0]
        # Fallbacks already terminating are going away anyway: not asked, not counted.
        candidates = [candidates[0], *(t for t in candidates[1:] if not self._terminating(t.uid))]
        now = self._clock()
        window = self.config.eviction_window_s
        self._evictions = [at for at in self._evictions if now - at < window]
        if len(self._evictions) >= self.config.evictions_per_window:
            self._count("rate_limited", candidates[0], reason,
                        f"{self.config.evictions_per_window} evictions in the last {window:g} s")
            raise EvictionRefused(f"at most {self.config.evictions_per_window} evictions per {window:g} s "
                                  "([kubernetes] evictions_per_window)")
        refusals = []
        for i, target in enumerate(candidates):
            if i and self._terminating(target.uid):  # the watch saw it deleting meanwhile
                continue
            path = f"/api/v1/namespaces/{quote(target.namespace, safe='')}/pods/{quote(target.name, safe='')}/eviction"
            body = {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": target.name, "namespace": target.namespace},
                    "deleteOptions": {"preconditions": {"uid": target.uid}} if target.uid else {}}
            try:
                await self.client.create(path, body)
            except ApiError as exc:
                if exc.status == 429:
                    log.warning("eviction_refused", pod=f"{target.namespace}/{target.name}",
                                detail="a PodDisruptionBudget refuses it; trying the next candidate", error=exc.message)
                    self._count("refused", target, reason, exc.message)
                    refusals.append(f"{target.namespace}/{target.name}: {exc.message or exc.reason}")
                    continue
                if exc.status in (404, 409):  # gone, or a recreated pod of the same name
                    self._count("gone", target, reason, str(exc))
                    return "gone", target
                self._count("failed", target, reason, str(exc))
                raise
            self._evictions.append(self._clock())
            self._evicted[target.uid] = self._clock()
            self._count("evicted", target, reason)
            log.warning("pod_evicted", pod=f"{target.namespace}/{target.name}", reason=reason,
                        detail="through the Eviction API")
            return "evicted", target
        raise EvictionRefused("refused by PodDisruptionBudgets: " + "; ".join(refusals))

    # ---- NodeMetric ----------------------------------------------------------------------------

    async def report_once(self) -> int:
        """Create this node's NodeMetric if missing, put its status; returns the interval to wait."""
        path = f"{NODEMETRICS}/{quote(self.node_name, safe='')}"
        try:
            obj = await self.client.get(path)
        except ApiError as exc:
            if exc.status != 404:
                raise
            obj = await self.client.create(NODEMETRICS, new_node_metric(self.node_name))
        request = metric_request(obj, self.config.node_metric_interval_s)
        interval = int(request.interval_s)
        status = await asyncio.to_thread(self._node_metric_status, request)
        if status is None:
            self.node_metric = {**self.node_metric, "state": "waiting for the first measurements"}
            return min(interval, 10)
        obj["status"] = status
        await self.client.replace(path + "/status", obj)
        self.node_metric = {"state": "reported", "at": time.time(), "interval_s": interval,
                            "pods": len(status.get("podsMetric", [])), "node_usage": status["nodeMetric"]["nodeUsage"]}
        return interval

    async def _report_loop(self, stop: asyncio.Event) -> None:
        await repeat_with_backoff(self.report_once, stop, event="node_metric_report",
                                  on_error=self._report_failed, backoff_max_s=self.config.backoff_max_s)

    def _report_failed(self, error: str) -> None:
        self.node_metric = {**self.node_metric, "last_error": error, "last_error_at": time.time()}

    # ---- status --------------------------------------------------------------------------------

    def reachable(self) -> tuple[bool, str]:
        """Whether the API server answered last; with the last error when not."""
        watches = [w for w, on in ((self.nodeslo_watch, self.config.nodeslo), (self.pod_watch, self.config.pod_facts))
                   if on]
        down = [w for w in watches if not w.health.connected]
        if not down:
            return True, "ok"
        return False, "; ".join(f"{w.name}: {w.health.last_error or 'not connected yet'}" for w in down)

    def status(self) -> dict[str, Any]:
        ok, detail = self.reachable()
        return {
            "node_name": self.node_name,
            "server": self.client.credentials.server,
            "identity": self.client.credentials.source,
            "api_server": "ok" if ok else f"unreachable: {detail} (last good values kept)",
            "nodeslo": self.nodeslo_status,
            "watches": {"nodeslo": self.nodeslo_watch.health.to_dict(), "pods": self.pod_watch.health.to_dict(),
                        "node": self.node_watch.health.to_dict()},
            "node_reservation": {"annotation": self.reservation.annotation, "values": dict(self.reservation.values),
                                 "problems": list(self.reservation.problems)},
            "pod_facts": {"pods": len(self.facts), "problems": list(self.fact_problems)},
            "evictions": {"counts": dict(self.eviction_counts), "recent": list(self.recent_evictions),
                          "per_window": self.config.evictions_per_window, "window_s": self.config.eviction_window_s},
            "node_metric": self.node_metric,
            "node_resource_topology": self.topology.status,
        }


_MAX_APPLY_ROUNDS = 8  # each round leaves out what the last one refused


def _drop_key(values: dict[str, Any], key: str) -> None:
    """Remove a dotted key ("qos.LSR.memory_high_percent") from the nested table."""
    *tables, last = key.split(".")
    table: Any = values
    for part in tables:
        table = table.get(part) if isinstance(table, dict) else None
    if isinstance(table, dict):
        table.pop(last, None)


def _name_spec_field(error: str, mapping: NodeSloMapping) -> str:
    """"strategy.x.y: msg" -> "spec.<field> (strategy.x.y): msg" where the key came from the NodeSLO."""
    key, sep, message = error.partition(": ")
    source = mapping.fields.get(key)
    if source == RESERVATION_SOURCE:
        return f"{source} ({key}): {message}"
    return f"spec.{source} ({key}): {message}" if sep and source else error
