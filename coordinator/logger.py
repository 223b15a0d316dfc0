"""structlog set-up: human console lines by default, JSON lines with ``--log-format json``.

Levels per logger, as Kafka's log4j loggers have them (the BROKER_LOGGER config resource,
docs/configs.md, "Broker loggers"): every logger of the broker is named (``rallypoint.groups``
...), its level is its own if one was set, else its nearest dotted parent's, else the root's
(``--log-level``).  The check is one dict lookup in :class:`Logger` before structlog is called.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Final

import structlog

ROOT: Final = "root"
# log4j's level names (what Kafka's DescribeConfigs shows and IncrementalAlterConfigs takes)
LEVELS: Final[dict[str, int]] = {
    "TRACE": 5,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
}
_NAMES: Final = {v: k for k, v in LEVELS.items()}

_set: dict[str, int] = {ROOT: logging.INFO}  # levels set explicitly (the root always is)
_effective: dict[str, int] = {}  # logger name -> its level now
_known: set[str] = set()


def _resolve(name: str) -> int:
    probe = name
    while True:
        if probe in _set:
            return _set[probe]
        if "." not in probe:
            return _set[ROOT]
        probe = probe.rsplit(".", 1)[0]


def _recompute() -> None:
    for name in _known:
        _effective[name] = _resolve(name)


def configure(fmt: str = "console", level: str = "info") -> None:
    lvl = getattr(logging, level.upper(), logging.INFO)
    renderer: structlog.types.Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        # Every level reaches the processors; :class:`Logger` filters per logger first.
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    _set.clear()
    _set[ROOT] = lvl
    _recompute()


def loggers() -> dict[str, str]:
    """Every logger's level name now, the root first, then by name."""
    out = {ROOT: level_name(_set[ROOT])}
    for name in sorted(_known):
        out[name] = level_name(_effective[name])
    return out


def level_name(level: int) -> str:
    return _NAMES.get(level) or min(LEVELS, key=lambda k: abs(LEVELS[k] - level))


def exists(name: str) -> bool:
    return name == ROOT or name in _known


def set_level(name: str, level: str | None) -> None:
    """Give logger ``name`` the log4j ``level`` (None: inherit again; never for the root)."""
    if level is None:
        if name == ROOT:
            raise ValueError("the root logger always has a level")
        _set.pop(name, None)
    else:
        _set[name] = LEVELS[level]
    _recompute()


class Logger:
    """A structlog logger behind a per-logger level check (the methods the broker uses)."""

    __slots__ = ("_proxy", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._proxy: Any = structlog.get_logger(name)
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # "rallypoint.groups" makes "rallypoint" a logger too
            prefix = ".".join(parts[:i])
            if prefix not in _known:
                _known.add(prefix)
                _effective[prefix] = _resolve(prefix)

    def enabled(self, level: int) -> bool:
        return level >= _effective[self.name]

    def debug(self, event: str, *args: Any, **kw: Any) -> None:
        if _effective[self.name] <= logging.DEBUG:
            self._proxy.debug(event, *args, **kw)

    def info(self, event: str, *args: Any, **kw: Any) -> None:
        if _effective[self.name] <= logging.INFO:
            self._proxy.info(event, *args, **kw)

    def warning(self, event: str, *args: Any, **kw: Any) -> None:
        if _effective[self.name] <= logging.WARNING:
            self._proxy.warning(event, *args, **kw)

    def error(self, event: str, *args: Any, **kw: Any) -> None:
        if _effective[self.name] <= logging.ERROR:
            self._proxy.error(event, *args, **kw)

    def exception(self, event: str, *args: Any, **kw: Any) -> None:
        if _effective[self.name] <= logging.ERROR:
            self._proxy.exception(event, *args, **kw)

    def critical(self, event: str, *args: Any, **kw: Any) -> None:
        if _effective[self.name] <= logging.CRITICAL:
            self._proxy.critical(event, *args, **kw)


def get(name: str) -> Logger:
    return Logger(name)
