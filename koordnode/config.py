"""koordnode configuration: TOML parsed into typed, validated, frozen dataclasses.

The schema *is* the dataclasses below. A small generic loader walks their fields and type
hints, converts the TOML values, checks them, and collects every error (not only the first)
with its full key path, e.g. ``proxy.hook_timeout_ms: expected an integer in [1, 60000],
got "fast"``. Keys missing from the file keep their defaults; unknown keys are errors.

Adding a section
----------------
Declare a frozen dataclass whose fields use :func:`setting` (or plain defaults), then add one
field to :class:`Config` with :func:`section`. Nothing else: loading, validation, error
paths, ``check-config`` output and :func:`describe_settings` pick it up. Also list the new
keys with their defaults in ``packaging/koordnode.toml`` (a test checks it covers every key).

Supported field types: ``str``, ``int``, ``float`` (an int is accepted for a float),
``bool`` (never accepted for an int), ``Literal[...]`` (enumerations), ``list[X]`` and
``tuple[X, ...]`` (prefer the tuple: sections are frozen), ``X | None``, unions such as
``int | str`` (the first type that accepts the value wins), nested section dataclasses, and
``dict[K, V]`` for tables such as ``[qos.BE]`` where K is ``str`` or a ``Literal`` of
strings. A table given for a dict field is merged over the default entry of the same key, so
``[qos.BE] cpu_shares = 4`` changes one value and keeps the other BE defaults.

Per-field constraints live in the field metadata (``setting()`` fills it):
``min`` / ``max`` (inclusive, for numbers and numbers inside lists), ``normalize`` (a callable
value -> value raising ValueError with a message, e.g. ``unix:///x`` -> ``/x``), ``check`` (a
callable value -> error message or None) and ``doc`` (one line: meaning and unit).
Checks across fields go in a ``validate(self) -> list[str]`` method of the section, returning
messages as ``"key: message"`` relative to the section.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import json
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from koordnode.configfield import section, setting
from koordnode.hooks.qos_config import KubeQoSMapping, NodeConfig, QoSConfig
from koordnode.hwqos_config import NetQoSConfig, ResctrlConfig
from koordnode.metrics import MetricsConfig
from koordnode.qos.config import QoSManagerConfig, StrategyConfig

__all__ = [
    "AdminConfig",
    "Config",
    "ConfigError",
    "DaemonConfig",
    "DEFAULT_CONFIG_PATH",
    "DEFAULTS_SOURCE",
    "LogConfig",
    "ProxyConfig",
    "Setting",
    "describe_settings",
    "from_dict",
    "load_config",
    "parse_config",
    "reload_config",
    "section",
    "setting",
    "to_dict",
    "to_toml",
]

_T = TypeVar("_T")

DEFAULT_CONFIG_PATH = "/etc/koordnode/koordnode.toml"
# Config.source when the default file does not exist and built-in defaults are in use.
DEFAULTS_SOURCE = "<defaults>"


class ConfigError(Exception):
    """The configuration cannot be used; ``errors`` holds one message per problem."""

    def __init__(self, errors: list[str], source: str = "<string>") -> None:
        self.errors = list(errors)
        self.source = source
        super().__init__(self.__str__())

    def __str__(self) -> str:
        count = len(self.errors)
        noun = "error" if count == 1 else "errors"
        return "\n".join([f"invalid configuration in {self.source} ({count} {noun}):"]
                         + [f"  {error}" for error in self.errors])


# ---------------------------------------------------------------------------------------------
# Field helpers


def _internal(default: Any) -> Any:
    # Not a TOML key: bookkeeping the loader fills in; ignored by ==.
    return field(default=default, compare=False, repr=False, metadata={"internal": True})


# ---------------------------------------------------------------------------------------------
# Value checks shared by sections

# sun_path is 108 bytes including the terminating NUL.
_MAX_UNIX_SOCKET_PATH = 107


def unix_socket_path(value: str) -> str:
    """Normalise ``/path``, ``unix:///path`` or ``unix:/path`` to an absolute path."""
    path = value
    if path.startswith("unix://"):
        path = path[len("unix://"):]
    elif path.startswith("unix:"):
        path = path[len("unix:"):]
    elif "://" in path:
        raise ValueError(f"only unix sockets are supported, got {_show(value)}")
    if not path:
        raise ValueError("expected a unix socket path, got an empty string")
    if "\0" in path:
        raise ValueError("a socket path cannot contain a NUL character")
    if not path.startswith("/"):
        raise ValueError(f"expected an absolute path, got {_show(value)}")
    path = os.path.normpath(path)
    size = len(path.encode())
    if size > _MAX_UNIX_SOCKET_PATH:
        raise ValueError(
            f"socket path is {size} bytes long; the kernel limit is {_MAX_UNIX_SOCKET_PATH}"
        )
    return path


