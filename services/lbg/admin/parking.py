"""The operator's side of parked keys: list them (`lbg parked`) and unpark one (`lbg unpark`).

Unparking only asks: it marks the key's record `replay` (model/parking.py); the member serving
the key's queue replays the lot in order, in the key's lane, and deletes the record when done.
With skip-first the first parked event (the poison) is dropped instead of replayed, and recorded
on the group's dead-letter destination as skipped, with who and when.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from urllib.parse import quote

from lbg.broker.base import Broker
from lbg.model.destinations import OutputKind, output_destination
from lbg.model.messages import KEY_HEADER, REASON_HEADER, MalformedMessage
from lbg.model.parking import (
    PARKED,
    REPLAY,
    SKIPPED_HEADER,
    ParkedKey,
    original_headers,
    replay_requested,
)

POLL_SECONDS = 0.2


class UnparkRefused(Exception):
    """The key cannot be unparked as asked; the message says why."""


@dataclass(frozen=True, slots=True)
class ParkedSummary:
    """One parked (or suspect) key as `lbg parked` shows it."""

    key: str
    state: str
    events: int
    reason: str
    since: float
    age: float
    by: str
    stalls: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def to_text(self) -> str:
        return (
            f"{self.key}\t{self.state}\t{self.events} events\t{self.age:.0f}s\t"
            f"{self.by}\t{self.reason}"
        )


async def read_records(broker: Broker, group: str) -> dict[str, ParkedKey]:
    """The group's registry; a record that cannot be read is left out."""
    records = {}
    for key, data in (await broker.parking(group).records()).items():
        try:
            records[key] = ParkedKey.from_json(data)
        except MalformedMessage:
            continue
    return records


async def list_parked(broker: Broker, group: str) -> list[ParkedSummary]:
    """Every key in the registry with its count of parked events, first reason and age."""
    lot = broker.parking(group)
    now = time.time()
    found = []
    for key, record in sorted((await read_records(broker, group)).items()):
        events = len(await lot.events(key))
        found.append(
            ParkedSummary(
                key,
                record.state,
                events,
                record.reason,
                record.since,
                now - record.since,
                record.by,
                record.stalls,
            )
        )
    return found


async def unpark(broker: Broker, group: str, key: str, skip_first: bool, who: str) -> ParkedKey:
    """Ask for the key's replay (after skipping its first parked event if `skip_first`)."""
    lot = broker.parking(group)
    record = (await read_records(broker, group)).get(key)
    if record is None or record.state not in (PARKED, REPLAY):
        raise UnparkRefused(f"key {key!r} is not parked in group '{group}'")
    if record.state == REPLAY:
        raise UnparkRefused(f"key {key!r}: its replay was asked for already and is under way")
    skip_through = 0
    if skip_first:
        events = await lot.events(key)
        if not events:
            raise UnparkRefused(f"key {key!r}: its parking lot is empty, nothing to skip")
        first = events[0]
        headers = {
            **original_headers(first.headers),
            KEY_HEADER: quote(key, safe=""),
            REASON_HEADER: f"skipped by {who} on unpark",
            SKIPPED_HEADER: who,
            "Lbg-Skipped-At": f"{time.time():.3f}",
        }
        await broker.publish(output_destination(group, OutputKind.DEAD), first.body, headers)
        skip_through = first.position
    requested = replay_requested(record, who, skip_through)
    await lot.put(key, requested.to_json())
    return requested


async def wait_unparked(broker: Broker, group: str, key: str, timeout: float) -> ParkedKey | None:
    """Wait until the key's record is gone (replayed) or parked again; its record then (None:
    unparked), or the record still asking for the replay after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        record = (await read_records(broker, group)).get(key)
        if record is None or record.state != REPLAY or time.monotonic() >= deadline:
            return record
        await asyncio.sleep(POLL_SECONDS)
