"""QoS class resolution (label, cgroup parent, mapping) and the QoS configuration dataclasses."""

from __future__ import annotations

import dataclasses

import pytest

from koordnode.model.qos_class import (
    QOS_CLASS_LABEL,
    KubeQoS,
    QoSClass,
    kube_qos_from_cgroup_parent,
    pod_uid_from_cgroup_parent,
    resolve_qos_class,
)
from koordnode.config.classes import (
    MIB,
    BEClassConfig,
    KubeQoSMapping,
    QoSClassConfig,
    QoSConfig,
)
from koordnode.config.node import NodeConfig

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
SYSTEMD_UID = UID.replace("-", "_")


@pytest.mark.parametrize("value", ["SYSTEM", "LSE", "LSR", "LS", "BE"])
def test_label_wins_over_cgroup_parent(value: str) -> None:
    decision = resolve_qos_class({QOS_CLASS_LABEL: value}, f"/kubepods/besteffort/pod{UID}")
    assert decision.qos_class == QoSClass(value)
    assert decision.source == "label"
    assert decision.label_problem is None
    assert value in decision.why
    # The Kubernetes QoS is still known (the memory policy needs it).
    assert decision.kube_qos is KubeQoS.BEST_EFFORT


@pytest.mark.parametrize("value", ["ls", "Be", "", "GOLD", " LS", "LS\n"])
def test_invalid_label_is_treated_as_absent(value: str) -> None:
    decision = resolve_qos_class({QOS_CLASS_LABEL: value}, f"/kubepods/burstable/pod{UID}")
    assert decision.qos_class is QoSClass.LS
    assert decision.source == "cgroup_parent"
    assert decision.label_problem is not None and repr(value) in decision.label_problem
    assert "invalid label" in decision.why


def test_non_string_label_value_does_not_crash() -> None:
    decision = resolve_qos_class({QOS_CLASS_LABEL: 3}, "")  # type: ignore[dict-item]
    assert decision.qos_class is QoSClass.LSR
    assert decision.label_problem


@pytest.mark.parametrize(
    ("parent", "kube_qos"),
    [
        # cgroupfs driver
        (f"/kubepods/besteffort/pod{UID}", KubeQoS.BEST_EFFORT),
        (f"/kubepods/burstable/pod{UID}", KubeQoS.BURSTABLE),
        (f"/kubepods/pod{UID}", KubeQoS.GUARANTEED),
        (f"/kubepods/burstable/pod{UID}/", KubeQoS.BURSTABLE),
        # systemd driver, as kubelet passes it (slice name) and as a full path
        (f"kubepods-besteffort-pod{SYSTEMD_UID}.slice", KubeQoS.BEST_EFFORT),
        (f"kubepods-burstable-pod{SYSTEMD_UID}.slice", KubeQoS.BURSTABLE),
        (f"kubepods-pod{SYSTEMD_UID}.slice", KubeQoS.GUARANTEED),
        (
            f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice",
            KubeQoS.BEST_EFFORT,
        ),
        (f"/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice", KubeQoS.GUARANTEED),
        # not kubelet's: assumed Guaranteed, as the issue says "otherwise"
        ("", KubeQoS.GUARANTEED),
        ("/system.slice/foo", KubeQoS.GUARANTEED),
        # a pod whose UID merely contains the word is not in that tier
        ("/kubepods/podburstable", KubeQoS.GUARANTEED),
    ],
)
def test_kube_qos_from_cgroup_parent(parent: str, kube_qos: KubeQoS) -> None:
    found, evidence = kube_qos_from_cgroup_parent(parent)
    assert found is kube_qos
    assert evidence


@pytest.mark.parametrize(
    ("parent", "expected"),
    [
        (f"/kubepods/besteffort/pod{UID}", QoSClass.BE),
        (f"/kubepods/burstable/pod{UID}", QoSClass.LS),
        (f"/kubepods/pod{UID}", QoSClass.LSR),
        (f"kubepods-besteffort-pod{SYSTEMD_UID}.slice", QoSClass.BE),
        (f"kubepods-burstable-pod{SYSTEMD_UID}.slice", QoSClass.LS),
        (f"kubepods-pod{SYSTEMD_UID}.slice", QoSClass.LSR),
    ],
)
def test_default_mapping(parent: str, expected: QoSClass) -> None:
    decision = resolve_qos_class({}, parent)
    assert decision.qos_class is expected
    assert decision.source == "cgroup_parent"
    assert expected.value in decision.why