# ---------------------------------------------------------------------------------------------
# The schema. Keep packaging/koordnode.toml in step with it.


FailurePolicy = Literal["ignore", "fail"]
LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["json", "console"]


@dataclass(frozen=True)
class ProxyConfig:
    listen: str = setting(
        "/var/run/koordnode/koordnode.sock",
        doc="CRI socket koordnode serves; point kubelet's --container-runtime-endpoint here",
        normalize=unix_socket_path,
    )
    backend: str = setting(
        "/run/containerd/containerd.sock",
        doc="CRI socket of the container runtime calls are forwarded to (path or unix://path)",
        normalize=unix_socket_path,
    )
    hook_timeout_ms: int = setting(
        200,
        min=1,
        max=60000,
        doc="milliseconds a runtime hook may take before the call goes on without it",
    )
    failure_policy: FailurePolicy = setting(
        "ignore",
        doc='when a hook fails or times out: "ignore" forwards the original request '
        '(fail-open), "fail" fails the CRI call',
    )

    @property
    def hook_timeout_s(self) -> float:
        return self.hook_timeout_ms / 1000

    def validate(self) -> list[str]:
        if self.listen == self.backend:
            return ["listen: is the same socket as backend; koordnode would call itself"]
        return []


RuntimeMode = Literal["proxy", "nri"]


@dataclass(frozen=True)
class RuntimeConfig:
    mode: RuntimeMode = setting(
        "proxy",
        doc='how koordnode hooks into pod and container creation: "proxy" (kubelet talks to '
        'koordnode\'s CRI socket) or "nri" (containerd calls koordnode as an NRI plugin)',
    )


def _plugin_index(value: str) -> str:
    if not re.fullmatch(r"[0-9]{2}", value):
        raise ValueError(f"expected two digits (\"00\" to \"99\"), got {_show(value)}")
    return value


def _plugin_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", value):
        raise ValueError(f"expected letters, digits, '.', '_' or '-' (at most 63), got {_show(value)}")
    return value


@dataclass(frozen=True)
class NriConfig:
    socket: str = setting(
        "/var/run/nri/nri.sock",
        doc="the runtime's NRI socket koordnode connects to in NRI mode",
        normalize=unix_socket_path,
    )
    plugin_name: str = setting(
        "koordnode", doc="name koordnode registers under as an NRI plugin", normalize=_plugin_name
    )
    plugin_index: str = setting(
        "00",
        doc='two-digit NRI plugin index: plugins are called in ascending order ("00" first)',
        normalize=_plugin_index,
    )


@dataclass(frozen=True)
class LogConfig:
    level: LogLevel = setting("info", doc="lowest level logged")
    format: LogFormat = setting(
        "json", doc='"json": one JSON object per line; "console": human-readable'
    )


@dataclass(frozen=True)
class DaemonConfig:
    dry_run: bool = setting(
        False,
        doc="decide, log, count and report everything, but write nothing to the kernel "
        "(cgroups, sysctls, resctrl, tc/nftables, PSI triggers), evict nothing, and forward "
        "every CRI request unchanged",
    )


@dataclass(frozen=True)
class AdminConfig:
    socket: str = setting(
        "/var/run/koordnode/admin.sock",
        doc="root-only unix socket answering `koordnode status`",
        normalize=unix_socket_path,
    )


CgroupDriverName = Literal["auto", "cgroupfs", "systemd"]


