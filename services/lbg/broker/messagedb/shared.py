"""What one client's bindings of a group share, so that an idle client's cost does not grow
with its queue count: its lock connection (locks.py), its reader pool, and the reads every
binding would otherwise repeat each poll (the group's generations, who holds which member
lock, how far the category goes), each done once for all of them. A holder with nothing new
to read sleeps until one watcher of the category's head sees a position it waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import asyncpg

from lbg.aio import cancel_and_wait
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
        self,
        locks: MemberLocks,
        db: asyncpg.Pool,
        group: str,
        category: str,
        lock_class: int,
        poll_seconds: float,
    ) -> None:
        self.locks = locks
        self.db = db
        self.generations: Fresh[list[Generation]] = Fresh(lambda: generations.load(db, group))
        self.holders: Fresh[dict[int, int]] = Fresh(lambda: _holders(db, lock_class))
        self.head: Fresh[int] = Fresh(lambda: _head(db, category))
        self._poll = poll_seconds
        self._waiting: dict[asyncio.Event, int] = {}
        self._watcher: asyncio.Task[None] | None = None

    def wake_past(self, position: int, wake: asyncio.Event) -> None:
        """Set `wake` once the category's head reaches `position` (or its read fails)."""
        self._waiting[wake] = position
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(), name="messagedb-head-watcher")

    def forget(self, wake: asyncio.Event) -> None:
        self._waiting.pop(wake, None)

    async def _watch(self) -> None:
        """Read the head every poll while anyone waits (a read started after they asked)."""
        try:
            while self._waiting:
                await asyncio.sleep(self._poll)
                try:
                    head = await self.head.get(time.monotonic())
                except Exception:
                    head = None  # each waiter meets the failure in its own read
                for wake, position in list(self._waiting.items()):
                    if head is None or head >= position:
                        del self._waiting[wake]
                        wake.set()
        finally:
            self._watcher = None

    async def close(self) -> None:
        self._waiting.clear()
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await cancel_and_wait(self._watcher)


async def _holders(db: asyncpg.Pool, lock_class: int) -> dict[int, int]:
    """The backend pid holding each member lock of the group, by its second key."""
    return {row["member_key"]: row["pid"] for row in await db.fetch(HOLDERS_SQL, lock_class)}


async def _head(db: asyncpg.Pool, category: str) -> int:
    """The category's highest global position (0 if it is empty)."""
    return int(await db.fetchval(HEAD_SQL, category))
