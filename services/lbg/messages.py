"""The one wire format every daemon shares: events, processed records, summaries, dead letters.

Payloads are compact JSON (orjson). Short keys keep messages small on the hot path.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

MAX_MESSAGE_BYTES = 1024 * 1024
MAX_KEY_BYTES = 200
SUMMARY_CHUNK_BYTES = 256 * 1024
SHOWN_CHARS = 60


class MalformedMessage(ValueError):
    """A message body that cannot be decoded; the text is the dead-letter reason."""


@dataclass(frozen=True, slots=True)
class Event:
    """One keyed event as the publisher sends it: key, per-key sequence (from 1), data, and
    when it was first published (epoch seconds), which lets the validator measure lag."""

    key: str
    seq: int
    data: Any = None
    ts: float | None = None


@dataclass(frozen=True, slots=True)
class Processed:
    """What the default handler republishes for the validator: who processed which event."""

    key: str
    seq: int
    client: str
    queue: int
    bucket: int
    redelivered: bool = False
    published_at: float | None = None


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
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise MalformedMessage("key is not valid Unicode text") from None
    if size > MAX_KEY_BYTES:
        raise MalformedMessage(f"key of {size} bytes exceeds {MAX_KEY_BYTES} (UTF-8)")
    return key


def _show(value: object) -> str:
    """A value's repr cut to one short line: a dead-letter reason must stay small."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


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
    document: dict[str, Any] = {"k": event.key, "s": event.seq, "d": event.data}
    if event.ts is not None:
        document["t"] = event.ts
    return orjson.dumps(document)


def decode_event(body: bytes) -> Event:
    """Parse an event body, raising MalformedMessage with the reason if it is not one."""
    obj = _load_object(body)
    for field in ("k", "s"):
        if field not in obj:
            raise MalformedMessage(f"missing field '{field}'")
    return Event(
        key=check_key(obj["k"]), seq=_check_seq(obj["s"]), data=obj.get("d"), ts=_check_ts(obj)
    )


def encode_processed(record: Processed) -> bytes:
    """Serialise a processed record for the validation destination."""
    document: dict[str, Any] = {
        "k": record.key,
        "s": record.seq,
        "c": record.client,
        "q": record.queue,
        "b": record.bucket,
        "r": record.redelivered,
    }
    if record.published_at is not None:
        document["t"] = record.published_at
    return orjson.dumps(document)


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
            published_at=_check_ts(obj),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedMessage(f"bad processed record: {_show(exc)}") from None


def _check_ts(obj: Mapping[str, Any]) -> float | None:
    """The optional publish time `t`: a finite number of epoch seconds, if present."""
    ts = obj.get("t")
    if ts is None:
        return None
    if (
        isinstance(ts, bool)
        or not isinstance(ts, int | float)
        or ts != ts
        or abs(ts) == float("inf")
    ):
        raise MalformedMessage(f"t must be a number of seconds, got {_show(ts)}")
    return float(ts)


def _chunk_keys(keys: list[str]) -> list[list[str]]:
    """Group keys so that each summary message stays under SUMMARY_CHUNK_BYTES."""
    chunks: list[list[str]] = [[]]
    size = 0
    for key in keys:
        entry = len(key.encode("utf-8")) * 2 + 24
        if chunks[-1] and size + entry > SUMMARY_CHUNK_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(key)
        size += entry
    return chunks


def encode_summaries(publisher: str, last: Mapping[str, int]) -> Iterator[bytes]:
    """Split a publisher's per-key last sequences into messages of bounded size."""
    chunks = _chunk_keys(sorted(last))
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
        raise MalformedMessage(f"bad summary: {_show(exc)}") from None
