"""A kubeconfig user's `exec` credential plugin (client.authentication.k8s.io): a command that
prints an ExecCredential with a token or a client certificate, run again before what it gave
expires. The command runs with a bounded time and output, never on the event loop (KubeClient
runs it in a worker thread), and never interactively (a node agent has no terminal).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["ExecCredential", "ExecPlugin", "ExecPluginError"]

API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
MAX_OUTPUT_BYTES = 1 << 20
# Ask again this long before the credential's expiry, so no request carries an expired one.
REFRESH_BEFORE_EXPIRY_S = 30.0


class ExecPluginError(Exception):
    """The plugin's configuration, run or answer cannot be used; the message says why."""


@dataclass(frozen=True)
class ExecCredential:
    token: str | None
    client_cert_pem: bytes | None
    client_key_pem: bytes | None
    expires_at: float | None  # wall-clock seconds; None: valid until the server refuses it


def _expiry(value: Any) -> float | None:
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise ExecPluginError(f"status.expirationTimestamp is not a string: {value!r:.60}")
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ExecPluginError(f"status.expirationTimestamp is not RFC 3339: {value!r:.60}") from None


def parse_exec_credential(stdout: bytes, api_version: str) -> ExecCredential:
    """The plugin's answer: an ExecCredential of the configured apiVersion with a token, or a
    client certificate and key (PEM), and optionally when they expire."""
    try:
        doc = json.loads(stdout)
    except ValueError as exc:
        raise ExecPluginError(f"its output is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
        raise ExecPluginError("its output is not an ExecCredential")
    if doc.get("apiVersion") != api_version:
        raise ExecPluginError(f"it answered apiVersion {doc.get('apiVersion')!r:.60}, configured {api_version!r}")
    status = doc.get("status")
    if not isinstance(status, dict):
        raise ExecPluginError("its ExecCredential has no status")
    token, cert, key = status.get("token"), status.get("clientCertificateData"), status.get("clientKeyData")
    if token is not None and (not isinstance(token, str) or any(c in token for c in "\r\n")):
        raise ExecPluginError("status.token is not a one-line string")
    if (cert is None) != (key is None) or any(v is not None and not isinstance(v, str) for v in (cert, key)):
        raise ExecPluginError("status.clientCertificateData and clientKeyData come together, as PEM text")
    if not token and cert is None:
        raise ExecPluginError("status has neither a token nor a client certificate")
    return ExecCredential(token or None, cert.encode() if cert else None, key.encode() if key else None,
                          _expiry(status.get("expirationTimestamp")))


class ExecPlugin:
    """The `exec` section of a kubeconfig user, and the credential it last gave."""

    def __init__(self, spec: Any, *, timeout_s: float = 10.0) -> None:
        if not isinstance(spec, dict):
            raise ExecPluginError("exec is not a mapping")
        command, args, env = spec.get("command"), spec.get("args") or [], spec.get("env") or []
        if not isinstance(command, str) or not command:
            raise ExecPluginError("exec.command is missing")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ExecPluginError("exec.args is not a list of strings")
        if not isinstance(env, list) or not all(
                isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("value"), str)
                for e in env):
            raise ExecPluginError("exec.env is not a list of {name, value} strings")
        self.api_version = spec.get("apiVersion")
        if self.api_version not in API_VERSIONS:
            raise ExecPluginError(f"exec.apiVersion must be one of {', '.join(API_VERSIONS)}, "
                                  f"got {self.api_version!r:.60}")
        if spec.get("interactiveMode") == "Always":
            raise ExecPluginError("exec.interactiveMode Always needs a terminal, which a node agent has not")
        self.argv = [command, *args]
        self.env = {e["name"]: e["value"] for e in env}
        self.timeout_s = timeout_s
        self.credential: ExecCredential | None = None
        self.runs = 0
        self._lock = threading.Lock()

    def due(self, now: float | None = None) -> bool:
        """No credential yet, or it expires within REFRESH_BEFORE_EXPIRY_S."""
        cred = self.credential
        if cred is None:
            return True
        return cred.expires_at is not None and cred.expires_at - REFRESH_BEFORE_EXPIRY_S <= (now or time.time())

    def forget(self) -> None:
        """The server refused the credential (401): the next request runs the plugin again."""
        self.credential = None

    def refresh(self) -> ExecCredential:
        """Run the plugin when due (one run at a time; blocking: call from a worker thread)."""
        with self._lock:
            if not self.due() and self.credential is not None:
                return self.credential
            info = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
            environ = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
            try:
                proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=environ, start_new_session=True)
            except OSError as exc:
                raise ExecPluginError(f"cannot run {self.argv[0]!r}: {exc.strerror or exc}") from None
            try:
                out, err = proc.communicate(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                # The whole session: a child the plugin started would hold its output open.
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise ExecPluginError(f"{self.argv[0]!r} did not answer within {self.timeout_s:g} s") from None
            self.runs += 1
            if proc.returncode != 0:
                tail = err.decode("utf-8", "replace").strip()[-300:]
                raise ExecPluginError(f"{self.argv[0]!r} exited {proc.returncode}: {tail or 'no error text'}")
            if len(out) > MAX_OUTPUT_BYTES:
                raise ExecPluginError(f"{self.argv[0]!r} printed more than {MAX_OUTPUT_BYTES} bytes")
            try:
                self.credential = parse_exec_credential(out, str(self.api_version))
            except ExecPluginError as exc:
                raise ExecPluginError(f"{self.argv[0]!r}: {exc}") from None
            return self.credential
