"""The sd_notify client against a fake NOTIFY_SOCKET: a unix datagram socket bound here."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordnode import sdnotify


class FakeSystemd:
    """The receiving end of $NOTIFY_SOCKET."""

    def __init__(self, sock: socket.socket, env_value: str) -> None:
        self.sock = sock
        self.env_value = env_value

    def receive(self, timeout: float = 2.0) -> dict[str, str]:
        self.sock.settimeout(timeout)
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.split("\n"))

    def receive_all(self) -> list[dict[str, str]]:
        messages = []
        self.sock.setblocking(False)
        while True:
            try:
                data = self.sock.recv(4096).decode()
            except BlockingIOError:
                return messages
            messages.append(dict(line.split("=", 1) for line in data.split("\n")))


@pytest.fixture
def path_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSystemd]:
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        yield FakeSystemd(sock, path)


@pytest.fixture
def abstract_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSystemd]:
    name = f"koordnode-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        yield FakeSystemd(sock, "@" + name)


def test_ready_reaches_a_path_socket(path_socket: FakeSystemd) -> None:
    assert sdnotify.ready() is True
    assert path_socket.receive() == {"READY": "1"}


def test_ready_reaches_an_abstract_socket(abstract_socket: FakeSystemd) -> None:
    assert sdnotify.ready("serving on /run/koordnode/koordnode.sock") is True
    assert abstract_socket.receive() == {
        "READY": "1",
        "STATUS": "serving on /run/koordnode/koordnode.sock",
    }


def test_status_text_stays_one_assignment(path_socket: FakeSystemd) -> None:
    assert sdnotify.status("line one\nREADY=1") is True
    message = path_socket.receive()
    assert message == {"STATUS": "line one READY=1"}  # no smuggled READY=1


def test_stopping_and_watchdog(path_socket: FakeSystemd) -> None:
    assert sdnotify.stopping("bye") is True
    assert sdnotify.watchdog() is True
    assert path_socket.receive() == {"STOPPING": "1", "STATUS": "bye"}
    assert path_socket.receive() == {"WATCHDOG": "1"}


def test_reloading_carries_a_monotonic_timestamp(path_socket: FakeSystemd) -> None:
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert sdnotify.reloading() is True
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    message = path_socket.receive()
    assert message["RELOADING"] == "1"
    assert before <= int(message["MONOTONIC_USEC"]) <= after


def test_without_notify_socket_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.ready() is False
    assert sdnotify.notify("WATCHDOG=1") is False


@pytest.mark.parametrize("value", ["", "relative/path.sock", "vsock:2:1234"])
def test_unusable_socket_values_are_ignored(value: str) -> None:
    assert sdnotify.notify("READY=1", environ={"NOTIFY_SOCKET": value}) is False


def test_a_socket_nobody_listens_on_is_not_an_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "gone.sock")
    assert sdnotify.notify("READY=1", environ={"NOTIFY_SOCKET": missing}) is False
    nobody = "@koordnode-nobody-" + uuid.uuid4().hex
    assert sdnotify.notify("READY=1", environ={"NOTIFY_SOCKET": nobody}) is False


def test_watchdog_interval_from_environment() -> None:
    pid = str(os.getpid())
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "1500000", "WATCHDOG_PID": pid}) == 1.5
    # Inherited from a parent: not ours.
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "x"}) is None
    assert sdnotify.watchdog_interval_s({}) is None
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "0"}) is None
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "-5"}) is None
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "soon"}) is None


def test_watchdog_loop_pings_at_half_the_interval(
    path_socket: FakeSystemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # 0.2 s -> a ping every 0.1 s
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))

    async def scenario() -> float:
        stop = asyncio.Event()
        task = asyncio.create_task(sdnotify.watchdog_loop(stop))
        await asyncio.sleep(0.55)
        stop.set()
        started = time.monotonic()
        await asyncio.wait_for(task, timeout=1)
        return time.monotonic() - started

    stop_delay = asyncio.run(scenario())
    pings = path_socket.receive_all()
    assert all(p == {"WATCHDOG": "1"} for p in pings)
    assert 4 <= len(pings) <= 7  # at 0, 0.1, ... 0.5 s
    assert stop_delay < 0.1  # the loop ends as soon as it is told, not at the next tick


def test_watchdog_loop_returns_at_once_without_a_watchdog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    asyncio.run(asyncio.wait_for(sdnotify.watchdog_loop(asyncio.Event()), timeout=1))


def test_watchdog_loop_skips_pings_while_unhealthy(path_socket: FakeSystemd) -> None:
    answers = iter([True, False, False, True])
    calls: list[bool] = []

    def healthy() -> bool:
        value = next(answers, True)
        calls.append(value)
        if len(calls) == 3:
            raise RuntimeError("health check broke")  # counts as unhealthy
        return value

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(sdnotify.watchdog_loop(stop, interval_s=0.1, healthy=healthy))
        while len(calls) < 4:
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, timeout=1)

    asyncio.run(scenario())
    assert len(path_socket.receive_all()) == 2  # the 1st and 4th checks passed
