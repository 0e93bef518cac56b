"""koordnode/kube without an API server: the HTTP client's bounds against a scripted server,
kubeconfig and token rotation, the NodeSLO mapping and its precedence, pod facts, evictions,
NodeMetric's shape and the batch allocatable formula. tests/test_kube_apiserver.py runs the
same parts against a real kube-apiserver."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from koordnode.config import key_sources, parse_config, to_dict, with_nodeslo
from koordnode.config.kubernetes import KubernetesConfig
from koordnode.kube import http
from koordnode.kube.agent import ClusterLink, EvictionRefused, EvictTarget
from koordnode.kube.client import ApiError, Gone, KubeClient, Unreachable
from koordnode.kube.credentials import Credentials, CredentialsError, parse_kubeconfig_text
from koordnode.kube.nodemetric import (
    PodUsage, aggregated_usages, format_duration, koord_priority_class, metric_request, new_node_metric,
    node_metric_status, parse_duration, report_interval_s)
from koordnode.kube.nodeslo import CLASS_FIELDS, DERIVED_FIELDS, IGNORED, SCALAR_FIELDS, map_nodeslo
from koordnode.kube.pods import parse_quantity, pod_facts_of
from koordnode.kube.reflector import Reflector
from koordnode.model.pod_facts import PodFacts
from koordnode.policy.batch_resources import UsageInputs, batch_allocatable
from koordnode.policy.class_inputs import ContainerInput, ContainerResources, PodInput
from koordnode.policy.container_policy import plan_container
from koordnode.config.classes import QoSConfig
from koordnode.model.qos_class import ClassDecision, KubeQoS, QoSClass

REPO = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------
# A scripted HTTP server: each connection gets the next answer (bytes, or a coroutine writing).

Answer = bytes | Callable[[asyncio.StreamWriter], Awaitable[None]]


class ScriptedServer:
    def __init__(self, answers: list[Answer]) -> None:
        self.answers = answers
        self.requests: list[str] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> ScriptedServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"Content-Length: (\d+)", head)
        body = await reader.readexactly(int(length.group(1))) if length else b""
        self.requests.append(head.decode().split("\r\n")[0] + (" " + body.decode() if body else ""))
        answer = self.answers.pop(0) if self.answers else _json(404, {"kind": "Status", "reason": "NotFound"})
        if isinstance(answer, bytes):
            writer.write(answer)
        else:
            await answer(writer)
        try:
            await writer.drain()
            writer.close()
        except ConnectionError:
            pass


def _json(status: int, doc: Any) -> bytes:
    body = json.dumps(doc).encode()
    return f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def _chunked(lines: list[bytes], status: int = 200) -> bytes:
    out = f"HTTP/1.1 {status} OK\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    for line in lines:
        out += f"{len(line):x}\r\n".encode() + line + b"\r\n"
    return out + b"0\r\n\r\n"


def _event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def _client(url: str, max_bytes: int = 1 << 20) -> KubeClient:
    return KubeClient(Credentials(url, token="t0"), timeout_s=2.0, max_response_bytes=max_bytes)


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# HTTP client bounds


def test_request_decodes_json_and_sends_the_token() -> None:
    async def go() -> None:
        async with ScriptedServer([_json(200, {"kind": "Pod"})]) as server:
            assert await _client(server.url).get("/api/v1/x") == {"kind": "Pod"}
    run(go())


def test_huge_response_is_refused_with_a_clear_error() -> None:
    async def go() -> None:
        async with ScriptedServer([_json(200, {"items": ["x" * 200_000]})]) as server:
            with pytest.raises(Unreachable, match="exceeds 65536 bytes"):
                await _client(server.url, max_bytes=65536).get("/api/v1/pods")
    run(go())


def test_garbage_answers_are_errors_not_crashes() -> None:
    async def go() -> None:
        answers: list[Answer] = [b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n{x}",
                                 b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                                 b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 5000]
        async with ScriptedServer(answers) as server:
            client = _client(server.url)
            for _ in range(4):
                with pytest.raises(Unreachable):
                    await client.get("/x")
    run(go())


def test_a_silent_server_costs_the_timeout_not_a_stall() -> None:
    async def hang(writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    async def go() -> None:
        async with ScriptedServer([hang]) as server:
            client = KubeClient(Credentials(server.url), timeout_s=0.3)
            started = asyncio.get_running_loop().time()
            with pytest.raises(Unreachable, match="within 0.3 s"):
                await client.get("/x")
            assert asyncio.get_running_loop().time() - started < 2
    run(go())


def test_error_status_carries_reason_and_message() -> None:
    async def go() -> None:
        status = {"kind": "Status", "reason": "TooManyRequests", "message": "Cannot evict pod as it would violate "
                  "the pod's disruption budget.", "code": 429}
        async with ScriptedServer([_json(429, status), _json(410, {"reason": "Expired"})]) as server:
            client = _client(server.url)
            with pytest.raises(ApiError) as info:
                await client.create("/api/v1/namespaces/a/pods/b/eviction", {})
            assert info.value.status == 429 and "disruption budget" in info.value.message
            with pytest.raises(Gone):
                await client.get("/x")
    run(go())


def test_watch_streams_chunked_events_and_refuses_an_oversized_one() -> None:
    async def go() -> None:
        pod = {"metadata": {"name": "a", "namespace": "n", "resourceVersion": "5"}}
        answers: list[Answer] = [_chunked([_event("ADDED", pod)[:20], _event("ADDED", pod)[20:],
                                           _event("BOOKMARK", {"metadata": {"resourceVersion": "9"}})]),
                                 _chunked([b'{"type":"ADDED","object":{"a":"' + b"x" * 70000])]
        async with ScriptedServer(answers) as server:
            client = _client(server.url, max_bytes=65536)
            events = [e async for e in client.watch("/api/v1/pods", {}, 10)]
            assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
            assert "allowWatchBookmarks=true" in server.requests[0]
            with pytest.raises(Unreachable, match="one watch event exceeds"):
                _ = [e async for e in client.watch("/api/v1/pods", {}, 10)]
    run(go())


def test_reflector_relists_on_410_and_resumes_from_the_bookmark() -> None:
    seen: list[list[str]] = []

    async def go() -> None:
        def pod(name: str, rv: str) -> dict[str, Any]:
            return {"metadata": {"name": name, "namespace": "n", "resourceVersion": rv}}

        answers: list[Answer] = [
            _json(200, {"metadata": {"resourceVersion": "10"}, "items": [pod("a", "3"), {"bad": 1}]}),
            _chunked([_event("ADDED", pod("b", "11")), _event("BOOKMARK", {"metadata": {"resourceVersion": "20"}})]),
            _chunked([_event("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"})]),
            _json(200, {"metadata": {"resourceVersion": "30"}, "items": [pod("c", "30")]}),
        ]
        async with ScriptedServer(answers) as server:
            stop = asyncio.Event()
            reflector = Reflector(_client(server.url), "/api/v1/pods", field_selector="spec.nodeName=n1",
                                  on_change=lambda store: seen.append(sorted(store)), name="pods")
            task = asyncio.create_task(reflector.run(stop))
            while len(seen) < 3:
                await asyncio.sleep(0.01)
            stop.set()
            task.cancel()
            requests = server.requests
            assert "fieldSelector=spec.nodeName%3Dn1" in requests[0]
            assert "resourceVersion=10" in requests[1] and "watch=true" in requests[1]
            assert "resourceVersion=20" in requests[2]  # resumed from the bookmark
            assert "watch=true" not in requests[3]  # 410: a fresh list
            assert reflector.health.malformed == 1 and reflector.health.relists == 2
    run(go())
    assert seen[:3] == [["n/a"], ["n/a", "n/b"], ["n/c"]]


# ---------------------------------------------------------------------------------------------
# credentials


KUBECONFIG = """\
apiVersion: v1
clusters:
- cluster:
    certificate-authority: ca.crt
    server: https://127.0.0.1:6443
  name: bed
