"""Config loading and validation: defaults, every kind of error with its key path, overrides."""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from koordnode.config import loader as config_module
from koordnode.config import (
    DEFAULTS_SOURCE,
    Config,
    ConfigError,
    describe_settings,
    from_dict,
    load_config,
    parse_config,
    reload_config,
    section,
    setting,
    to_dict,
    to_toml,
)

EXAMPLE = Path(__file__).resolve().parent.parent / "packaging" / "koordnode.toml"


@pytest.fixture(autouse=True)
def absent_default_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The machine may have a real /etc/koordnode/koordnode.toml; tests must not read it."""
    path = tmp_path / "etc" / "koordnode.toml"
    monkeypatch.setattr(config_module, "DEFAULT_CONFIG_PATH", str(path))
    return path


def errors_of(text: str, **kwargs: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, **kwargs)
    return info.value.errors


# ---------------------------------------------------------------------------------------------
# Defaults and the shipped example


def test_defaults_when_default_file_is_absent() -> None:
    config = load_config(None)
    assert config.uses_defaults and config.source == DEFAULTS_SOURCE
    assert config.proxy.listen == "/var/run/koordnode/koordnode.sock"
    assert config.proxy.backend == "/run/containerd/containerd.sock"
    assert config.proxy.hook_timeout_ms == 200
    assert config.proxy.hook_timeout_s == pytest.approx(0.2)
    assert config.proxy.failure_policy == "ignore"
    assert config.log.level == "info" and config.log.format == "json"
    assert config.admin.socket == "/var/run/koordnode/admin.sock"
    assert config == Config()


def test_default_file_is_read_when_present(absent_default_path: Path) -> None:
    absent_default_path.parent.mkdir(parents=True)
    absent_default_path.write_text('[log]\nlevel = "debug"\n')
    config = load_config(None)
    assert config.source == str(absent_default_path)
    assert not config.uses_defaults
    assert config.log.level == "debug"


def test_empty_file_gives_defaults() -> None:
    assert parse_config("") == Config()


def test_example_file_parses_to_exactly_the_defaults() -> None:
    config = load_config(EXAMPLE)
    assert config == Config()
    assert config.source == str(EXAMPLE)


def _leaf_keys(raw: Mapping[str, Any], path: str = "", documented: frozenset[str] = frozenset()) -> Iterator[str]:
    for key, value in raw.items():
        full = f"{path}.{key}" if path else key
        # A key whose value is itself a table of values (e.g. net.priorities) is one setting.
        if isinstance(value, Mapping) and full not in documented:
            yield from _leaf_keys(value, full, documented)
        else:
            yield full


def test_example_file_lists_every_key_with_its_default() -> None:
    raw = tomllib.loads(EXAMPLE.read_text())
    documented = {s.key for s in describe_settings()}
    assert set(_leaf_keys(raw, documented=frozenset(documented))) == documented
    for item in describe_settings():
        value: Any = raw
        for part in item.key.split("."):
            value = value[part]
        assert value == item.default, item.key


def test_every_setting_has_a_doc() -> None:
    undocumented = [s.key for s in describe_settings() if not s.doc]
    assert undocumented == []


def test_config_is_frozen() -> None:
    config = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.proxy.listen = "/x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.log = None  # type: ignore[misc]


def test_to_toml_round_trips() -> None:
    config = parse_config(
        '[proxy]\nlisten = "/run/k n\\"ode.sock"\nhook_timeout_ms = 5\nfailure_policy = "fail"\n'
        '[log]\nformat = "console"\n'
    )
    assert parse_config(to_toml(config)) == config
    assert to_dict(config)["proxy"]["hook_timeout_ms"] == 5


# ---------------------------------------------------------------------------------------------
# Errors, each with its key path


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('[proxy]\nhook_timeout_ms = "fast"',
         'proxy.hook_timeout_ms: expected an integer in [1, 60000], got "fast"'),
        ("[proxy]\nhook_timeout_ms = 0",
         "proxy.hook_timeout_ms: expected an integer in [1, 60000], got 0"),
        ("[proxy]\nhook_timeout_ms = 60001",
         "proxy.hook_timeout_ms: expected an integer in [1, 60000], got 60001"),
        ("[proxy]\nhook_timeout_ms = 2.5",
         "proxy.hook_timeout_ms: expected an integer in [1, 60000], got 2.5"),
        ("[proxy]\nhook_timeout_ms = true",
         "proxy.hook_timeout_ms: expected an integer in [1, 60000], got true"),
        ('[log]\nformat = "xml"',
         'log.format: expected one of "json", "console", got "xml"'),
        ('[log]\nlevel = "INFO"',
         'log.level: expected one of "debug", "info", "warning", "error", got "INFO"'),
        ('[proxy]\nfailure_policy = "open"',
         'proxy.failure_policy: expected one of "ignore", "fail", got "open"'),
        ("[proxy]\nlisten = 5", "proxy.listen: expected a string, got 5"),
        ("[proxy]\nlisten = 1979-05-27", "proxy.listen: expected a string, got 1979-05-27"),
        ('[proxy]\nlisten = ["/a"]', 'proxy.listen: expected a string, got ["/a"]'),
        ('[proxy]\nbackend = "tcp://10.0.0.1:1234"',
         'proxy.backend: only unix sockets are supported, got "tcp://10.0.0.1:1234"'),
        ('[proxy]\nbackend = "run/containerd.sock"',
         'proxy.backend: expected an absolute path, got "run/containerd.sock"'),
        ('[proxy]\nlisten = ""',
         "proxy.listen: expected a unix socket path, got an empty string"),
        (f'[admin]\nsocket = "/{"x" * 120}"',
         "admin.socket: socket path is 121 bytes long; the kernel limit is 107"),
        ('proxy = "yes"', 'proxy: expected a table, got "yes"'),
        ("[proxy]\nlistn = '/x'", 'proxy.listn: unknown key (did you mean "listen"?)'),
        ("[proxy]\nzzz = 1", "proxy.zzz: unknown key"),
        ("[proxyy]\nlisten = '/x'", 'proxyy: unknown key (did you mean "proxy"?)'),
        ("source = 'x'", "source: unknown key"),
        ('[log.extra]\nx = 1', "log.extra: unknown key"),
        ('[proxy]\n"odd key" = 1', 'proxy."odd key": unknown key'),
        ('[proxy]\nlisten = "unix:///run/containerd/containerd.sock"',
         "proxy.listen: is the same socket as backend; koordnode would call itself"),
        ('[admin]\nsocket = "/var/run/koordnode/koordnode.sock"',
         "admin.socket: must differ from proxy.listen and proxy.backend"),
    ],
)
def test_error_names_its_key_path(text: str, error: str) -> None:
    assert errors_of(text) == [error]


# ---------------------------------------------------------------------------------------------
# [kubernetes]


def test_kubernetes_is_off_by_default() -> None:
    kube = Config().kubernetes
    assert kube.enable is False
    assert (kube.kubeconfig, kube.node_name) == ("", "")
    assert kube.service_account_dir == "/var/run/secrets/kubernetes.io/serviceaccount"
    assert (kube.evictions_per_window, kube.eviction_window_s) == (3, 60.0)
    assert (kube.nodeslo, kube.pod_facts, kube.node_metric) == (True, True, True)


def test_kubernetes_accepts_a_kubeconfig_and_a_node_name() -> None:
    kube = parse_config('[kubernetes]\nenable = true\nkubeconfig = "/etc/koordnode/kubeconfig"\n'
                        'node_name = "worker-1.example"\nevictions_per_window = 10').kubernetes
    assert kube.enable and kube.kubeconfig == "/etc/koordnode/kubeconfig"
    assert (kube.node_name, kube.evictions_per_window) == ("worker-1.example", 10)


@pytest.mark.parametrize(("text", "error"), [
    ('[kubernetes]\nnode_name = "Worker_1"',
     "kubernetes.node_name: expected a node name (lower-case DNS subdomain, at most 253 characters) "
     "or \"\", got 'Worker_1'"),
    ('[kubernetes]\nkubeconfig = "kubeconfig"',
     "kubernetes.kubeconfig: expected an absolute path or \"\", got 'kubeconfig'"),
    ("[kubernetes]\nevictions_per_window = 0",
     "kubernetes.evictions_per_window: expected an integer in [1, 1000], got 0"),
    ('[kubernetes]\nenable = "yes"', 'kubernetes.enable: expected true or false, got "yes"'),
])
def test_kubernetes_rejects(text: str, error: str) -> None:
    assert errors_of(text) == [error]


def test_pod_class_weight_key() -> None:
    assert Config().cgroup.pod_class_weight is False
    assert parse_config("[cgroup]\npod_class_weight = true\n").cgroup.pod_class_weight is True
    assert errors_of("[cgroup]\npod_class_weight = 1") == ["cgroup.pod_class_weight: expected true or false, got 1"]


def test_be_memory_budget_keys() -> None:
    defaults = Config().strategy.be_memory
    assert (defaults.enable, defaults.budget_percent, defaults.reserved_mib, defaults.min_budget_mib,
            defaults.pod_high_percent) == (True, 65.0, 0, 256, 70)
    config = parse_config("[strategy.be_memory]\nbudget_percent = 50\nreserved_mib = 2048\n"
                          "min_budget_mib = 0\npod_high_percent = 100\nenable = false\n").strategy.be_memory
    assert (config.enable, config.budget_percent, config.reserved_mib, config.min_budget_mib,
            config.pod_high_percent) == (False, 50.0, 2048, 0, 100)
    assert errors_of("[strategy.be_memory]\nbudget_percent = 0") == [
        "strategy.be_memory.budget_percent: expected a number in [1, 100], got 0"]
    assert errors_of("[strategy.be_memory]\nreserved_mib = -1") == [
        "strategy.be_memory.reserved_mib: expected an integer in [0, 1073741824], got -1"]
    assert errors_of('[strategy.be_memory]\nmin_budget_mib = "1G"') == [
        'strategy.be_memory.min_budget_mib: expected an integer in [0, 1073741824], got "1G"']
    assert errors_of("[strategy.be_memory]\npod_high_percent = 101") == [
        "strategy.be_memory.pod_high_percent: expected an integer in [1, 100], got 101"]


def test_all_errors_are_reported_together() -> None:
    text = """
