"""The one wire format every daemon shares: events, processed records, summaries, dead letters.

Payloads are compact JSON (orjson). Short keys keep messages small on the hot path.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

MAX_MESSAGE_BYTES = 1024 * 1024
MAX_KEY_CHARS = 1024
SUMMARY_CHUNK_KEYS = 2000


class MalformedMessage(ValueError):
    """A message body that cannot be decoded; the text is the dead-letter reason."""


@dataclass(frozen=True, slots=True)
class Event:
    """One keyed event as the publisher sends it: key, per-key sequence (from 1) and data."""

    key: str
    seq: int
    data: Any = None


@dataclass(frozen=True, slots=True)
class Processed:
    """What the default handler republishes for the validator: who processed which event."""

    key: str
    seq: int
    client: str
    queue: int
    bucket: int
    redelivered: bool = False


@dataclass(frozen=True, slots=True)
class Summary:
    """One chunk of a publisher's final word: the last sequence it published per key."""

    publisher: str
    last: dict[str, int]
    part: int
    parts: int


def check_key(key: object) -> str:
    """Return key if it is a usable event key, else raise MalformedMessage saying why."""
    if not isinstance(key, str):
        raise MalformedMessage(f"key must be a string, got {type(key).__name__}")
    if not key:
        raise MalformedMessage("key must not be empty")
    if len(key) > MAX_KEY_CHARS:
        raise MalformedMessage(f"key longer than {MAX_KEY_CHARS} characters")
    return key


def _check_seq(seq: object) -> int:
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise MalformedMessage(f"seq must be an integer, got {type(seq).__name__}")
    if seq < 1:
        raise MalformedMessage(f"seq must be >= 1, got {seq}")
    return seq


def _load_object(body: bytes) -> dict[str, Any]:
    if len(body) > MAX_MESSAGE_BYTES:
        raise MalformedMessage(f"message of {len(body)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedMessage(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise MalformedMessage(f"expected a JSON object, got {type(value).__name__}")
    return value


def encode_event(event: Event) -> bytes:
    """Serialise an event for the broker."""
    return orjson.dumps({"k": event.key, "s": event.seq, "d": event.data})


def decode_event(body: bytes) -> Event:
    """Parse an event body, raising MalformedMessage with the reason if it is not one."""
    obj = _load_object(body)
    for field in ("k", "s"):
        if field not in obj:
            raise MalformedMessage(f"missing field '{field}'")
    return Event(key=check_key(obj["k"]), seq=_check_seq(obj["s"]), data=obj.get("d"))


def encode_processed(record: Processed) -> bytes:
    """Serialise a processed record for the validation destination."""
    return orjson.dumps(
        {
            "k": record.key,
            "s": record.seq,
            "c": record.client,
            "q": record.queue,
            "b": record.bucket,
            "r": record.redelivered,
        }
    )


def decode_processed(body: bytes) -> Processed:
    """Parse a processed record, raising MalformedMessage if it is not one."""
    obj = _load_object(body)
    try:
        return Processed(
            key=check_key(obj["k"]),
            seq=_check_seq(obj["s"]),
            client=str(obj["c"]),
            queue=int(obj["q"]),
            bucket=int(obj["b"]),
            redelivered=bool(obj.get("r", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedMessage(f"bad processed record: {exc!r}") from None


def encode_summaries(publisher: str, last: Mapping[str, int]) -> Iterator[bytes]:
    """Split a publisher's per-key last sequences into messages of bounded size."""
    keys = sorted(last)
    chunks = [keys[i : i + SUMMARY_CHUNK_KEYS] for i in range(0, len(keys), SUMMARY_CHUNK_KEYS)]
    chunks = chunks or [[]]
    for part, chunk in enumerate(chunks):
        yield orjson.dumps(
            {"p": publisher, "l": {k: last[k] for k in chunk}, "i": part, "n": len(chunks)}
        )


def decode_summary(body: bytes) -> Summary:
    """Parse one summary chunk, raising MalformedMessage if it is not one."""
    obj = _load_object(body)
    try:
        last = {check_key(k): _check_seq(v) for k, v in obj["l"].items()}
        return Summary(publisher=str(obj["p"]), last=last, part=int(obj["i"]), parts=int(obj["n"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MalformedMessage(f"bad summary: {exc!r}") from None
