"""Rebuild NodeState from the runtime, so a koordnode restart loses nothing it still knows.

Labels, annotations and metadata come from the CRI status calls. What CRI status does not carry
(the sandbox's cgroup parent, the resources a container was created with) comes from the
verbose `info` document containerd attaches: its "config" is the CRI config it was created from,
and its "runtimeSpec" the OCI spec it runs with.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from koordnode.cri import api_pb2 as pb
from koordnode.cri.client import CriClient, CriError
from koordnode.cri.methods import RUNTIME_SERVICE as RT
from koordnode.model.network import pod_network_from_status
from koordnode.model.state import (
    CONTAINER_CREATED,
    CONTAINER_EXITED,
    CONTAINER_RUNNING,
    CONTAINER_UNKNOWN,
    POD_NOTREADY,
    POD_READY,
    ContainerRecord,
    NodeState,
    PodRecord,
)

log = structlog.get_logger("koordnode.recovery")

_CONTAINER_STATES = {
    pb.CONTAINER_CREATED: CONTAINER_CREATED,
    pb.CONTAINER_RUNNING: CONTAINER_RUNNING,
    pb.CONTAINER_EXITED: CONTAINER_EXITED,
}

# Field names of LinuxContainerResources as containerd's JSON spells them (Go struct tags,
# snake_case) and as the OCI runtime spec spells them.
_RESOURCE_FIELDS = ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes",
                    "oom_score_adj", "cpuset_cpus", "cpuset_mems", "memory_swap_limit_in_bytes")


def _info_doc(info: Any) -> dict[str, Any]:
    raw = info.get("info") if info else None
    if not raw:
        return {}
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _get(d: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def resources_from_info(doc: dict[str, Any]) -> pb.LinuxContainerResources:
    """The container's LinuxContainerResources from containerd's verbose info."""
    res = pb.LinuxContainerResources()
    cfg_res = _get(doc, "config", "linux", "resources")
    if isinstance(cfg_res, dict):
        for field in _RESOURCE_FIELDS:
            value = cfg_res.get(field, cfg_res.get(_camel(field)))
            if value in (None, ""):
                continue
            try:
                setattr(res, field, value if isinstance(getattr(res, field), str) else int(value))
            except (TypeError, ValueError):
                continue
        unified = cfg_res.get("unified")
        if isinstance(unified, dict):
            res.unified.update({str(k): str(v) for k, v in unified.items()})
        return res
    # Fall back to the OCI spec the container runs with.
    spec = _get(doc, "runtimeSpec", "linux", "resources") or {}
    cpu = spec.get("cpu") or {}
    mem = spec.get("memory") or {}
    if "shares" in cpu:
        res.cpu_shares = int(cpu["shares"])
    if "quota" in cpu:
        res.cpu_quota = int(cpu["quota"])
    if "period" in cpu:
        res.cpu_period = int(cpu["period"])
    if cpu.get("cpus"):
        res.cpuset_cpus = str(cpu["cpus"])
    if cpu.get("mems"):
        res.cpuset_mems = str(cpu["mems"])
    if "limit" in mem:
        res.memory_limit_in_bytes = int(mem["limit"])
    oom = _get(doc, "runtimeSpec", "process", "oomScoreAdj")
    if isinstance(oom, int):
        res.oom_score_adj = oom
    return res


def cgroup_parent_from_info(doc: dict[str, Any]) -> str:
    parent = _get(doc, "config", "linux", "cgroup_parent")
    if isinstance(parent, str) and parent:
        return parent
    # runtimeSpec.linux.cgroupsPath is "<parent>/<id>" (cgroupfs) or "slice:prefix:id" (systemd).
    path = _get(doc, "runtimeSpec", "linux", "cgroupsPath")
    if isinstance(path, str) and path:
        if ":" in path:
            return path.split(":", 1)[0]
        return path.rsplit("/", 1)[0]
    return ""


async def rebuild(state: NodeState, cri: CriClient, *, timeout_s: float = 10.0) -> None:
    """One rebuild pass; raises CriError when the runtime cannot be asked."""
    sandboxes = await cri.call(RT + "ListPodSandbox", pb.ListPodSandboxRequest(),
                               pb.ListPodSandboxResponse, timeout_s)
    pods: list[PodRecord] = []
    for sb in sandboxes.items:
        try:
            st = await cri.call(RT + "PodSandboxStatus",
                                pb.PodSandboxStatusRequest(pod_sandbox_id=sb.id, verbose=True),
                                pb.PodSandboxStatusResponse, timeout_s)
        except CriError as exc:
            if exc.code_name == "NOT_FOUND":
                continue  # removed while we were listing
            raise
        doc = _info_doc(st.info)
        ips, host_network = pod_network_from_status(st.status)
        pods.append(
            PodRecord(
                sandbox_id=sb.id,
                name=sb.metadata.name,
                namespace=sb.metadata.namespace,
                uid=sb.metadata.uid,
                labels=dict(sb.labels),
                annotations=dict(sb.annotations),
                cgroup_parent=cgroup_parent_from_info(doc),
                state=POD_READY if sb.state == pb.SANDBOX_READY else POD_NOTREADY,
                runtime_handler=sb.runtime_handler,
                source="recovered",
                ips=ips,
                host_network=host_network,
            )
        )
    listed = await cri.call(RT + "ListContainers", pb.ListContainersRequest(),
                            pb.ListContainersResponse, timeout_s)
    containers: list[ContainerRecord] = []
    for c in listed.containers:
        try:
            cst = await cri.call(RT + "ContainerStatus",
                                pb.ContainerStatusRequest(container_id=c.id, verbose=True),
                                pb.ContainerStatusResponse, timeout_s)
        except CriError as exc:
            if exc.code_name == "NOT_FOUND":
                continue
            raise
        doc = _info_doc(cst.info)
        containers.append(
            ContainerRecord(
                container_id=c.id,
                sandbox_id=c.pod_sandbox_id,
                name=c.metadata.name,
                labels=dict(c.labels),
                annotations=dict(c.annotations),
                resources=resources_from_info(doc),
                image=c.image.image,
                state=_CONTAINER_STATES.get(c.state, CONTAINER_UNKNOWN),
                source="recovered",
            )
        )
    state.replace_all(pods, containers)
    log.info("state_rebuilt_from_runtime", pods=len(pods), containers=len(containers))


async def rebuild_until_done(state: NodeState, backend: str, *, max_backoff_s: float = 10.0,
                             on_done: Callable[[], Awaitable[None]] | None = None) -> None:
    """Keep trying until the runtime answers (it may be down when koordnode starts)."""
    backoff = 0.5
    cri = CriClient(backend)
    try:
        while True:
            try:
                await rebuild(state, cri)
                if on_done is not None:
                    await on_done()
                return
            except CriError as exc:
                state.rebuild_error = f"{exc.code_name}: {exc.details}"
                log.warning("state_rebuild_failed", detail="will retry",
                            backend=backend, error=state.rebuild_error, retry_in_s=backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, max_backoff_s)
    finally:
        await cri.close()
