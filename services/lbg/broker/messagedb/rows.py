"""What a Message DB row holds: how our events are written, and how any writer's row reads
back as the body and headers a handler gets.

Our rows carry a marker in their metadata, `{"lbg": {"body": E, "headers": {...}}}`, the
headers exactly as published. E says how `data` holds the body: `text` (`{"text": body}`) or
`base64` (`{"base64": ...}`) in the groups' own categories, where any bytes must round-trip;
`json` (the body itself) in a category that other writers share, where the data must be the
message. A row without a valid marker is another writer's: its body is the data's JSON text as
PostgreSQL returns it (jsonb normalizes it), its headers the metadata's top-level fields as
text (PostgreSQL's `jsonb_each_text`: strings as they are, anything else as its JSON text)
plus the row's type as `Message-Type`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

import orjson

MARK = "lbg"
TYPE_HEADER = "Message-Type"
DEFAULT_TYPE = "Event"
TEXT, BASE64, JSON = "text", "base64", "json"

# What a reader selects from get_*_messages: the metadata's top-level fields are flattened to
# text by PostgreSQL, so that a number keeps its exact JSON text (Python would round it); a
# JSON null, which jsonb_each_text gives as SQL NULL, becomes its JSON text too.
COLUMNS = (
    "global_position, stream_name, type, data, time, "
    "CASE WHEN jsonb_typeof(metadata::jsonb) = 'object' THEN "
    "(SELECT jsonb_object_agg(f.key, COALESCE(f.value, 'null')) "
    "FROM jsonb_each_text(metadata::jsonb) f) END AS fields"
)


class BodyNotJson(ValueError):
    """A body for a shared category that cannot be Message DB data (jsonb)."""


def message_type(headers: Mapping[str, str]) -> str:
    """The type an event is written with: its `Message-Type` header, else `Event`."""
    return headers.get(TYPE_HEADER) or DEFAULT_TYPE


def encode(body: bytes, headers: Mapping[str, str], as_json: bool) -> tuple[str, str]:
    """The data and metadata (JSON text) of one of our rows. `as_json`: the body is the data
    itself (PostgreSQL then judges whether it is JSON); BodyNotJson if it is not even UTF-8."""
    if as_json:
        try:
            data, encoding = body.decode("utf-8"), JSON
        except UnicodeDecodeError as exc:
            raise BodyNotJson(f"body is not JSON (not UTF-8 at byte {exc.start})") from None
    else:
        data, encoding = _wrap(body)
    metadata = {MARK: {"body": encoding, "headers": dict(headers)}}
    return data, orjson.dumps(metadata).decode()


def _wrap(body: bytes) -> tuple[str, str]:
    """Any bytes as jsonb data: UTF-8 text as it is, anything else (or NUL, which jsonb
    cannot hold) as base64."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text:
        return orjson.dumps({BASE64: base64.b64encode(body).decode()}).decode(), BASE64
    return orjson.dumps({TEXT: text}).decode(), TEXT


def read_row(row: Mapping[str, Any]) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a row selected with COLUMNS (its `type`, `data` and `fields`)."""
    fields = orjson.loads(row["fields"]) if row["fields"] else {}
    own = _own(fields.get(MARK), row["data"])
    if own is not None:
        return own
    return (row["data"] or "").encode(), {**fields, TYPE_HEADER: row["type"]}


def _own(mark: str | None, data: str | None) -> tuple[bytes, dict[str, str]] | None:
    """Body and headers of one of our rows; None if the marker is missing or does not fit."""
    if mark is None:
        return None
    try:
        document = orjson.loads(mark)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(document, dict):
        return None
    headers = document.get("headers")
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        return None
    body = _own_body(document.get("body"), data)
    return None if body is None else (body, headers)


def _own_body(encoding: object, data: str | None) -> bytes | None:
    if data is None:
        return None
    if encoding == JSON:
        return data.encode()
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(document, dict) or len(document) != 1:
        return None
    value = document.get(encoding) if encoding in (TEXT, BASE64) else None
    if not isinstance(value, str):
        return None
    if encoding == TEXT:
        return value.encode()
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        return None