contexts:
- context:
    cluster: bed
    user: koordnode
  name: koordnode@bed
current-context: koordnode@bed
kind: Config
preferences: {}
users:
- name: koordnode
  user:
    tokenFile: token   # re-read when it changes
"""


def test_kubeconfig_yaml_and_json() -> None:
    doc = parse_kubeconfig_text(KUBECONFIG)
    assert doc["users"][0]["user"] == {"tokenFile": "token"}
    assert parse_kubeconfig_text(json.dumps(doc)) == doc
    with pytest.raises(ValueError, match="line 3: invalid YAML"):
        parse_kubeconfig_text("a: b\nc: [x\nd: e\n")


def test_token_file_is_read_again_when_it_rotates(tmp_path: Path) -> None:
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    token = tmp_path / "token"
    token.write_text("first\n")
    creds = Credentials.from_kubeconfig(str(tmp_path / "kubeconfig"))
    assert creds.server == "https://127.0.0.1:6443"
    assert creds.auth_headers() == {"Authorization": "Bearer first"}
    assert creds.auth_headers() == {"Authorization": "Bearer first"} and creds.token_reads == 1
    rotated = tmp_path / "token.new"
    rotated.write_text("second")
    os.replace(rotated, token)  # as the kubelet rotates a projected token: a new file
    assert creds.auth_headers() == {"Authorization": "Bearer second"} and creds.token_reads == 2


def test_unsupported_kubeconfig_users_are_refused_with_why(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG.replace("tokenFile: token   # re-read when it changes", "exec: {}"))
    with pytest.raises(CredentialsError, match="exec.command is missing"):
        Credentials.from_kubeconfig(str(path))
    path.write_text(KUBECONFIG.replace("tokenFile: token   # re-read when it changes", "auth-provider: {name: gcp}"))
    with pytest.raises(CredentialsError, match="auth-provider, which Kubernetes removed"):
        Credentials.from_kubeconfig(str(path))
    with pytest.raises(CredentialsError, match="KUBERNETES_SERVICE_HOST"):
        Credentials.in_cluster(str(tmp_path), environ={})


# ---------------------------------------------------------------------------------------------
# NodeSLO -> config, precedence


NODESLO_SPEC: dict[str, Any] = {
    "resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 55, "cpuSuppressPolicy": "cfsQuota",
                                    "memoryEvictThresholdPercent": 80, "memoryEvictLowerPercent": 75,
                                    "cpuEvictBESatisfactionUpperPercent": 60},
    "resourceQOSStrategy": {
        "lsClass": {"memoryQOS": {"enable": True, "minLimitPercent": 40, "lowLimitPercent": 70, "priority": 0}},
        "beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1}, "resctrlQOS": {"catRangeEndPercent": 40}},
        "lsrClass": {"memoryQOS": {"wmarkRatio": 90}},
    },
    "cpuBurstStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": 500, "cfsQuotaBurstPeriodSeconds": -1},
    "systemStrategy": {"minFreeKbytesFactor": 100, "watermarkScaleFactor": 150},
}


def test_nodeslo_maps_onto_koordnode_keys_with_units() -> None:
    mapping = map_nodeslo(NODESLO_SPEC, memory_total_bytes=16 << 30)
    assert mapping.errors == []
    config = with_nodeslo(parse_config(""), mapping.values)
    assert config.strategy.cpu_suppress.threshold_percent == 55.0
    # Koordinator's threshold whether or not BE is in koordnode's idle group (its 95 % replaced).
    assert config.strategy.cpu_suppress.idle_group_threshold_percent == 55.0
    assert config.strategy.cpu_suppress.policy == "cfs_quota"
    assert (config.strategy.be_evict.memory_threshold_percent, config.strategy.be_evict.memory_margin_percent) == (80, 5)
    assert (config.qos.LS.memory_min_percent, config.qos.LS.memory_low_percent) == (40, 70)
    assert config.qos.BE.cpu_bvt_warp_ns == -1 and config.qos.BE.resctrl.cat_range_end_percent == 40
    assert config.qos.LSR.memory_wmark_ratio == 90 and config.qos.LSE.memory_wmark_ratio == 90  # LSE takes lsrClass
    assert (config.strategy.cpu_burst.enable, config.strategy.cpu_burst.cfs_quota_burst) == (True, False)
    assert config.strategy.memory_qos.min_free_kbytes == 16 * 1024 * 1024 * 100 // 10000
    assert config.strategy.memory_qos.watermark_scale_factor == 150
    ignored = "\n".join(mapping.ignored)
    for field in ("cpuEvictBESatisfactionUpperPercent", "memoryQOS.priority", "cfsQuotaBurstPeriodSeconds"):
        assert field in ignored


def test_the_mapping_table_is_documented() -> None:
    docs = (REPO / "docs" / "operations.md").read_text()
    for path, (key, _) in {**SCALAR_FIELDS, **DERIVED_FIELDS}.items():
        assert f"`{path}`" in docs and f"`{key}`" in docs, path
    for sub, key in CLASS_FIELDS.items():
        assert f"`{sub}`" in docs and f"`{key}`" in docs, sub
    for path in IGNORED:
        assert f"`{path}`" in docs, path


def test_core_expeller_is_taken_with_the_core_sched_policy_only() -> None:
    """Koordinator reads cpuQOS.coreExpeller only under cpuPolicy "coreSched"; koord-manager's
    defaults set it for lsClass and lsrClass (LSR and LSE here), and BE never expels."""
    def spec(policy: str) -> dict[str, Any]:
        def cls(expeller: bool) -> dict[str, Any]:
            return {"cpuQOS": {"enable": True, "coreExpeller": expeller}}
        return {"resourceQOSStrategy": {"policies": {"cpuPolicy": policy}, "lsrClass": cls(True),
                                        "lsClass": cls(True), "beClass": cls(True)}}

    mapping = map_nodeslo(spec("coreSched"))
    assert mapping.errors == []
    config = with_nodeslo(parse_config(""), mapping.values)  # BE's true was not taken: no config error
    assert [config.qos.for_class(c).core_expeller for c in QoSClass] == [False, True, True, True, False]
    assert key_sources(config)["qos.LS.core_expeller"] == "nodeslo"
    assert any(line.startswith("spec.resourceQOSStrategy.beClass.cpuQOS.coreExpeller: taken") for line in mapping.ignored)
    mapping = map_nodeslo(spec("groupIdentity"))
    assert not any("core_expeller" in key for key in mapping.fields)
    assert any(line.startswith("spec.resourceQOSStrategy.lsClass.cpuQOS.coreExpeller:") for line in mapping.ignored)


def test_the_local_file_wins_over_nodeslo_over_defaults() -> None:
    local = parse_config("[strategy.cpu_suppress]\nthreshold_percent = 70\n[qos.LS]\nmemory_min_percent = 10\n")
    config = with_nodeslo(local, map_nodeslo(NODESLO_SPEC).values)
    assert config.strategy.cpu_suppress.threshold_percent == 70.0  # toml
    assert config.qos.LS.memory_min_percent == 10 and config.qos.LS.memory_low_percent == 70  # toml, nodeslo
    sources = key_sources(config)
    assert sources["strategy.cpu_suppress.threshold_percent"] == "toml"
    assert sources["qos.LS.memory_low_percent"] == "nodeslo"
    assert sources["qos.LS.oom_score_adj"] == "default"
    assert set(sources.values()) == {"toml", "nodeslo", "default"}
    # Without a NodeSLO again: back to the file and the defaults.
    assert with_nodeslo(config, None).qos.LS.memory_low_percent == 80
    assert key_sources(with_nodeslo(config, None))["qos.LS.memory_low_percent"] == "default"


@pytest.mark.parametrize(("spec", "error"), [
    ({"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": "high"}},
     "spec.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent: expected an integer, got 'high'"),
    ({"resourceUsedThresholdWithBE": {"cpuSuppressPolicy": "quota"}},
     'spec.resourceUsedThresholdWithBE.cpuSuppressPolicy: expected one of "cfsQuota", "cpuset", got \'quota\''),
    ({"resourceUsedThresholdWithBE": {"memoryEvictThresholdPercent": 60, "memoryEvictLowerPercent": 65}},
     "spec.resourceUsedThresholdWithBE.memoryEvictLowerPercent: must be below memoryEvictThresholdPercent (65 >= 60)"),
    ({"cpuBurstStrategy": {"policy": "always"}},
     'spec.cpuBurstStrategy.policy: expected one of "none", "cpuBurstOnly", "cfsQuotaBurstOnly", "auto", got \'always\''),
])
def test_an_invalid_nodeslo_is_refused_with_reasons(spec: dict[str, Any], error: str) -> None:
    assert map_nodeslo(spec).errors == [error]


def test_a_nodeslo_field_out_of_koordnode_ranges_is_left_out_and_the_rest_applied() -> None:
    """Valid for Koordinator, not for koordnode: that field is named in status and the log, the
    others apply; only a spec that is not an object (or an error no field explains) is refused."""
    applied: list[Any] = []

    async def apply(values: Any) -> None:
        applied.append(with_nodeslo(parse_config(""), values))

    link = ClusterLink(KubernetesConfig(enable=True, node_name="n1"), apply_nodeslo=apply,
                       on_pod_facts=lambda: None, node_metric_status=lambda request: None, client=FakeApi({}))  # type: ignore[arg-type]
    spec = {"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 150, "cpuEvictPolicy": "evictByRealLimit",
                                            "cpuSuppressPolicy": "quota"},
            "cpuBurstStrategy": {"policy": "auto", "cfsQuotaBurstPercent": 50},
            "resourceQOSStrategy": {"lsClass": {"memoryQOS": {"minLimitPercent": 30}},
                                    "lsrClass": {"memoryQOS": {"throttlingPercent": 120}},
                                    "beClass": {"memoryQOS": {"throttlingPercent": 5000}}}}
    run(link._take_nodeslo({"metadata": {"name": "n1", "resourceVersion": "7"}, "spec": spec}, "7"))
    status = link.nodeslo_status
    assert status["state"] == "applied in part" and "last_refused" not in status
    assert sorted(status["not_applied"]) == [
        "spec.cpuBurstStrategy.cfsQuotaBurstPercent (strategy.cpu_burst.max_quota_percent): "
        "expected a number in [100, 10000], got 50.0",
        'spec.resourceUsedThresholdWithBE.cpuSuppressPolicy: expected one of "cfsQuota", "cpuset", got \'quota\'',
        "spec.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent (strategy.cpu_suppress.idle_group_threshold_percent): "
        "expected a number in [1, 100], got 150.0",
        "spec.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent (strategy.cpu_suppress.threshold_percent): "
        "expected a number in [1, 100], got 150.0"]
    config = applied[-1]
    assert config.qos.LS.memory_min_percent == 30 and config.strategy.cpu_burst.enable  # the rest applied
    assert config.strategy.cpu_suppress.threshold_percent == 65.0  # the default, not 150
    assert config.strategy.cpu_suppress.idle_group_threshold_percent == 95.0
    # Koordinator's example value above 100 is taken as it is (memory.high above the limit); one
    # beyond koordnode's 1000 is applied as 1000 and named.
    assert config.qos.LSR.memory_high_percent == 120 and config.qos.LSE.memory_high_percent == 120
    assert config.qos.BE.memory_high_percent == 1000
    assert any("beClass.memoryQOS.throttlingPercent: 5000 is above 1000" in line for line in status["ignored"])
    assert any("cpuEvictPolicy" in line for line in status["ignored"])

    run(link._take_nodeslo({"metadata": {"name": "n1", "resourceVersion": "8"}, "spec": "junk"}, "8"))
    assert link.nodeslo_status["last_refused"]["errors"] == ["spec: expected an object"]
    assert len(applied) == 1 and link.nodeslo_status["state"] == "applied in part"  # the last good one stays


# ---------------------------------------------------------------------------------------------
# pod facts, memory protection from them


def test_quantities() -> None:
    assert parse_quantity("512Mi") == 512 << 20 and parse_quantity("1G") == 10**9
    assert parse_quantity("100m") * 1000 == 100 and parse_quantity(3) == 3
    for bad in ("1e999999", "12 Mi", "", "Mi", True, None, "1" * 100):
        with pytest.raises(ValueError):
            parse_quantity(bad)


def test_pod_facts_from_a_pod_and_from_a_malformed_one() -> None:
    pod = {"metadata": {"uid": "u1", "name": "web", "namespace": "prod", "deletionTimestamp": "2026-01-01T00:00:00Z",
                        "ownerReferences": [{"kind": "ReplicaSet", "name": "web-5d"}],
                        "labels": {"koordinator.sh/qosClass": "LS"}},
           "spec": {"priority": 9100, "priorityClassName": "koord-prod",
                    "containers": [{"name": "app", "resources": {"requests": {"memory": "1Gi"}}},
                                   {"name": "side", "resources": {"requests": {"memory": "lots"}}}, "junk"]},
           "status": {"qosClass": "Burstable"}}
    facts, problems = pod_facts_of(pod)
    assert facts is not None and facts.memory_requests == {"app": 1 << 30}
    assert (facts.priority, facts.owners, facts.terminating, facts.kube_qos) == (9100, ("ReplicaSet/web-5d",), True,
                                                                                  "Burstable")
    assert len(problems) == 2
    assert pod_facts_of({"metadata": {"name": "x"}}) == (None, ["pod without metadata.uid"])
    assert pod_facts_of({"metadata": {"uid": "u", "name": []}, "spec": {"containers": 5, "priority": "hi"}})[0] \
        is not None


def test_ls_burstable_pod_gets_memory_protection_from_the_api() -> None:
    decision = ClassDecision(QoSClass.LS, "burstable", "cgroup_parent", KubeQoS.BURSTABLE)
    container = ContainerInput("app", ContainerResources(memory_limit_in_bytes=4 << 30))
    config = QoSConfig().for_class(QoSClass.LS)
    from koordnode.policy.class_inputs import KernelFeatures

    features = KernelFeatures(cgroup_version="v2")
    alone = plan_container(PodInput(uid="u1"), container, decision=decision, config=config, features=features,
                           container_cgroup="kubepods/burstable/podu1/c1")
    assert alone.memory.min_bytes == 0 and any("not known to the API server" in n for n in alone.notes)
    known = plan_container(PodInput(uid="u1", memory_requests={"app": 1 << 30}), container, decision=decision,
                           config=config, features=features, container_cgroup="kubepods/burstable/podu1/c1")
    assert (known.memory.min_bytes, known.memory.low_bytes) == ((1 << 30) // 2, (1 << 30) * 8 // 10)


# ---------------------------------------------------------------------------------------------
# evictions


class FakeApi:
    def __init__(self, answers: dict[str, Exception | dict[str, Any]]) -> None:
        self.answers = answers
        self.posts: list[str] = []
        self.credentials = Credentials("https://fake")

    async def create(self, path: str, obj: dict[str, Any]) -> Any:
        self.posts.append(path)
        answer = self.answers.get(path.split("/")[-2], {})
        if isinstance(answer, Exception):
            raise answer
        return answer


def _link(api: FakeApi, **config: Any) -> ClusterLink:
    async def apply(values: Any) -> None:
        return None

    return ClusterLink(KubernetesConfig(enable=True, node_name="n1", **config), apply_nodeslo=apply,
                       on_pod_facts=lambda: None, node_metric_status=lambda request: None, client=api)  # type: ignore[arg-type]


def test_pdb_refusal_is_reported_and_the_next_candidate_tried() -> None:
    pdb = ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.")
    api = FakeApi({"be-1": pdb})
    link = _link(api)
    targets = [EvictTarget("batch", "be-1", "u1"), EvictTarget("batch", "be-2", "u2")]
    assert run(link.evict(targets, "memory")) == ("evicted", targets[1])
    assert link.eviction_counts == {"refused": 1, "evicted": 1}
    assert [e["result"] for e in link.recent_evictions] == ["refused", "evicted"]
    assert "disruption budget" in link.recent_evictions[0]["detail"]


def test_terminating_pods_are_not_counted_twice_and_the_window_is_bounded() -> None:
    api = FakeApi({})
    link = _link(api, evictions_per_window=2, eviction_window_s=60)
    one, two, three = (EvictTarget("b", f"p{i}", f"u{i}") for i in range(3))
    assert run(link.evict([one], "memory"))[0] == "evicted"
    assert run(link.evict([one], "memory"))[0] == "already terminating"  # another container of the same pod
    link.facts["u1"] = PodFacts("u1", "b", "p1", terminating=True)  # the watch shows it deleting
    assert run(link.evict([two], "memory"))[0] == "already terminating"
    assert run(link.evict([three], "memory"))[0] == "evicted"
    with pytest.raises(EvictionRefused, match="at most 2 evictions per 60 s"):
        run(link.evict([EvictTarget("b", "p3", "u3")], "memory"))
    assert len(api.posts) == 2


def test_a_terminating_fallback_is_skipped_not_returned() -> None:
    pdb = ApiError(429, "TooManyRequests", "budget")
    api = FakeApi({"guarded": pdb})
    link = _link(api)
    link.facts["u-going"] = PodFacts("u-going", "n", "going", terminating=True)
    with pytest.raises(EvictionRefused):
        run(link.evict([EvictTarget("n", "guarded", "u-g"), EvictTarget("n", "going", "u-going")], "memory"))
    assert [p.split("/")[-2] for p in api.posts] == ["guarded"]  # the guarded pod was asked, the other skipped


class SlowApi(FakeApi):
    """Answers after a round trip, as a real API server does: concurrent evictions interleave."""

    async def create(self, path: str, obj: dict[str, Any]) -> Any:
        self.posts.append(path)
        await asyncio.sleep(0.02)
        answer = self.answers.get(path.split("/")[-2], {})
        if isinstance(answer, Exception):
            raise answer
        return answer  # a pod already deleting is "evicted" again: the API server accepts it


def test_a_rounds_concurrent_evictions_count_a_pod_once() -> None:
    """One round picks both BE pods' containers; the QoS manager runs their evictions as
    concurrent tasks, each with the other pod as its fallback. The guarded pod's task is refused
    and falls back to the free pod, which the other task is evicting: asked and counted once."""
    pdb = ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.")
    api = SlowApi({"guarded": pdb})
    link = _link(api)
    guarded, free = EvictTarget("n", "guarded", "u-g"), EvictTarget("n", "free", "u-f")

    async def round_of_two() -> list[Any]:
        return await asyncio.gather(link.evict([guarded, free], "memory"), link.evict([free, guarded], "memory"),
                                    return_exceptions=True)

    results = run(round_of_two())
    assert results[0] == ("evicted", free) and results[1] == ("already terminating", free), results
    assert link.eviction_counts == {"refused": 1, "evicted": 1, "already_terminating": 1}
    assert [p.split("/")[-2] for p in api.posts] == ["guarded", "free"]


def test_concurrent_evictions_respect_the_window() -> None:
    link = _link(SlowApi({}), evictions_per_window=1, eviction_window_s=60)

    async def two() -> list[Any]:
        return await asyncio.gather(link.evict([EvictTarget("n", "a", "1")], "memory"),
                                    link.evict([EvictTarget("n", "b", "2")], "memory"), return_exceptions=True)

    results = run(two())
    assert results[0] == ("evicted", EvictTarget("n", "a", "1"))
    assert isinstance(results[1], EvictionRefused)
    assert link.eviction_counts == {"evicted": 1, "rate_limited": 1}


def test_every_candidate_refused_raises() -> None:
    pdb = ApiError(429, "TooManyRequests", "budget")
    link = _link(FakeApi({"a": pdb, "b": pdb}))
    with pytest.raises(EvictionRefused, match="PodDisruptionBudgets"):
        run(link.evict([EvictTarget("n", "a", "1"), EvictTarget("n", "b", "2")], "memory"))


# ---------------------------------------------------------------------------------------------
# NodeMetric, batch allocatable


def test_node_metric_status_in_koordinators_shape() -> None:
    status = node_metric_status(node_cpu_cores=3.5, node_memory_bytes=8 << 30, system_cpu_cores=0.5,
                                system_memory_bytes=1 << 30,
                                pods=[PodUsage("prod", "web", "LS", 9100, 2.0, 1 << 30),
                                      PodUsage("batch", "job", "BE", 5500, 1.0, 2 << 30)],
                                now=datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.UTC))
    assert status["updateTime"] == "2026-11-26T12:00:00Z"
    assert status["nodeMetric"]["nodeUsage"] == {"resources": {"cpu": "3500m", "memory": str(8 << 30)}}
    assert status["podsMetric"][1] == {"namespace": "batch", "name": "job", "qos": "BE", "priority": "koord-batch",
                                       "podUsage": {"resources": {"cpu": "1000m", "memory": str(2 << 30)}}}
    assert [koord_priority_class(p) for p in (9999, 7000, 5000, 3500, 0, None)] == \
        ["koord-prod", "koord-mid", "koord-batch", "koord-free", "", ""]
    assert report_interval_s({"spec": {"metricCollectPolicy": {"reportIntervalSeconds": 30}}}, 60) == 30
    assert report_interval_s({"spec": {"metricCollectPolicy": {"reportIntervalSeconds": "x"}}}, 60) == 60


def test_usage_percentiles_as_koordlet_reports_them() -> None:
    """avg and p50/p90/p95/p99 of the samples in each window (koordlet's index: int(n x p) - 1),
    CPU in milli-cores and memory in bytes; a window the samples span less than half of gets
    empty maps, as koordlet sends them after a start; system usage CPU only."""
    cpu = [(float(t), t / 100) for t in range(1, 601)]  # one a second for 10 minutes: 0.01 .. 6.00 cores
    memory = [(float(t), float(t << 20)) for t in range(1, 601)]
    five, ten, thirty = aggregated_usages(cpu, memory, end=600.0, durations_s=(300, 600, 1800))
    assert five["duration"] == "5m0s" and thirty["duration"] == "30m0s"
    # the last 5 minutes: samples 300..600 (301 of them); p90 index int(301 x 0.9) - 1 = 269 -> 569
    assert five["usage"]["p90"] == {"resources": {"cpu": "5690m", "memory": str(569 << 20)}}
    assert five["usage"]["p50"]["resources"]["cpu"] == "4490m"  # index 149 -> 449
    assert five["usage"]["avg"]["resources"]["cpu"] == "4500m"
    assert ten["usage"]["p99"]["resources"]["cpu"] == "5940m"  # 600 samples: index int(594.0) - 1 = 593 -> 5.94
    assert thirty["usage"] == {name: {} for name in ("avg", "p50", "p90", "p95", "p99")}  # 10 of 30 minutes: cold
    [system] = aggregated_usages(cpu, None, end=600.0, durations_s=(300,))
    assert system["usage"]["p95"] == {"resources": {"cpu": "5840m"}}
    assert aggregated_usages([], None, end=600.0, durations_s=(300,))[0]["usage"]["avg"] == {}


def test_go_durations_and_the_metric_request_of_a_nodemetric() -> None:
    assert [parse_duration(d) for d in ("5m0s", "10m", "1h0m0s", "1m30s", "90s", "500ms")] == [
        300, 600, 3600, 90, 90, 0.5]
    assert [parse_duration(d) for d in ("", "5", "m", "5x", 5, "1.2.3s", "x" * 100)] == [None] * 7
    assert [format_duration(s) for s in (300, 600, 1800, 3600, 30, 5400)] == [
        "5m0s", "10m0s", "30m0s", "1h0m0s", "30s", "1h30m0s"]
    request = metric_request(new_node_metric("n1"), 60)
    assert (request.interval_s, request.aggregate_durations_s) == (60, (300, 600, 1800))
    odd = {"spec": {"metricCollectPolicy": {"reportIntervalSeconds": 20,
                                            "nodeAggregatePolicy": {"durations": ["5s", "junk", "2m0s", 7]}}}}
    assert (metric_request(odd, 60).interval_s, metric_request(odd, 60).aggregate_durations_s) == (20, (120,))


def test_batch_allocatable_formula() -> None:
    # 16 CPUs, 2 reserved, node uses 9 of which pods 7 (LS 5): system 2 -> 16 - 2 - 2 - 5 = 7
    cpu = batch_allocatable(UsageInputs(16, 2, node_used=9, pods_used=7, ls_pods_used=5))
    assert (cpu.value, cpu.system_used) == (7, 2)
    # the annotated reservation wins when larger than what the system uses
    assert batch_allocatable(UsageInputs(16, 0, 9, 7, 5, annotated_reserved=4)).value == 7
    assert batch_allocatable(UsageInputs(4, 1, 4, 1, 3)).value == 0  # never negative


def test_status_shows_every_key_with_its_source() -> None:
    config = with_nodeslo(parse_config("[qos.LS]\nmemory_min_percent = 10\n"), map_nodeslo(NODESLO_SPEC).values)
    sources = key_sources(config)
    # every key of the file, a table of values such as net.priorities as one key
    leaves = {k if not k.startswith("net.priorities.") else "net.priorities" for k in _leaves(to_dict(config))}
    assert set(sources) == leaves
    assert sources["qos.LS.memory_min_percent"] == "toml"


def _leaves(table: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in table.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and not value:
            continue  # an empty table ([host_applications]): no key
        out += _leaves(value, path) if isinstance(value, dict) else [path]
    return out


def test_http_parse_server() -> None:
    assert http.parse_server("https://[::1]:6443/base/").host == "::1"
    with pytest.raises(ValueError):
        http.parse_server("unix:///x")


def test_node_name_defaults_to_the_host_name_as_kubelet() -> None:
    import socket

    from koordnode.kube.agent import node_name_of

    assert node_name_of(KubernetesConfig(), {}) == socket.gethostname().lower()
    assert node_name_of(KubernetesConfig(node_name="worker-7")) == "worker-7"
    # a DaemonSet's pod: its host name is the pod's; the downward API gives $NODE_NAME
    assert node_name_of(KubernetesConfig(), {"NODE_NAME": "worker-9"}) == "worker-9"
    assert node_name_of(KubernetesConfig(node_name="worker-7"), {"NODE_NAME": "worker-9"}) == "worker-7"
    with pytest.raises(ValueError, match=r"\$NODE_NAME: expected a node name"):
        node_name_of(KubernetesConfig(), {"NODE_NAME": "Worker_9/../x"})


def test_daemon_evicts_through_the_api_and_falls_back_to_cri_when_it_does_not_answer() -> None:
    """BeEviction's choice (the daemon wires it as the QoS manager's evict): the container's pod
    first, then the node's other BE pods by priority; CRI stop when the API does not answer."""
    from koordnode.cri import api_pb2 as pb
    from koordnode.metrics.recorder import Metrics
    from koordnode.qos.eviction import BeEviction
    from koordnode.model.state import ContainerRecord, NodeState, PodRecord

    state = NodeState()
    for sid, name, cls in (("s1", "be-big", "BE"), ("s2", "be-low", "BE"), ("s3", "web", "LS"), ("s4", "be-high", "BE")):
        state.put_pod(PodRecord(sid, name, "batch", f"u-{name}", {}, {}, "/kubepods", qos_class=cls))
    state.put_container(ContainerRecord("c1", "s1", "app", {}, {}, pb.LinuxContainerResources()))
    priorities = {"s2": 3000, "s4": 5500}
    tried: list[list[str]] = []
    stopped: list[str] = []

    class Link:
        answer: Exception | None = None

        async def evict(self, targets: list[EvictTarget], reason: str) -> tuple[str, EvictTarget]:
            tried.append([t.name for t in targets])
            if self.answer is not None:
                raise self.answer
            return "evicted", targets[0]

    class Backend:
        async def stop_container(self, container_id: str, timeout_s: int) -> None:
            stopped.append(container_id)

    evict = stub = BeEviction(state, Backend(), Metrics(process_metrics=False), cluster=Link())
    stub.priority_of = priorities.get
    run(evict("c1", "memory"))
    assert tried == [["be-big", "be-low", "be-high"]] and stopped == []
    stub.cluster.answer = Unreachable("connection refused")
    run(evict("c1", "memory"))
    assert stopped == ["c1"]  # the API did not answer: stopped through the runtime
    stub.cluster.answer = EvictionRefused("refused by PodDisruptionBudgets: ...")
    with pytest.raises(EvictionRefused):
        run(evict("c1", "memory"))  # reported by the QoS manager as a failed eviction
    stub.cluster = None
    run(evict("c1", "memory"))
    assert stopped == ["c1", "c1"]  # [kubernetes] off: CRI stop


