"""What one client's bindings of a group share, so that an idle client's cost does not grow
with its queue count: its lock connection (locks.py), its reader pool, and the reads every
binding would otherwise repeat each poll (the group's generations, who holds which member
lock, how far the category goes), each done once for all of them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import asyncpg

from lbg.broker.messagedb import generations
from lbg.broker.messagedb.locks import MemberLocks
from lbg.model.generations import Generation

T = TypeVar("T")

HOLDERS_SQL = """
SELECT l.objid::bigint AS member_key, l.pid FROM pg_locks l
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.classid = $1::bigint::oid
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
# Message DB's index messages_category (category, global_position) answers this at once.
HEAD_SQL = (
    "SELECT COALESCE(max(global_position), 0) FROM message_store.messages"
    " WHERE message_store.category(stream_name) = $1"
)


class Fresh(Generic[T]):
    """A value read from the database on behalf of many callers: one read at a time, and
    each caller gets a read that started no earlier than the `since` it asks for (a
    monotonic time), so a caller that must see what was committed before it asked passes now."""

    def __init__(self, read: Callable[[], Awaitable[T]]) -> None:
        self._read = read
        self._value: tuple[float, T] | None = None
        self._task: asyncio.Task[None] | None = None

    async def get(self, since: float) -> T:
        while self._value is None or self._value[0] < since:
            if self._task is None:
                self._task = asyncio.create_task(self._fetch())
                self._task.add_done_callback(lambda t: t.cancelled() or t.exception())
            await asyncio.shield(self._task)
        return self._value[1]

    async def _fetch(self) -> None:
        started = time.monotonic()
        try:
            value = await self._read()
        finally:
            self._task = None
        if self._value is None or self._value[0] < started:
            self._value = (started, value)


class Shared:
    """One client's share of a group: its locks, its readers, and the shared reads."""

    def __init__(
        self, locks: MemberLocks, db: asyncpg.Pool, group: str, category: str, lock_class: int
    ) -> None:
        self.locks = locks
        self.db = db
        self.generations: Fresh[list[Generation]] = Fresh(lambda: generations.load(db, group))
        self.holders: Fresh[dict[int, int]] = Fresh(lambda: _holders(db, lock_class))
        self.head: Fresh[int] = Fresh(lambda: _head(db, category))


async def _holders(db: asyncpg.Pool, lock_class: int) -> dict[int, int]:
    """The backend pid holding each member lock of the group, by its second key."""
    return {row["member_key"]: row["pid"] for row in await db.fetch(HOLDERS_SQL, lock_class)}


async def _head(db: asyncpg.Pool, category: str) -> int:
    """The category's highest global position (0 if it is empty)."""
    return int(await db.fetchval(HEAD_SQL, category))
