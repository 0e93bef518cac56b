"""Network QoS on the real kernel, inside network namespaces this test creates and deletes.

Topology (names unique per test, every namespace deleted afterwards):

    pod-ls (10.231.0.10) --veth--+
                                 br0 (10.231.0.1) [node]  up0 (10.232.0.1) --veth-- up1 (10.232.0.2) [peer]
    pod-be (10.231.0.11) --veth--+

The node namespace forwards between the pods' bridge and the uplink; with ``masquerade``
it also SNATs pod traffic leaving up0 (so the uplink only ever sees 10.232.0.1 as source).
Traffic is plain TCP from a tiny sender to a receiver (both bounded in bytes and time),
measured at the receiver over the steady part of the transfer.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from koordnode.executor.netqos import NetQoSExecutor
from koordnode.qos.net_control import NetQoSController
from koordnode.config.netqos import NetQoSConfig
from koordnode.policy.net import NETWORK_QOS_ANNOTATION, PodNetwork

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nft"),
    reason="needs root, iproute2 and nftables",
)

POD_NET = "10.231.0"
UPLINK_NET = "10.232.0"
LS_IP, BE_IP, PEER_IP = f"{POD_NET}.10", f"{POD_NET}.11", f"{UPLINK_NET}.2"

LINK_MBPS = 200
BE_MBPS = 20
SECONDS = 3.0
TOLERANCE = 0.15

# A self-contained traffic tool run with `python3 -c` inside a namespace.
#   recv PORT CONNECTIONS DEADLINE_S  -> prints "ready", then JSON
#        {"rates": {label: Mbit/s}, "sources": {label: source address seen}}
#   send HOST PORT LABEL SECONDS MAX_BYTES
_TRAFFIC_TOOL = r"""
import json, socket, sys, threading, time

def recv(port, expected, deadline):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(8)
    print("ready", flush=True)
    end = time.monotonic() + deadline
    results, sources, threads = {}, {}, []

    def handle(conn, peer):
        conn.settimeout(max(end - time.monotonic(), 0.1))
        label, buf = b"", b""
        while b"\n" not in buf:
            chunk = conn.recv(64)
            if not chunk:
                return
            buf += chunk
        label, rest = buf.split(b"\n", 1)
        start, total, marks = time.monotonic(), len(rest), []
        try:
            while time.monotonic() < end:
                data = conn.recv(1 << 16)
                if not data:
                    break
                total += len(data)
                marks.append((time.monotonic() - start, total))
        except OSError:
            pass
        steady = [m for m in marks if m[0] >= 1.0]  # skip slow start and bursts
        if len(steady) < 2:  # an unshaped transfer may be over (max bytes) within a second
            steady = marks
        if len(steady) >= 2 and steady[-1][0] > steady[0][0]:
            mbps = (steady[-1][1] - steady[0][1]) * 8 / (steady[-1][0] - steady[0][0]) / 1e6
        else:
            mbps = 0.0
        results[label.decode()] = round(mbps, 2)
        sources[label.decode()] = peer

    while len(threads) < expected and time.monotonic() < end:
        server.settimeout(max(end - time.monotonic(), 0.1))
        try:
            conn, address = server.accept()
        except OSError:
            break
        thread = threading.Thread(target=handle, args=(conn, address[0]))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(max(end - time.monotonic(), 0) + 1)
    print(json.dumps({"rates": results, "sources": sources}), flush=True)

def send(host, port, label, seconds, max_bytes):
    conn = socket.create_connection((host, port), timeout=5)
    conn.sendall(label.encode() + b"\n")
    block, sent, end = b"x" * 65536, 0, time.monotonic() + seconds
    while time.monotonic() < end and sent < max_bytes:
        sent += conn.send(block)
    conn.close()

if sys.argv[1] == "recv":
    recv(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
else:
    send(sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5]), int(sys.argv[6]))
