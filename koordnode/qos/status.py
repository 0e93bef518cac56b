"""What `koordnode status` shows of the QoS manager: every strategy's last decision and write,
write and eviction counts, tick counters. Written by the tick thread and the event loop,
read by the loop at any time: every access takes one lock.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from typing import Any

from koordnode.executor.write_result import WriteResult, WriteStatus
from koordnode.policy.plan import CgroupWrite
from koordnode.policy.strategies.base import Strategy
from koordnode.policy.strategies.common import Explanation

RECENT_EVICTIONS = 20


class StatusBook:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._explanations: dict[str, dict[str, Any]] = {}
        self._last_writes: dict[str, dict[str, Any]] = {}
        self._write_counts: dict[str, Counter[str]] = {}
        self._evictions: dict[str, deque[dict[str, Any]]] = {}
        self._eviction_counts: dict[str, Counter[str]] = {}
        self._eviction_failures: Counter[str] = Counter()
        self.ticks = 0
        self._woken_ticks = 0
        self._usage_ticks = 0
        self._skipped_wakes = 0
        self._tick_errors = 0
        self._last_error: str | None = None
        self._last_tick: dict[str, Any] | None = None
        self._tick_seconds_total = 0.0

    # ------------------------------------------------------------------ recording

    def explain(self, name: str, explanation: Explanation, at: float, *, only_if_new: bool = False) -> None:
        """Keep a strategy's decision; `only_if_new`: only when it has none yet."""
        with self._lock:
            if only_if_new and name in self._explanations:
                return
            self._explanations[name] = {"at": at, **explanation.as_dict()}

    def record_writes(self, owners: list[str], results: list[WriteResult], at: float) -> None:
        with self._lock:
            for owner, result in zip(owners, results, strict=True):
                self._write_counts.setdefault(owner, Counter())[result.status.value] += 1
                if result.status in (WriteStatus.WRITTEN, WriteStatus.FAILED, WriteStatus.WOULD_WRITE):
                    write = result.write
                    target = {"cgroup": write.cgroup, "resource": write.resource} if isinstance(write, CgroupWrite) \
                        else {"sysctl": write.name}
                    self._last_writes[owner] = {
                        **target, "value": write.value, "old": result.old, "status": result.status.value,
                        "detail": result.detail or None, "at": at, "reason": write.reason,
                    }

    def record_eviction(self, owner: str, cause: str, record: dict[str, Any]) -> None:
        with self._lock:
            self._eviction_counts.setdefault(owner, Counter())[cause] += 1
            if record["ok"] is False:
                self._eviction_failures[owner] += 1
            self._evictions.setdefault(owner, deque(maxlen=RECENT_EVICTIONS)).append(record)

    def record_tick(self, woken_by: str | None, duration_s: float, last: dict[str, Any]) -> None:
        with self._lock:
            self.ticks += 1
            self._woken_ticks += woken_by is not None and woken_by.startswith("pressure:")
            self._usage_ticks += woken_by is not None and woken_by.startswith("usage:")
            self._tick_seconds_total += duration_s
            self._last_tick = last

    def skipped_wake(self) -> None:
        with self._lock:
            self._skipped_wakes += 1

    def tick_failed(self, err: Exception) -> None:
        with self._lock:
            self._tick_errors += 1
            self._last_error = f"{type(err).__name__}: {err}"

    # ------------------------------------------------------------------ reading

    def strategies(self, registry: Iterable[Strategy], configs: Mapping[str, Any],
                   states: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            for strategy in registry:
                name, cfg = strategy.name, configs[strategy.name]
                entry = {
                    "enabled": cfg.enable,
                    **strategy.status(cfg, states.get(name)),
                    "decision": self._explanations.get(name),
                    "last_write": self._last_writes.get(name),
                    "writes": dict(self._write_counts.get(name, {})),
                }
                if strategy.evicts:
                    counts = self._eviction_counts.get(name, Counter())
                    entry["evictions"] = {
                        "total": sum(counts.values()),
                        "by_cause": dict(counts),
                        "failed": self._eviction_failures[name],
                        "recent": list(self._evictions.get(name, ())),
                    }
                out[name] = entry
        return out

    def ticks_status(self, period_ms: int) -> dict[str, Any]:
        with self._lock:
            return {
                "period_ms": period_ms,
                "count": self.ticks,
                "woken_by_pressure": self._woken_ticks,
                "woken_by_usage": self._usage_ticks,
                "pressure_wakes_skipped": self._skipped_wakes,
                "errors": self._tick_errors,
                "last_error": self._last_error,
                "last": self._last_tick,
                "avg_duration_ms": round(1000 * self._tick_seconds_total / self.ticks, 3) if self.ticks else None,
            }
