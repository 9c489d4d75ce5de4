"""Logging with the request id of the request being served: JSON lines for files and collectors,
short human-readable lines for a person watching a terminal."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

# Only these record attributes are emitted: a log call cannot leak a secret through an extra field
# that nobody reviewed.
EXTRA_FIELDS = ("method", "path", "status", "duration_ms", "client", "user_id", "event", "port", "url")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None) or request_id_var.get()
        if request_id:
            entry["request_id"] = request_id
        for name in EXTRA_FIELDS:
            if hasattr(record, name):
                entry[name] = getattr(record, name)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def stamp_request_ids() -> None:
    """Records take the current request id when they are created, not when a handler formats them
    (which may be later, on another task)."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "stamps_request_id", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        record.request_id = request_id_var.get()
        return record

    factory.stamps_request_id = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


LogFormat = Literal["auto", "json", "text"]


class TextFormatter(logging.Formatter):
    """``09:38:44 INFO  message``: what a person at a terminal reads. A request shows as its method,
    path, status and duration; tracebacks follow their line."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        message = record.getMessage()
        if message == "request" and hasattr(record, "status"):
            fields = vars(record)
            message = f"{fields['method']} {fields['path']} {fields['status']} {fields['duration_ms']} ms"
        line = f"{when} {record.levelname:<7} {message}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _worth_watching(record: logging.LogRecord) -> bool:
    """On a terminal, requests that went well are noise (a console page alone makes a dozen)."""
    status = getattr(record, "status", None)
    return not (record.getMessage() == "request" and isinstance(status, int) and status < 400)


def configure(level: str = "INFO", fmt: LogFormat = "auto", stream: TextIO | None = None) -> None:
    """``auto`` writes text lines when the stream is a terminal and JSON lines otherwise."""
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    if fmt == "text" or (fmt == "auto" and stream.isatty()):
        handler.setFormatter(TextFormatter())
        handler.addFilter(_worth_watching)
    else:
        handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's access log would print query strings; our middleware logs each request instead.
    logging.getLogger("uvicorn.access").disabled = True
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
