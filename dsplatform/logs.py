"""How every dsplatform process writes its log: one handler, one format, text or JSON.

Who calls it: the main of each long-running process, once, before anything logs:
``dsagent serve`` (:mod:`dsagent.nodeagent.serve`), the Dataset controller
(:mod:`dsagent.controller.reconcile`), the admission webhook
(:mod:`dsagent.webhook.server`) and the extender (:mod:`scheduler_plugin.__main__`);
their settings classes take the fields from :class:`LogSettings` (``<PREFIX>LOG_LEVEL``,
``<PREFIX>LOG_FORMAT``, ``<PREFIX>ACCESS_LOG``).
What it owns (docs/design.md#logs):

- :func:`configure`: one ``StreamHandler`` on stderr on the root logger, formatted as text
  (``time level logger: message``) or as one JSON object per line (:class:`JsonFormatter`);
- :func:`uvicorn_options`: the keyword arguments that make uvicorn log through that same
  handler instead of installing its own (``log_config=None``: uvicorn's ``uvicorn.error``
  and ``uvicorn.access`` loggers then propagate to the root), so a process never mixes
  uvicorn's format with ours; the access log is off unless asked for.

Decisions: JSON lines come from a small :class:`logging.Formatter` here, not a library:
python-json-logger and structlog are not in the lock, and the format needs ~40 lines
(a fixed set of keys, the record's ``extra`` fields, the traceback as one string). Keys:
``time`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``message``, then any
``extra`` a caller passed, then ``exception``. uvicorn's access lines also carry
``client``, ``method``, ``path``, ``http_version`` and ``status`` as fields, so a log
pipeline need not parse the message.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Annotated, Any, Literal, TextIO

from pydantic import BeforeValidator

from dsplatform.settings import EnvSettings, Flag

#: the levels every process accepts, most severe first
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
#: the formats every process accepts
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: uvicorn's own loggers, routed to the root handler by :func:`configure`
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


def parse_log_level(value: Any) -> str:
    level = str(value).strip().lower()
    if level not in LOG_LEVELS:
        raise ValueError(f"unknown log level {value!r} (use one of {', '.join(LOG_LEVELS)})")
    return level


def parse_log_format(value: Any) -> str:
    fmt = str(value).strip().lower()
    if fmt not in LOG_FORMATS:
        raise ValueError(f"unknown log format {value!r} (use one of {', '.join(LOG_FORMATS)})")
    return fmt


LogLevel = Annotated[str, BeforeValidator(parse_log_level)]
LogFormat = Annotated[Literal["text", "json"], BeforeValidator(parse_log_format)]


class LogSettings(EnvSettings):
    """The logging fields every process's settings share; a subclass sets ``env_prefix``."""

    log_level: LogLevel = "info"
    log_format: LogFormat = "text"
    access_log: Flag = False  # one line per HTTP request (uvicorn's access log), at INFO


# the attributes every LogRecord has: anything else on a record is a caller's ``extra``
# (``color_message``: uvicorn's copy of the message with terminal colours, noise in a log store)
_RECORD_KEYS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "color_message",
}
_ACCESS_FIELDS = ("client", "method", "path", "http_version", "status")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the caller's extras, exception."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": _rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            doc.update(zip(_ACCESS_FIELDS, record.args))
        for key, value in record.__dict__.items():
            if key not in _RECORD_KEYS and key not in doc and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exception"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


def _rfc3339(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


def formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if parse_log_format(log_format) == "json" else logging.Formatter(TEXT_FORMAT)


class ProcessHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The one handler :func:`configure` installs (a class of its own, so it can be found)."""


def configure(level: str, log_format: str, *, stream: TextIO | None = None) -> logging.Handler:
    """Send every logger of this process, uvicorn's included, to one handler in one format.

    Replaces the root logger's handlers (a second call reconfigures, it does not add a
    second handler) and takes uvicorn's loggers' own handlers off so they propagate here.
    """
    handler = ProcessHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(parse_log_level(level).upper())
    for name in UVICORN_LOGGERS:  # as uvicorn's own dictConfig left them: handlers, a level of their own
        logger = logging.getLogger(name)
        logger.handlers = []
        logger.propagate = True
        logger.setLevel(logging.NOTSET)  # the root's level decides (uvicorn.Config sets its own after)
    return handler


def uvicorn_options(settings: LogSettings) -> dict[str, Any]:
    """``uvicorn.Config``/``uvicorn.run`` keywords: log through :func:`configure`'s handler."""
    return {"log_config": None, "log_level": settings.log_level, "access_log": settings.access_log}


__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "JsonFormatter",
    "LogFormat",
    "LogLevel",
    "LogSettings",
    "configure",
    "formatter",
    "parse_log_format",
    "parse_log_level",
    "uvicorn_options",
]
