"""Logging setup: text or JSON lines on stderr, journald-aware.

Loggers: ``streamd.server`` (connections, lifecycle), ``streamd.engine``
(batching, migration), ``streamd.model`` (loading), ``streamd.access`` (one
line per connection as it ends, at INFO; ``log.access = "off"`` silences it).
Extra fields passed with ``extra={...}`` (``path``, ``remote``...) are appended
as ``key=value`` in text and as keys in JSON. When stderr is connected to
journald (``JOURNAL_STREAM`` matches it) lines carry a ``<priority>`` prefix
and no timestamp: journald adds its own.
Nothing happens on import; call :func:`configure`.
"""
from __future__ import annotations

import json
import logging
import logging.config
import os
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, TextIO


LOGGERS = ("streamd.server", "streamd.engine", "streamd.model", "streamd.access")

_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
_SYSLOG_PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4),
                      (logging.INFO, 6))


def _priority(levelno: int) -> int:
    """The syslog priority journald reads from a ``<N>`` line prefix."""
    return next((prio for level, prio in _SYSLOG_PRIORITIES if levelno >= level), 7)


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRS and not k.startswith("_")}


def under_journald(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """Whether ``stream`` is the journal stream systemd announced in ``JOURNAL_STREAM``."""
    try:
        device, inode = (int(part) for part in environ["JOURNAL_STREAM"].split(":"))
        stat = os.fstat(stream.fileno())
    except (KeyError, ValueError, OSError, AttributeError):
        return False
    return (stat.st_dev, stat.st_ino) == (device, inode)


class TextFormatter(logging.Formatter):
    """``[time] LEVEL logger: message key=value...``; journald mode adds ``<prio>``, drops time."""

    def __init__(self, journald: bool = False) -> None:
        prefix = "" if journald else "%(asctime)s "
        super().__init__(prefix + "%(levelname)s %(name)s: %(message)s")
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = _extras(record)
        if extras:
            head, sep, tail = line.partition("\n")
            line = head + "".join(f" {k}={v}" for k, v in extras.items()) + sep + tail
        return f"<{_priority(record.levelno)}>{line}" if self.journald else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (unless journald), ``level``, ``logger``, ``message``, extras."""

    def __init__(self, timestamps: bool = True) -> None:
        super().__init__()
        self.timestamps = timestamps

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {}
        if self.timestamps:
            entry["ts"] = datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds")
        entry.update(level=record.levelname.lower(), logger=record.name, message=record.getMessage())
        entry.update(_extras(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def levels(level: str, access: str = "on") -> dict[str, str]:
    """Each streamd logger's level: ``level``, but ``streamd.access`` at WARNING (silent) when
    ``access`` is ``off``."""
    out = {name: level.upper() for name in ("streamd", *LOGGERS)}
    if access == "off":
        out["streamd.access"] = max(level.upper(), "WARNING", key=logging.getLevelName)
    return out


def set_levels(level: str, access: str = "on") -> None:
    """Change the levels :func:`configure` set, in this process (a reload)."""
    for name, value in levels(level, access).items():
        logging.getLogger(name).setLevel(value)


def configure(level: str = "info", fmt: str = "text", *, access: str = "on", stream: TextIO | None = None,
              environ: Mapping[str, str] | None = None) -> None:
    """Send streamd's logs (at ``level``) and other libraries' warnings to ``stream``.

    Args:
        level: ``debug``, ``info``, ``warning``, ``error`` or ``critical``.
        fmt: ``text`` or ``json``.
        access: ``on``: a line per stream as it ends (``streamd.access``); ``off``: none.
        stream: defaults to ``sys.stderr``.
        environ: where to look for ``JOURNAL_STREAM``; defaults to ``os.environ``.
    """
    out = sys.stderr if stream is None else stream
    journald = under_journald(out, os.environ if environ is None else environ)
    if fmt == "json":
        formatter: dict[str, Any] = {"()": JsonFormatter, "timestamps": not journald}
    elif fmt == "text":
        formatter = {"()": TextFormatter, "journald": journald}
    else:
        raise ValueError(f"unknown log format {fmt!r}; use text or json")
    logging.config.dictConfig({
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"streamd": formatter},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "stream": out,
                                "formatter": "streamd"}},
        "root": {"level": "WARNING", "handlers": ["stderr"]},
        "loggers": {name: {"level": value} for name, value in levels(level, access).items()},
    })
    logging.captureWarnings(True)
