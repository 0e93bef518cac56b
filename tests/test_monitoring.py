"""The Grafana dashboard and the Prometheus rules of docs/monitoring/ against what koordnode
really exports: promtool checks the rules and a live koordnode's /metrics, and every metric a
panel or a rule queries must be one that /metrics declares (or a recording rule defined here).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from support.cri import Cri, container_config, remove_pod, run_pod, sandbox_config, start_container
from support.koordnode_runner import KoordnodeProcess
from testbed.fixtures import running_in_ci

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "docs" / "monitoring" / "koordnode-rules.yml"
DASHBOARD = REPO / "docs" / "monitoring" / "koordnode-dashboard.json"
# Series Prometheus makes itself, not koordnode.
PROMETHEUS_OWN = frozenset({"up"})

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENTIFIER = re.compile(r"(?<![\w:.])[A-Za-z_:][\w:]*")  # not the unit of a number (1h)
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                       "unless", "offset", "inf", "nan"})


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, label names, label
    values and durations left out)."""
    for pattern, by in ((_STRING, '""'), (_MATCHERS, " "), (_GROUPING, " "), (_RANGE, " ")):
        expr = pattern.sub(by, expr)
    names = set()
    for match in _IDENTIFIER.finditer(expr):
        if expr[match.end():].lstrip().startswith("("):
            continue  # a function
        if match.group().lower() not in _KEYWORDS:
            names.add(match.group())
    return names


def rule_file() -> dict:
    return yaml.safe_load(RULES.read_text())


def rules() -> Iterator[dict]:
    for group in rule_file()["groups"]:
        yield from group["rules"]


def recorded_names() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


def dashboard_queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and template variable of the dashboard."""
    dash = json.loads(DASHBOARD.read_text())
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in dash["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            found = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query["query"])
            assert found, f"variable {variable['name']}: unexpected query {query['query']!r}"
            yield f"variable {variable['name']}", found[1]


def exported_names(exposition: str) -> set[str]:
    """Every series name a /metrics text can carry: the declared families (present even before
    their first sample), with a histogram's _bucket/_sum/_count, and every sample's name."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            names.add(name)
            if kind in ("histogram", "summary"):
                names.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if running_in_ci():
            pytest.fail("promtool is missing (scripts/install-deps.sh installs the prometheus package)")
        pytest.skip("promtool is not installed")
    return path


# ------------------------------------------------------------------ without a daemon


def test_the_name_finder_sees_metrics_and_nothing_else():
    expr = ('histogram_quantile(0.99, sum by (instance, method, le) (rate(koordnode_x_bucket{code=~"a|b", '
            'job="up"}[5m]))) / on (instance) group_left (pod) koordnode:y:rate5m offset 1h > bool 0 '
            'and absent(up)')
    assert metric_names(expr) == {"koordnode_x_bucket", "koordnode:y:rate5m", "up"}
    assert metric_names("koordnode_missing_total") - exported_names("# TYPE koordnode_there_total counter\n")


def test_rules_pass_promtool():
    run = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(list(rules()))} rules found" in run.stdout


def test_every_alert_says_what_to_do():
    alerts = [r for r in rules() if "alert" in r]
    assert {a["alert"] for a in alerts} >= {"KoordnodeDown", "KoordnodeLSCpuPressure", "KoordnodeBEOverSuppressed",
                                             "KoordnodeHookTimeouts", "KoordnodeEvictions",
                                             "KoordnodeValuesOverwritten", "KoordnodeCriLatencyAdded"}
    for alert in alerts:
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), alert["alert"]
        assert alert["annotations"]["summary"] and alert["annotations"]["description"], alert["alert"]