def test_mapping_is_configurable() -> None:
    mapping = KubeQoSMapping(guaranteed="LSE", burstable="BE", best_effort="LS").as_mapping()
    assert resolve_qos_class(None, f"/kubepods/pod{UID}", mapping).qos_class is QoSClass.LSE
    assert resolve_qos_class(None, f"/kubepods/burstable/pod{UID}", mapping).qos_class is QoSClass.BE
    assert resolve_qos_class(None, f"/kubepods/besteffort/pod{UID}", mapping).qos_class is QoSClass.LS


def test_mapping_rejects_unknown_class() -> None:
    with pytest.raises(ValueError, match="guaranteed"):
        KubeQoSMapping(guaranteed="GOLD")


@pytest.mark.parametrize(
    ("parent", "uid"),
    [
        (f"/kubepods/burstable/pod{UID}", UID),
        (f"/kubepods/pod{UID}", UID),
        (f"kubepods-besteffort-pod{SYSTEMD_UID}.slice", UID),
        (f"/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice", UID),
        ("/kubepods/burstable", None),
        ("", None),
    ],
)
def test_pod_uid_from_cgroup_parent(parent: str, uid: str | None) -> None:
    assert pod_uid_from_cgroup_parent(parent) == uid


# --- configuration ---------------------------------------------------------------------------

# The issue's table, written out independently of the config module.
TABLE = {
    QoSClass.SYSTEM: dict(cpu_shares_per_cpu=32768, oom_score_adj=-1000, memory_qos=False, blkio_weight=0),
    QoSClass.LSE: dict(
        cpu_shares_per_cpu=262144,
        oom_score_adj=-900,
        memory_min_percent=100,
        memory_low_percent=120,
        memory_high_percent=90,
        blkio_weight=1000,
    ),
    QoSClass.LSR: dict(
        cpu_shares_per_cpu=65536,
        oom_score_adj=-700,
        memory_min_percent=80,
        memory_low_percent=100,
        memory_high_percent=90,
        blkio_weight=800,
    ),
    QoSClass.LS: dict(
        cpu_shares_per_cpu=1024,
        oom_score_adj=-300,
        memory_min_percent=50,
        memory_low_percent=80,
        memory_high_percent=90,
        blkio_weight=500,
    ),
    QoSClass.BE: dict(
        cpu_shares_fixed=2,
        oom_score_adj=1000,
        memory_min_percent=0,
        memory_low_percent=0,
        memory_high_percent=70,
        blkio_weight=100,
        blkio_read_bps=500 * MIB,
        blkio_write_bps=200 * MIB,
        cpu_idle=0,  # an idle BE pod draws LS wake-ups to its CPU (docs/design/2026-11-ls-latency.md, wake placement)
        cpu_bvt_warp_ns=-1,
    ),
}


@pytest.mark.parametrize("qos_class", list(QoSClass))
def test_class_defaults_match_the_issue_table(qos_class: QoSClass) -> None:
    config = QoSConfig().for_class(qos_class)
    for name, value in TABLE[qos_class].items():
        assert getattr(config, name) == value, name
    if qos_class is not QoSClass.BE:
        assert config.cpu_shares_fixed == 0
        assert config.cpu_idle == 0 and config.blkio_read_bps == 0


def test_every_numeric_field_declares_its_range() -> None:
    for spec in dataclasses.fields(QoSClassConfig):
        if spec.type in ("int", int):
            assert "min" in spec.metadata and "max" in spec.metadata, spec.name


@pytest.mark.parametrize(
    "changes",
    [
        {"cpu_shares_per_cpu": 1},
        {"cpu_shares_per_cpu": 262145},
        {"oom_score_adj": -1001},
        {"memory_min_percent": 101},
        {"memory_high_percent": -1},
        {"blkio_weight": 5},
        {"blkio_weight": 1001},
        {"cpu_idle": 2},
        {"cpu_bvt_warp_ns": -2},
        {"oom_score_adj": True},
        {"oom_score_adj": "1"},
        {"memory_qos": "yes"},
    ],
)
def test_class_config_validation(changes: dict) -> None:
    with pytest.raises(ValueError):
        QoSClassConfig(**changes)


