"""Log lines on stderr as text or JSON objects (for log pipelines), with secrets masked.

A JSON line has `time` (UTC, ISO 8601), `level`, `logger` and `message`, then every `extra=`
field of the call, and `exception` when there is one. Any `user:password@` in a URL is shown
as `user:***@` in both formats, whatever the call passed.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import orjson

from lbg.settings import mask_password

# The attributes every LogRecord has: anything else on a record came from `extra=`.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class TextFormatter(logging.Formatter):
    """The classic one-line text format, with passwords in URLs masked."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        """The line as logging.Formatter writes it, masked."""
        return mask_password(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the call's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one JSON line; values orjson cannot encode are written as str()."""
        document: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": mask_password(record.getMessage()),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in document:
                document[key] = mask_password(value) if isinstance(value, str) else value
        if record.exc_info:
            document["exception"] = mask_password(self.formatException(record.exc_info))
        elif record.exc_text:
            document["exception"] = mask_password(record.exc_text)
        return orjson.dumps(document, default=str).decode()


def formatter(kind: str) -> logging.Formatter:
    """The formatter for a `[logging] format` value: "text" or "json"."""
    return JsonFormatter() if kind == "json" else TextFormatter()
