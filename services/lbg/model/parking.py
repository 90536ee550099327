"""Parked keys: what the group's registry says about a key whose events wait in its parking lot.

A key is parked when one of its events exhausted the handler's retries (or hung past the stall
timeout on `stall_limit` members): that event and every later one of the key go, in order, to
the group's parking lot, while the other keys flow. The registry (one record per key, stored in
the broker) is what every member reads when it takes a queue over, so a parked key stays parked
when its queue moves. States of a record:
- suspect: the key's handler hung past the stall timeout `stalls` times (not parked yet);
- parked: the key's events go to the lot;
- replay: an operator asked to unpark it: the owner of the key's queue replays the lot through
  the handler, in order (dropping the lot's entries up to `skip_through` first), then deletes
  the record; new events of the key wait behind the replay in the key's lane.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import orjson

from lbg.model.messages import REASON_CHARS, MalformedMessage, check_key

SUSPECT = "suspect"
PARKED = "parked"
REPLAY = "replay"
STATES = (SUSPECT, PARKED, REPLAY)
SKIPPED_HEADER = "Lbg-Skipped-By"
PARKED_PREFIX = "Lbg-Parked-"


@dataclass(frozen=True, slots=True)
class ParkedKey:
    """One key's registry record: its state, why and since when it is parked, by whom."""

    key: str
    state: str
    reason: str = ""
    attempts: int = 0
    since: float = 0.0
    by: str = ""
    stalls: int = 0
    skip_through: int = 0
    requested_by: str = ""
    requested_at: float = 0.0

    @property
    def parked(self) -> bool:
        """True while the key's events go to the parking lot (parked, or being replayed)."""
        return self.state != SUSPECT

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, data: bytes) -> ParkedKey:
        """A stored record; MalformedMessage naming what is wrong with it."""
        try:
            document: Any = orjson.loads(data)
            record = cls(**document)
        except (orjson.JSONDecodeError, TypeError) as exc:
            raise MalformedMessage(f"parked-key record is not valid: {exc}") from None
        check_key(record.key)
        if record.state not in STATES:
            raise MalformedMessage(f"parked-key record of {record.key!r}: state {record.state!r}")
        return record


def parked(key: str, reason: str, attempts: int, by: str, stalls: int = 0) -> ParkedKey:
    """The record of a key parked now."""
    return ParkedKey(key, PARKED, reason[:REASON_CHARS], attempts, time.time(), by, stalls)


def stalled(record: ParkedKey | None, key: str, by: str) -> ParkedKey:
    """The record after one more stall of the key's handler."""
    if record is None:
        return ParkedKey(key, SUSPECT, "handler hung past the stall timeout", 0, time.time(), by, 1)
    return replace(record, stalls=record.stalls + 1, by=by)


def replay_requested(record: ParkedKey, by: str, skip_through: int) -> ParkedKey:
    """The record once an operator asked to replay (and unpark) the key."""
    return replace(
        record, state=REPLAY, requested_by=by, requested_at=time.time(), skip_through=skip_through
    )


def parked_again(record: ParkedKey, reason: str, attempts: int, by: str) -> ParkedKey:
    """The record of a key whose replay failed: parked again, with the new reason."""
    return replace(record, state=PARKED, reason=reason[:REASON_CHARS], attempts=attempts, by=by)


def token(key: str) -> str:
    """The key as one broker-safe name (base64url, no padding): a KV key, a subject token, a
    routing key, a stream name's suffix; reversible with `key_of`."""
    return base64.urlsafe_b64encode(key.encode()).rstrip(b"=").decode()


def key_of(name: str) -> str:
    """The key a `token` stands for; MalformedMessage if it stands for none."""
    try:
        return check_key(base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)).decode())
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise MalformedMessage(f"{name!r} is no parked key's name") from None


def lot_headers(headers: Mapping[str, str], **parking: str) -> dict[str, str]:
    """A parked event's headers: its own, plus `parking` (reason, attempts, subject, by, at)
    as Lbg-Parked-* (one line each), which `original_headers` takes off again."""
    extra = {f"{PARKED_PREFIX}{name.title()}": _one_line(v) for name, v in parking.items()}
    return {**original_headers(headers), **extra}


def original_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """A parked event's headers as its producer sent them (without the Lbg-Parked-* ones)."""
    return {name: value for name, value in headers.items() if not name.startswith(PARKED_PREFIX)}


def _one_line(text: str) -> str:
    return " ".join(text.split())[:REASON_CHARS]