@dataclass(frozen=True)
class CgroupConfig:
    root: str = setting(
        "/sys/fs/cgroup",
        doc="where the cgroup hierarchies are mounted; every cgroup write stays under it",
    )
    driver: CgroupDriverName = setting(
        "auto",
        doc='kubelet\'s cgroup driver: "auto" (systemd when the parent is a .slice), '
        '"cgroupfs" or "systemd"',
    )
    reconcile_interval_s: float = setting(
        10.0,
        min=0,
        max=3600,
        doc="seconds between passes re-applying every running pod's values (0 = never)",
    )
    be_idle_group: bool = setting(
        True,
        doc="run BestEffort pods of class BE in koordnode's idle cgroup beside kubelet's QoS tiers "
        '("<kubepods>/koordnode_be", systemd "kubepods-koordnode_be.slice", cpu.idle = 1) so they '
        "yield to LS at once; false: they stay in kubelet's besteffort tier",
    )
    be_idle_group_systemd: bool = setting(
        True,
        doc="also with the systemd driver: the group slice made idle through systemd (CPUWeight=idle, "
        "systemd >= 252), prepared at start; false: BestEffort pods stay in kubelet's besteffort slice",
    )


@dataclass(frozen=True)
class ProcfsConfig:
    root: str = setting("/proc", doc="procfs mount; node memory watermarks are written under it")


@dataclass(frozen=True)
class SysfsConfig:
    root: str = setting("/sys", doc="sysfs mount the CPU topology is read from")


@dataclass(frozen=True)
class Config:
    runtime: RuntimeConfig = section(RuntimeConfig, doc="proxy or NRI mode")
    proxy: ProxyConfig = section(ProxyConfig, doc="the CRI proxy between kubelet and runtime")
    nri: NriConfig = section(NriConfig, doc="NRI mode: the runtime's NRI socket and the plugin's registration")
    log: LogConfig = section(LogConfig, doc="logging to stderr")
    daemon: DaemonConfig = section(DaemonConfig, doc="how the daemon acts: dry-run")
    admin: AdminConfig = section(AdminConfig, doc="local admin endpoint")
    cgroup: CgroupConfig = section(CgroupConfig, doc="cgroup hierarchy and reconcile period")
    procfs: ProcfsConfig = section(ProcfsConfig, doc="procfs root")
    sysfs: SysfsConfig = section(SysfsConfig, doc="sysfs root")
    node: NodeConfig = section(NodeConfig, doc="node CPU reservation and block devices")
    qos_mapping: KubeQoSMapping = section(
        KubeQoSMapping, doc="class of pods without a valid koordinator.sh/qosClass label"
    )
    qos: QoSConfig = section(QoSConfig, doc="per-class numbers, [qos.<CLASS>]")
    metrics: MetricsConfig = section(MetricsConfig, doc="Prometheus metrics endpoint")
    resctrl: ResctrlConfig = section(ResctrlConfig, doc="L3 cache and memory bandwidth per class (resctrl)")
    net: NetQoSConfig = section(NetQoSConfig, doc="egress shaping per class (tc HTB + nftables)")
    qos_manager: QoSManagerConfig = section(QoSManagerConfig, doc="the QoS manager loop: ticks and PSI wake-ups")
    strategy: StrategyConfig = section(StrategyConfig, doc="QoS manager strategies, [strategy.<name>]")

    # Where the values came from: the file path, "<string>", or DEFAULTS_SOURCE.
    source: str = _internal(DEFAULTS_SOURCE)
    # What load_config was called with, so reload_config can repeat it.
    path: str | None = _internal(None)
    overrides: Mapping[str, Any] | None = _internal(None)

    @property
    def uses_defaults(self) -> bool:
        """True when no config file was found and only built-in defaults (+ overrides) apply."""
        return self.source == DEFAULTS_SOURCE

    def validate(self) -> list[str]:
        if self.admin.socket in (self.proxy.listen, self.proxy.backend):
            return ["admin.socket: must differ from proxy.listen and proxy.backend"]
        if self.runtime.mode == "nri" and self.nri.socket in (self.proxy.listen, self.proxy.backend, self.admin.socket):
            return ["nri.socket: must differ from proxy.listen, proxy.backend and admin.socket"]
        return []


# ---------------------------------------------------------------------------------------------
# Public entry points


