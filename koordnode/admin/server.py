"""A unix socket that answers one JSON document per connection.

Protocol: the client sends one line naming what it wants ("status"), the server answers with
one JSON document and closes. The socket is mode 0600: only root (the daemon's user) may ask.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
from typing import Any, Awaitable, Callable, Union

import structlog

from koordnode.proxy.server import prepare_socket_path

log = structlog.get_logger("koordnode.admin")


class AdminServer:
    def __init__(self, path: str,
                 status: Callable[[], Union[dict[str, Any], Awaitable[dict[str, Any]]]]) -> None:
        self.path = path
        self.status = status
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        prepare_socket_path(self.path)
        old_umask = os.umask(0o177)  # no window in which the socket is group/world accessible
        try:
            self._server = await asyncio.start_unix_server(self._serve, self.path)
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            what = line.decode(errors="replace").strip() or "status"
            if what == "status":
                # The handler runs on the event loop: it must never wait for a lock a worker
                # holds (the status sources publish snapshots), only await I/O.
                status = self.status()
                if inspect.isawaitable(status):
                    status = await status
                body: dict[str, Any] = {"ok": True, "status": status}
            else:
                body = {"ok": False, "error": f"unknown request {what!r}; try 'status'"}
            writer.write(json.dumps(body, default=str).encode() + b"\n")
            await writer.drain()
        except Exception as exc:  # never let a bad admin client hurt the daemon
            log.warning("admin_request_failed", error=repr(exc))
        finally:
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
