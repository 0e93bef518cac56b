"""Network QoS policy (pure): HTB trees, the nftables classifier, annotations, config."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from koordnode.config import ConfigError, from_dict
from koordnode.cri import api_pb2 as pb
from koordnode.model.network import pod_network_from_status
from koordnode.config.netqos import NetQoSConfig
from koordnode.policy.net import (
    NETWORK_QOS_ANNOTATION,
    HtbClass,
    PodLimits,
    PodNetwork,
    classid,
    parse_network_qos,
    plan_network,
)

CONFIG = NetQoSConfig(enable=True, link_rate_mbps=200, be_rate_mbps=20, be_ceil_mbps=40)
M = 1_000_000


def pod(sid: str, qos: str | None, *ips: str, limits: str | None = None, **kw) -> PodNetwork:
    annotations = {NETWORK_QOS_ANNOTATION: limits} if limits is not None else {}
    return PodNetwork(sid, f"default/{sid}", qos, ips, annotations=annotations, **kw)


def test_uplink_tree_has_a_class_per_priority() -> None:
    plan = plan_network(CONFIG, [], ["eth0"])
    (tree,) = plan.trees
    assert tree.device == "eth0" and tree.role == "uplink"
    assert tree.default_minor == 0x20  # SYSTEM's leaf takes unclassified traffic
    assert [(c.minor, c.parent_minor, c.rate_bps, c.ceil_bps, c.prio) for c in tree.classes] == [
        (0x1, 0x0, 200 * M, 200 * M, 0),
        # 200 - 20 (BE) shared by the three other priorities as guarantees; all may borrow
        # the whole link.
        (0x10, 0x1, 60 * M, 200 * M, 0), (0x20, 0x10, 60 * M, 200 * M, 0),
        (0x11, 0x1, 60 * M, 200 * M, 1), (0x21, 0x11, 60 * M, 200 * M, 1),
        (0x12, 0x1, 60 * M, 200 * M, 2), (0x22, 0x12, 60 * M, 200 * M, 2),
        (0x13, 0x1, 20 * M, 40 * M, 3), (0x23, 0x13, 20 * M, 40 * M, 3),
    ]
    assert HtbClass(0x13, 0x1, 1, 1, 3, "").handle == 0x4B4E0013 == classid(0x13)


def test_pods_map_to_their_priority_leaf_by_ip() -> None:
    pods = [
        pod("a", "LS", "10.1.0.5"),
        pod("b", "BE", "10.1.0.6", "fd00::6"),
        pod("c", "LSE", "10.1.0.7"),
        pod("d", "LSR", "10.1.0.8"),
        pod("e", "SYSTEM", "10.1.0.9"),
    ]
    plan = plan_network(CONFIG, pods, ["eth0", "eth1"])
    assert [t.device for t in plan.trees] == ["eth0", "eth1"]
    assert plan.egress4 == (("10.1.0.5", "4b4e:22"), ("10.1.0.6", "4b4e:23"), ("10.1.0.7", "4b4e:20"),
                            ("10.1.0.8", "4b4e:21"), ("10.1.0.9", "4b4e:20"))
    assert plan.egress6 == (("fd00::6", "4b4e:23"),)
    assert plan.skipped == ()


def test_nft_table_text_byte_for_byte() -> None:
    plan = plan_network(CONFIG, [pod("a", "LS", "10.1.0.5"), pod("b", "BE", "10.1.0.6")], ["eth0"])
    assert plan.nft_body() == (
        "table inet koordnode {\n"
        "  set uplinks {\n"
        "    type ifname\n"
        '    elements = { "eth0" }\n'
        "  }\n"
        "  map egress4 {\n"
        "    type ipv4_addr : classid\n"
        "    elements = { 10.1.0.5 : 4b4e:22, 10.1.0.6 : 4b4e:23 }\n"
        "  }\n"
        "  map egress6 {\n"
        "    type ipv6_addr : classid\n"
        "  }\n"
        "  map ingress4 {\n"
        "    type ifname . ipv4_addr : classid\n"
        "  }\n"
        "  map ingress6 {\n"
        "    type ifname . ipv6_addr : classid\n"
        "  }\n"
        "  chain postrouting {\n"
        "    type filter hook postrouting priority mangle; policy accept;\n"
        "    oifname @uplinks meta priority set ip saddr map @egress4\n"
        "    oifname @uplinks meta priority set ip6 saddr map @egress6\n"
        "    meta priority set oifname . ip daddr map @ingress4\n"
        "    meta priority set oifname . ip6 daddr map @ingress6\n"
        "  }\n"
        "}\n"
    )
    script = plan.nft_script()
    # Atomic replace: create (so that delete cannot fail), delete, define, in one transaction.
    assert script.startswith("table inet koordnode\ndelete table inet koordnode\n"
                             "table inet koordnode {\n"
                             f'  comment "koordnode netqos {plan.fingerprint}"\n')


def test_fingerprint_follows_content_only() -> None:
    one = plan_network(CONFIG, [pod("a", "LS", "10.1.0.5")], ["eth0"])
    again = plan_network(CONFIG, [pod("a", "LS", "10.1.0.5")], ["eth0"])
    other = plan_network(CONFIG, [pod("a", "BE", "10.1.0.5")], ["eth0"])
    assert one.fingerprint == again.fingerprint != other.fingerprint


def test_unclassifiable_pods_are_skipped_with_a_reason() -> None:
    pods = [
        pod("h", "BE", "192.168.1.10", host_network=True),
        pod("n", "BE"),
        pod("x", None, "10.1.0.5"),
        pod("l", "BE", "192.168.1.10"),  # the node's own address
        pod("z", "BE", "not-an-ip"),
        pod("k", "BE", "10.9.0.1"),  # excluded network
        pod("p", "LS", "10.1.0.6"),
        pod("q", "BE", "10.1.0.6"),  # same IP as p (a stale record)
    ]
    config = NetQoSConfig(enable=True, exclude_cidrs=("10.9.0.0/16",))
    plan = plan_network(config, pods, ["eth0"], local_ips=["192.168.1.10"])
    assert plan.egress4 == (("10.1.0.6", "4b4e:22"),)
    reasons = {s.pod: s.reason for s in plan.skipped}
    assert reasons["default/h"].startswith("host network")
    assert reasons["default/n"] == "no pod IP to classify"
    assert "None" in reasons["default/x"]
    assert reasons["default/l"] == "no pod IP to classify"
    assert "not-an-ip" in reasons["default/z"]
    assert reasons["default/k"] == "no pod IP to classify"
    assert reasons["default/q"] == "IP 10.1.0.6 is already default/p's"


def test_egress_limit_adds_a_pod_leaf_inside_its_class() -> None:
    pods = [pod("be1", "BE", "10.1.0.6", limits='{"egressLimit": "10M"}'),
            pod("be2", "BE", "10.1.0.7"),
            pod("ls1", "LS", "10.1.0.8", limits='{"egressLimit": "1G"}')]
    plan = plan_network(CONFIG, pods, ["eth0"])
    classes = {c.label: c for c in plan.trees[0].classes}
    be_leaf = classes["egress limit of default/be1"]
    ls_leaf = classes["egress limit of default/ls1"]
    assert be_leaf.minor >= 0x100 and be_leaf.parent_minor == 0x13
    assert be_leaf.ceil_bps == 10 * M and be_leaf.rate_bps == 10 * M
    # Children's guarantees stay within their parent's: BE's 20 M shared by 2 leaves.
    assert classes["BE pods"].rate_bps == 10 * M
    # A limit above the link is just the link.
    assert ls_leaf.parent_minor == 0x12 and ls_leaf.ceil_bps == 200 * M
    assert dict(plan.egress4) == {"10.1.0.6": f"4b4e:{be_leaf.minor:x}", "10.1.0.7": "4b4e:23",
                                  "10.1.0.8": f"4b4e:{ls_leaf.minor:x}"}


def test_pod_leaf_minors_are_stable_and_distinct() -> None:
    pods = [pod(f"sandbox-{i}", "BE", f"10.2.{i // 250}.{i % 250 + 1}", limits='{"egressLimit": "1M"}')
            for i in range(300)]
    first = plan_network(CONFIG, pods, ["eth0"])
    minors = [c.minor for c in first.trees[0].classes if c.label.startswith("egress limit")]
    assert len(set(minors)) == 300 and all(0x100 <= m <= 0xFFFE for m in minors)
    assert plan_network(CONFIG, list(reversed(pods)), ["eth0"]).trees == first.trees


def test_ingress_limit_shapes_the_device_the_pod_is_routed_to() -> None:
    pods = [pod("be1", "BE", "10.1.0.6", limits='{"ingressLimit": "100M"}'),
            pod("ls1", "LS", "10.1.0.7", limits='{"IngressLimit": "50M"}'),
            pod("ls2", "LS", "10.1.0.8", limits='{"ingressLimit": "5M"}')]
    routes = {"10.1.0.6": "cni0", "10.1.0.7": "cni0", "10.1.0.8": "eth0"}  # eth0: the uplink
    plan = plan_network(CONFIG, pods, ["eth0"], route_devices=routes)
    (uplink, cni0) = plan.trees
    assert cni0.device == "cni0" and cni0.role == "ingress" and cni0.default_minor == 0x2
    leaves = {c.label: c for c in cni0.classes}
    assert leaves["ingress limit of default/be1"].ceil_bps == 100 * M
    assert leaves["ingress limit of default/ls1"].ceil_bps == 50 * M
    assert leaves["unlimited"].rate_bps == 100_000 * M - 150 * M
    assert [(dev, ip) for dev, ip, _ in plan.ingress4] == [("cni0", "10.1.0.6"), ("cni0", "10.1.0.7")]


def test_pod_limits_can_be_switched_off() -> None:
    config = NetQoSConfig(enable=True, pod_limits=False)
    plan = plan_network(config, [pod("a", "BE", "10.1.0.6", limits='{"egressLimit": "1M"}')], ["eth0"])
    assert dict(plan.egress4) == {"10.1.0.6": "4b4e:23"}


@pytest.mark.parametrize(
    ("text", "limits"),
    [
        ('{"ingressLimit":"100M","egressLimit":"200M"}', PodLimits(200 * M, 100 * M)),
        ('{"IngressLimit":"1G","EgressLimit":""}', PodLimits(None, 1000 * M)),
        ('{"egressLimit":"1.5M","other":"x"}', PodLimits(1_500_000, None)),
        ('{"egressLimit": 8000}', PodLimits(8000, None)),
        ("{}", PodLimits()),
    ],
)
def test_parse_network_qos(text: str, limits: PodLimits) -> None:
    assert parse_network_qos(text) == limits


@pytest.mark.parametrize("text", ["[]", "nope", '{"egressLimit":"fast"}', '{"egressLimit":"10"}',
                                  '{"egressLimit":true}', '{"egressLimit":"-5M"}'])
def test_parse_network_qos_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="networkQOS"):
        parse_network_qos(text)


def test_bad_annotation_keeps_the_pod_classified_without_limits() -> None:
    plan = plan_network(CONFIG, [pod("a", "BE", "10.1.0.6", limits="{oops")], ["eth0"])
    assert dict(plan.egress4) == {"10.1.0.6": "4b4e:23"}
    assert "limits ignored" in plan.skipped[0].reason


def test_custom_priorities_merge_classes() -> None:
    config = from_dict(NetQoSConfig, {"enable": True, "priorities": {"LSR": 0, "LS": 0}})
    assert config.priorities == {"SYSTEM": 0, "LSE": 0, "LSR": 0, "LS": 0, "BE": 3}
    plan = plan_network(config, [pod("a", "LS", "10.1.0.5")], ["eth0"])
    assert sorted(c.minor for c in plan.trees[0].classes) == [0x1, 0x10, 0x13, 0x20, 0x23]
    assert dict(plan.egress4) == {"10.1.0.5": "4b4e:20"}


def test_config_validation() -> None:
    with pytest.raises(ConfigError, match="BE needs a tc class of its own"):
        from_dict(NetQoSConfig, {"priorities": {"LS": 3}})
    with pytest.raises(ConfigError, match="be_ceil_mbps: must be >= be_rate_mbps"):
        from_dict(NetQoSConfig, {"be_rate_mbps": 600, "be_ceil_mbps": 500})
    with pytest.raises(ConfigError, match="be_ceil_mbps: must be <= link_rate_mbps"):
        from_dict(NetQoSConfig, {"link_rate_mbps": 100})
    with pytest.raises(ConfigError, match="interfaces"):
        from_dict(NetQoSConfig, {"interfaces": ["eth0; rm -rf /"]})
    with pytest.raises(ConfigError, match="priorities"):
        from_dict(NetQoSConfig, {"priorities": {"BE": 9}})
    with pytest.raises(ConfigError, match="exclude_cidrs"):
        from_dict(NetQoSConfig, {"exclude_cidrs": ["10.0.0.0/33"]})
    default = NetQoSConfig()
    assert not default.enable and default.interfaces == ()
    assert (default.be_rate_mbps, default.be_ceil_mbps) == (500, 1000)


def test_unsafe_interface_name_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be shaped"):
        plan_network(CONFIG, [], ['eth"0'])


def test_pod_network_from_sandbox_status() -> None:
    status = pb.PodSandboxStatus()
    status.network.ip = "10.1.0.5"
    status.network.additional_ips.add(ip="fd00::5")
    assert pod_network_from_status(status) == (("10.1.0.5", "fd00::5"), False)
    status.linux.namespaces.options.network = pb.NODE
    assert pod_network_from_status(status)[1] is True
    assert pod_network_from_status(SimpleNamespace(
        network=SimpleNamespace(ip="", additional_ips=[]),
        linux=SimpleNamespace(namespaces=SimpleNamespace(options=SimpleNamespace(network=0)))),
    ) == ((), False)


def test_deeply_nested_annotation_is_refused_and_the_pod_still_shaped() -> None:
    # Reliability: a few thousand "[" raised RecursionError out of the network reconcile,
    # which stopped shaping for every pod of the node.
    hostile = "[" * 4000
    with pytest.raises(ValueError, match="networkQOS"):
        parse_network_qos(hostile)
    plan = plan_network(CONFIG, [pod("a", "BE", "10.1.0.6", limits=hostile), pod("b", "LS", "10.1.0.7")],
                        ["eth0"])
    assert dict(plan.egress4) == {"10.1.0.6": "4b4e:23", "10.1.0.7": "4b4e:22"}
    assert "nested too deeply" in plan.skipped[0].reason


def test_one_pod_failing_unexpectedly_leaves_the_others_shaped(monkeypatch) -> None:
    import koordnode.policy.net as net_policy

    real = net_policy.parse_network_qos

    def explode(text):
        if text == "boom":
            raise RuntimeError("unexpected")
        return real(text)

    monkeypatch.setattr(net_policy, "parse_network_qos", explode)
    plan = plan_network(CONFIG, [pod("a", "BE", "10.1.0.6", limits="boom"),
                                 pod("b", "LS", "10.1.0.7", limits='{"egressLimit":"10M"}')], ["eth0"])
    assert [ip for ip, _ in plan.egress4] == ["10.1.0.7"]
    assert plan.skipped[0].pod == "default/a" and "RuntimeError" in plan.skipped[0].reason
