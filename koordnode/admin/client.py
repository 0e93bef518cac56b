"""`koordnode status`: ask the running daemon over its admin socket and print the answer."""

from __future__ import annotations

import json
import socket
import sys
from typing import Any


def fetch_status(path: str, timeout_s: float = 5.0) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(path)
        sock.sendall(b"status\n")
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    reply = json.loads(b"".join(chunks))
    if not reply.get("ok"):
        raise RuntimeError(reply.get("error", "unknown error"))
    return reply["status"]


_RECORD_LABELS = (("applied", "applied"), ("skipped", "skipped"), ("processes", "process"), ("notes", "note"))


def _mib(value: Any) -> str:
    return f"{value / (1 << 20):.0f} MiB" if isinstance(value, int) else "?"


def render_status(status: dict[str, Any]) -> str:
    config = status.get("config", {})
    reload = config.get("last_reload", {})
    lines = [
        f"koordnode {status.get('version')}  up {status.get('uptime_s')} s",
        f"listen  {status.get('listen')}",
        f"backend {status.get('backend')}  ({status.get('backend_health', '?')})",
        f"config  {config.get('source', '?')}  last reload: {reload.get('result', '?')}",
    ]
    for error in reload.get("errors", []) or []:
        lines.append(f"  reload error: {error}")
    keys = config.get("keys") or {}
    # Keys not at their default, with where the value came from (--json lists every key).
    for key, entry in sorted(keys.items()):
        if isinstance(entry, dict) and entry.get("source") in ("toml", "nodeslo") and not key.startswith(
                ("proxy.", "admin.", "metrics.", "log.", "qos_manager.kubepods_cgroup", "kubernetes.")):
            lines.append(f"  {key} = {json.dumps(entry.get('value'))}  source: {entry['source']}")
    kube = status.get("kubernetes") or {}
    if kube.get("node_name"):
        slo = kube.get("nodeslo") or {}
        lines.append(f"cluster {kube.get('server')} as node {kube['node_name']}: api server {kube.get('api_server')}")
        lines.append(f"  nodeslo {slo.get('state', '?')} (version {slo.get('resource_version')}); "
                     f"refused {slo.get('refused_total', 0)}")
        for error in (slo.get("last_refused") or {}).get("errors", [])[:5]:
            lines.append(f"  nodeslo refused: {error}")
        evictions = (kube.get("evictions") or {}).get("counts") or {}
        lines.append(f"  pod facts {(kube.get('pod_facts') or {}).get('pods', 0)} pods; evictions "
                     + (", ".join(f"{k} {v}" for k, v in sorted(evictions.items())) or "none")
                     + f"; node metric {(kube.get('node_metric') or {}).get('state', '?')}")
    elif kube.get("error"):
        lines.append(f"cluster {kube['error']}")
    batch = status.get("batch_allocatable") or {}
    if "cpu_cores" in batch:
        lines.append(f"batch allocatable  cpu {batch['cpu_cores']} cores, memory {batch['memory_bytes']} bytes")
    nri = status.get("nri")
    if nri:
        lines = [line for line in lines if not line.startswith("listen  ")]  # no CRI socket served
        link = "connected" if nri.get("connected") else f"not connected ({nri.get('last_error') or 'waiting'})"
        lines.append(f"mode    nri: plugin {nri.get('plugin_name')}/{nri.get('plugin_index')} on {nri.get('socket')}, "
                     f"{link}; runtime {nri.get('runtime') or '?'}; registrations {nri.get('registrations', 0)}, "
                     f"synchronizations {nri.get('synchronizations', 0)}")
        for event, count in sorted((nri.get("answered_without_changes_after_deadline") or {}).items()):
            lines.append(f"  late answer (no changes) {event}: {count}")
    dry_run = status.get("dry_run") or {}
    if dry_run.get("enabled"):
        lines.append("DRY RUN  nothing is written to the kernel; CRI requests reach the runtime "
                     "unchanged; 'would_write' marks what a real run would write")
        lines.append(f"  requests the hooks would have changed: "
                     f"{dry_run.get('requests_forwarded_unchanged', 0)}")
        for method, changes in sorted((dry_run.get("last_request_changes") or {}).items()):
            lines.append(f"  last {method} would change: " + "; ".join(changes[:8]))
    manager = status.get("qos_manager") or {}
    if manager:
        lines.append(f"qos manager  {manager.get('trigger_mode', '?')}")
        for name, strategy in sorted((manager.get("strategies") or {}).items()):
            explanation = strategy.get("decision") or {}
            decision = explanation.get("decision", "") if isinstance(explanation, dict) else ""
            reason = explanation.get("reason", "") if isinstance(explanation, dict) else ""
            enabled = "on" if strategy.get("enabled", True) else "off"
            lines.append(f"  {name} [{enabled}] {decision}" + (f": {reason}" if reason else ""))
    core_sched = (status.get("qos") or {}).get("core_sched") or {}
    if core_sched.get("classes") or core_sched.get("expellers"):
        uses = ([f"{', '.join(core_sched['classes'])} a cookie per pod"] if core_sched.get("classes") else []) + (
            [f"BE kept off the cores of {', '.join(core_sched['expellers'])}"] if core_sched.get("expellers") else [])
        lines.append(f"core sched  {'; '.join(uses)}: {core_sched.get('state', '?')}")
    tiers = (status.get("qos") or {}).get("memory_tiers") or {}
    if tiers:
        lines.append("memory tiers  (kubelet's cgroups above the pods: a pod's protection counts only up to theirs)")
        for cgroup, files in tiers.items():
            for entry in files.values():
                lines.append(f"  {cgroup}  [{entry.get('kept_by', '?')}] {entry.get('why', '')}")
    proxy = status.get("proxy", {})
    lines.append(
        f"proxy   {proxy.get('connections_open', 0)} connections open, "
        f"{proxy.get('intercepted_calls', 0)} intercepted calls"
    )
    for name, count in sorted(proxy.get("hook_failures", {}).items()):
        lines.append(f"  hook failure {name}: {count}")
    if status.get("rebuild_error"):
        lines.append(f"state   not rebuilt yet: {status['rebuild_error']}")
    for extra in status.get("sections", []):
        lines.append(extra)
    pods = status.get("pods", [])
    lines.append(f"pods    {len(pods)}")
    for pod in pods:
        qos = pod.get("qos_class") or "-"
        lines.append(f"  {pod['namespace']}/{pod['name']}  {pod['state']}  qos={qos}  {pod['sandbox_id'][:13]}")
        if pod.get("qos_reason"):
            lines.append(f"    why: {pod['qos_reason']}")
        if "cpu_weight" in pod:
            weight = pod["cpu_weight"]
            lines.append("    weight: " + (", ".join(f"{k} {v}" for k, v in weight.items()) if weight
                                          else "kubelet's ([cgroup] pod_class_weight off, no running container yet, or an idle BE pod)"))
        if pod.get("core_sched"):
            lines.append(f"    core sched: {pod['core_sched']}")
        if pod.get("sched_slice"):
            lines.append(f"    sched slice: {pod['sched_slice']}")
        if "be_memory_bound" in pod:
            bound = pod["be_memory_bound"]
            lines.append("    BE memory bound: " + (
                f"memory.high / soft limit {_mib(bound['memory.high'])} of the BE budget "
                f"{_mib(bound['budget_bytes'])}" if bound
                else "none from the budget (the pod has a memory limit, or no decision since it started)"))
        for key, label in _RECORD_LABELS:
            for item in pod.get(key, []) or []:
                lines.append(f"    {label}: {item}")
        for c in pod.get("containers", []):
            lines.append(f"    {c['name']}  {c['state']}  {c['container_id'][:13]}  {c.get('resources', {})}")
            for key, label in _RECORD_LABELS:
                for item in c.get(key, []) or []:
                    lines.append(f"      {label}: {item}")
    return "\n".join(lines)