def parse_config(
    text: str, source: str = "<string>", *, overrides: Mapping[str, Any] | None = None
) -> Config:
    """Parse TOML text into a Config; raise ConfigError listing every problem."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"invalid TOML: {exc}"], source) from None
    return _build_config(raw, source, overrides)


def load_config(
    path: str | os.PathLike[str] | None = None, *, overrides: Mapping[str, Any] | None = None
) -> Config:
    """Load the config file, or built-in defaults when the *default* file does not exist.

    ``overrides`` is a nested dict (e.g. ``{"proxy": {"listen": "/x.sock"}}``) applied on top of
    the file and validated the same way; ``None`` values in it are ignored, so CLI flags that
    were not given can be passed as they are. An explicitly given path must exist.
    """
    explicit = path is not None
    file_path = os.fspath(path) if explicit else DEFAULT_CONFIG_PATH
    try:
        data = Path(file_path).read_bytes()
    except FileNotFoundError:
        if explicit:
            raise ConfigError(["config file not found"], file_path) from None
        return _build_config({}, DEFAULTS_SOURCE, overrides)
    except OSError as exc:
        raise ConfigError([f"cannot read config file: {exc.strerror or exc}"], file_path) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([f"invalid TOML: not UTF-8 text ({exc.reason} at byte {exc.start})"],
                          file_path) from None
    config = parse_config(text, file_path, overrides=overrides)
    return dataclasses.replace(config, path=file_path if explicit else None)


def from_dict(cls: type[_T], data: Mapping[str, Any], source: str = "<dict>") -> _T:
    """Build any schema dataclass from already-parsed data; raise ConfigError on problems."""
    errors: list[str] = []
    result = _Loader(errors).section(cls, dict(data), "", None)
    if errors:
        raise ConfigError(errors, source)
    return result


def reload_config(current: Config) -> Config:
    """Read the configuration again the way ``current`` was loaded (same path and overrides)."""
    return load_config(current.path, overrides=current.overrides)


def to_dict(config: Any) -> dict[str, Any]:
    """The TOML keys of a config (or section) as plain dicts, lists and scalars."""
    return _plain(config)


def to_toml(config: Any) -> str:
    """Render a config (or section) as TOML that parses back to the same values."""
    lines: list[str] = []
    _emit_table(to_dict(config), "", lines)
    return "\n".join(lines).strip("\n") + "\n"


@dataclass(frozen=True)
class Setting:
    key: str  # full key path, e.g. "proxy.hook_timeout_ms"
    expected: str  # e.g. "an integer in [1, 60000]"
    default: Any
    doc: str


def describe_settings(cls: type = Config) -> list[Setting]:
    """Every key of the schema with its expected value, default and doc, in file order."""
    out: list[Setting] = []
    _describe_section(cls, cls(), "", out)
    return out


# ---------------------------------------------------------------------------------------------
# The generic loader

_INVALID: Any = object()  # a conversion failed; its error is already recorded


def _build_config(
    raw: dict[str, Any], source: str, overrides: Mapping[str, Any] | None
) -> Config:
    if overrides:
        raw = _merge(raw, overrides)
    config = from_dict(Config, raw, source)
    return dataclasses.replace(
        config, source=source, overrides=_freeze(overrides) if overrides else None
    )


def _merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if value is None:
            continue
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        elif isinstance(value, Mapping):
            merged[key] = _merge({}, value)
        else:
            merged[key] = value
    return merged


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return types.MappingProxyType({k: _freeze(v) for k, v in value.items()})
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _keys(cls: type) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if not f.metadata.get("internal")]


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


class _Loader:
    def __init__(self, errors: list[str]) -> None:
        self.errors = errors

    def error(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}" if path else message)

    def section(self, cls: type, raw: Any, path: str, base: Any) -> Any:
        """Build section ``cls`` from ``raw``; keys not in ``raw`` come from ``base``/defaults."""
        if not isinstance(raw, dict):
            self.error(path, f"expected a table, got {_show(raw)}")
            return _INVALID
        hints = _hints(cls)
        keys = _keys(cls)
        names = [f.name for f in keys]
        for key in raw:
            if key not in names:
                self.error(_join(path, key), "unknown key" + _suggest(key, names))
        values: dict[str, Any] = {}
        ok = True
        for f in keys:
            key_path = _join(path, f.name)
            if f.name in raw:
                if base is not None:
                    field_base = getattr(base, f.name)
                else:
                    field_base = _default(f) if _has_default(f) else None
                value = self.value(hints[f.name], raw[f.name], key_path, field_base, f.metadata)
                if value is not _INVALID:
                    value = self.refine(value, key_path, f.metadata)
                if value is _INVALID:
                    ok = False
                else:
                    values[f.name] = value
            elif base is not None:
                values[f.name] = getattr(base, f.name)
            elif _has_default(f):
                values[f.name] = _default(f)
            else:
                self.error(key_path, "missing required key")
                ok = False
        if not ok or any(key not in names for key in raw):
            return _INVALID
        try:
            result = cls(**values)
        except (TypeError, ValueError) as exc:  # checks in __post_init__ count as errors too
            self.error(path, str(exc))
            return _INVALID
        validate = getattr(result, "validate", None)
        if callable(validate):
            messages = validate()
            # Messages are "key: message" relative to this section.
            self.errors += [f"{path}.{m}" if path else m for m in messages]
            if messages:
                return _INVALID
        return result

    def refine(self, value: Any, path: str, meta: Mapping[str, Any]) -> Any:
        normalize = meta.get("normalize")
        if normalize is not None:
            try:
                value = normalize(value)
            except ValueError as exc:
                self.error(path, str(exc))
                return _INVALID
        check = meta.get("check")
        if check is not None:
            message = check(value)
            if message:
                self.error(path, message)
                return _INVALID
        return value

    def value(self, tp: Any, raw: Any, path: str, base: Any, meta: Mapping[str, Any]) -> Any:
        origin = typing.get_origin(tp)
        if dataclasses.is_dataclass(tp):
            return self.section(tp, raw, path, base)
        if origin is typing.Union or origin is types.UnionType:
            return self.union(tp, raw, path, base, meta)
        if origin is dict:
            return self.table(tp, raw, path, base, meta)
        if origin in (list, tuple):
            return self.sequence(tp, raw, path, meta)
        if _accepts(tp, raw, meta):
            return float(raw) if tp is float else raw
        self.error(path, f"expected {_expected(tp, meta)}, got {_show(raw)}")
        return _INVALID

    def union(self, tp: Any, raw: Any, path: str, base: Any, meta: Mapping[str, Any]) -> Any:
        members = [m for m in typing.get_args(tp) if m is not type(None)]
        if raw is None and len(members) < len(typing.get_args(tp)):
            return None
        if len(members) == 1:
            return self.value(members[0], raw, path, base, meta)
        for member in members:
            trial = _Loader([])
            value = trial.value(member, raw, path, base, meta)
            if value is not _INVALID:
                return value
        self.error(path, f"expected {_expected(tp, meta)}, got {_show(raw)}")
        return _INVALID

    def table(self, tp: Any, raw: Any, path: str, base: Any, meta: Mapping[str, Any]) -> Any:
        if not isinstance(raw, dict):
            self.error(path, f"expected a table, got {_show(raw)}")
            return _INVALID
        key_type, value_type = typing.get_args(tp)
        choices = typing.get_args(key_type) if typing.get_origin(key_type) is Literal else None
        result = dict(base) if isinstance(base, Mapping) else {}
        ok = True
        for key, item in raw.items():
            item_path = _join(path, key)
            if choices is not None and key not in choices:
                self.error(item_path, "unknown key (expected one of "
                           + ", ".join(_show(c) for c in choices) + ")")
                ok = False
                continue
            item_base = result.get(key)
            value = self.value(value_type, item, item_path, item_base, meta)
            if value is _INVALID:
                ok = False
            else:
                result[key] = value
        return result if ok else _INVALID

    def sequence(self, tp: Any, raw: Any, path: str, meta: Mapping[str, Any]) -> Any:
        args = typing.get_args(tp)
        item_type = args[0]
        if typing.get_origin(tp) is tuple and (len(args) != 2 or args[1] is not Ellipsis):
            raise TypeError(f"config type {tp!r}: only tuple[X, ...] is supported")
        if not isinstance(raw, list):
            self.error(path, f"expected {_expected(tp, meta)}, got {_show(raw)}")
            return _INVALID
        items = [self.value(item_type, item, f"{path}[{i}]", None, meta)
                 for i, item in enumerate(raw)]
        if any(item is _INVALID for item in items):
            return _INVALID
        return tuple(items) if typing.get_origin(tp) is tuple else items


def _accepts(tp: Any, raw: Any, meta: Mapping[str, Any]) -> bool:
    """Whether a scalar ``raw`` is a valid value of type ``tp`` within meta's min/max."""
    if typing.get_origin(tp) is Literal:
        # type() check keeps True from matching 1 and 1 from matching 1.0.
        return any(raw == c and type(raw) is type(c) for c in typing.get_args(tp))
    if tp is bool:
        return isinstance(raw, bool)
    if tp is str:
        return isinstance(raw, str)
    if tp is int:
        return isinstance(raw, int) and not isinstance(raw, bool) and _in_range(raw, meta)
    if tp is float:
        return (isinstance(raw, (int, float)) and not isinstance(raw, bool)
                and math.isfinite(raw) and _in_range(raw, meta))
    if tp is Any:
        return True
    raise TypeError(f"config type {tp!r} is not supported by the loader")