def test_dashboard_is_importable_grafana_json():
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    seen: set[tuple[int, int]] = set()
    for panel in dash["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {(grid["y"] + dy, grid["x"] + dx) for dy in range(grid["h"]) for dx in range(grid["w"])}
        assert not cells & seen, f"panel {panel['title']!r} overlaps another"
        seen |= cells
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
    # Every recording rule is shown somewhere, or it is only there for an alert.
    used = set().union(*(metric_names(q) for _, q in dashboard_queries()))
    alert_inputs = set().union(*(metric_names(r["expr"]) for r in rules() if "alert" in r))
    assert recorded_names() <= used | alert_inputs


# ------------------------------------------------------------------ against a live koordnode


@pytest.fixture
def live_metrics(containerd_bed, tmp_path):
    """/metrics of a real koordnode that has relayed a pod's creation (so the CRI histograms
    have samples), and the exposition text."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kn = KoordnodeProcess(tmp_path / "kn", str(containerd_bed.socket), kubepods=containerd_bed.kubepods_cgroup,
                          metrics_listen=f"127.0.0.1:{port}").start()
    cri = Cri(kn.listen)
    sid = None
    try:
        sb = sandbox_config(containerd_bed, "scraped", qos="burstable")
        sid = run_pod(cri, sb)
        start_container(cri, sid, sb, container_config(containerd_bed, "c", ["sleep", "3600"]))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            yield response.read().decode()
    finally:
        if sid is not None:
            remove_pod(cri, sid)
        cri.close()
        kn.stop()


@pytest.mark.e2e
def test_live_metrics_pass_promtool(live_metrics):
    run = subprocess.run([promtool(), "check", "metrics"], input=live_metrics, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "koordnode_cri_hook_delay_seconds_bucket{" in live_metrics  # the latency added, measured


@pytest.mark.e2e
def test_every_panel_and_rule_queries_a_metric_koordnode_exports(live_metrics):
    exported = exported_names(live_metrics)
    known = exported | recorded_names() | PROMETHEUS_OWN
    queries = [(f"rule {r.get('record') or r.get('alert')}", r["expr"]) for r in rules()]
    queries += list(dashboard_queries())
    unknown = {where: sorted(metric_names(expr) - known) for where, expr in queries if metric_names(expr) - known}
    assert not unknown, f"queries name metrics koordnode does not export: {unknown}"
    # And they cover what an operator must watch (the metrics, not just any).
    queried = set().union(*(metric_names(expr) for _, expr in queries))
    for needed in ("koordnode_pod_cpu_pressure_seconds_total", "koordnode_be_cpu_quota_cores",
                   "koordnode_evictions_total", "koordnode_hook_failures_total", "koordnode_cgroup_overwrites_total",
                   "koordnode_cri_hook_delay_seconds_bucket"):
        assert needed in queried, needed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prometheus_query(port: int, expr: str) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:  # a query Prometheus refuses answers 400 with the reason
        return json.loads(err.read())


@pytest.mark.e2e
def test_a_real_prometheus_evaluates_the_rules_and_every_panel(containerd_bed, tmp_path):
    """A Prometheus server scraping a live koordnode every second, with the rules loaded (their
    groups evaluated every second): every panel's query is valid PromQL there, and the panels
    that a node with a pod always has data for show it."""
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        if running_in_ci():
            pytest.fail("prometheus is missing (scripts/install-deps.sh installs it)")
        pytest.skip("prometheus is not installed")
    metrics_port, prometheus_port = free_port(), free_port()
    kn = KoordnodeProcess(tmp_path / "kn", str(containerd_bed.socket), kubepods=containerd_bed.kubepods_cgroup,
                          metrics_listen=f"127.0.0.1:{metrics_port}").start()
    fast_rules = rule_file()
    for group in fast_rules["groups"]:
        group["interval"] = "1s"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(fast_rules))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yml")],
        "scrape_configs": [{"job_name": "koordnode", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}],
    }))
    server = subprocess.Popen(
        [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prometheus_port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"))
    cri = Cri(kn.listen)
    sid = None
    try:
        sb = sandbox_config(containerd_bed, "scraped", qos="burstable", labels={"koordinator.sh/qosClass": "LS"})
        sid = run_pod(cri, sb)
        start_container(cri, sid, sb, container_config(containerd_bed, "c", ["sleep", "3600"]))

        def has_data(expr: str) -> bool:
            answer = prometheus_query(prometheus_port, expr)
            return answer.get("status") == "success" and bool(answer["data"]["result"])

        deadline = time.monotonic() + 60
        # Two scrapes after the pod's calls, and the recording rules evaluated on them.
        while not has_data('koordnode:cri_hook_delay_seconds:p99_5m{method="CreateContainer"}'):
            assert server.poll() is None, (tmp_path / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "Prometheus never recorded the hook delay"
            time.sleep(0.5)
        assert has_data('up{job="koordnode"} == 1')

        empty = []
        for where, expr in dashboard_queries():
            answer = prometheus_query(prometheus_port, expr.replace("$instance", ".*"))
            assert answer.get("status") == "success", (where, expr, answer)
            if not answer["data"]["result"]:
                empty.append(where)
        # What a node with a pod always has: the rest shows data once there is something to show
        # (evictions, hook failures, overwrites, memory protection on cgroup v2).
        for where in ("koordnode up", "Dry run", "Last reload applied", "kubelet connections", "BE quota now",
                      "Node pressure (PSI avg10)", "BE CPU quota", "CRI latency koordnode adds",
                      "CRI call duration through koordnode", "CRI calls by status", "Kernel writes by outcome"):
            assert not [e for e in empty if e.startswith(f"panel '{where}")], (where, empty)
        print("panels without data on this node:", empty)
        for rule in rules():
            if "alert" in rule:
                answer = prometheus_query(prometheus_port, rule["expr"])
                assert answer.get("status") == "success", (rule["alert"], answer)
    finally:
        server.terminate()
        server.wait(20)
        if sid is not None:
            remove_pod(cri, sid)
        cri.close()
        kn.stop()
