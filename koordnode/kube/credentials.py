"""Where the API server is and who koordnode is to it: a kubeconfig, or the in-cluster service account.

The bearer token, the CA and the client certificate and key are files re-read when they change
(the kubelet rotates a projected service-account token well before it expires, and its own client
certificate; an operator may replace a kubeconfig's token file), so a rotated credential is used
at the next request without a restart. A kubeconfig may also embed its client certificate and key
(client-certificate-data / client-key-data) or name an `exec` plugin (exec_credential.py).
"""

from __future__ import annotations

import base64
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from koordnode.kube.exec_credential import ExecCredential, ExecPlugin, ExecPluginError

__all__ = ["Credentials", "CredentialsError", "parse_kubeconfig_text"]

MAX_CREDENTIAL_FILE_BYTES = 1 << 20


class CredentialsError(Exception):
    """The kubeconfig or the service account cannot be used; the message says why."""


def _read_small(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CREDENTIAL_FILE_BYTES + 1)
    except OSError as exc:
        raise CredentialsError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_CREDENTIAL_FILE_BYTES:
        raise CredentialsError(f"the {what} {path} is larger than {MAX_CREDENTIAL_FILE_BYTES} bytes")
    return data


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class _Watched:
    """A file's content, read again when its inode, size or mtime changed."""

    path: str
    what: str
    stamp: tuple[int, int, int] | None = None
    data: bytes = b""

    def get(self) -> tuple[bytes, bool]:
        stamp = _stamp(self.path)
        if stamp is not None and stamp == self.stamp:
            return self.data, False
        self.data = _read_small(self.path, self.what)
        self.stamp = stamp
        return self.data, True


