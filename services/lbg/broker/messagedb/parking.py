"""A group's parking lot on Message DB, append-only like everything there:
- the registry: category `lbgparked:<g>`, one stream per parked key (`-<key as base64url>`);
  its last message is the record (`Parked`), or `Unparked` once the key was unparked;
- the lot: category `lbgpark:<g>`, one stream per parked key: `Event` messages (the parked
  event's body and headers as the event rows keep them; the global position is its position)
  and `Trimmed` ones (events up to `through` replayed or skipped).
Writes are transactions, so a read sees every write confirmed before it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

import orjson

from lbg.broker.base import BrokerError, ParkedEvent, ParkingLot
from lbg.broker.messagedb import rows
from lbg.model.messages import MalformedMessage
from lbg.model.parking import key_of, token

if TYPE_CHECKING:
    import asyncpg

REGISTRY_PREFIX = "lbgparked:"
LOT_PREFIX = "lbgpark:"
WRITE_SQL = "SELECT message_store.write_message($1, $2, $3, $4::jsonb, $5::jsonb)"


def registry_category(group: str) -> str:
    return f"{REGISTRY_PREFIX}{group.replace('-', '~')}"


def lot_category(group: str) -> str:
    return f"{LOT_PREFIX}{group.replace('-', '~')}"


class MessageDbParkingLot(ParkingLot):
    """One group's registry and lot, through the broker's connection pool."""

    def __init__(self, pool: asyncpg.Pool, group: str, errors: tuple[type[Exception], ...]) -> None:
        self._pool = pool
        self._group = group
        self._errors = errors

    def _lot(self, key: str) -> str:
        return f"{lot_category(self._group)}-{token(key)}"

    async def _write(self, stream: str, kind: str, data: str, metadata: str | None) -> None:
        try:
            await self._pool.execute(WRITE_SQL, str(uuid.uuid4()), stream, kind, data, metadata)
        except self._errors as exc:
            raise BrokerError(f"group '{self._group}': parking not written: {exc}") from None

    async def _fetch(self, sql: str, *args: object) -> list:
        try:
            return await self._pool.fetch(sql, *args)
        except self._errors as exc:
            raise BrokerError(f"group '{self._group}': parked keys not read: {exc}") from None

    async def records(self, current: bool = True) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        sql = "SELECT stream_name, type, data FROM message_store.get_category_messages($1, 1, -1)"
        for row in await self._fetch(sql, registry_category(self._group)):
            try:
                key = key_of(row["stream_name"].partition("-")[2])
            except MalformedMessage:
                continue
            if row["type"] == "Parked":
                found[key] = orjson.loads(row["data"])["record"].encode()
            else:
                found.pop(key, None)
        return found

    async def put(self, key: str, record: bytes) -> None:
        stream = f"{registry_category(self._group)}-{token(key)}"
        data = orjson.dumps({"record": record.decode()}).decode()
        await self._write(stream, "Parked", data, None)

    async def delete(self, key: str) -> None:
        stream = f"{registry_category(self._group)}-{token(key)}"
        await self._write(stream, "Unparked", "{}", None)

    async def append(self, key: str, body: bytes, headers: Mapping[str, str]) -> None:
        data, metadata = rows.encode(body, headers, as_json=False)
        await self._write(self._lot(key), "Event", data, metadata)

    async def events(self, key: str) -> list[ParkedEvent]:
        sql = f"SELECT {rows.COLUMNS} FROM message_store.get_stream_messages($1, 0, -1)"
        found: list[ParkedEvent] = []
        for row in await self._fetch(sql, self._lot(key)):
            if row["type"] == "Trimmed":
                through = int(orjson.loads(row["data"])["through"])
                found = [e for e in found if e.position > through]
            elif row["type"] == "Event":
                body, headers = rows.read_row(row)
                found.append(ParkedEvent(body, headers, int(row["global_position"])))
        return found

    async def trim(self, key: str, through: int) -> None:
        data = orjson.dumps({"through": through}).decode()
        await self._write(self._lot(key), "Trimmed", data, None)
