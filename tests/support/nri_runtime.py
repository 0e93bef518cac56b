"""The runtime end of NRI, for in-process tests of the plugin.

Written independently of koordnode/nri/{mux,ttrpc}.py (its own framing code) so that the two
check each other: it listens on a unix socket like containerd's NRI, serves the Runtime
service on connection 2 (RegisterPlugin, UpdateContainers), and calls the plugin's service
on connection 1 — Configure then Synchronize after registration, as containerd does, then
whatever the test asks.
"""

from __future__ import annotations

import asyncio
import struct

from koordnode.nri import api_pb2 as nri
from koordnode.nri import ttrpc_pb2

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME = "nri.pkg.api.v1alpha1.Runtime"


class CallFailed(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class FakeRuntime:
    def __init__(self, path: str, *, request_timeout_ms: int = 2000, nri_version: str = "",
                 pods=(), containers=()) -> None:
        self.path = path
        self.request_timeout_ms = request_timeout_ms
        self.nri_version = nri_version
        self.pods, self.containers = list(pods), list(containers)
        self.registrations: list[nri.RegisterPluginRequest] = []
        self.configured: list[nri.ConfigureResponse] = []
        self.synchronized: list[nri.SynchronizeResponse] = []
        self.updates: list[nri.UpdateContainersRequest] = []
        self.frame_sizes: list[int] = []  # payload sizes of the frames the plugin sent
        self.ready = asyncio.Event()
        self._server = None
        self._writer: asyncio.StreamWriter | None = None
        self._buffers: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        self._pending: dict[int, asyncio.Future] = {}
        self._next_id = 1
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> FakeRuntime:
        self._server = await asyncio.start_unix_server(self._accept, self.path)
        return self

    async def stop(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()

    def drop_connection(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def send_raw(self, data: bytes) -> None:
        assert self._writer is not None
        self._writer.write(data)

    # ---- wire ---------------------------------------------------------------------------

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._buffers = {1: bytearray(), 2: bytearray()}
        self.ready.clear()
        try:
            while True:
                conn_id, length = struct.unpack(">II", await reader.readexactly(8))
                payload = await reader.readexactly(length)
                self.frame_sizes.append(length)
                buf = self._buffers.setdefault(conn_id, bytearray())
                buf += payload
                while len(buf) >= 10:
                    size, stream_id, msg_type, _ = struct.unpack(">IIBB", buf[:10])
                    if len(buf) < 10 + size:
                        break
                    body = bytes(buf[10:10 + size])
                    del buf[:10 + size]
                    self._message(conn_id, stream_id, msg_type, body)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("plugin went away"))
            self._pending.clear()

    def _send(self, conn_id: int, stream_id: int, msg_type: int, body: bytes) -> None:
        message = struct.pack(">IIBB", len(body), stream_id, msg_type, 0) + body
        self._writer.write(struct.pack(">II", conn_id, len(message)) + message)

    def _message(self, conn_id: int, stream_id: int, msg_type: int, body: bytes) -> None:
        if conn_id == 2 and msg_type == 1:  # the plugin calls the runtime
            req = ttrpc_pb2.Request.FromString(body)
            resp = ttrpc_pb2.Response()
            if (req.service, req.method) == (RUNTIME, "RegisterPlugin"):
                self.registrations.append(nri.RegisterPluginRequest.FromString(req.payload))
                resp.payload = nri.Empty().SerializeToString()
                self._spawn(self._after_registration())
            elif (req.service, req.method) == (RUNTIME, "UpdateContainers"):
                self.updates.append(nri.UpdateContainersRequest.FromString(req.payload))
                resp.payload = nri.UpdateContainersResponse().SerializeToString()
            else:
                resp.status.code, resp.status.message = 12, "not here"
            self._send(2, stream_id, 2, resp.SerializeToString())
        elif conn_id == 1 and msg_type == 2:  # an answer of the plugin
            fut = self._pending.pop(stream_id, None)
            if fut is not None and not fut.done():
                fut.set_result(ttrpc_pb2.Response.FromString(body))

    async def _after_registration(self) -> None:
        cfg = await self.call("Configure", nri.ConfigureRequest(
            runtime_name="fake", runtime_version="0", request_timeout=self.request_timeout_ms,
            registration_timeout=5000, NRI_version=self.nri_version), nri.ConfigureResponse)
        self.configured.append(cfg)
        sync = await self.call("Synchronize", nri.SynchronizeRequest(pods=self.pods, containers=self.containers),
                               nri.SynchronizeResponse)
        self.synchronized.append(sync)
        self.ready.set()

    async def call(self, method: str, request, response_cls, timeout_s: float = 10.0):
        stream_id, self._next_id = self._next_id, self._next_id + 2
        fut = asyncio.get_running_loop().create_future()
        self._pending[stream_id] = fut
        req = ttrpc_pb2.Request(service=PLUGIN, method=method, payload=request.SerializeToString())
        self._send(1, stream_id, 1, req.SerializeToString())
        resp = await asyncio.wait_for(fut, timeout_s)
        if resp.status.code:
            raise CallFailed(resp.status.code, resp.status.message)
        return response_cls.FromString(resp.payload)
