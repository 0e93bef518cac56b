"""kubeconfigs as clusters issue them: full YAML (anchors, flow style, block scalars), embedded
client certificates and keys, client-certificate files re-read when they rotate (a half-written
rotation keeps the pair that worked), and `exec` credential plugins with a bounded time.
The same credentials against a real API server: tests/test_kube_client_cert.py."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from koordnode.kube.client import KubeClient, Unreachable
from koordnode.kube.credentials import Credentials, CredentialsError, parse_kubeconfig_text
from koordnode.kube.exec_credential import ExecPlugin, ExecPluginError, parse_exec_credential


def make_pair(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate and its key (PEM files)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


KUBEADM_STYLE = """\
apiVersion: v1
clusters:
- cluster: &bed
    server: https://127.0.0.1:6443
    insecure-skip-tls-verify: true
  name: bed
contexts: [{{name: ctx, context: {{cluster: bed, user: node}}}}]
current-context: ctx
kind: Config
users:
- name: node
  user:
    client-certificate-data: {cert}
    client-key-data: >-
      {key}
"""


def test_full_yaml_with_embedded_client_certificate(tmp_path: Path) -> None:
    cert, key = make_pair(tmp_path, "node-a")
    path = tmp_path / "kubeconfig"
    path.write_text(KUBEADM_STYLE.format(cert=b64(cert), key=b64(key)))
    creds = Credentials.from_kubeconfig(str(path))
    assert creds.server == "https://127.0.0.1:6443"
    assert creds.ssl_context() is not None and creds.client_cert_loads == 1
    assert creds.ssl_context() is not None and creds.client_cert_loads == 1  # loaded once
    assert creds.auth_headers() == {}  # the certificate is the identity


def test_embedded_pair_that_does_not_match_is_refused_with_why(tmp_path: Path) -> None:
    cert, _ = make_pair(tmp_path, "a")
    _, other_key = make_pair(tmp_path, "b")
    path = tmp_path / "kubeconfig"
    path.write_text(KUBEADM_STYLE.format(cert=b64(cert), key=b64(other_key)))
    with pytest.raises(CredentialsError, match="cannot use the CA or client certificate"):
        Credentials.from_kubeconfig(str(path)).ssl_context()
    path.write_text(KUBEADM_STYLE.format(cert=b64(cert), key="not base64!"))
    with pytest.raises(CredentialsError, match="client-key-data is not base64"):
        Credentials.from_kubeconfig(str(path))


@pytest.mark.parametrize("text, why", [
    ("a: [b\n", "line 2: invalid YAML"),
    ("[" * 5000 + "]" * 5000, "nested too deeply|invalid YAML"),
    ("", "empty"),
    ("- just\n- a list\n", "not a mapping"),
    ("a: !!python/object:os.system x\n", "invalid YAML"),
])
def test_hostile_or_malformed_kubeconfig_is_a_clear_error(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(CredentialsError, match=why):
        Credentials.from_kubeconfig(str(path))


def test_anchor_expansion_is_shared_not_copied() -> None:
    # A "billion laughs" kubeconfig: aliases are the same object, so it costs what it weighs.
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    started = time.monotonic()
    doc = parse_kubeconfig_text("\n".join(lines) + "\n")
    assert doc["a8"][0] is doc["a8"][1]
    assert time.monotonic() - started < 5


FILES_STYLE = """\
apiVersion: v1
kind: Config
clusters: [{name: bed, cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}}]
contexts: [{name: ctx, context: {cluster: bed, user: node}}]
current-context: ctx
users: [{name: node, user: {client-certificate: current.crt, client-key: current.key}}]
"""


def test_client_certificate_files_are_read_again_when_they_rotate(tmp_path: Path) -> None:
    first, second = make_pair(tmp_path, "first"), make_pair(tmp_path, "second")
    current = tmp_path / "current.crt", tmp_path / "current.key"

    def install(pair: tuple[Path, Path], which: tuple[int, ...] = (0, 1)) -> None:
        for i in which:  # a new file moved into place, as certificate rotation does
            staged = current[i].with_suffix(".new")
            staged.write_bytes(pair[i].read_bytes())
            os.replace(staged, current[i])

    install(first)
    (tmp_path / "kubeconfig").write_text(FILES_STYLE)
    creds = Credentials.from_kubeconfig(str(tmp_path / "kubeconfig"))
    context = creds.ssl_context()
    assert creds.client_cert_loads == 1 and creds.ssl_context() is context
    install(second, (0,))  # half-way: the new certificate beside the old key
    assert creds.ssl_context() is context and "do not load yet" in (creds.rotation_problem or "")
    install(second, (1,))
    rotated = creds.ssl_context()
    assert rotated is not context and creds.client_cert_loads == 2 and creds.rotation_problem is None


def plugin_script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "plugin.sh"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return script


def exec_spec(script: Path, **extra: object) -> dict:
    return {"command": str(script), "args": ["--flag"], "env": [{"name": "WHO", "value": "node-a"}],
            "apiVersion": "client.authentication.k8s.io/v1", **extra}


def answer(token: str, expires: str | None = None) -> str:
    status: dict = {"token": token}
    if expires:
        status["expirationTimestamp"] = expires
    return json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": status})


def test_exec_plugin_token_is_cached_until_it_expires(tmp_path: Path) -> None:
    # The plugin sees its env, its args and KUBERNETES_EXEC_INFO; it counts its runs.
    soon = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 20))  # within the refresh margin
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    script = plugin_script(tmp_path, f"""\
echo run >> {tmp_path}/runs
[ "$WHO" = node-a ] && [ "$1" = --flag ] || exit 3
echo "$KUBERNETES_EXEC_INFO" | grep -q '"interactive": false' || exit 4
if [ "$(wc -l < {tmp_path}/runs)" = 1 ]; then echo '{answer("t1", soon)}'; else echo '{answer("t2", later)}'; fi
""")
    plugin = ExecPlugin(exec_spec(script))
    creds = Credentials("https://127.0.0.1:1", exec_plugin=plugin, insecure=True)
    assert creds.exec_due()
    creds.refresh_exec()
    assert creds.auth_headers() == {"Authorization": "Bearer t1"}
    assert creds.exec_due()  # expires within 30 s: asked again before it does
    creds.refresh_exec()
    assert creds.auth_headers() == {"Authorization": "Bearer t2"} and not creds.exec_due() and plugin.runs == 2
    creds.refused()  # a 401: ask again
    assert creds.exec_due()


def test_exec_plugin_runs_off_the_loop_and_a_401_asks_again(tmp_path: Path) -> None:
    script = plugin_script(tmp_path, f"echo '{answer('tok')}'\n")
    creds = Credentials("http://127.0.0.1:9", exec_plugin=ExecPlugin(exec_spec(script)))
    client = KubeClient(creds, timeout_s=1)

    async def go() -> None:
        with pytest.raises(Unreachable):  # nothing listens; the plugin ran first
            await client.get("/api")

    asyncio.run(go())
    assert creds.exec_plugin is not None and creds.exec_plugin.runs == 1
    assert creds.auth_headers() == {"Authorization": "Bearer tok"}


@pytest.mark.parametrize("body, why", [
    ("sleep 30\n", "did not answer within 0.5 s"),
    ("echo oops >&2; exit 7\n", "exited 7: oops"),
    ("echo not json\n", "not JSON"),
    ("echo '{\"kind\": \"ExecCredential\", \"apiVersion\": \"client.authentication.k8s.io/v1beta1\", "
     "\"status\": {\"token\": \"x\"}}'\n", "answered apiVersion"),
    ("echo '{\"kind\": \"ExecCredential\", \"apiVersion\": \"client.authentication.k8s.io/v1\", "
     "\"status\": {}}'\n", "neither a token nor a client certificate"),
])
def test_exec_plugin_failures_are_bounded_and_say_why(tmp_path: Path, body: str, why: str) -> None:
    plugin = ExecPlugin(exec_spec(plugin_script(tmp_path, body)), timeout_s=0.5)
    creds = Credentials("https://127.0.0.1:1", exec_plugin=plugin)
    started = time.monotonic()
    with pytest.raises(CredentialsError, match=why):
        creds.refresh_exec()
    assert time.monotonic() - started < 5


def test_exec_plugin_configuration_is_checked_at_start(tmp_path: Path) -> None:
    with pytest.raises(ExecPluginError, match="apiVersion must be one of"):
        ExecPlugin({"command": "x", "apiVersion": "v9"})
    with pytest.raises(ExecPluginError, match="needs a terminal"):
        ExecPlugin({"command": "x", "apiVersion": "client.authentication.k8s.io/v1", "interactiveMode": "Always"})
    with pytest.raises(ExecPluginError, match="come together"):
        parse_exec_credential(json.dumps({"kind": "ExecCredential", "apiVersion": "v", "status": {
            "clientCertificateData": "x"}}).encode(), "v")


def test_exec_plugin_client_certificate_is_loaded(tmp_path: Path) -> None:
    cert, key = make_pair(tmp_path, "exec")
    doc = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
           "status": {"clientCertificateData": cert.read_text(), "clientKeyData": key.read_text()}}
    (tmp_path / "answer.json").write_text(json.dumps(doc))
    plugin = ExecPlugin(exec_spec(plugin_script(tmp_path, f"cat {tmp_path}/answer.json\n")))
    creds = Credentials("https://127.0.0.1:1", exec_plugin=plugin)
    creds.refresh_exec()
    assert creds.ssl_context() is not None and creds.client_cert_loads == 1
    assert creds.auth_headers() == {}
