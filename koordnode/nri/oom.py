"""oom_score_adj where NRI cannot carry it: written to the container's processes instead.

Runtimes whose NRI cannot adjust oom_score_adj (containerd 1.7) run a new container with
kubelet's value, and NRI updates never carry it for containers that already run.
"""

from __future__ import annotations

import asyncio

import structlog

from koordnode.executor.process import oom_score_adj_floor, oom_score_adj_wanted, set_oom_score_adj
from koordnode.hooks.qos_engine import QoSEngine
from koordnode.model.state import NodeState
from koordnode.nri import api_pb2 as nri

log = structlog.get_logger("koordnode.nri")


class OomScoreAdj:
    def __init__(self, state: NodeState, engine: QoSEngine | None, procfs_root: str) -> None:
        self.state = state
        self.engine = engine
        self.procfs_root = procfs_root
        self.dry_run = False  # set with the plugin's
        self.floor = oom_score_adj_floor()
        if self.floor is not None:
            log.warning("oom_score_adj_clamped",
                        detail="no CAP_SYS_RESOURCE: oom_score_adj below koordnode's own is clamped to it, "
                               "as containerd's restrict_oom_score_adj does", floor=self.floor)

    async def after_start(self, container: nri.Container) -> None:
        """Runtimes whose NRI cannot adjust oom_score_adj (containerd 1.7) run the container with
        kubelet's: give its process the class value after start instead."""
        record = self.state.containers.get(container.id)
        if record is None or not container.pid or not container.linux.HasField("oom_score_adj"):
            return
        want = self.wanted(record.resources.oom_score_adj, container.linux.oom_score_adj.value)
        if want is not None:
            await asyncio.to_thread(self.write, container.id, [container.pid], want,
                                    "class value; the runtime did not apply the NRI adjustment")

    def wanted(self, want: int, have: int) -> int | None:
        """The value to write over `have`, or None (already right, or not lowerable here)."""
        want = oom_score_adj_wanted(want, have, self.floor)
        return None if want == have else want

    def write(self, container_id: str, pids: list[int], value: int, reason: str) -> None:
        if self.dry_run:
            log.info("dry_run_would_set_oom_score_adj", container_id=container_id, pids=pids, value=value,
                     reason=reason)
            return
        for pid in pids:
            error = set_oom_score_adj(self.procfs_root, pid, value, reason)
            if error is not None:
                log.warning("oom_score_adj_not_set", container_id=container_id, pid=pid, error=error)

    def fix_after_sync(self, fixes: list[tuple[str, str, int, int]]) -> None:
        """Engine thread: running containers whose processes run with another oom_score_adj than
        their class's (created while koordnode was away): NRI updates cannot carry it."""
        if self.engine is None:
            return
        for cid, cgroup, pid, value in fixes:
            pids = None
            try:
                pids = self.engine.executor.read_pids(cgroup)
            except Exception:  # the cgroup may be gone; the init process is enough then
                pids = None
            self.write(cid, pids or [pid], value, "class value for a container synchronized from the runtime")
