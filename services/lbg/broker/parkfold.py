"""A parking lot kept as one append-only sequence of messages (RabbitMQ's stream, Solace's
queue), folded in order into the registry and every key's lot:
- a registry record of a key (`Lbg-Park-Op: record`; an empty body deletes it: last value wins),
- a parked event (`event`; its place in the sequence is its position in the lot),
- a trim of a key's events up to a position (`trim`).
Each carries its key (base64url) in `Lbg-Park-Key`; a message of neither kind is skipped.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field

from lbg.broker.base import ParkedEvent, ParkingLot
from lbg.model.messages import MalformedMessage
from lbg.model.parking import key_of, token

OP_HEADER = "Lbg-Park-Op"
KEY_HEADER = "Lbg-Park-Key"
THROUGH_HEADER = "Lbg-Park-Through"
SYNC_HEADER = "Lbg-Park-Sync"
RECORD, EVENT, TRIM = "record", "event", "trim"


def park_headers(op: str, key: str, headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of one message of the sequence: the event's own (if any), op and key."""
    return {**headers, OP_HEADER: op, KEY_HEADER: token(key)}


@dataclass
class ParkFold:
    """The sequence read so far: the registry and every key's lot."""

    records: dict[str, bytes] = field(default_factory=dict)
    lots: dict[str, list[ParkedEvent]] = field(default_factory=dict)

    def apply(self, headers: Mapping[str, str], body: bytes, position: int) -> None:
        """Fold one message in, at its position in the sequence (increasing)."""
        op = headers.get(OP_HEADER)
        try:
            key = key_of(headers.get(KEY_HEADER, ""))
        except MalformedMessage:
            return
        if op == RECORD:
            if body:
                self.records[key] = body
            else:
                self.records.pop(key, None)
        elif op == EVENT:
            own = {n: v for n, v in headers.items() if not n.startswith(("Lbg-Park-", "x-"))}
            self.lots.setdefault(key, []).append(ParkedEvent(body, own, position))
        elif op == TRIM:
            through = int(headers.get(THROUGH_HEADER, "0"))
            kept = [e for e in self.lots.get(key, []) if e.position > through]
            if kept:
                self.lots[key] = kept
            else:
                self.lots.pop(key, None)


class FoldedParkingLot(ParkingLot):
    """A lot kept as such a sequence: every move is one message sent, every read a fold."""

    @abc.abstractmethod
    async def _send(self, op: str, key: str, body: bytes, headers: Mapping[str, str]) -> None:
        """Append one message of `op` for `key`, confirmed before it returns."""

    @abc.abstractmethod
    async def _fold(self, current: bool) -> ParkFold:
        """The sequence folded: with `current`, past every message confirmed before the call."""

    async def records(self, current: bool = True) -> dict[str, bytes]:
        return dict((await self._fold(current)).records)

    async def put(self, key: str, record: bytes) -> None:
        await self._send(RECORD, key, record, {})

    async def delete(self, key: str) -> None:
        await self._send(RECORD, key, b"", {})

    async def append(self, key: str, body: bytes, headers: Mapping[str, str]) -> None:
        await self._send(EVENT, key, body, headers)

    async def events(self, key: str) -> list[ParkedEvent]:
        return list((await self._fold(True)).lots.get(key, []))

    async def trim(self, key: str, through: int) -> None:
        await self._send(TRIM, key, b"", {THROUGH_HEADER: str(through)})