def _in_range(value: float, meta: Mapping[str, Any]) -> bool:
    low, high = meta.get("min"), meta.get("max")
    return (low is None or value >= low) and (high is None or value <= high)


def _range(meta: Mapping[str, Any]) -> str:
    low, high = meta.get("min"), meta.get("max")
    if low is not None and high is not None:
        return f" in [{low}, {high}]"
    if low is not None:
        return f" >= {low}"
    if high is not None:
        return f" <= {high}"
    return ""


def _expected(tp: Any, meta: Mapping[str, Any], plural: bool = False) -> str:
    """How an expected value reads in an error message: 'an integer in [1, 60000]'."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp) or origin is dict:
        return "tables" if plural else "a table"
    if origin is Literal:
        return "one of " + ", ".join(_show(c) for c in typing.get_args(tp))
    if origin is typing.Union or origin is types.UnionType:
        members = [m for m in typing.get_args(tp) if m is not type(None)]
        return " or ".join(_expected(m, meta, plural) for m in members)
    if origin in (list, tuple):
        return "a list of " + _expected(typing.get_args(tp)[0], meta, plural=True)
    names = {
        bool: ("true or false", "booleans"),
        str: ("a string", "strings"),
        int: ("an integer", "integers"),
        float: ("a number", "numbers"),
        Any: ("any value", "values"),
    }
    if tp not in names:
        raise TypeError(f"config type {tp!r} is not supported by the loader")
    text = names[tp][1] if plural else names[tp][0]
    return text + (_range(meta) if tp in (int, float) else "")


def _show(value: Any) -> str:
    """A value as TOML would spell it, shortened for error messages."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
    elif isinstance(value, (int, float)):
        text = repr(value)
    elif isinstance(value, (datetime.date, datetime.time)):
        text = value.isoformat()
    elif isinstance(value, (list, tuple)):
        text = "[" + ", ".join(_show(v) for v in value) + "]"
    elif isinstance(value, Mapping):
        return "a table"
    elif value is None:
        return "nothing"
    else:
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(name: str) -> str:
    return name if _BARE_KEY.match(name) else _toml_string(name)


