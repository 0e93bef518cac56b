"""Prometheus metrics: names and units, recording semantics, the text format and the HTTP endpoint."""

from __future__ import annotations

import json
import math
import socket
import threading
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from koordnode import __version__
from koordnode.config import ConfigError, from_dict
from koordnode.policy.plan import SysctlWrite
from koordnode.executor.write_result import WriteResult, WriteStatus
from koordnode.policy.plan import CgroupWrite
from koordnode.metrics.exposition import format_value, render
from koordnode.metrics.recorder import Metrics
from koordnode.metrics.server import MetricsStartError, start
from koordnode.metrics.types import Counter as CounterMetric
from koordnode.metrics.types import Gauge, Histogram, Registry
from koordnode.model.interference import PodInterference
from koordnode.config.metrics import MetricsConfig, normalize_listen, parse_listen
from support import metrics_text

POD = ("default", "web-0")


def samples(metrics: Metrics) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} from the text exposition."""
    return metrics_text.samples(metrics.render().decode())


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, frozenset(labels.items())))


def applied(metrics: Metrics, name: str, container: str = "", qos: str = "LS") -> float | None:
    return value(metrics, f"koordnode_applied_{name}", namespace=POD[0], pod=POD[1],
                 container=container, **{"class": qos})


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(process_metrics=False)


# --- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "normalized", "parsed"), [
    ("127.0.0.1:9316", "127.0.0.1:9316", ("127.0.0.1", 9316)),
    ("[::1]:9316", "[::1]:9316", ("::1", 9316)),
    ("localhost:0", "localhost:0", ("localhost", 0)),
    (":9316", "0.0.0.0:9316", ("0.0.0.0", 9316)),
    ("", "", None),
])
def test_listen_addresses(given: str, normalized: str, parsed: tuple[str, int] | None) -> None:
    assert normalize_listen(given) == normalized
    assert parse_listen(given) == parsed


@pytest.mark.parametrize("bad", ["9316", "127.0.0.1", "127.0.0.1:http", "127.0.0.1:70000",
                                 "::1:9316", "[::1]9316", "[nothost]:1", "bad host:1", " :1"])
def test_bad_listen_addresses_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        normalize_listen(bad)


def test_metrics_config_through_the_config_loader() -> None:
    assert from_dict(MetricsConfig, {}) == MetricsConfig(listen="127.0.0.1:9316")
    assert from_dict(MetricsConfig, {"listen": ""}).listen == ""
    assert from_dict(MetricsConfig, {"listen": ":9100"}).listen == "0.0.0.0:9100"
    with pytest.raises(ConfigError) as err:
        from_dict(MetricsConfig, {"listen": "localhost"})
    assert err.value.errors[0].startswith("listen: expected \"host:port\"")
    with pytest.raises(ConfigError) as err:
        from_dict(MetricsConfig, {"listen": 9316})
    assert err.value.errors == ["listen: expected a string, got 9316"]


# --- names and conventions -----------------------------------------------------------------


def test_names_follow_prometheus_conventions(metrics: Metrics) -> None:
    metrics.observe_cri_call("/runtime.v1.RuntimeService/RunPodSandbox", 0, 0.01)
    metrics.record_eviction("memory")
    metrics.record_write("cpu.shares", "written")
    metrics.record_config_reload(True)
    metrics.record_writes([SimpleNamespace(write=SimpleNamespace(resource="cpu.cfs_quota_us"), status="written",
                                           overwritten=True)])
    metrics.follow_hook_failures(lambda: {("qos", "pre", "timeout"): 1})
    metrics.follow_proxy_stats(SimpleNamespace(connections_open=1, connections_total=2,
                                               intercepted_calls=3))
    families = metrics_text.parse(metrics.render().decode())
    assert families
    for family in families:
        assert family.name.startswith("koordnode_"), family.name
        if family.type == "counter":
            assert family.name.endswith("_total"), family.name
            assert all(s.name == family.name for s in family.samples), family.name
        assert not family.name.endswith(("_ms", "_us", "_milliseconds", "_percent"))
    names = {f.name for f in families}
    assert {"koordnode_build_info", "koordnode_uptime_seconds", "koordnode_cri_requests_total",
            "koordnode_cri_request_duration_seconds", "koordnode_hook_failures_total",
            "koordnode_executor_writes_total", "koordnode_evictions_total", "koordnode_psi_avg10_ratio",
            "koordnode_be_cpu_quota_cores", "koordnode_be_cpu_suppress_ratio",
            "koordnode_applied_cpu_shares", "koordnode_applied_memory_high_bytes",
            "koordnode_config_reloads_total", "koordnode_proxy_connections_open",
            "koordnode_cgroup_overwrites_total"} <= names
    assert 'koordnode_cgroup_overwrites_total{resource="cpu.cfs_quota_us"} 1.0' in metrics.render().decode()


def test_build_info_and_uptime() -> None:
    now = [1000.0]
    metrics = Metrics(process_metrics=False, clock=lambda: now[0])
    now[0] = 1012.5
    build = [k for k in samples(metrics) if k[0] == "koordnode_build_info"]
    assert len(build) == 1 and ("version", __version__) in build[0][1]
    assert value(metrics, "koordnode_uptime_seconds") == 12.5
    assert value(metrics, "koordnode_start_time_seconds") == 1000.0


def test_registries_are_private() -> None:
    one, two = Metrics(process_metrics=False), Metrics(process_metrics=False)
    one.record_eviction("cpu")
    assert value(one, "koordnode_evictions_total", reason="cpu") == 1
    assert value(two, "koordnode_evictions_total", reason="cpu") is None


# --- recording -----------------------------------------------------------------------------


def test_cri_calls_by_method_and_code(metrics: Metrics) -> None:
    metrics.observe_cri_call("/runtime.v1.RuntimeService/CreateContainer", 0, 0.003)
    metrics.observe_cri_call("CreateContainer", 0, 0.2)
    metrics.observe_cri_call("CreateContainer", 14, 0.001)
    metrics.observe_cri_call("StartContainer", None, 0.001)
    metrics.observe_cri_call("StartContainer", "deadline_exceeded", 0.001)
    metrics.observe_cri_call("StartContainer", SimpleNamespace(name="CANCELLED"), 0.001)
    assert value(metrics, "koordnode_cri_requests_total", method="CreateContainer", code="OK") == 2
    assert value(metrics, "koordnode_cri_requests_total", method="CreateContainer",
                 code="UNAVAILABLE") == 1
    for code in ("NO_STATUS", "DEADLINE_EXCEEDED", "CANCELLED"):
        assert value(metrics, "koordnode_cri_requests_total", method="StartContainer", code=code) == 1
    hist = "koordnode_cri_request_duration_seconds"
    assert value(metrics, hist + "_count", method="CreateContainer") == 3
    assert value(metrics, hist + "_bucket", method="CreateContainer", le="0.005") == 2
    assert value(metrics, hist + "_sum", method="CreateContainer") == pytest.approx(0.204)


def test_hook_delay_is_the_latency_koordnode_adds_per_method(metrics: Metrics) -> None:
    metrics.observe_hook_delay("CreateContainer", 0.0004)
    metrics.observe_hook_delay("CreateContainer", 0.03)
    metrics.observe_hook_delay("/evil/path", 0.001)
    metrics.observe_hook_delay("RunPodSandbox", -1.0)  # a clock step backwards is not a latency
    hist = "koordnode_cri_hook_delay_seconds"
    assert value(metrics, hist + "_count", method="CreateContainer") == 2
    assert value(metrics, hist + "_bucket", method="CreateContainer", le="0.0005") == 1
    assert value(metrics, hist + "_count", method="other") == 1
    assert value(metrics, hist + "_count", method="RunPodSandbox") is None


def test_method_and_code_labels_stay_bounded_whatever_the_client_sends(metrics: Metrics) -> None:
    # The method comes from the client's :path: made-up names must not each make a series.
    for i in range(500):
        metrics.observe_cri_call(f"/runtime.v1.RuntimeService/Made{i}Up", 12, 0.001)
        metrics.observe_cri_call(f"/evil.Service/{i}", 12, 0.001)
    metrics.observe_cri_call("/runtime.v1alpha2.ImageService/PullImage", 0, 0.001)
    metrics.observe_cri_call("/runtime.v1.RuntimeService/Version", 10**9, 0.001)
    metrics.observe_cri_call("Version", "no-such-code", 0.001)
    series = {labels for name, labels in samples(metrics) if name == "koordnode_cri_requests_total"}
    assert series == {
        frozenset({("code", "UNIMPLEMENTED"), ("method", "other")}),
        frozenset({("code", "OK"), ("method", "PullImage")}),
        frozenset({("code", "UNKNOWN"), ("method", "Version")}),
    }
    assert value(metrics, "koordnode_cri_requests_total", method="other", code="UNIMPLEMENTED") == 1000


def test_hook_failures_are_read_from_the_chain_at_scrape_time(metrics: Metrics) -> None:
    failures: Counter[tuple[str, str, str]] = Counter()
    metrics.follow_hook_failures(lambda: failures)
    assert not [k for k in samples(metrics) if k[0] == "koordnode_hook_failures_total"]
    failures[("cpuset", "pre", "timeout")] += 2
    failures[("cpuset", "post", "error")] += 1
    assert value(metrics, "koordnode_hook_failures_total", hook="cpuset", phase="pre",
                 kind="timeout") == 2
    assert value(metrics, "koordnode_hook_failures_total", hook="cpuset", phase="post",
                 kind="error") == 1


def test_following_again_replaces_the_source(metrics: Metrics) -> None:
    metrics.follow_hook_failures(lambda: {("a", "pre", "error"): 1})
    metrics.follow_hook_failures(lambda: {("b", "pre", "error"): 2})
    metrics.follow_proxy_stats(SimpleNamespace(connections_open=1))
    metrics.follow_proxy_stats(SimpleNamespace(connections_open=3))
    failures = [k for k in samples(metrics) if k[0] == "koordnode_hook_failures_total"]
    assert [dict(labels)["hook"] for _, labels in failures] == ["b"]
    assert value(metrics, "koordnode_proxy_connections_open") == 3


def test_eviction_reasons_stay_few(metrics: Metrics) -> None:
    metrics.record_eviction("memory")
    metrics.record_eviction("node memory 93.1% >= 90%: releasing 1.20 GiB; web-1 uses 0.50 GiB")
    metrics.record_eviction("BE CPU satisfaction 20% < 40% for 60 s: releasing 2.00 CPUs", 2)
    metrics.record_eviction("Something Else")
    metrics.record_eviction("cpu", 0)
    reasons = {dict(labels)["reason"]: v for (name, labels), v in samples(metrics).items()
               if name == "koordnode_evictions_total"}
    assert reasons == {"memory": 2, "cpu": 2, "other": 1}


def test_a_broken_source_does_not_break_the_scrape(metrics: Metrics) -> None:
    def broken() -> dict:
        raise RuntimeError("mid-change")

    metrics.follow_hook_failures(broken)
    metrics.record_eviction("memory")
    assert value(metrics, "koordnode_evictions_total", reason="memory") == 1


def test_proxy_stats(metrics: Metrics) -> None:
    stats = SimpleNamespace(connections_open=0, connections_total=0, intercepted_calls=0)
    metrics.follow_proxy_stats(stats)
    stats.connections_open, stats.connections_total, stats.intercepted_calls = 2, 5, 40
    assert value(metrics, "koordnode_proxy_connections_open") == 2
    assert value(metrics, "koordnode_proxy_connections_total") == 5
    assert value(metrics, "koordnode_proxy_intercepted_calls_total") == 40


def test_executor_results_by_resource_and_outcome(metrics: Metrics) -> None:
    cg = "/kubepods/besteffort/pod1"
    metrics.record_writes([
        WriteResult(CgroupWrite(cg, "cpu.shares", 2), WriteStatus.WRITTEN),
        WriteResult(CgroupWrite(cg, "cpu.shares", 2), WriteStatus.UNCHANGED),
        WriteResult(CgroupWrite(cg, "cpu.cfs_quota_us", 50000), WriteStatus.FAILED),
        WriteResult(SysctlWrite("vm.min_free_kbytes", 65536), WriteStatus.WRITTEN),
    ])
    assert value(metrics, "koordnode_executor_writes_total", resource="cpu.shares",
                 outcome="written") == 1
    assert value(metrics, "koordnode_executor_writes_total", resource="cpu.shares",
                 outcome="unchanged") == 1
    assert value(metrics, "koordnode_executor_writes_total", resource="cpu.cfs_quota_us",
                 outcome="failed") == 1
    assert value(metrics, "koordnode_executor_writes_total", resource="vm.min_free_kbytes",
                 outcome="written") == 1


def test_tick_gauges_are_set_only_when_their_value_changes() -> None:
    """The QoS tick publishes PSI and the BE budget every tick; a value that did not change is
    not set again (counted: labelled lookups and sets), and a change still shows."""
    metrics = Metrics(process_metrics=False)
    lookups: list[tuple[str, ...]] = []
    labels = metrics.psi.labels

    def counting(*names: str):  # noqa: ANN202 - a spy on the gauge
        lookups.append(names)
        return labels(*names)

    metrics.psi.labels = counting  # type: ignore[method-assign]
    sets: list[float] = []
    quota_set = metrics.be_cpu_quota.set
    metrics.be_cpu_quota.set = lambda v: sets.append(v) or quota_set(v)  # type: ignore[method-assign]
    line = SimpleNamespace
    pressures = {"cpu": SimpleNamespace(some=line(avg10=5.0), full=None)}
    for _ in range(5):
        metrics.set_pressures(pressures)
        metrics.set_be_cpu(1.5, 1.0)
    assert lookups == [("node", "cpu", "some")]
    assert sets == [1.5]
    metrics.set_pressures({"cpu": SimpleNamespace(some=line(avg10=7.0), full=None)})
    metrics.set_be_cpu(None)
    assert value(metrics, "koordnode_psi_avg10_ratio", scope="node", resource="cpu", kind="some") == 0.07
    assert value(metrics, "koordnode_be_cpu_quota_cores") == -1


def test_be_cpu_psi_and_reloads() -> None:
    metrics = Metrics(process_metrics=False, clock=lambda: 5000.0)
    assert value(metrics, "koordnode_be_cpu_quota_cores") == -1  # unlimited until told
    assert value(metrics, "koordnode_be_cpu_suppress_ratio") == 1
    metrics.set_be_cpu(3.5, 0.25)
    assert value(metrics, "koordnode_be_cpu_quota_cores") == 3.5
    assert value(metrics, "koordnode_be_cpu_suppress_ratio") == 0.25
    metrics.set_be_cpu(None)
    assert value(metrics, "koordnode_be_cpu_quota_cores") == -1
    assert value(metrics, "koordnode_be_cpu_suppress_ratio") == 1.0
    metrics.set_be_cpu(-0.5, -1)  # a negative raw budget means none left, not a negative quota
    assert value(metrics, "koordnode_be_cpu_quota_cores") == 0
    assert value(metrics, "koordnode_be_cpu_suppress_ratio") == 0

    metrics.set_psi("memory", some_avg10=12.5, full_avg10=2.0)
    metrics.set_psi("cpu", some_avg10=40.0, scope="be")
    assert value(metrics, "koordnode_psi_avg10_ratio", scope="node", resource="memory",
                 kind="some") == 0.125
    assert value(metrics, "koordnode_psi_avg10_ratio", scope="node", resource="memory",
                 kind="full") == 0.02
    assert value(metrics, "koordnode_psi_avg10_ratio", scope="be", resource="cpu",
                 kind="some") == 0.4

    line = SimpleNamespace
    metrics.set_pressures({"io": SimpleNamespace(some=line(avg10=5.0), full=line(avg10=1.5)),
                           "cpu": SimpleNamespace(some=line(avg10=50.0), full=None),
                           "memory": None})
    assert value(metrics, "koordnode_psi_avg10_ratio", scope="node", resource="io",
                 kind="full") == 0.015
    assert value(metrics, "koordnode_psi_avg10_ratio", scope="node", resource="cpu",
                 kind="some") == 0.5
    assert value(metrics, "koordnode_psi_avg10_ratio", scope="node", resource="memory",
                 kind="some") == 0.125  # None: the last value stays

    metrics.record_config_reload(False)
    assert value(metrics, "koordnode_config_last_reload_successful") == 0
    assert value(metrics, "koordnode_config_last_reload_timestamp_seconds") == 5000.0
    metrics.record_config_reload(True)
    assert value(metrics, "koordnode_config_last_reload_successful") == 1
    assert value(metrics, "koordnode_config_reloads_total", result="failure") == 1
    assert value(metrics, "koordnode_config_reloads_total", result="success") == 1


def test_applied_values_in_base_units(metrics: Metrics) -> None:
    ignored = metrics.set_applied(*POD, "", "LS", {
        "cpu.shares": 2048,
        "cpu.cfs_quota_us": 150000,
        "cpu.cfs_period_us": 100000,
        "cpuset.cpus": "0-3,8",
        "memory.min": 64 << 20,
        "memory.low": "134217728",
        "memory.high": 256 << 20,
        "oom_score_adj": -998,
        "blkio.weight": 500,
    })
    assert ignored == []
    assert applied(metrics, "cpu_shares") == 2048
    assert applied(metrics, "cpu_quota_cores") == 1.5
    assert applied(metrics, "cpuset_cpus") == 5
    assert applied(metrics, "memory_min_bytes") == 64 << 20
    assert applied(metrics, "memory_low_bytes") == 128 << 20
    assert applied(metrics, "memory_high_bytes") == 256 << 20
    assert applied(metrics, "oom_score_adj") == -998
    assert applied(metrics, "blkio_weight") == 500


def test_applied_values_merge_and_unlimited_drops_the_series(metrics: Metrics) -> None:
    metrics.set_applied(*POD, "app", "BE", {"cpu_quota": 50000, "cpu_shares": 2,
                                            "memory.high": 1 << 30})
    assert applied(metrics, "cpu_quota_cores", "app", "BE") == 0.5  # default 100 ms period
    metrics.set_applied(*POD, "app", "BE", {"cpu_period": 200000})  # quota kept, period new
    assert applied(metrics, "cpu_quota_cores", "app", "BE") == 0.25
    assert applied(metrics, "cpu_shares", "app", "BE") == 2
    metrics.set_applied(*POD, "app", "BE", {"cpu.cfs_quota_us": -1, "memory.high": "max"})
    assert applied(metrics, "cpu_quota_cores", "app", "BE") is None
    assert applied(metrics, "memory_high_bytes", "app", "BE") is None
    assert applied(metrics, "cpu_shares", "app", "BE") == 2


def test_a_new_class_relabels_the_series(metrics: Metrics) -> None:
    metrics.set_applied(*POD, "app", "LS", {"cpu.shares": 1024})
    metrics.set_applied(*POD, "app", "LSR", {"cpuset_cpus": "2-3"})
    assert applied(metrics, "cpu_shares", "app", "LS") is None
    assert applied(metrics, "cpu_shares", "app", "LSR") == 1024
    assert applied(metrics, "cpuset_cpus", "app", "LSR") == 2


def test_bad_values_are_ignored_and_reported(metrics: Metrics) -> None:
    ignored = metrics.set_applied(*POD, "app", "LS", {
        "cpu.shares": "lots", "cpuset.cpus": "3-1", "memory.min": True,
        "cpuset.mems": "0", "blkio.weight": 100,
    })
    assert sorted(ignored) == ["cpu.shares", "cpuset.cpus", "cpuset.mems", "memory.min"]
    assert applied(metrics, "blkio_weight", "app") == 100


def test_dropping_a_pod_removes_all_its_series(metrics: Metrics) -> None:
    metrics.set_applied(*POD, "", "LS", {"cpu.shares": 2048})
    metrics.set_applied(*POD, "app", "LS", {"cpu.shares": 1024, "oom_score_adj": -998})
    metrics.set_applied("default", "other", "app", "LS", {"cpu.shares": 512})
    metrics.drop_container(*POD, "app")
    assert applied(metrics, "cpu_shares", "app") is None
    assert applied(metrics, "cpu_shares") == 2048
    metrics.set_applied(*POD, "app", "LS", {"cpu.shares": 1024})
    metrics.drop_pod(*POD)
    remaining = [k for k in samples(metrics) if k[0].startswith("koordnode_applied_")]
    assert [dict(labels)["pod"] for _, labels in remaining] == ["other"]
    metrics.drop_pod(*POD)  # again: nothing to do, no error


# --- the HTTP endpoint ---------------------------------------------------------------------


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_scrape_over_http(metrics: Metrics) -> None:
    metrics.record_eviction("cpu", 3)
    server = start(MetricsConfig(listen="127.0.0.1:0"), metrics)
    assert server is not None
    try:
        host, port = server.address
        assert host == "127.0.0.1" and port > 0
        status, content_type, body = _get(server.url)
        assert status == 200
        assert content_type.startswith("text/plain")
        assert 'koordnode_evictions_total{reason="cpu"} 3.0' in body
        assert _get(f"http://127.0.0.1:{port}/")[0] == 200
        assert _get(f"http://127.0.0.1:{port}/nothing")[0] == 404
        post = urllib.request.Request(server.url, data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(post, timeout=5)
        assert err.value.code == 405
    finally:
        server.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_scrape_over_ipv6_loopback(metrics: Metrics) -> None:
    try:
        socket.socket(socket.AF_INET6).bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    server = start("[::1]:0", metrics)
    assert server is not None
    try:
        assert server.url.startswith("http://[::1]:")
        assert _get(server.url)[0] == 200
    finally:
        server.stop()


def test_empty_listen_turns_the_endpoint_off(metrics: Metrics) -> None:
    assert start(MetricsConfig(listen=""), metrics) is None


def test_a_busy_port_is_a_clear_error(metrics: Metrics) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(MetricsStartError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            start(f"127.0.0.1:{port}", metrics)


def test_an_invalid_address_is_a_clear_error(metrics: Metrics) -> None:
    with pytest.raises(MetricsStartError, match="metrics.listen"):
        start("nowhere", metrics)


def test_the_default_instance_serves_process_metrics() -> None:
    from koordnode.metrics.recorder import METRICS

    server = start("127.0.0.1:0")
    assert server is not None
    try:
        body = _get(server.url)[2]
    finally:
        server.stop()
    assert "koordnode_build_info" in body
    assert "process_resident_memory_bytes" in body
    assert METRICS.registry is not None


def test_interference_per_pod_and_class_read_at_each_scrape(metrics: Metrics) -> None:
    rows = [PodInterference("default", "web-0", "LS", 1.5, 0.25),
            PodInterference("default", "web-1", "LS", 0.5, None),
            PodInterference("db", "pg-0", "LSR", None, 2.0)]
    metrics.follow_interference(lambda: rows)
    assert value(metrics, "koordnode_pod_cpu_pressure_seconds_total", namespace="default", pod="web-0",
                 **{"class": "LS"}) == 1.5
    assert value(metrics, "koordnode_pod_cpu_throttled_seconds_total", namespace="db", pod="pg-0",
                 **{"class": "LSR"}) == 2.0
    assert value(metrics, "koordnode_pod_cpu_pressure_seconds_total", namespace="db", pod="pg-0",
                 **{"class": "LSR"}) is None  # no file, no series
    assert value(metrics, "koordnode_class_cpu_pressure_seconds_total", **{"class": "LS"}) == 2.0
    assert value(metrics, "koordnode_class_cpu_throttled_seconds_total", **{"class": "LS"}) == 0.25
    rows[0] = PodInterference("default", "web-0", "LS", 3.0, 0.25)  # read again at the next scrape
    assert value(metrics, "koordnode_class_cpu_pressure_seconds_total", **{"class": "LS"}) == 3.5

    def broken():
        raise RuntimeError("state changed mid-scrape")

    metrics.follow_interference(broken)  # a failing source gives no series, not a failed scrape
    assert value(metrics, "koordnode_class_cpu_pressure_seconds_total", **{"class": "LS"}) is None


# --- the contract: names, types, labels and HELP texts -------------------------------------

CONTRACT = Path(__file__).parent / "data" / "metrics_contract.json"


def _record_one_of_everything(metrics: Metrics) -> None:
    metrics.observe_cri_call("/runtime.v1.RuntimeService/RunPodSandbox", 0, 0.01)
    metrics.observe_hook_delay("RunPodSandbox", 0.001)
    metrics.record_eviction("memory")
    metrics.record_write("cpu.shares", "written")
    metrics.record_writes([SimpleNamespace(write=SimpleNamespace(resource="cpu.cfs_quota_us"), status="written",
                                           overwritten=True)])
    metrics.record_config_reload(True)
    metrics.follow_hook_failures(lambda: {("qos", "pre", "timeout"): 1})
    metrics.follow_proxy_stats(SimpleNamespace(connections_open=1, connections_total=2, intercepted_calls=3))
    metrics.follow_interference(lambda: [PodInterference("default", "web-0", "LS", 1.5, 0.25)])
    metrics.set_applied("default", "web-0", "", "LS", {
        "cpu.shares": 2, "cpu.cfs_quota_us": 1000, "cpuset.cpus": "0-1", "memory.min": 1, "memory.low": 2,
        "memory.high": 3, "oom_score_adj": 1, "blkio.weight": 10})
    metrics.set_be_cpu(1.0, 0.5)
    metrics.set_psi("cpu", some_avg10=1.0, full_avg10=2.0)
    metrics.record_nodeslo(True)
    metrics.record_api_eviction("evicted")
    metrics.set_batch_allocatable(1.0, 2.0)
    metrics.kube_api_up.set(1)
    metrics.dry_run.set(0)


def test_every_name_type_label_set_and_help_text_stays_as_users_know_them() -> None:
    """tests/data/metrics_contract.json was captured from prometheus-client's exposition before
    koordnode wrote its own: dashboards, alerts and scrapers rely on each line of it."""
    metrics = Metrics(process_metrics=True, clock=lambda: 1000.0)
    _record_one_of_everything(metrics)
    now = [{"name": f.name, "type": f.type, "help": f.help,
            "samples": [[n, list(labels)] for n, labels in sorted({(s.name, tuple(sorted(s.labels)))
                                                                  for s in f.samples})]}
           for f in metrics_text.parse(metrics.render().decode())]
    assert now == json.loads(CONTRACT.read_text())


def test_process_metrics_are_this_process() -> None:
    metrics = Metrics(clock=lambda: 1000.0)
    got = samples(metrics)
    rss = got[("process_resident_memory_bytes", frozenset())]
    with open("/proc/self/status") as f:
        status_kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    assert 0.5 < rss / (status_kib * 1024) < 2
    assert got[("process_open_fds", frozenset())] >= 3
    assert got[("process_max_fds", frozenset())] >= got[("process_open_fds", frozenset())]
    assert 0 < got[("process_start_time_seconds", frozenset())] <= __import__("time").time()
    assert got[("process_cpu_seconds_total", frozenset())] > 0
    info = [labels for name, labels in got if name == "python_info"]
    assert dict(info[0])["implementation"] == "CPython"


# --- the text format -----------------------------------------------------------------------


def test_label_values_and_help_are_escaped() -> None:
    registry = Registry()
    gauge = Gauge("x_ratio", 'help with \\ and\nnewline', ["path"], registry=registry)
    gauge.labels('C:\\dir "quoted"\nnext').set(0.5)
    text = render(registry.collect()).decode()
    assert "# HELP x_ratio help with \\\\ and\\nnewline\n" in text
    assert 'x_ratio{path="C:\\\\dir \\"quoted\\"\\nnext"} 0.5\n' in text
    [family] = metrics_text.parse(text)
    assert family.help == "help with \\ and\nnewline"
    assert family.samples[0].labels == {"path": 'C:\\dir "quoted"\nnext'}


def test_counters_histograms_and_gauges_in_the_text_format() -> None:
    registry = Registry()
    counter = CounterMetric("x_events_total", "Events", ["kind", "app"], registry=registry)
    counter.labels("b", "z").inc(2)
    hist = Histogram("x_seconds", "Durations", ["op"], buckets=(0.1, 1.0), registry=registry)
    for v in (0.05, 0.1, 0.5, 3.0):
        hist.labels("get").observe(v)
    Gauge("x_up", "Up", registry=registry).set(1)
    lines = render(registry.collect()).decode().splitlines()
    assert lines[:3] == ["# HELP x_events_total Events", "# TYPE x_events_total counter",
                         'x_events_total{app="z",kind="b"} 2.0']
    assert lines[3:5] == ["# HELP x_events_created Events", "# TYPE x_events_created gauge"]
    assert lines[7:14] == ["# TYPE x_seconds histogram",
                           'x_seconds_bucket{le="0.1",op="get"} 2.0',
                           'x_seconds_bucket{le="1.0",op="get"} 3.0',
                           'x_seconds_bucket{le="+Inf",op="get"} 4.0',
                           'x_seconds_count{op="get"} 4.0',
                           'x_seconds_sum{op="get"} 3.65',
                           "# HELP x_seconds_created Durations"]
    assert lines[-3:] == ["# HELP x_up Up", "# TYPE x_up gauge", "x_up 1.0"]
    assert [format_value(v) for v in (math.inf, -math.inf, math.nan, 1e20, -0.5)] == [
        "+Inf", "-Inf", "NaN", "1e+20", "-0.5"]
    with pytest.raises(ValueError):
        counter.labels("a", "b").inc(-1)
    with pytest.raises(ValueError):
        counter.labels("only one")


def test_recording_from_many_threads_loses_nothing() -> None:
    """The Metrics object is recorded into from the event loop, hook threads and the tick's
    thread while scrapes read it: every increment and observation counts."""
    metrics = Metrics(process_metrics=False)
    start_line = threading.Barrier(8)

    def work(n: int) -> None:
        start_line.wait()
        for i in range(2000):
            metrics.observe_cri_call("CreateContainer", 0, 0.001)
            metrics.record_write(f"r{i % 3}", "written")
            metrics.set_applied("ns", f"pod-{n}", "", "LS", {"cpu.shares": i + 2})
            if i % 500 == 0:
                metrics.render()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert value(metrics, "koordnode_cri_requests_total", method="CreateContainer", code="OK") == 16000
    assert value(metrics, "koordnode_cri_request_duration_seconds_count", method="CreateContainer") == 16000
    assert sum(v for (name, _), v in samples(metrics).items() if name == "koordnode_executor_writes_total") == 16000
    assert metrics.cri_calls_by_method() == {"CreateContainer": 16000}


def test_head_and_query_strings(metrics: Metrics) -> None:
    server = start("127.0.0.1:0", metrics)
    assert server is not None
    try:
        request = urllib.request.Request(server.url, method="HEAD")
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert int(response.headers["Content-Length"]) > 0
            assert response.read() == b""
        assert _get(server.url + "?name[]=koordnode_build_info")[0] == 200
        host, port = server.address
        with socket.create_connection((host, port), timeout=5) as raw:  # not HTTP at all
            raw.sendall(b"hello\r\n\r\n")
            assert raw.recv(100).startswith(b"HTTP/1.0 400 ")
    finally:
        server.stop()
