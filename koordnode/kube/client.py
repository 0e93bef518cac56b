"""The Kubernetes API client koordnode uses: JSON requests, watches, typed errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from koordnode.kube import http
from koordnode.kube.credentials import Credentials, CredentialsError

__all__ = ["ApiError", "Gone", "KubeClient", "Unreachable"]


class Unreachable(Exception):
    """No answer from the API server (connection, TLS, framing, credentials, timeout)."""


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")


class Gone(ApiError):
    """410: the resourceVersion is too old; list again."""


def _error_of(status: int, body: bytes) -> ApiError:
    reason, message = "", body[:300].decode("utf-8", "replace")
    try:
        doc = json.loads(body)
        if isinstance(doc, dict):
            reason, message = str(doc.get("reason", "")), str(doc.get("message", ""))[:500]
    except ValueError:
        pass
    return (Gone if status == 410 else ApiError)(status, reason or http_reason(status), message)


def http_reason(status: int) -> str:
    return {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "Conflict",
            410: "Gone", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
            503: "ServiceUnavailable"}.get(status, "Error")


def _decode(body: bytes) -> Any:
    """JSON; ValueError (UnicodeDecodeError is one) when it is not. On the loop: json's C parser
    holds the GIL, so a worker thread would not spare the loop; the cost is bounded instead, by
    [kubernetes] max_response_bytes and the list pages (a page of pods parses in milliseconds)."""
    return json.loads(body)


class KubeClient:
    def __init__(self, credentials: Credentials, *, timeout_s: float = 10.0,
                 max_response_bytes: int = 4 << 20) -> None:
        self.credentials = credentials
        self.timeout_s = timeout_s
        self.max_response_bytes = max_response_bytes

    async def _prepare(self) -> tuple[Any, dict[str, str]]:
        try:
            if self.credentials.exec_due():  # a command with a bounded time: off the loop
                await asyncio.to_thread(self.credentials.refresh_exec)
            return self.credentials.ssl_context(), self.credentials.auth_headers()
        except CredentialsError as exc:
            raise Unreachable(str(exc)) from None

    def _refused(self, status: int, body: bytes) -> ApiError:
        if status == 401:
            self.credentials.refused()
        return _error_of(status, body)

    async def request(self, method: str, path: str, *, query: Mapping[str, str] | None = None,
                      body: Any = None) -> Any:
        """The decoded JSON answer of a 2xx; ApiError otherwise, Unreachable without an answer."""
        context, headers = await self._prepare()
        payload = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
        try:
            response = await http.request(self.credentials.server, context, method, path, query=query,
                                          headers=headers, body=payload, timeout=self.timeout_s,
                                          max_bytes=self.max_response_bytes)
        except http.HttpError as exc:
            raise Unreachable(str(exc)) from None
        if not 200 <= response.status < 300:
            raise self._refused(response.status, response.body)
        try:
            return _decode(response.body)
        except ValueError as exc:
            raise Unreachable(f"{method} {path}: response is not JSON ({exc})") from None

    async def get(self, path: str, query: Mapping[str, str] | None = None) -> Any:
        return await self.request("GET", path, query=query)

    async def create(self, path: str, obj: Mapping[str, Any]) -> Any:
        return await self.request("POST", path, body=obj)

    async def replace(self, path: str, obj: Mapping[str, Any]) -> Any:
        return await self.request("PUT", path, body=obj)

    async def watch(self, path: str, query: Mapping[str, str], timeout_s: int) -> AsyncIterator[dict[str, Any]]:
        """Watch events ({"type", "object"}) from `path` with `query` (resourceVersion, field
        selector); ends when the server ends the watch. A malformed event is an Unreachable
        error (the stream cannot be trusted past it); an ERROR event is raised as ApiError."""
        context, headers = await self._prepare()
        query = {**query, "watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_s)}
        try:
            async for status, line in http.stream_lines(
                    self.credentials.server, context, path, query=query, headers=headers,
                    connect_timeout=self.timeout_s, idle_timeout=timeout_s + self.timeout_s + 30,
                    max_line=self.max_response_bytes):
                if status != 200:
                    raise self._refused(status, line)
                try:
                    event = _decode(line)
                except ValueError:
                    raise Unreachable(f"watch {path}: an event is not JSON: {line[:80]!r}") from None
                if not isinstance(event, dict) or not isinstance(event.get("object"), dict) \
                        or event.get("type") not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"):
                    raise Unreachable(f"watch {path}: malformed event {line[:80]!r}")
                if event["type"] == "ERROR":
                    obj = event["object"]
                    code = obj.get("code") if isinstance(obj.get("code"), int) else 500
                    raise (Gone if code == 410 else ApiError)(code, str(obj.get("reason", "")),
                                                             str(obj.get("message", ""))[:500])
                yield event
        except http.HttpError as exc:
            raise Unreachable(str(exc)) from None
