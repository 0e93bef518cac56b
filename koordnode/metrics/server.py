"""The metrics endpoint: ``GET /metrics`` answers the exposition, ``/`` a one-line pointer.

A small HTTP/1.0 server (one request per connection, as Prometheus scrapes) on socketserver's
threads rather than http.server or wsgiref: those bring the email package and http.client
into the daemon's memory for a handler of a few lines. Only GET and HEAD; no keep-alive.
"""

from __future__ import annotations

import socket
import socketserver
import threading

from koordnode import __version__
from koordnode.config.metrics import MetricsConfig, parse_listen
from koordnode.metrics.exposition import CONTENT_TYPE
from koordnode.metrics.recorder import METRICS, Metrics

__all__ = ["MetricsServer", "MetricsStartError", "start"]

_MAX_LINE = 8192  # bytes of a request or header line
_MAX_HEADERS = 100
_MAX_BODY = 1 << 16  # a request body read (and dropped) before answering 405
_TEXT = "text/plain; charset=utf-8"


class MetricsStartError(Exception):
    """The endpoint could not listen (address in use, not local, ...)."""


class _BadRequest(Exception):
    pass


class _Handler(socketserver.StreamRequestHandler):
    timeout = 10  # seconds a client may take to send its request
    server: _Server

    def handle(self) -> None:
        try:
            method, path, length = self._read_request()
        except _BadRequest:
            self._answer("GET", "400 Bad Request", _TEXT, b"bad request\n")
            return
        except OSError:  # the client went away or was too slow: nothing to answer
            return
        if method not in ("GET", "HEAD"):
            if 0 < length <= _MAX_BODY:  # read it: closing on unread data would reset the connection
                self.rfile.read(length)
            self._answer(method, "405 Method Not Allowed", "text/plain", b"method not allowed\n",
                         ("Allow", "GET, HEAD"))
        elif path == "/metrics":
            self._answer(method, "200 OK", CONTENT_TYPE, self.server.metrics.render())
        elif path == "/":
            self._answer(method, "200 OK", _TEXT, f"koordnode {__version__}: metrics at /metrics\n".encode())
        else:
            self._answer(method, "404 Not Found", "text/plain", b"not found; metrics are at /metrics\n")

    def _read_request(self) -> tuple[str, str, int]:
        """The method, the path (query dropped) and the Content-Length of the request."""
        parts = self.rfile.readline(_MAX_LINE + 1).decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            raise _BadRequest
        method, target = parts[0], parts[1]
        length = 0
        for _ in range(_MAX_HEADERS):
            line = self.rfile.readline(_MAX_LINE + 1)
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                try:
                    length = int(value.strip())
                except ValueError:
                    raise _BadRequest from None
        else:
            raise _BadRequest
        path = target.split("?", 1)[0].split("#", 1)[0]
        if "://" in path:  # an absolute URI (a proxy's form): its path
            path = "/" + path.split("://", 1)[1].partition("/")[2]
        return method, path or "/", length

    def _answer(self, method: str, status: str, content_type: str, body: bytes,
                *headers: tuple[str, str]) -> None:
        head = [f"HTTP/1.0 {status}", f"Content-Type: {content_type}", f"Content-Length: {len(body)}",
                "Connection: close", *(f"{name}: {value}" for name, value in headers)]
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        try:
            self.wfile.write(data if method == "HEAD" else data + body)
        except OSError:
            pass  # the scraper gave up; nothing to tell it


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True  # a restarted daemon binds again while old connections linger

    def __init__(self, address: tuple[str, int], family: int, metrics: Metrics) -> None:
        self.address_family = family
        self.metrics = metrics
        super().__init__(address, _Handler)

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a scraper's broken connection is not the daemon's error (and scrapes are frequent)


class MetricsServer:
    """A running /metrics endpoint; :meth:`stop` it on shutdown or when the address changes."""

    def __init__(self, httpd: _Server, thread: threading.Thread, listen: str) -> None:
        self._httpd = httpd
        self._thread = thread
        self.listen = listen

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); the port is the real one when 0 was asked for."""
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"

    def stop(self) -> None:
        """Stop serving and close the socket (blocks for at most ~0.1 s)."""
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def start(config: MetricsConfig | str, metrics: Metrics | None = None) -> MetricsServer | None:
    """Serve ``metrics`` (default: :data:`~koordnode.metrics.recorder.METRICS`) at
    ``http://<listen>/metrics`` from a daemon thread; None when ``listen`` is ``""``. Raises
    MetricsStartError if it cannot bind."""
    listen = config.listen if isinstance(config, MetricsConfig) else config
    try:
        address = parse_listen(listen)
    except ValueError as exc:
        raise MetricsStartError(f"metrics.listen {listen!r}: {exc}") from None
    if address is None:
        return None
    host, port = address
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        httpd = _Server((host, port), family, metrics if metrics is not None else METRICS)
    except OSError as exc:
        raise MetricsStartError(f"cannot serve metrics on {listen}: {exc.strerror or exc}") from None
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                              name="koordnode-metrics", daemon=True)
    thread.start()
    return MetricsServer(httpd, thread, listen)
