"""A minimal asyncio HTTP/1.1 client for the Kubernetes API: one request per connection.

Why not a library: the API server needs only GET/POST/PUT with JSON bodies and a streamed
watch; the daemon keeps its dependencies pure Python or abi3 (packaging/build.sh), and every
read here is bounded (header size, body size, one watch line), so a hostile or broken server
costs an error, never unbounded memory or a stalled loop. Connections are not reused: requests
are rare (a NodeMetric a minute, an eviction now and then) and each watch holds its own.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

__all__ = ["HttpError", "Response", "TooLarge", "request", "stream_lines"]

MAX_HEADER_BYTES = 64 * 1024
MAX_HEADERS = 100


class HttpError(Exception):
    """The connection or the HTTP framing failed (not an HTTP error status)."""


class TooLarge(HttpError):
    """A response or one watch event exceeded the configured bound."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    tls: bool
    base_path: str


def parse_server(server: str) -> Target:
    parts = urlsplit(server)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError(f"expected an https:// server URL, got {server!r}")
    tls = parts.scheme == "https"
    return Target(parts.hostname, parts.port or (443 if tls else 80), tls, parts.path.rstrip("/"))


def _request_bytes(target: Target, method: str, path: str, query: Mapping[str, str] | None,
                   headers: Mapping[str, str], body: bytes | None) -> bytes:
    url = target.base_path + path + ("?" + urlencode(query) if query else "")
    host = f"[{target.host}]" if ":" in target.host else target.host
    lines = [f"{method} {url} HTTP/1.1", f"Host: {host}:{target.port}", "Connection: close",
             "Accept: application/json", "User-Agent: koordnode"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


async def _open(target: Target, ssl_context: ssl.SSLContext | None, timeout: float
                ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        return await asyncio.wait_for(asyncio.open_connection(
            target.host, target.port, ssl=ssl_context if target.tls else None,
            limit=MAX_HEADER_BYTES), timeout)
    except TimeoutError:
        raise HttpError(f"connecting to {target.host}:{target.port} timed out after {timeout:g} s") from None
    except (OSError, ssl.SSLError) as exc:
        raise HttpError(f"cannot connect to {target.host}:{target.port}: {exc}") from None


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise TooLarge(f"response headers exceed {MAX_HEADER_BYTES} bytes") from None
    except asyncio.IncompleteReadError:
        raise HttpError("connection closed before a response") from None
    lines = head.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith("HTTP/1.") or not status_line[1].isdigit():
        raise HttpError(f"not an HTTP/1.1 response: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise HttpError(f"malformed header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
        if len(headers) > MAX_HEADERS:
            raise TooLarge(f"more than {MAX_HEADERS} response headers")
    return int(status_line[1]), headers


class _Body:
    """Reads a body framed by Content-Length, chunked encoding or the connection's end."""

    def __init__(self, reader: asyncio.StreamReader, headers: Mapping[str, str]) -> None:
        self._reader = reader
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._left: int | None = None
        if not self._chunked and length is not None:
            if not length.isdigit():
                raise HttpError(f"bad Content-Length {length[:40]!r}")
            self._left = int(length)
        self._done = False

    async def read(self) -> bytes:
        """The next piece of the body, b"" at its end."""
        if self._done:
            return b""
        try:
            if self._chunked:
                size_line = await self._reader.readuntil(b"\r\n")
                size_text = size_line.split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise HttpError(f"bad chunk size {size_text[:20]!r}") from None
                if size == 0:
                    self._done = True
                    return b""
                data = await self._reader.readexactly(size)
                await self._reader.readexactly(2)
                return data
            if self._left is not None:
                if self._left == 0:
                    self._done = True
                    return b""
                data = await self._reader.read(min(self._left, 65536))
                if not data:
                    raise HttpError("connection closed before the end of the body")
                self._left -= len(data)
                return data
            data = await self._reader.read(65536)
            if not data:
                self._done = True
            return data
        except asyncio.LimitOverrunError:
            raise HttpError("malformed chunked encoding") from None
        except asyncio.IncompleteReadError:
            raise HttpError("connection closed in the middle of the body") from None


async def request(server: str, ssl_context: ssl.SSLContext | None, method: str, path: str, *,
                  query: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None,
                  body: bytes | None = None, timeout: float = 10.0, max_bytes: int = 4 << 20) -> Response:
    """One request; the whole exchange within `timeout`, the body at most `max_bytes`."""
    target = parse_server(server)

    async def exchange() -> Response:
        reader, writer = await _open(target, ssl_context, timeout)
        try:
            writer.write(_request_bytes(target, method, path, query, headers or {}, body))
            await writer.drain()
            status, response_headers = await _read_head(reader)
            framing = _Body(reader, response_headers)
            parts: list[bytes] = []
            size = 0
            while data := await framing.read():
                size += len(data)
                if size > max_bytes:
                    raise TooLarge(f"response body exceeds {max_bytes} bytes ({method} {path})")
                parts.append(data)
            return Response(status, response_headers, b"".join(parts))
        except (OSError, ssl.SSLError) as exc:
            raise HttpError(f"{method} {path}: {exc}") from None
        finally:
            writer.close()

    try:
        return await asyncio.wait_for(exchange(), timeout)
    except TimeoutError:
        raise HttpError(f"{method} {path}: no complete answer within {timeout:g} s") from None


async def stream_lines(server: str, ssl_context: ssl.SSLContext | None, path: str, *,
                       query: Mapping[str, str], headers: Mapping[str, str], connect_timeout: float,
                       idle_timeout: float, max_line: int) -> AsyncIterator[tuple[int, bytes]]:
    """A streamed GET (a watch): yields (status, line) per newline-ended line; a non-200 status
    yields the whole (bounded) body once. `idle_timeout`: longest silence between pieces."""
    target = parse_server(server)
    reader, writer = await _open(target, ssl_context, connect_timeout)
    try:
        writer.write(_request_bytes(target, "GET", path, query, headers, None))
        await writer.drain()
        status, response_headers = await asyncio.wait_for(_read_head(reader), connect_timeout)
        framing = _Body(reader, response_headers)
        pending = bytearray()
        while True:
            try:
                data = await asyncio.wait_for(framing.read(), idle_timeout)
            except TimeoutError:
                raise HttpError(f"watch {path}: silent for {idle_timeout:g} s") from None
            if not data:
                break
            pending += data
            if status != 200:
                if len(pending) > max_line:
                    raise TooLarge(f"error body exceeds {max_line} bytes")
                continue
            while (end := pending.find(b"\n")) >= 0:
                line = bytes(pending[:end])
                del pending[: end + 1]
                if line.strip():
                    yield status, line
            if len(pending) > max_line:
                raise TooLarge(f"one watch event exceeds {max_line} bytes ({path})")
        if pending.strip():
            yield status, bytes(pending)
    except (OSError, ssl.SSLError) as exc:
        raise HttpError(f"watch {path}: {exc}") from None
    finally:
        writer.close()
