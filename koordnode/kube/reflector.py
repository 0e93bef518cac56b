"""List, then watch from the list's resourceVersion; relist on 410 Gone; back off on failures.

A Reflector keeps one collection (e.g. the pods bound to this node) as a dict of objects keyed
by namespace/name and calls `on_change(store)` after every change it applied. Its `health`
says whether the API server answers, for status and doctor. It never raises out of `run`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from koordnode.kube.client import ApiError, Gone, KubeClient, Unreachable
from koordnode.kube.credentials import CredentialsError

__all__ = ["Backoff", "Health", "Reflector", "object_key", "repeat_with_backoff"]

log = structlog.get_logger("koordnode.kube")

# Objects per list page.
LIST_PAGE = 50
# A list+watch round shorter than this that brought no event counts as fruitless (backoff).
MIN_ROUND_S = 1.0


def object_key(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        return None
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if isinstance(namespace, str) and namespace else meta["name"]


class Backoff:
    """Exponential from `first` to `most`, with jitter (so many nodes do not retry in step)."""

    def __init__(self, first: float = 0.5, most: float = 60.0) -> None:
        self.first, self.most = first, most
        self.failures = 0

    def next_delay(self) -> float:
        delay = min(self.most, self.first * (2 ** min(self.failures, 30)))
        self.failures += 1
        return delay * random.uniform(0.8, 1.0)

    def reset(self) -> None:
        self.failures = 0


async def repeat_with_backoff(step: Callable[[], Awaitable[float]], stop: asyncio.Event, *, event: str,
                              on_error: Callable[[str], None], backoff_max_s: float) -> None:
    """Run `step` until `stop`, waiting the delay it returns; a failure is handed to `on_error`,
    logged as `<event>_failed` (the API's answer) or `<event>_error` (a bug), and retried after
    a growing backoff. For the periodic reports (NodeMetric, NodeResourceTopology)."""
    backoff = Backoff(most=backoff_max_s)
    while not stop.is_set():
        try:
            delay = await step()
            backoff.reset()
        except (ApiError, Unreachable, CredentialsError) as exc:
            on_error(str(exc))
            log.warning(f"{event}_failed", error=str(exc))
            delay = backoff.next_delay()
        except Exception as exc:
            on_error(repr(exc))
            log.exception(f"{event}_error")
            delay = backoff.next_delay()
        try:
            await asyncio.wait_for(stop.wait(), delay)
        except TimeoutError:
            pass


@dataclass
class Health:
    synced: bool = False  # a list succeeded and the store holds its objects
    connected: bool = False  # the last request or watch got an answer
    last_ok_at: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    relists: int = 0
    events: int = 0
    malformed: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"synced": self.synced, "connected": self.connected, "last_ok_at": self.last_ok_at,
                "last_error": self.last_error, "last_error_at": self.last_error_at, "relists": self.relists,
                "events": self.events, "malformed_objects": self.malformed, "errors": dict(self.errors)}


class Reflector:
    def __init__(self, client: KubeClient, path: str, *, field_selector: str | None = None,
                 on_change: Callable[[Mapping[str, Any]], None], name: str,
                 watch_timeout_s: int = 300, backoff_max_s: float = 60.0,
                 max_objects: int = 10000, transform: Callable[[dict[str, Any]], Any] | None = None) -> None:
        self.client = client
        self.path = path
        self.field_selector = field_selector
        self.on_change = on_change
        self.name = name
        self.watch_timeout_s = watch_timeout_s
        self.backoff = Backoff(most=backoff_max_s)
        self.max_objects = max_objects
        # What is kept of each object (the pod watch keeps PodFacts, not whole pods: bounded RSS).
        self.transform = transform or (lambda obj: obj)
        self.store: dict[str, Any] = {}
        self.resource_version: str | None = None
        self.health = Health()

    def _query(self) -> dict[str, str]:
        return {"fieldSelector": self.field_selector} if self.field_selector else {}

    def _ok(self) -> None:
        self.health.connected = True
        self.health.last_ok_at = time.time()

    def _failed(self, kind: str, error: Exception) -> None:
        self.health.connected = isinstance(error, ApiError)  # an error status is still an answer
        self.health.last_error = f"{kind}: {error}"
        self.health.last_error_at = time.time()
        name = type(error).__name__
        self.health.errors[name] = self.health.errors.get(name, 0) + 1

    def _notify(self) -> None:
        try:
            self.on_change(self.store)
        except Exception:  # a consumer's bug must not stop the watch
            log.exception("kube_watch_consumer_failed", watch=self.name)

    async def relist(self) -> None:
        """List in pages (a page's objects are parsed and reduced before the next is read: the
        memory a list costs is one page's, not the whole collection's)."""
        store: dict[str, Any] = {}
        query = {**self._query(), "limit": str(LIST_PAGE)}
        version: str | None = None
        while True:
            answer = await self.client.get(self.path, query)
            items = answer.get("items") if isinstance(answer, dict) else None
            meta = answer.get("metadata") if isinstance(answer, dict) else None
            if not isinstance(items, list) or not isinstance(meta, dict):
                raise Unreachable(f"list {self.path}: not a list object")
            for item in items:
                key = object_key(item) if isinstance(item, dict) else None
                if key is None:
                    self.health.malformed += 1
                    continue
                store[key] = self.transform(item)
            if len(store) > self.max_objects:
                raise Unreachable(f"list {self.path}: more than {self.max_objects} objects")
            version = str(meta.get("resourceVersion") or "") or None
            token = meta.get("continue")
            if not isinstance(token, str) or not token:
                break
            query = {**self._query(), "limit": str(LIST_PAGE), "continue": token}
        self.store = store
        self.resource_version = version
        self.health.synced = True
        self.health.relists += 1
        self._ok()
        self._notify()

    def apply(self, event: Mapping[str, Any]) -> None:
        obj = event["object"]
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if isinstance(meta, dict) and meta.get("resourceVersion"):
            self.resource_version = str(meta["resourceVersion"])
        if event["type"] == "BOOKMARK":
            return
        key = object_key(obj)
        if key is None:
            self.health.malformed += 1
            return
        self.health.events += 1
        if event["type"] == "DELETED":
            self.store.pop(key, None)
        elif key in self.store or len(self.store) < self.max_objects:
            self.store[key] = self.transform(obj)
        else:
            self.health.malformed += 1
            return
        self._notify()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started, seen = time.monotonic(), self.health.events
            try:
                if self.resource_version is None or not self.health.synced:
                    await self.relist()
                query = self._query()
                if self.resource_version:
                    query["resourceVersion"] = self.resource_version
                async for event in self.client.watch(self.path, query, self.watch_timeout_s):
                    self._ok()
                    self.apply(event)
                    if stop.is_set():
                        return
                self._ok()  # the server ended the watch (timeoutSeconds): resume from the last version
                if not self._fruitless(started, seen):
                    self.backoff.reset()
                    continue
            except Gone as exc:
                log.info("kube_watch_relist", watch=self.name, detail="resourceVersion too old (410 Gone)",
                         error=str(exc))
                self.resource_version = None
                self.health.synced = False
                self._ok()
                if not self._fruitless(started, seen):
                    continue
            except (ApiError, Unreachable) as exc:
                self._failed(self.name, exc)
                log.warning("kube_watch_failed", watch=self.name, error=str(exc))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let a watch die silently
                self._failed(self.name, exc)
                log.exception("kube_watch_error", watch=self.name)
            delay = self.backoff.next_delay()
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                pass

    def _fruitless(self, started: float, events_before: int) -> bool:
        """A round the server ended at once without an event (a watch closed right away, 410 on
        every watch): backed off like a failure, so a misbehaving server is not hammered."""
        return time.monotonic() - started < MIN_ROUND_S and self.health.events == events_before
