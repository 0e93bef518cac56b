"""The stdlib qdisc dump (koordnode/executor/rtnl.py) and pyroute2 loaded only when needed."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from koordnode.executor import rtnl
from koordnode.config.netqos import NetQoSConfig
from koordnode.executor.netqos import NetQoSExecutor, NetReport
from koordnode.qos.net_control import NetQoSController

REPO = Path(__file__).resolve().parents[1]
ROOT = 0xFFFFFFFF
OURS = 0x4B4E0000


def _attr(rta_type: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), rta_type) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _msg(msg_type: int, body: bytes, seq: int = 1, flags: int = 0x2) -> bytes:
    raw = struct.pack("=IHHII", 16 + len(body), msg_type, flags, seq, 4242) + body
    return raw + b"\0" * (-len(raw) % 4)


def _qdisc(index: int, handle: int, parent: int, kind: str, extra: bytes = b"") -> bytes:
    tcmsg = struct.pack("=BxxxiIII", 0, index, handle, parent, 1)
    return _msg(rtnl.RTM_NEWQDISC, tcmsg + extra + _attr(rtnl.TCA_KIND, kind.encode() + b"\0"))


def test_parses_qdiscs_until_done() -> None:
    # TCA_OPTIONS (2) before TCA_KIND: attributes are found wherever they are.
    data = (_qdisc(2, OURS, ROOT, "htb", extra=_attr(2, b"\x01\x02\x03\x04\x05"))
            + _qdisc(3, 0, ROOT, "fq_codel")
            + _msg(rtnl.NLMSG_DONE, struct.pack("=i", 0)))
    qdiscs, done = rtnl.parse_qdisc_dump(data, seq=1)
    assert done
    assert qdiscs == [rtnl.Qdisc(2, OURS, ROOT, "htb"), rtnl.Qdisc(3, 0, ROOT, "fq_codel")]


def test_a_datagram_without_done_is_not_the_end() -> None:
    qdiscs, done = rtnl.parse_qdisc_dump(_qdisc(7, 0x10000, ROOT, "noqueue"), seq=1)
    assert (qdiscs, done) == ([rtnl.Qdisc(7, 0x10000, ROOT, "noqueue")], False)


def test_messages_of_another_request_are_skipped() -> None:
    data = _qdisc(2, OURS, ROOT, "htb") + _msg(rtnl.NLMSG_DONE, struct.pack("=i", 0), seq=9)
    assert rtnl.parse_qdisc_dump(data, seq=9) == ([], True)


def test_netlink_error_reply_raises_oserror() -> None:
    data = _msg(rtnl.NLMSG_ERROR, struct.pack("=i", -1) + b"\0" * 16)
    with pytest.raises(OSError) as info:
        rtnl.parse_qdisc_dump(data, seq=1)
    assert info.value.errno == 1


@pytest.mark.parametrize("data", [
    _qdisc(2, OURS, ROOT, "htb")[:-6],  # cut inside the message
    _qdisc(2, OURS, ROOT, "htb", extra=struct.pack("=HH", 400, 2)),  # attribute longer than its message
    _msg(rtnl.RTM_NEWQDISC, b"\0" * 8),  # tcmsg cut short
])
def test_malformed_dump_raises_valueerror(data: bytes) -> None:
    with pytest.raises(ValueError):
        rtnl.parse_qdisc_dump(data, seq=1)


def test_interrupted_dump_raises_valueerror() -> None:
    data = _msg(rtnl.NLMSG_DONE, struct.pack("=i", 0), flags=0x2 | rtnl.NLM_F_DUMP_INTR)
    with pytest.raises(ValueError, match="interrupted"):
        rtnl.parse_qdisc_dump(data, seq=1)


# --- the disabled path: pyroute2 only when there is something of ours to remove ---------


class _NoPyroute2(Exception):
    pass


def _executor(monkeypatch, dump) -> NetQoSExecutor:
    executor = NetQoSExecutor()
    monkeypatch.setattr(rtnl, "dump_qdiscs", dump)
    monkeypatch.setattr(executor, "_nft_fingerprint", lambda: None)

    def no_pyroute2():
        raise _NoPyroute2

    monkeypatch.setattr(executor, "_ipr", no_pyroute2)
    return executor


def test_remove_all_without_our_qdiscs_does_not_use_pyroute2(monkeypatch) -> None:
    executor = _executor(monkeypatch, lambda: [rtnl.Qdisc(1, 0, ROOT, "noqueue"),
                                               rtnl.Qdisc(2, OURS, 0x10001, "htb")])  # not a root
    report = executor.remove_all()
    assert not report.changes and not report.failures


@pytest.mark.parametrize("dump_result", [
    [rtnl.Qdisc(2, OURS, ROOT, "htb")],
    OSError("netlink unavailable"),
    ValueError("interrupted"),
])
def test_remove_all_goes_to_pyroute2_when_ours_or_unsure(monkeypatch, dump_result) -> None:
    def dump():
        if isinstance(dump_result, Exception):
            raise dump_result
        return dump_result

    executor = _executor(monkeypatch, dump)
    with pytest.raises(_NoPyroute2):
        executor.remove_all()


def test_disabled_passes_stop_looking_once_nothing_of_ours_is_left(monkeypatch) -> None:
    """Disabled, the first pass (start, reload) removes what koordnode left; as only koordnode
    adds its qdiscs and table, the next passes neither dump qdiscs nor run nft."""
    looks: list[str] = []
    executor = _executor(monkeypatch, lambda: looks.append("dump") or [rtnl.Qdisc(1, 0, ROOT, "noqueue")])
    monkeypatch.setattr(executor, "_nft_fingerprint", lambda: looks.append("nft") or None)
    controller = NetQoSController(NetQoSConfig(enable=False), executor)
    for _ in range(3):
        report = controller.reconcile([])
        assert not report.changes and not report.failures
    assert looks == ["dump", "nft"]
    controller.update_config(NetQoSConfig(enable=False))  # a reload looks again
    controller.reconcile([])
    assert looks == ["dump", "nft"] * 2


def test_a_failed_disabled_pass_is_retried(monkeypatch) -> None:
    executor = _executor(monkeypatch, lambda: [])
    calls: list[int] = []

    def remove_all(report=None):
        calls.append(1)
        return NetReport(enabled=False, failures=["nft delete table: busy"] if len(calls) == 1 else [])

    monkeypatch.setattr(executor, "remove_all", remove_all)
    controller = NetQoSController(NetQoSConfig(enable=False), executor)
    for _ in range(3):
        controller.reconcile([])
    assert len(calls) == 2


def test_importing_the_daemon_does_not_load_pyroute2() -> None:
    code = "import sys, koordnode.cli, koordnode.daemon; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.check_output([sys.executable, "-c", "import json; " + code], cwd=REPO, text=True,
                                  env=dict(os.environ, PYTHONPATH=str(REPO)))
    loaded = set(json.loads(out))
    assert not {"pyroute2", "sqlite3"} & loaded


# --- the real kernel, in a namespace of our own -------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"),
                    reason="needs root, iproute2")
def test_dump_matches_the_kernel_in_a_namespace() -> None:
    ns = f"kn-rtnl-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        def ip(*args: str) -> None:
            subprocess.run(["ip", "-n", ns, *args], check=True)

        ip("link", "add", "a0", "type", "veth", "peer", "name", "a1")
        ip("link", "set", "a0", "up")
        ip("link", "set", "a1", "up")
        subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "a0", "root", "handle", "4b4e:", "htb"],
                       check=True)
        # Enough interfaces that the dump spans several datagrams.
        for i in range(120):
            ip("link", "add", f"x{i}", "type", "veth", "peer", "name", f"y{i}")
            ip("link", "set", f"x{i}", "up")
        probe = ("import json; from koordnode.executor import rtnl; from koordnode.executor.netqos "
                 "import NetQoSExecutor; q = rtnl.dump_qdiscs(); print(json.dumps({'qdiscs': "
                 "[[x.index, x.handle, x.parent, x.kind] for x in q], "
                 "'ours': NetQoSExecutor()._may_own_qdiscs()}))")
        out = subprocess.check_output(["ip", "netns", "exec", ns, sys.executable, "-c", probe], cwd=REPO,
                                      text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
        got = json.loads(out)
        links = json.loads(subprocess.check_output(["ip", "-n", ns, "-j", "link", "show", "a0"], text=True))
        roots = [q for q in got["qdiscs"] if q[2] == ROOT]
        assert [links[0]["ifindex"], OURS, ROOT, "htb"] in roots
        assert len(roots) >= 121  # a0 and every x<i> that is up
        assert got["ours"] is True
        subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", "a0", "root"], check=True)
        out = subprocess.check_output(["ip", "netns", "exec", ns, sys.executable, "-c", probe], cwd=REPO,
                                      text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert json.loads(out)["ours"] is False
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