def test_lists_are_read_in_pages() -> None:
    def pod(name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "n", "uid": name}}

    async def go() -> Reflector:
        answers: list[Answer] = [
            _json(200, {"metadata": {"resourceVersion": "7", "continue": "page-2"}, "items": [pod("a")]}),
            _json(200, {"metadata": {"resourceVersion": "7"}, "items": [pod("b")]}),
        ]
        async with ScriptedServer(answers) as server:
            reflector = Reflector(_client(server.url), "/api/v1/pods", on_change=lambda store: None, name="pods",
                                  transform=lambda obj: obj["metadata"]["uid"])
            await reflector.relist()
            assert "limit=50" in server.requests[0] and "continue=page-2" in server.requests[1]
            return reflector

    reflector = run(go())
    assert reflector.store == {"n/a": "a", "n/b": "b"} and reflector.resource_version == "7"


def _koord_class(group_identity: int, wmark_min_adj: int, cat_end: int) -> dict[str, Any]:
    return {"cpuQOS": {"enable": False, "groupIdentity": group_identity, "schedIdle": 0, "coreExpeller": False},
            "memoryQOS": {"enable": False, "minLimitPercent": 0, "lowLimitPercent": 0, "throttlingPercent": 0,
                          "wmarkRatio": 95, "wmarkScalePermill": 20, "wmarkMinAdj": wmark_min_adj,
                          "priorityEnable": 0, "priority": 0, "oomKillGroup": 0},
            "resctrlQOS": {"enable": False, "catRangeStartPercent": 0, "catRangeEndPercent": cat_end, "mbaPercent": 100},
            "blkioQOS": {"enable": False}, "networkQOS": {"enable": False}}


