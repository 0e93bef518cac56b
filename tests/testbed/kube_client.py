"""A small Kubernetes REST client for the real-node tests: JSON over HTTPS with a bearer token.

Only what the tests need (get, list, create, patch, delete, a subresource, waiting for a
condition). Every call is bounded twice: each socket operation (connect, the TLS handshake, each
read) by `timeout`, and the whole call by `call_timeout`, after which its socket is shut down
(a server that trickles bytes or a handshake that never completes cannot hold a test).
Errors carry the API server's own message.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Any, Callable

JSON = dict[str, Any]


class ApiError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        self.status = status
        self.body = body
        try:
            message = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            message = body
        super().__init__(f"{method} {path}: HTTP {status}: {message}")


class _Connection(http.client.HTTPSConnection):
    """An HTTPS connection that keeps its socket's fd from before the TLS handshake, so that
    the call's bound can cut the handshake too (the plain socket object gives its fd up to the
    TLS one while the handshake runs)."""

    fd = -1

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.fd = self.sock.fileno()
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self.host)  # type: ignore[attr-defined]


class KubeClient:
    def __init__(self, host: str, port: int, token: str, ca_file: str, timeout: float = 30.0,
                 call_timeout: float | None = None) -> None:
        self.host, self.port, self.token, self.timeout = host, port, token, timeout
        self.call_timeout = call_timeout if call_timeout is not None else 2 * timeout
        self._tls = ssl.create_default_context(cafile=ca_file)

    def request(self, method: str, path: str, body: JSON | list[Any] | None = None,
                content_type: str = "application/json", query: dict[str, str] | None = None) -> JSON:
        text = self.raw(method, path, body, content_type, query)
        return json.loads(text) if text else {}

    def raw(self, method: str, path: str, body: JSON | list[Any] | None = None,
            content_type: str = "application/json", query: dict[str, str] | None = None) -> str:
        """The response body as text (``/readyz``, ``/metrics``, logs); ``ApiError`` on a non-2xx status."""
        if query:
            path = f"{path}?{urllib.parse.urlencode(query)}"
        conn = _Connection(self.host, self.port, context=self._tls, timeout=self.timeout)
        cut = threading.Event()
        closing = threading.Lock()  # the fd is shut down only while it is still this call's

        def cut_off() -> None:
            with closing:
                cut.set()
                if conn.fd >= 0:  # shutdown(2) on the socket: safe beside a read blocked on it
                    with contextlib.suppress(OSError):
                        sock = socket.socket(fileno=conn.fd)
                        try:
                            sock.shutdown(socket.SHUT_RDWR)
                        finally:
                            sock.detach()

        watchdog = threading.Timer(self.call_timeout, cut_off)
        watchdog.daemon = True
        watchdog.start()
        try:
            headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = content_type
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            text = response.read().decode(errors="replace")
        except (OSError, http.client.HTTPException) as err:
            if cut.is_set():
                raise TimeoutError(f"{method} {path}: no whole answer within {self.call_timeout:.0f} s") from err
            raise
        finally:
            watchdog.cancel()
            with closing:
                conn.fd = -1
                conn.close()
        if cut.is_set():
            raise TimeoutError(f"{method} {path}: no whole answer within {self.call_timeout:.0f} s")
        if response.status >= 300:
            raise ApiError(response.status, method, path, text)
        return text

    # ----- conveniences ------------------------------------------------------

    def get(self, path: str, **query: str) -> JSON:
        return self.request("GET", path, query=query or None)

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
        except ApiError as err:
            if err.status == 404:
                return False
            raise
        return True

    def create(self, collection: str, obj: JSON) -> JSON:
        return self.request("POST", collection, obj)

    def patch(self, path: str, patch: JSON, kind: str = "merge") -> JSON:
        types = {"merge": "application/merge-patch+json", "strategic": "application/strategic-merge-patch+json"}
        return self.request("PATCH", path, patch, content_type=types[kind])

    def delete(self, path: str, grace_seconds: int | None = None) -> JSON:
        body = None if grace_seconds is None else {"gracePeriodSeconds": grace_seconds}
        try:
            return self.request("DELETE", path, body)
        except ApiError as err:
            if err.status == 404:
                return {}
            raise

    def pod(self, name: str, namespace: str = "default") -> JSON:
        return self.get(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def wait_for(self, what: str, probe: Callable[[], Any], timeout: float = 120.0, interval: float = 0.5) -> Any:
        """Poll ``probe`` until it returns something truthy; its last value or error in the message."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = probe()
            except ApiError as err:
                last = err
            else:
                if last:
                    return last
            time.sleep(interval)
        raise TimeoutError(f"{what}: not within {timeout:.0f} s (last: {last!r})")

    def wait_pod_phase(self, name: str, phase: str = "Running", namespace: str = "default",
                       timeout: float = 120.0) -> JSON:
        def probe() -> JSON | None:
            pod = self.pod(name, namespace)
            return pod if pod.get("status", {}).get("phase") == phase else None
        return self.wait_for(f"pod {namespace}/{name} {phase}", probe, timeout)
