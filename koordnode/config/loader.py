"""The generic loader: TOML -> the section dataclasses of koordnode.config, validated.

It walks the dataclasses' fields and type hints, converts the TOML values, checks them, and
collects every error (not only the first) with its full key path, e.g.
``proxy.hook_timeout_ms: expected an integer in [1, 60000], got "fast"``. Keys missing from
the file keep their defaults; unknown keys are errors. The sections themselves live in one
module each (koordnode.config.runtime, .cgroup, ...); the root is koordnode.config.root.Config.

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
import json
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from koordnode.config.fields import show_value
from koordnode.config.root import DEFAULTS_SOURCE, Config

__all__ = [
    "ConfigError",
    "DEFAULT_CONFIG_PATH",
    "Setting",
    "describe_settings",
    "from_dict",
    "key_sources",
    "load_config",
    "parse_config",
    "reload_config",
    "to_dict",
    "to_toml",
    "with_nodeslo",
]

_T = TypeVar("_T")

DEFAULT_CONFIG_PATH = "/etc/koordnode/koordnode.toml"


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
    file_path = os.fspath(path) if path is not None else DEFAULT_CONFIG_PATH
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
    result: _T = _Loader(errors).section(cls, dict(data), "", None)
    if errors:
        raise ConfigError(errors, source)
    return result


def reload_config(current: Config) -> Config:
    """Read the configuration again the way ``current`` was loaded (same path and overrides,
    the same NodeSLO table below the file)."""
    config = load_config(current.path, overrides=current.overrides)
    return with_nodeslo(config, current.nodeslo) if current.nodeslo is not None else config


def with_nodeslo(config: Config, nodeslo: Mapping[str, Any] | None) -> Config:
    """`config` with a NodeSLO's table (koordnode.kube.nodeslo) below its local file: a key the
    file (or an override) sets wins, the NodeSLO's next, then the built-in default. ConfigError
    when the NodeSLO's values, alone or merged, do not validate (nothing of it is applied then)."""
    local = _thaw(config.local) if config.local is not None else {}
    nodeslo = _thaw(nodeslo)  # a reload hands back the running config's frozen table
    if nodeslo is None:
        merged = from_dict(Config, local, config.source)
    else:
        from_dict(Config, nodeslo, "NodeSLO")  # its own values first: the errors name its keys alone
        merged = from_dict(Config, _merge(nodeslo, local), f"{config.source} over NodeSLO")
    return dataclasses.replace(merged, source=config.source, path=config.path, overrides=config.overrides,
                               local=config.local, nodeslo=_freeze(nodeslo) if nodeslo is not None else None)


def key_sources(config: Config) -> dict[str, str]:
    """Per key (as describe_settings names it): "toml" (the local file or a command-line
    override), "nodeslo" (the NodeSLO applied below it) or "default"."""
    def has(table: Mapping[str, Any] | None, key: str) -> bool:
        value: Any = table
        for part in key.split("."):
            if not isinstance(value, Mapping) or part not in value:
                return False
            value = value[part]
        return True

    return {item.key: "toml" if has(config.local, item.key) else "nodeslo" if has(config.nodeslo, item.key)
            else "default" for item in describe_settings(instance=config)}


def to_dict(config: Any) -> dict[str, Any]:
    """The TOML keys of a config (or section) as plain dicts, lists and scalars."""
    plain: dict[str, Any] = _plain(config)
    return plain


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


def describe_settings(cls: type = Config, *, instance: Any = None) -> list[Setting]:
    """Every key of the schema with its expected value, default and doc, in file order, with
    the entries of `instance`'s tables such as [host_applications.<name>]."""
    out: list[Setting] = []
    _describe_section(cls, cls() if instance is None else instance, "", out)
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
        config, source=source, overrides=_freeze(overrides) if overrides else None, local=_freeze(raw)
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


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    return value


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
    factory: Callable[[], Any] = f.default_factory  # type: ignore[assignment]
    return factory()


class _Loader:
    def __init__(self, errors: list[str]) -> None:
        self.errors = errors

    def error(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}" if path else message)

    def section(self, cls: type, raw: Any, path: str, base: Any) -> Any:
        """Build section ``cls`` from ``raw``; keys not in ``raw`` come from ``base``/defaults."""
        if not isinstance(raw, dict):
            self.error(path, f"expected a table, got {show_value(raw)}")
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
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return self.section(tp, raw, path, base)
        if origin is typing.Union or origin is types.UnionType:
            return self.union(tp, raw, path, base, meta)
        if origin is dict:
            return self.table(tp, raw, path, base, meta)
        if origin in (list, tuple):
            return self.sequence(tp, raw, path, meta)
        if _accepts(tp, raw, meta):
            return float(raw) if tp is float else raw
        self.error(path, f"expected {_expected(tp, meta)}, got {show_value(raw)}")
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
        self.error(path, f"expected {_expected(tp, meta)}, got {show_value(raw)}")
        return _INVALID

    def table(self, tp: Any, raw: Any, path: str, base: Any, meta: Mapping[str, Any]) -> Any:
        if not isinstance(raw, dict):
            self.error(path, f"expected a table, got {show_value(raw)}")
            return _INVALID
        key_type, value_type = typing.get_args(tp)
        choices = typing.get_args(key_type) if typing.get_origin(key_type) is Literal else None
        result = dict(base) if isinstance(base, Mapping) else {}
        ok = True
        for key, item in raw.items():
            item_path = _join(path, key)
            if choices is not None and key not in choices:
                self.error(item_path, "unknown key (expected one of "
                           + ", ".join(show_value(c) for c in choices) + ")")
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
            self.error(path, f"expected {_expected(tp, meta)}, got {show_value(raw)}")
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
        return "one of " + ", ".join(show_value(c) for c in typing.get_args(tp))
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


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(name: str) -> str:
    return name if _BARE_KEY.match(name) else _toml_string(name)


def _join(path: str, key: str) -> str:
    return f"{path}.{_key(key)}" if path else _key(key)


def _suggest(key: str, names: list[str]) -> str:
    import difflib  # only for a mistyped key: not kept in the daemon's memory

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
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            _describe_section(tp, value, key_path, out)
        elif typing.get_origin(tp) is dict and dataclasses.is_dataclass(typing.get_args(tp)[1]):
            entry_type = typing.get_args(tp)[1]
            for key, entry in value.items():
                _describe_section(entry_type, entry, _join(key_path, key), out)
        else:
            out.append(Setting(key_path, _expected(tp, f.metadata), _plain(value), doc))

