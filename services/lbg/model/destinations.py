"""Where messages go, as broker-neutral topic levels; each adapter maps levels to its syntax.

An event's topic is `<HP><sep><bucket><sep><key>` (`/` on Solace, `.` on NATS and RabbitMQ).
The key is everything after the bucket level, percent-decoded: a producer writes it as it is,
except that `%`, the separator, wildcards, whitespace and control characters are written as
%XX of their UTF-8 bytes (a separator written as is makes the key span several levels, which
decodes to the same key).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import unquote_to_bytes

from lbg.model.messages import MalformedMessage, check_key

SYSTEM_PREFIX = "_lbg"
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-/:+=@~!,;]")


class OutputKind(StrEnum):
    """The group's own output destinations, kept apart from the event topics."""

    VALIDATION = "validation"
    DEAD = "dead"
    SUMMARY = "summary"


@dataclass(frozen=True, slots=True)
class Destination:
    """A topic as a tuple of levels: `<HP>/<bucket>/<key>` on Solace, `HP.bucket.key` on NATS."""

    levels: tuple[str, ...]

    def __str__(self) -> str:
        return "/".join(self.levels)


def event_destination(hash_prefix: str, bucket: int, key: str) -> Destination:
    """The topic an event for `key` is published to: `<HP>/<bucket>/<key>`."""
    return Destination((hash_prefix, str(bucket), key))


def output_destination(group: str, kind: OutputKind) -> Destination:
    """The group's validation, dead-letter or summary destination."""
    return Destination((SYSTEM_PREFIX, group, kind.value))


def level_token(level: str) -> str:
    """Percent-encode a topic level so it is one dot-separated token on NATS and RabbitMQ
    (no '.', '*', '>', '#', space or control character), reversibly."""
    return _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), level)


@dataclass(frozen=True, slots=True)
class EventAddress:
    """What an event's topic says: its key, and the bucket the producer hashed it into
    (None where the broker's destination has no bucket level, e.g. Message DB)."""

    key: str
    bucket: int | None


def parse_event_topic(topic: str, separator: str) -> EventAddress:
    """The bucket and key of an event topic `<HP><sep><bucket><sep><key>`; MalformedMessage
    (a dead-letter reason) if it has no key level, a bucket that is not a number, or a key
    that is not UTF-8 once percent-decoded."""
    parts = topic.split(separator, 2)
    if len(parts) < 3 or not parts[2]:
        raise MalformedMessage(f"topic {topic[:120]!r} has no key level after <HP>/<bucket>")
    bucket = parts[1]
    if not bucket.isascii() or not bucket.isdigit():
        raise MalformedMessage(f"topic {topic[:120]!r}: bucket level {bucket[:20]!r} is no number")
    try:
        key = unquote_to_bytes(parts[2]).decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedMessage(
            f"topic {topic[:120]!r}: the key is not UTF-8 once percent-decoded"
        ) from None
    return EventAddress(check_key(key), int(bucket))