unknown_top = 1
[proxy]
listn = "/x"
hook_timeout_ms = "fast"
failure_policy = "open"
[log]
format = "xml"
level = 3
[admin]
socket = "tcp://x"
"""
    errors = errors_of(text)
    assert sorted(errors) == sorted([
        "unknown_top: unknown key",
        'proxy.listn: unknown key (did you mean "listen"?)',
        'proxy.hook_timeout_ms: expected an integer in [1, 60000], got "fast"',
        'proxy.failure_policy: expected one of "ignore", "fail", got "open"',
        'log.format: expected one of "json", "console", got "xml"',
        'log.level: expected one of "debug", "info", "warning", "error", got 3',
        'admin.socket: only unix sockets are supported, got "tcp://x"',
    ])


def test_config_error_str_lists_source_and_every_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config('[log]\nformat = "xml"\nlevel = 3', source="/etc/k.toml")
    text = str(info.value)
    assert text.splitlines()[0] == "invalid configuration in /etc/k.toml (2 errors):"
    assert '  log.format: expected one of "json", "console", got "xml"' in text.splitlines()
    assert info.value.source == "/etc/k.toml"


def test_malformed_toml_reports_line_and_column() -> None:
    errors = errors_of('[proxy]\nlisten = "/x"\nhook_timeout_ms = = 3\n', source="f.toml")
    assert len(errors) == 1
    assert errors[0].startswith("invalid TOML: ")
    assert "line 3, column" in errors[0]


def test_duplicate_key_is_malformed_toml() -> None:
    errors = errors_of('[log]\nlevel = "info"\nlevel = "debug"\n')
    assert errors[0].startswith("invalid TOML: ") and "line 3" in errors[0]


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert info.value.errors == ["config file not found"]
    assert info.value.source == str(missing)


def test_explicit_default_path_must_exist_too(absent_default_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_config(config_module.DEFAULT_CONFIG_PATH)


def test_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)  # a directory
    assert info.value.errors[0].startswith("cannot read config file: ")
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b'[log]\nlevel = "\xff"\n')
    with pytest.raises(ConfigError) as info:
        load_config(binary)
    assert info.value.errors[0].startswith("invalid TOML: not UTF-8")


# ---------------------------------------------------------------------------------------------
# Normalisation and overrides


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("unix:///run/containerd/containerd.sock", "/run/containerd/containerd.sock"),
        ("unix:/run/x.sock", "/run/x.sock"),
        ("/run//x/../y.sock", "/run/y.sock"),
        ("/run/containerd/containerd.sock", "/run/containerd/containerd.sock"),
    ],
)
def test_socket_paths_are_normalised(given: str, expected: str) -> None:
    config = parse_config(f'[proxy]\nbackend = "{given}"\n[admin]\nsocket = "{given}.admin"')
    assert config.proxy.backend == expected
    assert config.admin.socket == expected + ".admin"


def test_overrides_apply_on_top_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "k.toml"
    path.write_text('[proxy]\nlisten = "/file.sock"\nhook_timeout_ms = 50\n')
    config = load_config(path, overrides={"proxy": {"listen": "unix:///flag.sock",
                                                    "backend": None}})
    assert config.proxy.listen == "/flag.sock"  # override wins, normalised
    assert config.proxy.hook_timeout_ms == 50  # untouched file value kept
    assert config.proxy.backend == "/run/containerd/containerd.sock"  # None = not given
    assert config.source == str(path)


def test_overrides_apply_on_top_of_defaults() -> None:
    config = load_config(None, overrides={"log": {"level": "debug"}})
    assert config.uses_defaults
    assert config.log.level == "debug"


def test_overrides_are_validated_like_the_file() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides={"proxy": {"backend": "tcp://x", "bogus": 1}})
    assert sorted(info.value.errors) == [
        'proxy.backend: only unix sockets are supported, got "tcp://x"',
        "proxy.bogus: unknown key",
    ]


def test_reload_repeats_path_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "k.toml"
    path.write_text("[proxy]\nhook_timeout_ms = 50\n")
    first = load_config(path, overrides={"log": {"level": "debug"}})
    path.write_text("[proxy]\nhook_timeout_ms = 70\n")
    second = reload_config(first)
    assert second.proxy.hook_timeout_ms == 70
    assert second.log.level == "debug"
    path.write_text("[proxy]\nhook_timeout_ms = -1\n")
    with pytest.raises(ConfigError):
        reload_config(second)


def test_reload_keeps_the_nodeslo_table_below_the_new_file(tmp_path: Path) -> None:
    """SIGHUP while a NodeSLO is applied: the file read again, the same NodeSLO values below it
    (the running config holds them frozen; a reload once refused them as "not a table")."""
    from koordnode.config import with_nodeslo

    path = tmp_path / "k.toml"
    path.write_text("[proxy]\nhook_timeout_ms = 50\n")
    running = with_nodeslo(load_config(path), {"strategy": {"cpu_suppress": {"threshold_percent": 61.0}},
                                                "qos": {"LS": {"memory_min_percent": 40}}})
    path.write_text("[proxy]\nhook_timeout_ms = 70\n")
    reloaded = reload_config(running)
    assert reloaded.proxy.hook_timeout_ms == 70
    assert reloaded.strategy.cpu_suppress.threshold_percent == 61.0 and reloaded.qos.LS.memory_min_percent == 40


def test_reload_of_defaults_picks_up_a_new_default_file(absent_default_path: Path) -> None:
    first = load_config(None)
    absent_default_path.parent.mkdir(parents=True)
    absent_default_path.write_text('[log]\nformat = "console"\n')
    assert reload_config(first).log.format == "console"


# ---------------------------------------------------------------------------------------------
# The generic loader, on a schema using every supported kind of field


@dataclass(frozen=True)
class ClassKnobs:
    shares: int = setting(1024, min=2, max=262144, doc="cpu shares")
    ratio: float = setting(1.0, min=0.0, max=1.0, doc="a fraction")
    enable: bool = setting(True, doc="on or off")


@dataclass(frozen=True)
class Inner:
    name: str | None = setting(None, doc="optional")
    cpus: list[int] = setting(default_factory=list, min=0, max=63, doc="cpu ids")
    devices: tuple[str, ...] = setting((), doc="device paths")
    reserved: int | str = setting(0, min=0, doc="a count or a cpu list")
    even: int = setting(2, check=lambda v: None if v % 2 == 0 else "must be even", doc="even")
    low: int = setting(1, doc="low")
    high: int = setting(2, doc="high")

    def validate(self) -> list[str]:
        return [] if self.low <= self.high else ["high: must be >= low"]


def _class_defaults() -> dict[str, ClassKnobs]:
    return {"LS": ClassKnobs(), "BE": ClassKnobs(shares=2, ratio=0.5)}


@dataclass(frozen=True)
class Schema:
    inner: Inner = section(Inner, doc="inner section")
    qos: dict[Literal["LS", "BE"], ClassKnobs] = field(default_factory=_class_defaults)
    limits: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Required:
    name: str


def load(text: str) -> Schema:
    return from_dict(Schema, tomllib.loads(text))


def generic_errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(text)
    return info.value.errors


def test_generic_defaults() -> None:
    assert load("") == Schema()


def test_generic_values_are_converted() -> None:
    schema = load("""
