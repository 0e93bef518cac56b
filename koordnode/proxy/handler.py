"""Turns an intercepted call's bytes into a request for the interceptor (the hook chain, handed
in by the daemon: proxy/interceptor.py), and back."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog
from google.protobuf.message import DecodeError

from koordnode.cri.grpc_wire import Status, decode_grpc_message, encode_grpc_message
from koordnode.proxy.interceptor import Interceptor
from koordnode.cri.methods import OLD_API_PREFIX, SPECS_BY_PATH, MethodSpec
from koordnode.proxy.call_handler import BeforeResult

log = structlog.get_logger("koordnode.proxy")


class ProxyStats:
    """Counters the status endpoint and metrics read."""

    def __init__(self) -> None:
        self.connections_open = 0
        self.connections_total = 0
        self.intercepted_calls = 0
        self.unparsed_bodies = 0
        self.failed_by_policy = 0
        # Dry run: requests the hooks changed (forwarded unchanged), and hook failures that
        # failure_policy = "fail" would have turned into failed calls.
        self.dry_run_changed_requests = 0
        self.dry_run_would_fail = 0


class InterceptingHandler:
    """The relay's CallHandler: decodes intercepted requests, asks the interceptor, re-encodes.

    ``on_completed(path, grpc_status, seconds)`` is told of every relayed call (CRI call metrics).
    Dry run (``dry_run``, switched by reloads): the interceptor runs and decides as usual, but
    every request goes to the runtime as the client sent it, and no call is failed by
    failure_policy.
    """

    def __init__(self, interceptor: Interceptor, stats: ProxyStats | None = None, *,
                 on_completed: Callable[[str, int | None, float], None] | None = None,
                 dry_run: bool = False) -> None:
        self.interceptor = interceptor
        self.stats = stats or ProxyStats()
        self._old_api_logged = False
        self._on_completed = on_completed
        self.dry_run = dry_run
        self.last_dry_run_changes: dict[str, list[str]] = {}  # method -> the last would-be diff

    def opened(self) -> None:
        self.stats.connections_open += 1
        self.stats.connections_total += 1

    def closed(self) -> None:
        self.stats.connections_open -= 1

    def completed(self, path: str, grpc_status: int | None, seconds: float) -> None:
        """Every relayed call, intercepted or not, once its status is known."""
        if self._on_completed is not None:
            self._on_completed(path, grpc_status, seconds)

    def lookup(self, path: str) -> MethodSpec | None:
        spec = SPECS_BY_PATH.get(path)
        if spec is None and not self._old_api_logged and path.startswith(OLD_API_PREFIX):
            self._old_api_logged = True
            log.warning("old_cri_api_forwarded_without_hooks", detail="client uses the old runtime.v1alpha2 CRI API",
                        path=path)
        return spec

    async def before(self, spec: MethodSpec, body: bytes) -> BeforeResult:
        message = decode_grpc_message(body)
        request = None
        if message is not None:
            try:
                request = spec.request_cls.FromString(message)
            except DecodeError:
                request = None
        if request is None:
            # Compressed or malformed: the runtime is the judge, we just stay out of the way.
            self.stats.unparsed_bodies += 1
            log.warning("request_body_not_parsed", detail="forwarded unchanged", method=spec.name)
            return BeforeResult(body=body, ctx=None)
        self.stats.intercepted_calls += 1
        started = time.monotonic()
        seen = await self.interceptor.before(spec.name, request)
        hooks_s = time.monotonic() - started
        if seen.failure is not None:
            if self.dry_run:
                self.stats.dry_run_would_fail += 1
                log.warning("dry_run_would_fail_call", detail="failure_policy = fail; forwarded",
                            method=spec.name, error=seen.failure)
                return BeforeResult(body=body, ctx=(spec, seen.token, request, started, hooks_s))
            self.stats.failed_by_policy += 1
            return BeforeResult(body=body, ctx=(spec, seen.token, request, started, hooks_s),
                                fail=(Status.INTERNAL, f"koordnode: {seen.failure}"))
        if self.dry_run:
            self._report_dry_run_change(spec.name, request, seen.request, seen.log_fields)
            return BeforeResult(body=body, ctx=(spec, seen.token, request, started, hooks_s))
        if seen.request is not request:
            changed = seen.request.SerializeToString()
            # Re-encoding may reorder unknown fields and map entries; send the client's own bytes
            # unless a hook really changed something.
            if changed != request.SerializeToString():
                body = encode_grpc_message(changed)
        return BeforeResult(body=body, ctx=(spec, seen.token, seen.request, started, hooks_s))

    def _report_dry_run_change(self, method: str, original: Any, changed: Any, ids: Any) -> None:
        if changed is original:
            return
        try:
            changes = message_changes(original, changed)
        except Exception as exc:  # a report only: never in the way of the call
            changes = [f"(difference not described: {exc!r})"]
        if not changes:
            return
        self.stats.dry_run_changed_requests += 1
        self.last_dry_run_changes[method] = changes
        log.info("dry_run_request_forwarded_unchanged", detail="the hooks would have changed it",
                 method=method, **ids, would=changes)

    def after(self, ctx: Any, body: bytes, grpc_status: int | None, grpc_message: str) -> None:
        if ctx is None:
            return
        spec, token, sent, started, hooks_s = ctx
        response = None
        if grpc_status == 0:
            message = decode_grpc_message(body)
            if message is not None:
                try:
                    response = spec.response_cls.FromString(message)
                except DecodeError:
                    response = None
        fields = dict(self.interceptor.after(token, sent, response, grpc_status, grpc_message))
        duration_ms = fields.setdefault("duration_ms", round((time.monotonic() - started) * 1000, 3))
        # What koordnode's Pre hooks held the call for, and the rest (the runtime and the relay).
        fields["hooks_ms"] = round(hooks_s * 1000, 3)
        fields["runtime_ms"] = round(max(0.0, duration_ms - fields["hooks_ms"]), 3)
        log.info(
            "cri_call",
            method=spec.name,
            outcome="ok" if grpc_status == 0 else "error",
            grpc_status=grpc_status,
            grpc_message=grpc_message or None,
            **fields,
        )


def message_changes(old: Any, new: Any, prefix: str = "", limit: int = 40) -> list[str]:
    """Field-by-field differences between two protobuf messages of one type, as
    ``path: old -> new`` lines (maps by key; at most ``limit`` lines)."""
    out: list[str] = []
    _diff(old, new, prefix, out, limit)
    return out[:limit]


def _diff(old: Any, new: Any, prefix: str, out: list[str], limit: int) -> None:
    for fd in new.DESCRIPTOR.fields:
        if len(out) >= limit:
            return
        name = f"{prefix}{fd.name}"
        a, b = getattr(old, fd.name), getattr(new, fd.name)
        is_map = fd.message_type is not None and fd.message_type.GetOptions().map_entry
        if is_map:
            a, b = dict(a), dict(b)
            for key in sorted(set(a) | set(b), key=str):
                if a.get(key) != b.get(key):
                    out.append(f"{name}[{key}]: {_short(a.get(key))} -> {_short(b.get(key))}")
        elif fd.is_repeated:
            if list(a) != list(b):
                out.append(f"{name}: {len(a)} entries -> {len(b)} entries")
        elif fd.message_type is not None:
            if old.HasField(fd.name) or new.HasField(fd.name):
                _diff(a, b, f"{name}.", out, limit)
        elif a != b:
            out.append(f"{name}: {_short(a)} -> {_short(b)}")


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value) if value is not None else "(none)"
    return text if len(text) <= limit else text[:limit] + "..."
