"""Where the API server is and who koordnode is to it: a kubeconfig, or the in-cluster service account.

The bearer token and the CA are files re-read when they change (the kubelet rotates a projected
service-account token well before it expires; an operator may replace a kubeconfig's token
file), so a rotated credential is used at the next request without a restart.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
                 insecure: bool = False, source: str = "") -> None:
        self.server = server.rstrip("/")
        self.source = source
        self._ca = _Watched(ca_file, "CA file") if ca_file else None
        self._ca_data = ca_data
        self._token = token
        self._token_file = _Watched(token_file, "token file") if token_file else None
        self._client = (client_cert_file, client_key_file) if client_cert_file else None
        self._insecure = insecure
        self._context: ssl.SSLContext | None = None
        self.token_reads = 0  # how often the token file was read (tests: a rotation is seen)

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
        ca_data = None
        if cluster.get("certificate-authority-data"):
            try:
                ca_data = base64.b64decode(str(cluster["certificate-authority-data"]), validate=True)
            except ValueError:
                raise CredentialsError(f"kubeconfig {source}: certificate-authority-data is not base64") from None
        if any(key in user for key in ("client-certificate-data", "client-key-data", "exec", "auth-provider")):
            raise CredentialsError(f"kubeconfig {source}: the user of context {current!r} authenticates by "
                                   "client-certificate-data, exec or auth-provider, which koordnode does not support: "
                                   "give it a token, a tokenFile or client-certificate/client-key files")
        return cls(server, ca_file=file_of(cluster.get("certificate-authority")), ca_data=ca_data,
                   token=str(user["token"]) if user.get("token") else None,
                   token_file=file_of(user.get("tokenFile")),
                   client_cert_file=file_of(user.get("client-certificate")),
                   client_key_file=file_of(user.get("client-key")),
                   insecure=bool(cluster.get("insecure-skip-tls-verify")), source=f"kubeconfig {source}")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context, rebuilt when the CA file changed; None for http://."""
        if not self.server.startswith("https://"):
            return None
        changed = self._context is None
        ca_bytes = None
        if self._ca is not None:
            ca_bytes, ca_changed = self._ca.get()
            changed = changed or ca_changed
        if not changed and self._context is not None:
            return self._context
        context = ssl.create_default_context()
        try:
            if ca_bytes is not None or self._ca_data is not None:
                context = ssl.create_default_context(cadata=(ca_bytes or self._ca_data or b"").decode("ascii", "replace"))
            if self._client is not None:
                context.load_cert_chain(self._client[0] or "", self._client[1])
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise CredentialsError(f"{self.source}: cannot use the CA or client certificate: {exc}") from None
        if self._insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        self._context = context
        return context

    def auth_headers(self) -> dict[str, str]:
        """The Authorization header with the token as it is now (its file re-read when it changed)."""
        token = self._token
        if self._token_file is not None:
            data, changed = self._token_file.get()
            if changed:
                self.token_reads += 1
            token = data.decode("utf-8", "replace").strip()
        if not token:
            return {}
        if any(c in token for c in "\r\n"):
            raise CredentialsError(f"{self.source}: the token contains a line break")
        return {"Authorization": f"Bearer {token}"}


# --- kubeconfig text ---------------------------------------------------------------------------
# A kubeconfig is YAML (or JSON). koordnode reads the block-style subset kubectl and kubeadm
# write (mappings, lists of mappings, plain and quoted scalars, {} and []), not YAML at large:
# a YAML library would be a binary dependency; anything else is refused with its line.


def parse_kubeconfig_text(text: str) -> Any:
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ValueError(f"invalid JSON: {exc}") from None
    lines: list[tuple[int, int, str]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#") or stripped in ("---", "..."):
            continue
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise ValueError(f"line {number}: tab in indentation")
        lines.append((number, len(raw) - len(raw.lstrip(" ")), stripped))
    if not lines:
        raise ValueError("empty")
    value, index = _block(lines, 0, lines[0][1])
    if index != len(lines):
        raise ValueError(f"line {lines[index][0]}: unexpected indentation")
    return value


def _scalar(text: str, number: int) -> Any:
    if text in ("{}", "[]"):
        return {} if text == "{}" else []
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        inner = text[1:-1]
        return inner.replace("''", "'") if text[0] == "'" else json.loads(text)
    if text[:1] in ("{", "[", "&", "*", "!", "|", ">"):
        raise ValueError(f"line {number}: {text[:1]!r} (flow style, anchors, tags, block scalars) is not supported")
    if " #" in text:
        text = text.split(" #", 1)[0].rstrip()
    if text in ("true", "false"):
        return text == "true"
    if text in ("null", "~"):
        return None
    return text


def _split_key(text: str, number: int) -> tuple[str, str]:
    key, sep, rest = text.partition(":")
    if not sep or (rest and not rest.startswith(" ")):
        raise ValueError(f"line {number}: expected 'key: value', got {text[:60]!r}")
    key = key.strip()
    if len(key) >= 2 and key[0] == key[-1] and key[0] in "'\"":
        key = key[1:-1]
    return key, rest.strip()


def _block(lines: list[tuple[int, int, str]], index: int, indent: int) -> tuple[Any, int]:
    number, _, text = lines[index]
    if text.startswith("- ") or text == "-":
        items: list[Any] = []
        while index < len(lines) and lines[index][1] == indent and lines[index][2].startswith("-"):
            number, _, text = lines[index]
            rest = text[1:].strip()
            if not rest:
                if index + 1 < len(lines) and lines[index + 1][1] > indent:
                    value, index = _block(lines, index + 1, lines[index + 1][1])
                else:
                    value, index = None, index + 1
                items.append(value)
                continue
            if ":" in rest and rest[:1] not in "'\"":
                # "- key: value": a mapping whose keys sit at the dash's indent + 2
                inner = indent + (len(text) - len(rest))
                sub = [(number, inner, rest)] + lines[index + 1:]
                value, used = _block(sub, 0, inner)
                index += used
                items.append(value)
            else:
                items.append(_scalar(rest, number))
                index += 1
        return items, index
    mapping: dict[str, Any] = {}
    while index < len(lines) and lines[index][1] == indent:
        number, _, text = lines[index]
        if text.startswith("-"):
            break
        key, rest = _split_key(text, number)
        index += 1
        if rest:
            mapping[key] = _scalar(rest, number)
        elif index < len(lines) and (lines[index][1] > indent
                                     or (lines[index][1] == indent and lines[index][2].startswith("-"))):
            mapping[key], index = _block(lines, index, lines[index][1])
        else:
            mapping[key] = None
    if index < len(lines) and lines[index][1] > indent:
        raise ValueError(f"line {lines[index][0]}: unexpected indentation")
    return mapping, index