[inner]
name = "n"
cpus = [0, 63]
devices = ["/dev/sda"]
reserved = "0-1"
even = 4
[qos.BE]
ratio = 1
[limits]
a = 1
""")
    assert schema.inner.name == "n"
    assert schema.inner.cpus == [0, 63]
    assert schema.inner.devices == ("/dev/sda",)
    assert schema.inner.reserved == "0-1"
    assert schema.qos["BE"].ratio == 1.0 and isinstance(schema.qos["BE"].ratio, float)
    assert schema.limits == {"a": 1}


def test_dict_table_merges_over_its_default_entry() -> None:
    schema = load("[qos.BE]\nenable = false\n")
    # BE keeps its own defaults (shares 2, not the dataclass's 1024); LS is untouched.
    assert schema.qos["BE"] == ClassKnobs(shares=2, ratio=0.5, enable=False)
    assert schema.qos["LS"] == ClassKnobs()


def test_generic_to_toml_round_trips() -> None:
    schema = load("""
[inner]
name = "n"
cpus = [1, 2]
devices = ["/dev/sda", "/dev/sdb"]
reserved = "0-1"
[qos.LS]
shares = 2048
[limits]
"a.b" = 3
""")
    assert from_dict(Schema, tomllib.loads(to_toml(schema))) == schema


def test_union_tries_each_member() -> None:
    assert load("[inner]\nreserved = 3").inner.reserved == 3
    assert generic_errors("[inner]\nreserved = -1") == [
        "inner.reserved: expected an integer >= 0 or a string, got -1"
    ]
    assert generic_errors("[inner]\nreserved = true") == [
        "inner.reserved: expected an integer >= 0 or a string, got true"
    ]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[inner]\ncpus = [0, 64]", "inner.cpus[1]: expected an integer in [0, 63], got 64"),
        ("[inner]\ncpus = 3", "inner.cpus: expected a list of integers in [0, 63], got 3"),
        ('[inner]\ndevices = ["/a", 1]', "inner.devices[1]: expected a string, got 1"),
        ("[inner]\neven = 3", "inner.even: must be even"),
        ("[inner]\nlow = 5\nhigh = 1", "inner.high: must be >= low"),
        ("[qos.BE]\nshares = 1", "qos.BE.shares: expected an integer in [2, 262144], got 1"),
        ("[qos.BE]\nratio = 1.5", "qos.BE.ratio: expected a number in [0.0, 1.0], got 1.5"),
        ("[qos.BE]\nratio = nan", "qos.BE.ratio: expected a number in [0.0, 1.0], got nan"),
        ("[qos.BE]\nratio = true", "qos.BE.ratio: expected a number in [0.0, 1.0], got true"),
        ("[qos.BE]\nenable = 1", "qos.BE.enable: expected true or false, got 1"),
        ('[qos.BE]\nenable = "yes"', 'qos.BE.enable: expected true or false, got "yes"'),
        ("[qos.BE]\nshars = 1", 'qos.BE.shars: unknown key (did you mean "shares"?)'),
        ("[qos.XX]\nshares = 4", 'qos.XX: unknown key (expected one of "LS", "BE")'),
        ("qos = 1", "qos: expected a table, got 1"),
        ("[qos]\nBE = 1", "qos.BE: expected a table, got 1"),
        ('[limits]\na = "x"', 'limits.a: expected an integer, got "x"'),
    ],
)
def test_generic_errors_name_their_key_path(text: str, error: str) -> None:
    assert generic_errors(text) == [error]


def test_missing_required_key() -> None:
    with pytest.raises(ConfigError) as info:
        from_dict(Required, {})
    assert info.value.errors == ["name: missing required key"]
    assert from_dict(Required, {"name": "x"}) == Required("x")


@dataclass(frozen=True)
class PostInitChecked:
    count: int = 0

    def __post_init__(self) -> None:
        if self.count == 13:
            raise ValueError("count: unlucky")


@dataclass(frozen=True)
class HoldsPostInitChecked:
    part: PostInitChecked = section(PostInitChecked, doc="checks itself")


def test_value_error_from_post_init_is_reported_with_its_section() -> None:
    with pytest.raises(ConfigError) as info:
        from_dict(HoldsPostInitChecked, {"part": {"count": 13}})
    assert info.value.errors == ["part: count: unlucky"]


def test_describe_settings_expands_dict_sections() -> None:
    keys = {s.key: s for s in describe_settings(Schema)}
    assert keys["qos.BE.shares"].default == 2
    assert keys["qos.LS.shares"].default == 1024
    assert keys["inner.cpus"].expected == "a list of integers in [0, 63]"
    assert keys["inner.reserved"].expected == "an integer >= 0 or a string"


def test_unsupported_field_type_is_a_programming_error() -> None:
    @dataclass(frozen=True)
    class Bad:
        when: bytes = b""

    with pytest.raises(TypeError):
        from_dict(Bad, {"when": b"x"})
