"""The one wire format every daemon shares: events, processed records, summaries, dead letters.

An event's key travels in its destination and its body belongs to the producer: our own
metadata (the key's sequence, the publish time) is optional and travels in `Lbg-*` headers.
The group's own records (processed, summaries) are compact JSON (orjson).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import orjson

MAX_MESSAGE_BYTES = 1024 * 1024
SEQ_HEADER = "Lbg-Seq"
TIME_HEADER = "Lbg-Time"
KEY_HEADER = "Lbg-Key"
REASON_HEADER = "Lbg-Reason"
SUBJECT_HEADER = "Lbg-Subject"
REASON_CHARS = 500
MAX_KEY_BYTES = 200
SUMMARY_CHUNK_BYTES = 256 * 1024
SHOWN_CHARS = 60


class MalformedMessage(ValueError):
    """A message body that cannot be decoded; the text is the dead-letter reason."""


@dataclass(frozen=True, slots=True)
class Event:
    """One keyed event as a handler gets it: the key (from the destination), the body exactly as
    the producer sent it, its headers, and our optional metadata when the producer set it.

    `seq` (the key's sequence number from 1) and `ts` (first publish, epoch seconds) come from
    the `Lbg-Seq` and `Lbg-Time` headers; events from other producers have neither.
    """

    key: str
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    seq: int | None = None
    ts: float | None = None

    def json(self) -> Any:
        """The body parsed as JSON; MalformedMessage if it is not JSON."""
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError as exc:
            raise MalformedMessage(f"body is not valid JSON: {exc}") from None

    def text(self) -> str:
        """The body as UTF-8 text; MalformedMessage if it is not."""
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedMessage(f"body is not UTF-8 text: {exc.reason}") from None


@dataclass(frozen=True, slots=True)
class Processed:
    """What the default handler republishes for the validator: who processed which event
    (`seq` is None for an event from a producer that does not number its keys)."""

    key: str
    seq: int | None
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


def event_headers(seq: int, ts: float, headers: Mapping[str, str] | None = None) -> dict[str, str]:
    """A producer's own headers plus our metadata: the key's sequence and the publish time."""
    return {**(headers or {}), SEQ_HEADER: str(seq), TIME_HEADER: f"{ts:.6f}"}


def read_event(key: str, body: bytes, headers: Mapping[str, str]) -> Event:
    """The event of a delivery whose key came from its destination; MalformedMessage (the
    dead-letter reason) if the body is over the limit or our metadata headers are bad."""
    if len(body) > MAX_MESSAGE_BYTES:
        raise MalformedMessage(f"message of {len(body)} bytes exceeds {MAX_MESSAGE_BYTES}")
    seq = headers.get(SEQ_HEADER)
    ts = headers.get(TIME_HEADER)
    return Event(
        key=check_key(key),
        body=body,
        headers=headers,
        seq=None if seq is None else _header_seq(seq),
        ts=None if ts is None else _header_ts(ts),
    )


def _header_seq(text: str) -> int:
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise MalformedMessage(f"{SEQ_HEADER} header must be an integer >= 1, got {_show(text)}")
    return int(text)


def _header_ts(text: str) -> float:
    try:
        ts = float(text)
    except ValueError:
        ts = math.nan
    if not math.isfinite(ts):
        raise MalformedMessage(f"{TIME_HEADER} header must be epoch seconds, got {_show(text)}")
    return ts


def dead_letter_headers(
    headers: Mapping[str, str], reason: str, subject: str, key: str | None, **where: str
) -> dict[str, str]:
    """A dead letter's headers: the event's own (its Lbg-Seq included), the reason, where it
    came from, its key when known (percent-encoded) and `where` (client, queue) as Lbg-*."""
    extra = {f"Lbg-{name.title()}": _one_line(value) for name, value in where.items()}
    document = {**headers, REASON_HEADER: _one_line(reason), SUBJECT_HEADER: _one_line(subject)}
    if key is not None:
        document[KEY_HEADER] = quote(key, safe="")
    return {**document, **extra}


def read_dead_letter(headers: Mapping[str, str]) -> tuple[str, int] | None:
    """The key and sequence of a dead-lettered event, if it had both (None: it had not)."""
    key, seq = headers.get(KEY_HEADER), headers.get(SEQ_HEADER)
    if key is None or seq is None:
        return None
    try:
        return check_key(unquote(key, errors="strict")), _header_seq(seq)
    except (MalformedMessage, UnicodeDecodeError):
        return None


def _one_line(text: str) -> str:
    """A header value: one line, at most REASON_CHARS characters."""
    return " ".join(text.split())[:REASON_CHARS]


def encode_processed(record: Processed) -> bytes:
    """Serialise a processed record for the validation destination."""
    document: dict[str, Any] = {
        "k": record.key,
        "c": record.client,
        "q": record.queue,
        "b": record.bucket,
        "r": record.redelivered,
    }
    if record.seq is not None:
        document["s"] = record.seq
    if record.published_at is not None:
        document["t"] = record.published_at
    return orjson.dumps(document)


def decode_processed(body: bytes) -> Processed:
    """Parse a processed record, raising MalformedMessage if it is not one."""
    obj = _load_object(body)
    try:
        return Processed(
            key=check_key(obj["k"]),
            seq=None if obj.get("s") is None else _check_seq(obj["s"]),
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


def event_digest(target: str, headers: Mapping[str, str], body: bytes) -> bytes:
    """16 bytes naming one event (destination, headers, body), for brokers that drop a second
    copy of an id (JetStream's `Nats-Msg-Id`, Message DB's message id): a retried publish is
    dropped, and only that. An event with its key's sequence (`Lbg-Seq`) is the same event
    whenever it is sent, so its publish time is left out: a retried Spark task's republish,
    stamped later, is dropped too. Without a sequence the time tells apart two events of one
    key with the same body."""
    digest = hashlib.blake2b(target.encode(), digest_size=16)
    sequenced = SEQ_HEADER in headers
    for name in sorted(headers):
        if sequenced and name == TIME_HEADER:
            continue
        digest.update(b"\0" + name.encode() + b"\0" + headers[name].encode())
    digest.update(b"\1" + body)
    return digest.digest()