class Credentials:
    """The server URL, the TLS context (CA, client certificate) and the current bearer token."""

    def __init__(self, server: str, *, ca_file: str | None = None, ca_data: bytes | None = None,
                 token: str | None = None, token_file: str | None = None,
                 client_cert_file: str | None = None, client_key_file: str | None = None,
                 client_cert_data: bytes | None = None, client_key_data: bytes | None = None,
                 exec_plugin: ExecPlugin | None = None, insecure: bool = False, source: str = "") -> None:
        self.server = server.rstrip("/")
        self.source = source
        self._ca = _Watched(ca_file, "CA file") if ca_file else None
        self._ca_data = ca_data
        self._token = token
        self._token_file = _Watched(token_file, "token file") if token_file else None
        self._client_files = ((_Watched(client_cert_file, "client certificate"),
                               _Watched(client_key_file or client_cert_file, "client key"))
                              if client_cert_file else None)
        self._client_data = (client_cert_data, client_key_data) if client_cert_data else None
        self.exec_plugin = exec_plugin
        self._exec_pair: ExecCredential | None = None  # the exec credential the context holds
        self._insecure = insecure
        self._context: ssl.SSLContext | None = None
        self.token_reads = 0  # how often the token file was read (tests: a rotation is seen)
        self.client_cert_loads = 0  # how often a client certificate was loaded (tests: a rotation is seen)
        self.rotation_problem: str | None = None  # a changed client pair that would not load (old one kept)

    @classmethod
    def in_cluster(cls, account_dir: str, environ: dict[str, str] | None = None) -> Credentials:
        env = os.environ if environ is None else environ
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise CredentialsError("in-cluster: KUBERNETES_SERVICE_HOST is not set; set [kubernetes] kubeconfig "
                                   "when koordnode does not run in a pod")
        host = f"[{host}]" if ":" in host else host
        token_file = str(Path(account_dir) / "token")
        _read_small(token_file, "service account token")  # fail at start, not at the first request
        return cls(f"https://{host}:{port}", ca_file=str(Path(account_dir) / "ca.crt"),
                   token_file=token_file, source=f"service account {account_dir}")

    @classmethod
    def from_kubeconfig(cls, path: str) -> Credentials:
        text = _read_small(path, "kubeconfig").decode("utf-8", "replace")
        try:
            doc = parse_kubeconfig_text(text)
        except ValueError as exc:
            raise CredentialsError(f"kubeconfig {path}: {exc}") from None
        return cls._from_document(doc, Path(path).parent, path)

    @classmethod
    def _from_document(cls, doc: Any, base: Path, source: str) -> Credentials:
        if not isinstance(doc, dict):
            raise CredentialsError(f"kubeconfig {source}: not a mapping")

        def named(section: str, name: str, inner: str) -> dict[str, Any]:
            for entry in doc.get(section) or []:
                if isinstance(entry, dict) and entry.get("name") == name and isinstance(entry.get(inner), dict):
                    found: dict[str, Any] = entry[inner]
                    return found
            raise CredentialsError(f"kubeconfig {source}: no {section[:-1]} named {name!r}")

        current = doc.get("current-context")
        if not isinstance(current, str) or not current:
            raise CredentialsError(f"kubeconfig {source}: no current-context")
        context = named("contexts", current, "context")
        cluster = named("clusters", str(context.get("cluster", "")), "cluster")
        user = named("users", str(context.get("user", "")), "user") if context.get("user") else {}

        def file_of(value: Any) -> str | None:
            if not value:
                return None
            path = Path(str(value))
            return str(path if path.is_absolute() else base / path)

        server = cluster.get("server")
        if not isinstance(server, str) or not server.startswith(("https://", "http://")):
            raise CredentialsError(f"kubeconfig {source}: cluster of context {current!r} has no https:// server")
        ca_data = _base64_field(cluster, "certificate-authority-data", source)
        if "auth-provider" in user:
            raise CredentialsError(f"kubeconfig {source}: the user of context {current!r} authenticates by "
                                   "auth-provider, which Kubernetes removed: use an exec plugin, a token, "
                                   "a tokenFile or a client certificate")
        cert_data = _base64_field(user, "client-certificate-data", source)
        key_data = _base64_field(user, "client-key-data", source)
        if (cert_data is None) != (key_data is None):
            raise CredentialsError(f"kubeconfig {source}: client-certificate-data and client-key-data come together")
        if bool(user.get("client-certificate")) != bool(user.get("client-key")):
            raise CredentialsError(f"kubeconfig {source}: client-certificate and client-key come together")
        plugin = None
        if user.get("exec") is not None:
            try:
                plugin = ExecPlugin(user["exec"])
            except ExecPluginError as exc:
                raise CredentialsError(f"kubeconfig {source}: {exc}") from None
        return cls(server, ca_file=file_of(cluster.get("certificate-authority")), ca_data=ca_data,
                   token=str(user["token"]) if user.get("token") else None,
                   token_file=file_of(user.get("tokenFile")),
                   client_cert_file=file_of(user.get("client-certificate")),
                   client_key_file=file_of(user.get("client-key")),
                   client_cert_data=cert_data, client_key_data=key_data, exec_plugin=plugin,
                   insecure=bool(cluster.get("insecure-skip-tls-verify")), source=f"kubeconfig {source}")

    # ---- exec plugin: run in a worker thread by KubeClient, never on the loop ----------------

    def exec_due(self) -> bool:
        return self.exec_plugin is not None and self.exec_plugin.due()

    def refresh_exec(self) -> None:
        """Run the exec plugin when its credential is missing or about to expire (blocking)."""
        if self.exec_plugin is not None:
            try:
                self.exec_plugin.refresh()
            except ExecPluginError as exc:
                raise CredentialsError(f"{self.source}: exec plugin: {exc}") from None

    def refused(self) -> None:
        """The API server answered 401: an exec credential is asked for again."""
        if self.exec_plugin is not None:
            self.exec_plugin.forget()

    # ---- TLS and headers ---------------------------------------------------------------------

    def _client_pair(self) -> tuple[tuple[bytes, bytes] | None, bool]:
        """The client certificate and key (PEM) now, and whether they changed since the context."""
        if self._client_files is not None:
            (cert, cert_changed), (key, key_changed) = (w.get() for w in self._client_files)
            return (cert, key), cert_changed or key_changed
        if self.exec_plugin is not None and self.exec_plugin.credential is not None \
                and self.exec_plugin.credential.client_cert_pem is not None:
            cred = self.exec_plugin.credential
            changed = cred is not self._exec_pair
            self._exec_pair = cred
            return (cred.client_cert_pem or b"", cred.client_key_pem or b""), changed
        if self._client_data is not None:
            return (self._client_data[0] or b"", self._client_data[1] or b""), False
        return None, False

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context, rebuilt when the CA or the client certificate changed; None for http://."""
        if not self.server.startswith("https://"):
            return None
        changed = self._context is None
        ca_bytes = None
        if self._ca is not None:
            ca_bytes, ca_changed = self._ca.get()
            changed = changed or ca_changed
        pair, pair_changed = self._client_pair()
        changed = changed or pair_changed
        if not changed and self._context is not None:
            return self._context
        context = ssl.create_default_context()
        try:
            if ca_bytes is not None or self._ca_data is not None:
                context = ssl.create_default_context(cadata=(ca_bytes or self._ca_data or b"").decode("ascii", "replace"))
            if pair is not None:
                _load_client_pair(context, *pair)
                self.client_cert_loads += 1
        except (ssl.SSLError, OSError, ValueError) as exc:
            if self._context is not None and pair_changed:
                # A rotation caught half-written (a new certificate beside the old key): keep the
                # pair that worked, and read the files again at the next request.
                self.rotation_problem = f"the new client certificate and key do not load yet: {exc}"
                for watched in self._client_files or ():
                    watched.stamp = None
                return self._context
            raise CredentialsError(f"{self.source}: cannot use the CA or client certificate: {exc}") from None
        self.rotation_problem = None
        if self._insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        self._context = context
        return context

    def auth_headers(self) -> dict[str, str]:
        """The Authorization header with the token as it is now (its file re-read when it changed,
        the exec plugin's last token)."""
        token = self._token
        if self._token_file is not None:
            data, changed = self._token_file.get()
            if changed:
                self.token_reads += 1
            token = data.decode("utf-8", "replace").strip()
        if self.exec_plugin is not None and self.exec_plugin.credential is not None \
                and self.exec_plugin.credential.token:
            token = self.exec_plugin.credential.token
        if not token:
            return {}
        if any(c in token for c in "\r\n"):
            raise CredentialsError(f"{self.source}: the token contains a line break")
        return {"Authorization": f"Bearer {token}"}


def _base64_field(section: dict[str, Any], key: str, source: str) -> bytes | None:
    """A kubeconfig's *-data field, decoded (None: not given)."""
    value = section.get(key)
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError:
        raise CredentialsError(f"kubeconfig {source}: {key} is not base64") from None


def _load_client_pair(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """load_cert_chain reads files only: hand it the PEM through memory files (never on disk)."""
    fds: list[int] = []
    try:
        for name, data in (("client-cert", cert), ("client-key", key)):
            fd = os.memfd_create(f"koordnode-{name}", os.MFD_CLOEXEC)
            fds.append(fd)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        context.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
    finally:
        for fd in fds:
            os.close(fd)


# --- kubeconfig text ---------------------------------------------------------------------------


def parse_kubeconfig_text(text: str) -> Any:
    """A kubeconfig's document (YAML, JSON being YAML), by PyYAML's safe loader: no Python
    objects, aliases shared not copied; the file is at most MAX_CREDENTIAL_FILE_BYTES."""
    import yaml  # only a node in a cluster loads it

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"{where}invalid YAML ({problem})") from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if doc is None:
        raise ValueError("empty")
    return doc