"""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done


@dataclass
class Topology:
    tag: str
    masquerade: bool
    processes: list[subprocess.Popen[str]] = field(default_factory=list)
    last_sources: dict[str, str] = field(default_factory=dict)

    @property
    def node(self) -> str:
        return f"kn-node-{self.tag}"

    @property
    def peer(self) -> str:
        return f"kn-peer-{self.tag}"

    @property
    def pod_ls(self) -> str:
        return f"kn-ls-{self.tag}"

    @property
    def pod_be(self) -> str:
        return f"kn-be-{self.tag}"

    @property
    def namespaces(self) -> list[str]:
        return [self.node, self.peer, self.pod_ls, self.pod_be]

    def create(self) -> None:
        try:
            _run("ip", "netns", "add", self.namespaces[0])
        except RuntimeError as err:
            pytest.skip(f"cannot create network namespaces here: {err}")
        for ns in self.namespaces[1:]:
            _run("ip", "netns", "add", ns)
        for ns in self.namespaces:
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        node, peer = self.node, self.peer
        _run("ip", "-n", node, "link", "add", "up0", "type", "veth", "peer", "name", "up1", "netns", peer)
        _run("ip", "-n", node, "addr", "add", f"{UPLINK_NET}.1/24", "dev", "up0")
        _run("ip", "-n", node, "link", "set", "up0", "up")
        _run("ip", "-n", peer, "addr", "add", f"{PEER_IP}/24", "dev", "up1")
        _run("ip", "-n", peer, "link", "set", "up1", "up")
        _run("ip", "-n", node, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", node, "addr", "add", f"{POD_NET}.1/24", "dev", "br0")
        _run("ip", "-n", node, "link", "set", "br0", "up")
        for ns, ip, host_side in ((self.pod_ls, LS_IP, "hls"), (self.pod_be, BE_IP, "hbe")):
            _run("ip", "-n", node, "link", "add", host_side, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "-n", node, "link", "set", host_side, "master", "br0")
            _run("ip", "-n", node, "link", "set", host_side, "up")
            _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "route", "add", "default", "via", f"{POD_NET}.1")
        _run("ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        _run("ip", "-n", node, "route", "add", "default", "via", PEER_IP)
        if self.masquerade:
            # The CNI's SNAT, as a separate nftables table (what iptables-nft would create).
            script = (f"table ip cni-nat {{\n"
                      f"  chain post {{\n"
                      f"    type nat hook postrouting priority srcnat; policy accept;\n"
                      f"    ip saddr {POD_NET}.0/24 oifname \"up0\" masquerade\n"
                      f"  }}\n"
                      f"}}\n")
            subprocess.run(["ip", "netns", "exec", node, "nft", "-f", "-"], input=script, text=True,
                           check=True, capture_output=True, timeout=30)
        else:
            _run("ip", "-n", peer, "route", "add", f"{POD_NET}.0/24", "via", f"{UPLINK_NET}.1")

    def destroy(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        for ns in self.namespaces:
            _run("ip", "netns", "del", ns, check=False)

    # ---------------------------------------------------------------- traffic

    def _spawn(self, ns: str, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", _TRAFFIC_TOOL, *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.processes.append(proc)
        return proc

    def measure(self, receiver_ns: str, target_ip: str, senders: dict[str, str], port: int = 5201) -> dict[str, float]:
        """Run one sender per {label: namespace} at once towards target_ip; Mbit/s per label."""
        receiver = self._spawn(receiver_ns, "recv", str(port), str(len(senders)), str(SECONDS + 3))
        ready, _, _ = select.select([receiver.stdout], [], [], 10)
        assert ready and receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
        max_bytes = str(int(LINK_MBPS * 1e6 / 8 * SECONDS * 4))  # far above what the link carries
        procs = [self._spawn(ns, "send", target_ip, str(port), label, str(SECONDS), max_bytes)
                 for label, ns in senders.items()]
        for proc in procs:
            proc.wait(timeout=SECONDS + 15)
        out, err = receiver.communicate(timeout=SECONDS + 15)
        assert receiver.returncode == 0, err
        result = json.loads(out.strip().splitlines()[-1])
        self.last_sources = result["sources"]
        return result["rates"]


@pytest.fixture
def topology(request: pytest.FixtureRequest) -> Iterator[Topology]:
    topo = Topology(uuid.uuid4().hex[:6], masquerade=getattr(request, "param", False))
    try:
        topo.create()
        yield topo
    finally:
        topo.destroy()


def _config(**overrides) -> NetQoSConfig:
    values = dict(enable=True, interfaces=("up0",), link_rate_mbps=LINK_MBPS,
                  be_rate_mbps=BE_MBPS, be_ceil_mbps=BE_MBPS)
    values.update(overrides)
    return NetQoSConfig(**values)


def _pods(be_annotations: dict[str, str] | None = None, ls_annotations: dict[str, str] | None = None) -> list[PodNetwork]:
    return [
        PodNetwork("sandbox-ls", "default/ls", "LS", (LS_IP,), annotations=ls_annotations or {}),
        PodNetwork("sandbox-be", "default/be", "BE", (BE_IP,), annotations=be_annotations or {}),
    ]


def _within(measured: float, expected: float) -> bool:
    return abs(measured - expected) <= TOLERANCE * expected


def _tc(ns: str, *args: str) -> str:
    return _run("tc", "-n", ns, *args).stdout


@pytest.mark.parametrize("topology", [False, True], ids=["routed", "masquerade"], indirect=True)
def test_be_pod_is_capped_while_ls_pod_is_not(topology: Topology) -> None:
    controller = NetQoSController(_config(), NetQoSExecutor(netns=topology.node))
    report = controller.reconcile(_pods())
    assert not report.failures, report.failures
    rates = topology.measure(topology.peer, PEER_IP, {"ls": topology.pod_ls, "be": topology.pod_be})
    print(f"masquerade={topology.masquerade}: {rates} from {topology.last_sources}")
    if topology.masquerade:  # the uplink only ever saw the node's address
        assert topology.last_sources == {"ls": f"{UPLINK_NET}.1", "be": f"{UPLINK_NET}.1"}
    else:
        assert topology.last_sources == {"ls": LS_IP, "be": BE_IP}
    assert _within(rates["be"], BE_MBPS), rates
    assert rates["ls"] > 0.5 * LINK_MBPS, rates  # LS keeps (nearly) all of the rest
    # The BE class did the capping (not, say, the CPU): its counters saw the traffic.
    stats = _tc(topology.node, "-s", "class", "show", "dev", "up0", "classid", "4b4e:23")
    assert "Sent 0 bytes" not in stats


def test_without_koordnode_be_is_not_capped(topology: Topology) -> None:
    rates = topology.measure(topology.peer, PEER_IP, {"be": topology.pod_be})
    assert rates["be"] > 3 * BE_MBPS, rates


def test_reapply_and_restart_change_nothing(topology: Topology) -> None:
    first = NetQoSController(_config(), NetQoSExecutor(netns=topology.node)).reconcile(_pods())
    assert first.changes and not first.failures
    classes = _tc(topology.node, "class", "show", "dev", "up0")
    nft = _run("ip", "netns", "exec", topology.node, "nft", "list", "table", "inet", "koordnode").stdout
    # Same controller again, and a fresh one as after a daemon restart.
    controller = NetQoSController(_config(), NetQoSExecutor(netns=topology.node))
    assert controller.reconcile(_pods()).changes == []
    assert controller.reconcile(_pods()).changes == []
    assert _tc(topology.node, "class", "show", "dev", "up0") == classes
    assert _run("ip", "netns", "exec", topology.node, "nft", "list", "table", "inet", "koordnode").stdout == nft


def test_changes_follow_config_and_pods(topology: Topology) -> None:
    executor = NetQoSExecutor(netns=topology.node)
    controller = NetQoSController(_config(), executor)
    controller.reconcile(_pods(be_annotations={NETWORK_QOS_ANNOTATION: '{"egressLimit": "5M"}'}))
    assert "4b4e:13" in _tc(topology.node, "class", "show", "dev", "up0")
    # BE's ceiling raised, the egress limit annotation gone: one class changed, one removed,
    # the classifier rewritten; nothing else.
    controller.update_config(_config(be_ceil_mbps=40))
    report = controller.reconcile(_pods())
    assert len([c for c in report.changes if "changed class 4b4e:13 " in c]) == 1
    assert len([c for c in report.changes if "removed class" in c]) == 1
    assert [c for c in report.changes if c.startswith("nft:")]
    assert not [c for c in report.changes if "added class" in c or "htb 4b4e:" in c]
    assert "ceil 40Mbit" in _tc(topology.node, "class", "show", "dev", "up0", "classid", "4b4e:13")


def test_disable_removes_only_what_koordnode_added(topology: Topology) -> None:
    node = topology.node
    # Someone else's qdisc and table.
    _run("tc", "-n", node, "qdisc", "add", "dev", "hls", "root", "handle", "7:", "tbf",
         "rate", "1gbit", "burst", "64k", "latency", "50ms")
    subprocess.run(["ip", "netns", "exec", node, "nft", "-f", "-"], check=True, text=True, timeout=30,
                   input="table inet someone {\n chain c {\n  type filter hook output priority 0; policy accept;\n }\n}\n")
    controller = NetQoSController(_config(), NetQoSExecutor(netns=node))
    controller.reconcile(_pods(be_annotations={NETWORK_QOS_ANNOTATION: '{"ingressLimit": "10M"}'}))
    assert sorted(controller.executor.owned_devices()) == ["br0", "up0"]

    controller.update_config(_config(enable=False))
    report = controller.reconcile(_pods())
    assert not report.failures
    assert controller.executor.owned_devices() == []
    assert "htb" not in _tc(node, "qdisc", "show", "dev", "up0")
    assert "tbf 7:" in _tc(node, "qdisc", "show", "dev", "hls")
    tables = _run("ip", "netns", "exec", node, "nft", "list", "tables").stdout
    assert "inet someone" in tables and "koordnode" not in tables
    assert controller.reconcile(_pods()).changes == []  # nothing left to remove


def test_pod_limits_from_the_annotation(topology: Topology) -> None:
    limits = '{"ingressLimit": "10M", "egressLimit": "30M"}'
    controller = NetQoSController(_config(be_rate_mbps=50, be_ceil_mbps=100), NetQoSExecutor(netns=topology.node))
    report = controller.reconcile(_pods(ls_annotations={NETWORK_QOS_ANNOTATION: limits}))
    assert not report.failures, report.failures
    up = topology.measure(topology.peer, PEER_IP, {"ls": topology.pod_ls})
    assert _within(up["ls"], 30), up
    # Downloads to the pod are shaped on br0, where the node routes the pod's address.
    down = topology.measure(topology.pod_ls, LS_IP, {"peer": topology.peer}, port=5202)
    assert _within(down["peer"], 10), down
    other = topology.measure(topology.pod_be, BE_IP, {"peer": topology.peer}, port=5203)
    assert other["peer"] > 5 * 10, other  # the other pod's downloads are not limited


def test_foreign_qdisc_on_a_pod_facing_device_is_left_alone(topology: Topology) -> None:
    node = topology.node
    _run("tc", "-n", node, "qdisc", "add", "dev", "br0", "root", "handle", "7:", "tbf",
         "rate", "1gbit", "burst", "64k", "latency", "50ms")
    controller = NetQoSController(_config(), NetQoSExecutor(netns=node))
    report = controller.reconcile(_pods(be_annotations={NETWORK_QOS_ANNOTATION: '{"ingressLimit": "10M"}'}))
    assert report.failures == ["br0: keeps its tbf 7: root qdisc; pod ingress limits there are not applied"]
    assert "tbf 7:" in _tc(node, "qdisc", "show", "dev", "br0")
    assert controller.executor.owned_devices() == ["up0"]  # egress shaping still in place


def test_missing_nft_is_reported_and_logged_once(topology: Topology) -> None:
    events: list[str] = []

    class Log:
        def info(self, event: str, **_: object) -> None:
            events.append(event)

        warning = debug = info

    executor = NetQoSExecutor(netns=topology.node, nft_command=("/nonexistent/nft",), logger=Log())
    controller = NetQoSController(_config(), executor, logger=Log())
    for _ in range(3):
        report = controller.reconcile(_pods())
        assert [f for f in report.failures if f.startswith("nft replace table")]
    assert events.count("netqos_nft_failed") == 1
    assert executor.owned_devices() == ["up0"]  # tc shaping does not depend on nft
