"""Logging for koordnode: structlog events, one line each, on stderr.

Our own code logs through :func:`get_logger` (structlog, keyword events). Records of the
standard ``logging`` module (grpc, asyncio, libraries) go through the same renderer, so that
everything the daemon says is in one format on one stream.

Loggers returned by :func:`get_logger` are lazy and not cached, so a module-level
``log = get_logger(__name__)`` honours a later :func:`configure_logging` (e.g. a level change
on config reload). That costs a few microseconds per event; a ``log.bind(...)`` result is a
concrete logger fixed to the configuration of the moment, fine for a request's lifetime.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

__all__ = ["LEVELS", "FORMATS", "configure_logging", "get_logger"]

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
FORMATS = ("json", "console")


def _logger_key(logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    # structlog reserves the "logger" keyword, so get_logger(logger_name=...) binds another key;
    # a module's structlog.get_logger("koordnode.x") leaves its name on the _NamedWriteLogger.
    name = event_dict.pop("logger_name", None) or getattr(logger, "name", None)
    if name is not None:
        event_dict.setdefault("logger", name)
    return event_dict


class _NamedWriteLogger(structlog.WriteLogger):
    """A WriteLogger that keeps the name given to ``structlog.get_logger(name)``."""

    def __init__(self, file: TextIO, name: str | None) -> None:
        super().__init__(file)
        self.name = name


class _NamedWriteLoggerFactory:
    """Like structlog's WriteLoggerFactory, which drops the positional name; this one keeps it."""

    def __init__(self, file: TextIO) -> None:
        self._file = file

    def __call__(self, *args: Any) -> _NamedWriteLogger:
        name = args[0] if args and isinstance(args[0], str) else None
        return _NamedWriteLogger(self._file, name)


class _OurHandler(logging.StreamHandler):  # type: ignore[type-arg,unused-ignore]
    """Marks the root handler we installed, so reconfiguring replaces only ours."""


def configure_logging(level: str = "info", fmt: str = "json", *, stream: TextIO | None = None) -> None:
    """Route structlog and stdlib logging to ``stream`` (stderr) at ``level`` in ``fmt``.

    May be called again (config reload); the new level and format apply to every logger
    obtained from :func:`get_logger`, before or after this call.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown log level {level!r}; expected one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; expected one of {', '.join(FORMATS)}")
    out = stream if stream is not None else sys.stderr

    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _logger_key,
    ]
    renderer: list[Any]
    if fmt == "json":
        renderer = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        colors = bool(getattr(out, "isatty", lambda: False)())
        renderer = [structlog.dev.ConsoleRenderer(colors=colors)]

    structlog.configure(
        processors=[*shared, structlog.processors.StackInfoRenderer(), *renderer],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=_NamedWriteLoggerFactory(out),
        context_class=dict,
        cache_logger_on_first_use=False,
    )

    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
    )
    handler = _OurHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _OurHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LEVELS[level])
    logging.captureWarnings(True)


def get_logger(name: str) -> Any:
    """A structlog logger whose events carry ``logger=<name>`` (as ``structlog.get_logger(name)``)."""
    return structlog.get_logger(name)
