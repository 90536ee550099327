"""What the raw pipeline's roles exchange: the events, the records, and the reader's count.

The events are those of the other modes: an empty body, the key in the topic, the key's
sequence and the publish time in the `Lbg-Seq` / `Lbg-Time` headers. A record is a small
JSON object (key, sequence, client), one per processed event.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

SEQ_HEADER = "Lbg-Seq"
TIME_HEADER = "Lbg-Time"


def generated_keys(count: int) -> list[str]:
    """Fresh keys shaped like the hashed publisher's: `<uuid>/<uuid>`."""
    return [f"{uuid.uuid4()}/{uuid.uuid4()}" for _ in range(count)]


def events(keys: list[str], count: int) -> Iterator[tuple[str, dict[str, str]]]:
    """`count` events round-robin over the keys, as (key, headers); stamped when drawn."""
    sequence = dict.fromkeys(keys, 0)
    for index in range(count):
        key = keys[index % len(keys)]
        sequence[key] += 1
        yield key, {SEQ_HEADER: str(sequence[key]), TIME_HEADER: f"{time.time():.6f}"}


def record(key: str, headers: Mapping[str, Any] | None, client: str) -> bytes:
    """The record a consumer republishes for one event (header values may be str or bytes)."""
    return orjson.dumps({"k": key, "s": int((headers or {})[SEQ_HEADER]), "c": client})


class Tally:
    """The reader's count of records: distinct events, duplicates, per-key reorders and key
    moves between clients, records per client, and the span of the records' times."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, int]] = set()
        self.last: dict[str, tuple[int, str]] = {}
        self.per_client: Counter[str] = Counter()
        self.duplicates = 0
        self.reordered = 0
        self.moves = 0
        self.first_at: float | None = None
        self.last_at: float | None = None

    @property
    def unique(self) -> int:
        return len(self.seen)

    def add(self, body: bytes, at: float) -> None:
        """Count one record stored or sent at `at` (epoch seconds)."""
        document = orjson.loads(body)
        key, seq, client = document["k"], document["s"], document["c"]
        self.per_client[client] += 1
        if (key, seq) in self.seen:
            self.duplicates += 1
        self.seen.add((key, seq))
        previous = self.last.get(key)
        if previous is not None:
            self.reordered += seq < previous[0]
            self.moves += client != previous[1]
        self.last[key] = (seq, client)
        self.first_at = at if self.first_at is None else min(self.first_at, at)
        self.last_at = at if self.last_at is None else max(self.last_at, at)

    def progress_line(self) -> str:
        return (
            f"{self.unique} events seen, {self.duplicates} duplicates, {self.reordered} reordered"
        )