def test_a_nodeslo_with_every_koordinator_default_is_accepted() -> None:
    """What koord-manager renders when the ConfigMap sets nothing: every field, Koordinator's defaults."""
    spec = {
        "resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 65, "cpuSuppressPolicy": "cpuset",
                                        "memoryEvictThresholdPercent": 70},
        "resourceQOSStrategy": {"lsrClass": _koord_class(2, -25, 100), "lsClass": _koord_class(2, -25, 100),
                                "beClass": _koord_class(-1, 50, 30), "systemClass": _koord_class(0, -25, 100),
                                "cgroupRoot": _koord_class(0, -25, 100)},
        "cpuBurstStrategy": {"policy": "none", "cpuBurstPercent": 1000, "cfsQuotaBurstPercent": 300,
                             "cfsQuotaBurstPeriodSeconds": -1, "sharePoolThresholdPercent": 50},
        "systemStrategy": {"minFreeKbytesFactor": 100, "watermarkScaleFactor": 150, "memcgReapBackGround": 0},
    }
    mapping = map_nodeslo(spec, memory_total_bytes=8 << 30)
    assert mapping.errors == []
    config = with_nodeslo(parse_config(""), mapping.values)
    assert not config.qos.LS.memory_qos and config.qos.BE.cpu_bvt_warp_ns == 0  # memoryQOS / cpuQOS off
    assert config.strategy.cpu_suppress.policy == "cpuset" and not config.strategy.cpu_burst.enable
    assert config.qos.BE.resctrl.cat_range_end_percent == 30


def test_a_server_ending_every_watch_at_once_is_not_hammered() -> None:
    async def go() -> int:
        listing = _json(200, {"metadata": {"resourceVersion": "1"}, "items": []})
        async with ScriptedServer([listing] + [_chunked([])] * 50) as server:
            stop = asyncio.Event()
            reflector = Reflector(_client(server.url), "/api/v1/pods", on_change=lambda store: None, name="pods",
                                  backoff_max_s=60)
            task = asyncio.create_task(reflector.run(stop))
            await asyncio.sleep(2.0)
            stop.set()
            await asyncio.wait_for(task, 5)
            return len(server.requests)

    assert run(go()) <= 5  # list, then watches 0.5 s, 1 s apart: not 50 in 2 s
