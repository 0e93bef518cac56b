"""Memory the relay may hold for one connection, in process against the small gRPC backend of
test_relay (the held-body budget needs several huge requests in flight on one connection,
which no CRI client sends; containerd cannot show it):

- request bodies held for the hooks: past the per-connection budget the client's flow-control
  window is no longer returned, so it waits instead of making us hold more;
- a header block spread over CONTINUATION frames is collected up to a bound, then relayed
  undecoded;
- frame parsing survives padding and priority fields that do not fit.
"""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from koordnode.cri.grpc_wire import encode_grpc_message
from koordnode.proxy import h2wire as w
from koordnode.proxy import flow_ledger
from support.h2raw import RS, parse_frames, request_headers
from test_relay import Env, Recorder, create_request, run

MiB = 1024 * 1024


class RawClient:
    """Sends DATA only as far as the window the proxy returned allows (as a real client)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn_window = w.DEFAULT_WINDOW
        self.stream_window: dict[int, int] = {}
        self.frames: list[tuple[int, int, int, bytes]] = []
        self.updated = asyncio.Event()
        self._buf = b""
        self._task = asyncio.ensure_future(self._read())

    @classmethod
    async def open(cls, path: str) -> RawClient:
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(w.PREFACE + w.frame(w.SETTINGS, 0, 0))
        return cls(reader, writer)

    async def _read(self) -> None:
        while True:
            data = await self.reader.read(65536)
            if not data:
                return
            self._buf += data
            frames = parse_frames(self._buf)
            self._buf = self._buf[sum(9 + len(f[3]) for f in frames):]
            for ftype, flags, sid, payload in frames:
                self.frames.append((ftype, flags, sid, payload))
                if ftype == w.WINDOW_UPDATE:
                    inc = int.from_bytes(payload, "big")
                    if sid == 0:
                        self.conn_window += inc
                    elif sid in self.stream_window:
                        self.stream_window[sid] += inc
                    self.updated.set()

    def open_stream(self, sid: int, method: str = "CreateContainer") -> None:
        self.stream_window[sid] = w.DEFAULT_WINDOW
        self.writer.write(w.frame(w.HEADERS, w.FLAG_END_HEADERS, sid, request_headers(RS + method)))

    async def send_body(self, sid: int, size: int, stall_s: float = 0.5) -> int:
        """Send up to `size` body bytes (no END_STREAM); returns how many the windows let through."""
        sent = 0
        first = True
        while sent < size:
            n = min(16384, size - sent, self.conn_window, self.stream_window[sid])
            if n <= 0:
                self.updated.clear()
                try:
                    await asyncio.wait_for(self.updated.wait(), stall_s)
                except TimeoutError:
                    return sent  # no window came back
                continue
            payload = (b"\x00" + (16 * MiB - 1).to_bytes(4, "big") + bytes(n - 5)) if first else bytes(n)
            first = False
            self.writer.write(w.frame(w.DATA, 0, sid, payload))
            self.conn_window -= n
            self.stream_window[sid] -= n
            sent += n
            if sent % (1 * MiB) < 16384:
                await self.writer.drain()
        await self.writer.drain()
        return sent

    def close(self) -> None:
        self._task.cancel()
        self.writer.close()


def test_held_request_bytes_per_connection_are_bounded_by_flow_control(tmp_path):
    async def body():
        async with Env(tmp_path, [Recorder()]) as env:
            client = await RawClient.open(env.proxy_sock)
            try:
                held = 0
                for sid in (1, 3, 5):
                    client.open_stream(sid)
                    held += await client.send_body(sid, 15 * MiB)
                # Two bodies fit the budget; the third waits for window that does not come.
                assert flow_ledger.MAX_HELD_PER_CONNECTION <= held <= flow_ledger.MAX_HELD_PER_CONNECTION + 2 * w.DEFAULT_WINDOW
                assert held < 45 * MiB
                # Cancelling one held call frees its bytes: the withheld window comes back.
                client.writer.write(w.rst_stream(1))
                more = await client.send_body(5, 15 * MiB - (held - 30 * MiB))
                assert more > 0
                # The connection still answers.
                client.open_stream(7, "Version")
                client.writer.write(w.frame(w.DATA, w.FLAG_END_STREAM, 7, encode_grpc_message(b"")))
                for _ in range(100):
                    if any(f[0] == w.HEADERS and f[2] == 7 and f[1] & w.FLAG_END_STREAM for f in client.frames):
                        break
                    await asyncio.sleep(0.05)
                else:
                    pytest.fail("Version got no answer")
            finally:
                client.close()

    run(body())


def test_header_block_over_continuations_is_bounded_then_relayed_undecoded(tmp_path):
    # A literal header whose value is 2 MiB, split over CONTINUATION frames.
    value = b"v" * (2 * MiB)
    whole = (request_headers(RS + "Version") + b"\x00\x01x" + bytes([0x7F])
             + _hpack_int_rest(len(value) - 127) + value)
    frames = [w.frame(w.HEADERS, 0, 1, whole[:16384])]
    for i in range(16384, len(whole), 16384):
        last = i + 16384 >= len(whole)
        frames.append(w.frame(w.CONTINUATION, w.FLAG_END_HEADERS if last else 0, 1, whole[i:i + 16384]))

    async def body():
        async with Env(tmp_path, [Recorder()]) as env:
            with capture_logs() as logs:
                client = await RawClient.open(env.proxy_sock)
                try:
                    client.writer.write(b"".join(frames))
                    client.writer.write(w.frame(w.DATA, w.FLAG_END_STREAM, 1, encode_grpc_message(b"")))
                    await client.writer.drain()
                    await asyncio.sleep(0.5)
                finally:
                    client.close()
            # Not collected past the bound: interception is off for that connection, which is
            # relayed as is (the runtime judges the block).
            assert [e for e in logs if e["event"] == "interception_disabled"]
            # Other connections are intercepted as before.
            await env.rt.CreateContainer(create_request())
            assert env.hooks[0].pre_calls == ["CreateContainer"]

    run(body())


def _hpack_int_rest(value: int) -> bytes:
    out = bytearray()
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@pytest.mark.parametrize("ftype,flags,payload", [
    (w.HEADERS, w.FLAG_PADDED, b""),
    (w.DATA, w.FLAG_PADDED, b""),
    (w.HEADERS, w.FLAG_PADDED, b"\x05ab"),
    (w.HEADERS, w.FLAG_PRIORITY, b"ab"),
    (w.HEADERS, w.FLAG_PADDED | w.FLAG_PRIORITY, b"\x01" + bytes(5)),
])
def test_frame_payload_rejects_fields_that_do_not_fit(ftype, flags, payload):
    with pytest.raises(ValueError):
        w.frame_payload(ftype, flags, payload)


def test_frame_payload_strips_padding_and_priority():
    assert w.frame_payload(w.HEADERS, w.FLAG_PADDED | w.FLAG_PRIORITY, b"\x02" + bytes(5) + b"ab" + b"\x00\x00") == b"ab"
    assert w.frame_payload(w.DATA, w.FLAG_PADDED, b"\x00") == b""