def not_ready_because(status: dict[str, Any]) -> str | None:
    """Why the daemon cannot do its work yet (None: it can): in NRI mode, until the runtime has
    registered and synchronized it; in proxy mode, until the runtime answers and the pods are
    rebuilt from it. A readiness probe's answer (``koordnode status --ready``)."""
    if status.get("mode") == "nri":
        nri = status.get("nri") or {}
        if not nri.get("connected"):
            return f"not connected to the runtime's NRI socket {nri.get('socket')}: {nri.get('last_error') or 'connecting'}"
        if not nri.get("synchronizations"):
            return "connected to the runtime, not synchronized yet"
        return None
    health = str(status.get("backend_health") or "unknown")
    return None if health == "ok" else f"runtime {status.get('backend')}: {health}"


def status_command(config: Any, as_json: bool, ready: bool = False) -> int:
    return status_command_for(config.admin.socket, as_json, ready)


def status_command_for(path: str, as_json: bool, ready: bool = False) -> int:
    try:
        status = fetch_status(path)
    except FileNotFoundError:
        print(f"koordnode is not running (no admin socket at {path})", file=sys.stderr)
        return 1
    except PermissionError:
        print(f"permission denied on {path}: `koordnode status` must run as root", file=sys.stderr)
        return 1
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"cannot get status from {path}: {exc}", file=sys.stderr)
        return 1
    if ready:
        why = not_ready_because(status)
        print("ready" if why is None else f"not ready: {why}", file=sys.stdout if why is None else sys.stderr)
        return 0 if why is None else 1
    if as_json:
        print(json.dumps(status, indent=2, sort_keys=True, default=str))
    else:
        print(render_status(status))
    return 0
