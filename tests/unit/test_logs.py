"""Logs as JSON lines (time, level, logger, message, extra fields) or text, never a password."""

import logging
import sys

import orjson
from click.testing import CliRunner

from lbg.cli import client
from lbg.logs import JsonFormatter, TextFormatter


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    """A log record as logger.info(message, *args, extra=extra) makes it."""
    return logging.getLogger("lbg.test").makeRecord(
        "lbg.test", logging.INFO, __file__, 1, message, args, None, extra=extra
    )


def test_a_json_line_has_the_fields_and_the_extras() -> None:
    line = JsonFormatter().format(record("queue %d moved", 3, queue=3, to="c-2"))
    document = orjson.loads(line)
    assert document.pop("time").endswith("+00:00")
    assert document == {
        "level": "info",
        "logger": "lbg.test",
        "message": "queue 3 moved",
        "queue": 3,
        "to": "c-2",
    }


def test_a_json_line_carries_the_exception_on_the_same_line() -> None:
    try:
        raise ValueError("bad")
    except ValueError:
        failed = record("failed")
        failed.exc_info = sys.exc_info()
    line = JsonFormatter().format(failed)
    assert "\n" not in line
    assert "ValueError: bad" in orjson.loads(line)["exception"]


def test_no_password_in_either_format() -> None:
    url = "amqp://lbg:s3cret@rabbit:5672,nats://a:b@n:4222"
    for formatter in (JsonFormatter(), TextFormatter()):
        line = formatter.format(record("connecting to %s", url, url=url))
        assert "s3cret" not in line and ":b@" not in line, line
        assert "lbg:***@rabbit" in line


def test_the_daemon_logs_json_lines_with_log_format_json() -> None:
    """The start-up retry warnings of a daemon that cannot reach its broker, as JSON."""
    flags = ["--log-format", "json", "--connect-retry", "0.3"]
    result = CliRunner().invoke(
        client.main, [*flags, "--broker-url", "nats://u:s3cret@127.0.0.1:1"]
    )
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("{")]
    assert lines, result.stderr
    for line in lines:
        document = orjson.loads(line)
        assert {"time", "level", "logger", "message"} <= document.keys()
    assert "s3cret" not in result.stderr