def test_a_class_table_keeps_the_class_defaults() -> None:
    from koordnode.config import ConfigError, parse_config

    config = parse_config("[qos.BE]\noom_score_adj = 999\n").qos.BE
    assert isinstance(config, BEClassConfig)
    assert config.oom_score_adj == 999
    assert config.cpu_shares_fixed == 2  # BE's default, not LS's
    with pytest.raises(ConfigError, match="qos.LS.cpu_share: unknown key"):
        parse_config("[qos.LS]\ncpu_share = 3\n")
    with pytest.raises(ConfigError, match="qos.LS.oom_score_adj"):
        parse_config("[qos.LS]\noom_score_adj = 5000\n")


def test_node_config() -> None:
    assert NodeConfig().reserved_cpus == ""
    assert NodeConfig(reserved_cpus="0-1").reserved_cpus == "0-1"
    assert NodeConfig(reserved_cpus=2).reserved_cpus == 2
    config = NodeConfig(blkio_devices=["8:0", "253:1"], system_cpus="0")  # type: ignore[arg-type]
    assert config.blkio_devices == ("8:0", "253:1")
    assert config.system_cpu_set == {0}
    hash(config)
    for bad in (
        {"reserved_cpus": -1},
        {"reserved_cpus": "0-"},
        {"reserved_cpus": True},
        {"reserved_cpus": 1.5},
        {"system_cpus": "x"},
        {"blkio_devices": "8:0"},
        {"blkio_devices": ["sda"]},
        {"cpuset_mems_follow_cpus": 1},
    ):
        with pytest.raises(ValueError):
            NodeConfig(**bad)


def test_sections_load_through_the_generic_config_loader() -> None:
    from koordnode.config import ConfigError, from_dict

    @dataclasses.dataclass(frozen=True)
    class Root:
        qos: QoSConfig = dataclasses.field(default_factory=QoSConfig)
        node: NodeConfig = dataclasses.field(default_factory=NodeConfig)
        qos_mapping: KubeQoSMapping = dataclasses.field(default_factory=KubeQoSMapping)

    loaded = from_dict(
        Root,
        {
            "qos": {"BE": {"oom_score_adj": 999}},
            "node": {"reserved_cpus": 2, "blkio_devices": ["8:0"]},
            "qos_mapping": {"burstable": "BE"},
        },
    )
    assert loaded.qos.BE.oom_score_adj == 999 and loaded.qos.BE.cpu_shares_fixed == 2
    assert loaded.qos.LS == QoSConfig().LS
    assert loaded.node.reserved_cpus == 2 and loaded.node.blkio_devices == ("8:0",)
    assert from_dict(Root, {"node": {"reserved_cpus": "0-1"}}).node.reserved_cpus == "0-1"
    assert loaded.qos_mapping.as_mapping()[KubeQoS.BURSTABLE] is QoSClass.BE
    for bad in (
        {"qos": {"BE": {"oom_score_adj": 5000}}},
        {"qos": {"LS": {"blkio_weight": 5}}},
        {"qos_mapping": {"burstable": "GOLD"}},
        {"node": {"reserved_cpus": "x"}},
        {"qos": {"GOLD": {}}},
    ):
        with pytest.raises(ConfigError):
            from_dict(Root, bad)


def test_a_huge_invalid_label_is_quoted_bounded() -> None:
    # Label values are pod input: the reason (status, logs, each reconcile) quotes a prefix.
    from koordnode.hooks.chain import SKIP_LABEL, skip_requested

    decision = resolve_qos_class({"koordinator.sh/qosClass": "X" * 1_000_000}, "/kubepods/burstable/poda")
    assert decision.qos_class is QoSClass.LS
    assert len(decision.why) < 300 and "(1000000 characters)" in decision.why
    assert not skip_requested({SKIP_LABEL: "true" * 250_000})
    assert skip_requested({SKIP_LABEL: "True"})
