"""Where messages go, as broker-neutral topic levels; each adapter maps levels to its syntax."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

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
