"""CriClient against the real containerd: the same answers and errors grpcio gets, big answers
through flow control, concurrent calls on one connection; and the failures it must map."""

from __future__ import annotations

import asyncio
import time

import grpc
import h2.config
import h2.connection
import h2.events
import pytest

from koordnode.cri import api_pb2 as pb
from koordnode.cri.client import CriClient, CriError
from koordnode.cri.methods import IMAGE_SERVICE, RUNTIME_SERVICE
from support.cri import container_config, remove_pod, run_pod, sandbox_config

pytestmark = pytest.mark.e2e

RT = RUNTIME_SERVICE


def run(coro):
    return asyncio.run(coro)


def test_version_and_image_service_answer_like_grpcio(containerd_bed, cri_direct):
    async def scenario():
        cri = CriClient(str(containerd_bed.socket))
        try:
            version = await cri.call(RT + "Version", pb.VersionRequest(), pb.VersionResponse, 5)
            images = await cri.call(IMAGE_SERVICE + "ListImages", pb.ListImagesRequest(),
                                    pb.ListImagesResponse, 5)
            return version, images
        finally:
            await cri.close()

    version, images = run(scenario())
    assert version.runtime_name == "containerd"
    assert version == cri_direct.rt.Version(pb.VersionRequest())
    by_id = lambda resp: sorted((i.id, i.SerializeToString(deterministic=True)) for i in resp.images)  # noqa: E731
    assert by_id(images) == by_id(cri_direct.img.ListImages(pb.ListImagesRequest()))  # order is not stable
    assert images.images


def test_not_found_has_grpcio_code_and_percent_decoded_details(containerd_bed, cri_direct):
    missing = "no-such-container-é\u2603"  # echoed in the message: non-ASCII is percent-encoded

    async def scenario():
        cri = CriClient(containerd_bed.address)  # "unix://" prefix accepted too
        try:
            with pytest.raises(CriError) as err:
                await cri.call(RT + "ContainerStatus", pb.ContainerStatusRequest(container_id=missing),
                               pb.ContainerStatusResponse, 5)
            # The connection stays usable after an error answer.
            await cri.call(RT + "Version", pb.VersionRequest(), pb.VersionResponse, 5)
            return err.value
        finally:
            await cri.close()

    ours = run(scenario())
    with pytest.raises(grpc.RpcError) as theirs:
        cri_direct.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=missing), timeout=5)
    assert (ours.code, ours.code_name) == (5, "NOT_FOUND") == (theirs.value.code().value[0], theirs.value.code().name)
    assert ours.details == theirs.value.details()
    assert missing in ours.details


@pytest.fixture
def crowded_pod(containerd_bed, cri_direct):
    """A pod with containers carrying big annotations: ListContainers answers ~1.5 MB."""
    sb_cfg = sandbox_config(containerd_bed, "crowded")
    sandbox_id = run_pod(cri_direct, sb_cfg)
    try:
        ballast = {f"ballast-{i}": "x" * 8000 for i in range(6)}
        for n in range(30):
            cfg = container_config(containerd_bed, f"c{n}", ["sleep", "3600"], annotations=ballast)
            cri_direct.rt.CreateContainer(
                pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=cfg, sandbox_config=sb_cfg), timeout=60
            )
        yield sandbox_id
    finally:
        remove_pod(cri_direct, sandbox_id)


@pytest.mark.parametrize("window", [65535, None], ids=["default-window", "large-window"])
def test_big_answers_and_concurrent_calls_on_one_connection(containerd_bed, cri_direct, crowded_pod, window):
    request = pb.ListContainersRequest(filter=pb.ContainerFilter(pod_sandbox_id=crowded_pod))

    async def scenario():
        kwargs = {} if window is None else {"receive_window": window}
        cri = CriClient(str(containerd_bed.socket), **kwargs)
        try:
            first = await cri.call(RT + "ListContainers", request, pb.ListContainersResponse, 20)
            conn = cri._conn
            calls = [cri.call(RT + "ListContainers", request, pb.ListContainersResponse, 20) for _ in range(4)]
            calls += [cri.call(RT + "ContainerStatus", pb.ContainerStatusRequest(container_id=c.id, verbose=True),
                               pb.ContainerStatusResponse, 20) for c in first.containers]
            answers = await asyncio.gather(*calls)
            assert cri._conn is conn  # all of them on the first connection
            return first, answers
        finally:
            await cri.close()

    first, answers = run(scenario())
    assert len(first.containers) == 30
    assert first.ByteSize() > 1_000_000  # far above one flow-control window
    direct = cri_direct.rt.ListContainers(request)
    key = lambda resp: sorted(c.SerializeToString(deterministic=True) for c in resp.containers)  # noqa: E731
    for listed in [first, *answers[:4]]:
        assert key(listed) == key(direct)
    statuses = answers[4:]
    assert [s.status.id for s in statuses] == [c.id for c in first.containers]
    assert all(s.status.annotations["ballast-0"] == "x" * 8000 for s in statuses)