def _join(path: str, key: str) -> str:
    return f"{path}.{_key(key)}" if path else _key(key)


def _suggest(key: str, names: list[str]) -> str:
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return f' (did you mean "{close[0]}"?)' if close else ""


# ---------------------------------------------------------------------------------------------
# Output: plain dicts, TOML, descriptions


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in _keys(type(value))}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _toml_string(text: str) -> str:
    # JSON string escapes are valid TOML, except that TOML also forbids a raw DEL.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot render {value!r} as TOML")


def _emit_table(table: dict[str, Any], path: str, lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in table.items() if isinstance(v, dict)}
    if path and (scalars or not tables):
        lines += ["", f"[{path}]"]
    for key, value in scalars.items():
        if value is None:
            lines.append(f"# {_key(key)} is not set")
        else:
            lines.append(f"{_key(key)} = {_toml_value(value)}")
    for key, value in tables.items():
        _emit_table(value, _join(path, key), lines)


def _describe_section(cls: type, instance: Any, path: str, out: list[Setting]) -> None:
    hints = _hints(cls)
    for f in _keys(cls):
        tp, value, key_path = hints[f.name], getattr(instance, f.name), _join(path, f.name)
        doc = f.metadata.get("doc", "")
        if dataclasses.is_dataclass(tp):
            _describe_section(tp, value, key_path, out)
        elif typing.get_origin(tp) is dict and dataclasses.is_dataclass(typing.get_args(tp)[1]):
            entry_type = typing.get_args(tp)[1]
            for key, entry in value.items():
                _describe_section(entry_type, entry, _join(key_path, key), out)
        else:
            out.append(Setting(key_path, _expected(tp, f.metadata), _plain(value), doc))

