"""The QoS engine's part of `koordnode status`: what it decided and applied per pod and container
(records), published as an immutable snapshot at the end of each locked section, so the event
loop reads it without ever waiting for the engine's lock.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from koordnode.executor.write_result import WriteResult, WriteStatus
from koordnode.executor.paths import UnsafePathError
from koordnode.executor.process import ProcessResult
from koordnode.model.kernel import shares_to_weight


def oom_lines(results: Iterable[tuple[str, ProcessResult]]) -> dict[str, tuple[str, ...]]:
    """Status lines per container for its processes' oom_score_adj, one per outcome."""
    outcomes: dict[str, dict[str, list[int]]] = {}
    values: dict[str, int] = {}
    for cid, r in results:
        if r.status is WriteStatus.MISSING:
            continue  # exited meanwhile
        label = "restored" if r.overwritten else r.status.value
        if r.status is WriteStatus.FAILED:
            label = f"failed: {r.detail}"
        outcomes.setdefault(cid, {}).setdefault(label, []).append(r.write.pid)
        values[cid] = r.write.value
    return {cid: tuple(f"oom_score_adj={values[cid]} on {len(pids)} process(es)"
                       + (f" ({label})" if not label.startswith("failed") else
                          f", pid {','.join(map(str, pids[:5]))}: {label}")
                       for label, pids in sorted(by_label.items()))
            for cid, by_label in outcomes.items()}


def summarise(results: Iterable[WriteResult]) -> tuple[list[str], list[str]]:
    applied, skipped = [], []
    for r in results:
        w = r.cgroup_write
        where = f"{w.resource}={w.value} on {w.cgroup}"
        if r.ok:
            applied.append(f"{where} ({r.status.value}{', ' + r.detail if r.detail else ''})")
        else:
            skipped.append(f"{where}: {r.status.value}: {r.detail}")
    return applied, skipped


@dataclasses.dataclass(frozen=True)
class Record:
    """What koordnode decided and applied for one pod or container, for `koordnode status`.

    Frozen: a published status snapshot holds these while workers make new ones."""

    qos_class: str = ""
    why: str = ""
    applied: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    verified_at: float | None = None
    # A pod's cpu.shares as koordnode keeps it (its containers' class weights summed; BE: BE's);
    # None: kubelet's (no running container yet, or an idle BE pod).
    pod_cpu_shares: int | None = None
    # A pod's core-scheduling state ("" when its class does not ask for it).
    core_sched: str = ""
    # The pod's threads' scheduler slice (koordnode/hooks/sched_slice.py): "" when its class asks for none.
    sched_slice: str = ""
    # A container's values kept on its processes (oom_score_adj), one line per outcome.
    processes: tuple[str, ...] = ()

    def with_results(self, results: list[WriteResult], notes: Iterable[str] = ()) -> Record:
        applied, skipped = summarise(results)
        return dataclasses.replace(self, applied=tuple(applied), skipped=tuple(skipped),
                                   notes=tuple(dict.fromkeys(notes)), verified_at=time.time())

    def checked_at(self, when: float) -> Record:
        """The same record, verified again at `when` (the reconcile pass's cheap copy)."""
        record = object.__new__(Record)
        record.__dict__.update(self.__dict__)
        record.__dict__["verified_at"] = when
        return record

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PublishedStatus:
    """The engine's part of `koordnode status`, as of the end of its last locked section."""

    engine: Mapping[str, Any]
    pod_records: Mapping[str, Record]
    container_records: Mapping[str, Record]


class EngineStatus:
    """The records (changed under the engine's lock) and their last published snapshot (read
    without it)."""

    def __init__(self) -> None:
        self.pod_records: dict[str, Record] = {}
        self.container_records: dict[str, Record] = {}
        self.published = PublishedStatus({}, {}, {})

    def publish(self, engine: Mapping[str, Any]) -> None:
        """Called at the end of each locked section: the status readers' snapshot."""
        self.published = PublishedStatus(engine=engine, pod_records=dict(self.pod_records),
                                         container_records=dict(self.container_records))

    def republish_cpus(self, cpus: Mapping[str, Any]) -> None:
        """The CPU part again, outside the lock (a reservation settled on the loop). A worker's
        publish racing with it can only show a reservation a moment longer; the next publish
        corrects it."""
        published = self.published
        self.published = dataclasses.replace(published, engine={**published.engine, "cpus": cpus})

    def forget_container(self, container_id: str) -> None:
        self.container_records.pop(container_id, None)

    def keep_pods(self, live: Mapping[str, Any]) -> None:
        for sid in [sid for sid in self.pod_records if sid not in live]:
            del self.pod_records[sid]

    def note_pool_line(self, result: WriteResult) -> None:
        """Keep a container's status line for its cpuset current after a pool change."""
        cid = result.cgroup_write.cgroup.rsplit("/", 1)[-1].removeprefix("cri-containerd-").removesuffix(".scope")
        record = self.container_records.get(cid)
        if record is None:
            return
        applied, skipped = summarise([result])
        self.container_records[cid] = dataclasses.replace(
            record,
            applied=tuple(a for a in record.applied if not a.startswith("cpuset.cpus=")) + tuple(applied),
            skipped=tuple(s for s in record.skipped if not s.startswith("cpuset.cpus=")) + tuple(skipped),
            verified_at=time.time())

    def decorate(self, snapshot: dict[str, Any], pod_cgroup: Callable[[str], str], cgroup_version: str) -> dict[str, Any]:
        """Add what was applied to the pods of a NodeState snapshot (lock-free). `pod_cgroup`:
        the cgroup the engine writes for a cgroup parent (`koordnode top` reads it there)."""
        published = self.published
        for pod in snapshot.get("pods", []):
            try:
                pod["cgroup"] = pod_cgroup(pod.get("cgroup_parent") or "")
            except UnsafePathError:
                pod["cgroup"] = None
            rec = published.pod_records.get(pod["sandbox_id"])
            if rec is not None:
                pod.update(qos_class=rec.qos_class, qos_reason=rec.why, applied=list(rec.applied),
                           skipped=list(rec.skipped), notes=list(rec.notes), verified_at=rec.verified_at,
                           cpu_weight=_weight_status(rec.pod_cpu_shares, cgroup_version))
                if rec.core_sched:
                    pod["core_sched"] = rec.core_sched
                if rec.sched_slice:
                    pod["sched_slice"] = rec.sched_slice
            for c in pod.get("containers", []):
                crec = published.container_records.get(c["container_id"])
                if crec is not None:
                    c.update(applied=list(crec.applied), skipped=list(crec.skipped), notes=list(crec.notes),
                             processes=list(crec.processes), verified_at=crec.verified_at)
        return snapshot


def _weight_status(shares: int | None, cgroup_version: str) -> dict[str, int] | None:
    """The pod's CPU weight as status shows it (v2: also the cpu.weight written)."""
    if shares is None:
        return None
    if cgroup_version == "v2":
        return {"cpu.shares": shares, "cpu.weight": shares_to_weight(shares)}
    return {"cpu.shares": shares}