def test_reconnects_after_close(containerd_bed):
    async def scenario():
        cri = CriClient(str(containerd_bed.socket))
        try:
            await cri.call(RT + "Version", pb.VersionRequest(), pb.VersionResponse, 5)
            await cri.close()
            return await cri.call(RT + "Version", pb.VersionRequest(), pb.VersionResponse, 5)
        finally:
            await cri.close()

    assert run(scenario()).runtime_name == "containerd"


def test_missing_socket_is_unavailable(tmp_path):
    async def scenario():
        cri = CriClient(str(tmp_path / "nobody.sock"))
        try:
            await cri.call(RT + "Version", pb.VersionRequest(), pb.VersionResponse, 5)
        finally:
            await cri.close()

    with pytest.raises(CriError) as err:
        run(scenario())
    assert (err.value.code, err.value.code_name) == (14, "UNAVAILABLE")
    assert "nobody.sock" in err.value.details
    assert str(err.value).startswith("UNAVAILABLE: ")


def test_silent_server_gives_deadline_exceeded(tmp_path):
    path = str(tmp_path / "silent.sock")

    async def scenario():
        received = bytearray()

        async def swallow(reader, writer):
            while chunk := await reader.read(65536):
                received.extend(chunk)

        server = await asyncio.start_unix_server(swallow, path)
        cri = CriClient(path)
        try:
            started = time.monotonic()
            with pytest.raises(CriError) as err:
                await cri.call(RT + "Version", pb.VersionRequest(), pb.VersionResponse, 0.3)
            return err.value, time.monotonic() - started, bytes(received)
        finally:
            await cri.close()
            server.close()

    error, elapsed, received = run(scenario())
    assert (error.code, error.code_name) == (4, "DEADLINE_EXCEEDED")
    assert 0.25 < elapsed < 2.0
    server_side = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    request = next(e for e in server_side.receive_data(received) if isinstance(e, h2.events.RequestReceived))
    headers = dict(request.headers)
    assert headers[b"grpc-timeout"] == b"300m"  # the deadline travels with the call
    assert (headers[b":path"], headers[b"te"]) == (b"/runtime.v1.RuntimeService/Version", b"trailers")


async def _serve_h2(path: str, answer):
    """A tiny HTTP/2 server: answer(conn, stream_id) replies to each request; returns the server."""

    async def handle(reader, writer):
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        while data := await reader.read(65536):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.StreamEnded):
                    if answer(conn, event.stream_id) == "hang-up":
                        writer.close()
                        return
            writer.write(conn.data_to_send())

    return await asyncio.start_unix_server(handle, path)


def test_trailers_only_error_is_percent_decoded_and_lost_connection_is_unavailable(tmp_path):
    path = str(tmp_path / "fake.sock")
    answers = iter(["trailers-only", "hang-up", "trailers-only"])

    def answer(conn, stream_id):
        kind = next(answers)
        if kind == "trailers-only":
            conn.send_headers(stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc"),
                                          (b"grpc-status", b"9"), (b"grpc-message", b"not%20now%3A%20%E2%98%83")],
                              end_stream=True)
        return kind

    async def scenario():
        server = await _serve_h2(path, answer)
        cri = CriClient(path)
        errors = []
        try:
            for _ in range(3):
                with pytest.raises(CriError) as err:
                    await cri.call(RT + "Version", pb.VersionRequest(), pb.VersionResponse, 2)
                errors.append(err.value)
            return errors
        finally:
            await cri.close()
            server.close()

    first, lost, after = run(scenario())
    assert (first.code_name, first.details) == ("FAILED_PRECONDITION", "not now: \u2603")
    assert lost.code_name == "UNAVAILABLE"
    assert (after.code_name, after.details) == ("FAILED_PRECONDITION", "not now: \u2603")  # reconnected
