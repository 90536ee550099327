"""The in-process broker's parking lots: one per group, kept in its store (so they outlive
every member's connection, as a broker's would)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lbg.broker.base import ParkedEvent, ParkingLot

if TYPE_CHECKING:
    from lbg.broker.memory.store import Connection


@dataclass
class ParkedState:
    """One group's registry records and parked events."""

    records: dict[str, bytes] = field(default_factory=dict)
    lots: dict[str, list[ParkedEvent]] = field(default_factory=dict)
    position: int = 0


class MemoryParkingLot(ParkingLot):
    """A group's parking lot, as one connection reaches it."""

    def __init__(self, connection: Connection, state: ParkedState) -> None:
        self._connection = connection
        self._state = state

    async def records(self, current: bool = True) -> dict[str, bytes]:
        self._connection.check()
        return dict(self._state.records)

    async def put(self, key: str, record: bytes) -> None:
        self._connection.check()
        self._state.records[key] = record

    async def delete(self, key: str) -> None:
        self._connection.check()
        self._state.records.pop(key, None)

    async def append(self, key: str, body: bytes, headers: Mapping[str, str]) -> None:
        self._connection.check()
        self._state.position += 1
        event = ParkedEvent(body, dict(headers), self._state.position)
        self._state.lots.setdefault(key, []).append(event)

    async def events(self, key: str) -> list[ParkedEvent]:
        self._connection.check()
        return list(self._state.lots.get(key, []))

    async def trim(self, key: str, through: int) -> None:
        self._connection.check()
        kept = [e for e in self._state.lots.get(key, []) if e.position > through]
        if kept:
            self._state.lots[key] = kept
        else:
            self._state.lots.pop(key, None)
