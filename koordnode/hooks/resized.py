"""kubelet's resources of containers resized in place, kept across a koordnode restart.

At CreateContainer kubelet's resources travel in a container annotation, which the runtime
keeps. An in-place resize (UpdateContainerResources) cannot change that annotation, and the
runtime reports only the values koordnode sent on; so the resized kubelet values are written
to a small JSON file in koordnode's runtime directory (beside the admin socket: it lives as
long as the containers do, and a reboot removes both). A restarted koordnode plans those
containers from it instead of from the stale annotation.

Failures to read or write the file are logged and never fail a CRI call: the worst case is
the annotation's (pre-resize) values after a restart, which the next resize corrects.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

import structlog

from koordnode.policy.class_inputs import ContainerResources

log = structlog.get_logger("koordnode.resized")

MAX_ENTRIES = 20000  # far above any node's container count; bounds a hostile or stale file
MAX_FILE_BYTES = 8 << 20
_INT_FIELDS = ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes", "oom_score_adj",
               "memory_swap_limit_in_bytes")
_STR_FIELDS = ("cpuset_cpus", "cpuset_mems")


def _decode(raw: object) -> ContainerResources | None:
    if not isinstance(raw, dict):
        return None
    values: dict[str, Any] = {}
    for name in _INT_FIELDS:
        value = raw.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        values[name] = value
    for name in _STR_FIELDS:
        value = raw.get(name, "")
        if not isinstance(value, str) or len(value) > 4096:
            return None
        values[name] = value
    unified = raw.get("unified", {})
    if not isinstance(unified, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in unified.items()):
        return None
    return ContainerResources(**values, unified=dict(unified))


class ResizedResources:
    """container id -> kubelet's resources after its latest in-place resize (file-backed)."""

    def __init__(self, path: Path | str | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._entries: dict[str, ContainerResources] = self._load()

    def _load(self) -> dict[str, ContainerResources]:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            if self.path.stat().st_size > MAX_FILE_BYTES:
                raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
            data = json.loads(self.path.read_text())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as err:
            log.warning("resized_resources_file_ignored", path=str(self.path), error=str(err))
            return {}
        entries = {}
        for cid, raw in list(data.items())[:MAX_ENTRIES]:
            decoded = _decode(raw)
            if isinstance(cid, str) and decoded is not None:
                entries[cid] = decoded
        return entries

    def get(self, container_id: str) -> ContainerResources | None:
        with self._lock:
            return self._entries.get(container_id)

    def put(self, container_id: str, resources: ContainerResources) -> None:
        with self._lock:
            if container_id not in self._entries and len(self._entries) >= MAX_ENTRIES:
                return
            self._entries[container_id] = resources
            self._save()

    def drop(self, container_id: str) -> None:
        with self._lock:
            if self._entries.pop(container_id, None) is not None:
                self._save()

    def keep_only(self, container_ids: set[str]) -> None:
        """Forget containers that no longer exist (after the state was rebuilt)."""
        with self._lock:
            gone = [cid for cid in self._entries if cid not in container_ids]
            for cid in gone:
                del self._entries[cid]
            if gone:
                self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        data = {cid: {**asdict(res), "unified": dict(res.unified)} for cid, res in self._entries.items()}
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w") as handle:
                json.dump(data, handle)
            os.replace(tmp, self.path)
        except OSError as err:
            log.warning("resized_resources_not_saved", path=str(self.path), error=str(err))
