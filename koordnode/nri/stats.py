"""What `koordnode status` shows of NRI mode: the connection, events, answers and updates."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any


class NriStats:
    def __init__(self) -> None:
        self.connected = False
        self.connected_since: float | None = None
        self.registrations = 0
        self.synchronizations = 0
        self.last_error: str | None = None
        self.runtime = ""
        self.events: Counter[str] = Counter()
        self.answer_seconds: defaultdict[str, float] = defaultdict(float)  # total time to answer, per event
        self.answer_max_seconds: dict[str, float] = {}
        self.late_answers: Counter[str] = Counter()
        self.updates_answered = 0  # in CreateContainer/StopContainer/Synchronize answers
        self.updates_sent = 0  # unsolicited (UpdateContainers)
        self.updates_failed = 0
        self.dry_run_withheld: Counter[str] = Counter()  # answers with changes a dry run did not send

    def as_dict(self) -> dict[str, Any]:
        return {
            "connected": self.connected,
            "connected_since": self.connected_since,
            "registrations": self.registrations,
            "synchronizations": self.synchronizations,
            "runtime": self.runtime,
            "last_error": self.last_error,
            "events": dict(self.events),
            "answer_ms": {name: {"mean": round(total * 1000 / max(self.events[name], 1), 2),
                                 "max": round(self.answer_max_seconds.get(name, 0.0) * 1000, 2)}
                          for name, total in self.answer_seconds.items()},
            "answered_without_changes_after_deadline": dict(self.late_answers),
            "container_updates_in_answers": self.updates_answered,
            "container_updates_sent": self.updates_sent,
            "container_updates_failed": self.updates_failed,
            "dry_run_answers_without_changes": dict(self.dry_run_withheld),
        }
