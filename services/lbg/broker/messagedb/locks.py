"""One client's member locks, all on one PostgreSQL connection: a constant connection count.

A session advisory lock belongs to the connection that took it, and the server frees it the
moment that connection dies. A client takes every member lock it holds on one connection of
its own, so it holds a few connections whatever its queue count; when that connection dies
(a crash, a database restart, an eviction terminating its backend) every member it held is
lost at once, and each binding is told so as soon as the client sees the connection close.

What must not outlive a lock (the position writes, the `Claimed` fencing token) runs on that
same connection through `run`, which refuses a hold taken on an earlier connection: a write
either happens while the lock is held or fails. Session locks are reentrant, so two bindings
of one client must never both take a member's lock (a queue draining an old generation's
member while its successor queue waits for it): a key held here is refused to the others.

A standby need not keep trying a lock somebody holds: releasing one sends a NOTIFY on its
group's channel (its lock class), which every client waiting for a lock of that group hears on
its lock connection and wakes the waiter of that member. A session that ends frees its locks
without any NOTIFY (a crash): the client's look at the group's holders (shared.py), or the
waiter's own slower retry, covers that.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import asyncpg

T = TypeVar("T")
Keys = tuple[int, int]
Connect = Callable[[], Awaitable[asyncpg.Connection]]
Lost = Callable[[str], None]

LOST = "connection to the database lost (the member lock with it)"
UNLOCK_SQL = "SELECT pg_advisory_unlock($1, $2), pg_notify($3, $4)"
FREED_PREFIX = "lbgfreed_"


def freed_channel(lock_class: int) -> str:
    """The NOTIFY channel that says a member lock of this class (one group's) was freed."""
    return f"{FREED_PREFIX}{lock_class}"


class LockLost(ConnectionError):
    """The hold's connection is gone, and its lock with it."""


@dataclass(frozen=True, eq=False)
class Hold:
    """A member lock taken on the lock connection of one session (connection) number; each
    taking is a hold of its own (compared by identity)."""

    keys: Keys
    session: int


class MemberLocks:
    """The member locks of one client, on its one lock connection (opened when first used)."""

    def __init__(self, connect: Connect) -> None:
        self._connect = connect
        self._conn: asyncpg.Connection | None = None
        self._session = 0
        self._mutex = asyncio.Lock()
        self._held: dict[Keys, tuple[Hold, Lost]] = {}
        self._waiters: dict[Keys, set[asyncio.Event]] = {}
        self._listening: set[int] = set()

    @property
    def pid(self) -> int | None:
        """The lock connection's backend pid (what `evict` terminates), if it is open."""
        conn = self._conn
        return None if conn is None or conn.is_closed() else conn.get_server_pid()

    def holds(self, hold: Hold) -> bool:
        """Whether the lock of `hold` is still held (not released, its connection open)."""
        conn = self._conn
        held = self._held.get(hold.keys)
        return (
            held is not None
            and held[0] is hold
            and hold.session == self._session
            and conn is not None
            and not conn.is_closed()
        )

    async def _connection(self) -> asyncpg.Connection:
        """The lock connection (called holding the mutex): a new one is a new session."""
        if self._conn is None or self._conn.is_closed():
            self._lost()
            self._conn = await self._connect()
            self._listening = set()
            self._session += 1
            session = self._session
            self._conn.add_termination_listener(lambda _conn: self._closed(session))
        return self._conn

    def _closed(self, session: int) -> None:
        if session == self._session:
            self._lost()

    def _lost(self) -> None:
        """Every lock went with the connection: tell each holder at once, and wake each
        waiter (its LISTEN went too, and the server may have freed the lock it waits for)."""
        held, self._held = self._held, {}
        for _, lost in held.values():
            lost(LOST)
        waiters, self._waiters = self._waiters, {}
        for wakes in waiters.values():
            for wake in wakes:
                wake.set()

    def _freed(self, _conn: object, _pid: int, channel: str, payload: str) -> None:
        """A member lock of a group listened to was released: wake whoever waits for it."""
        keys = (int(channel.removeprefix(FREED_PREFIX)), int(payload))
        for wake in self._waiters.pop(keys, ()):
            wake.set()

    async def _listen(self, conn: asyncpg.Connection, lock_class: int) -> None:
        """Hear the releases of a group's locks on this connection (once per session)."""
        if lock_class not in self._listening:
            await conn.add_listener(freed_channel(lock_class), self._freed)
            self._listening.add(lock_class)

    async def try_lock(
        self, keys: Keys, lost: Lost, wake: asyncio.Event | None = None
    ) -> Hold | None:
        """Take the member lock if nobody holds it; `lost` is called if it goes with the
        connection (not when released). If it is held, `wake` is set once it is released
        (listening starts before the try, so no release after it goes unheard)."""
        async with self._mutex:
            conn = await self._connection()
            if wake is not None:
                await self._listen(conn, keys[0])
                self._waiters.setdefault(keys, set()).add(wake)
            if keys in self._held or not await conn.fetchval(
                "SELECT pg_try_advisory_lock($1, $2)", *keys
            ):
                return None
            if wake is not None:
                self._waiters.get(keys, set()).discard(wake)
            hold = Hold(keys, self._session)
            self._held[keys] = (hold, lost)
            return hold

    async def run(self, hold: Hold, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """`work` on the lock connection, only while `hold`'s lock is held (else LockLost)."""
        async with self._mutex:
            return await work(self._holding(hold))

    async def release(
        self, hold: Hold, last: Callable[[asyncpg.Connection], Awaitable[object]] | None = None
    ) -> None:
        """Run `last` while still holding the lock (best effort), then free it; nothing if
        the lock is gone already."""
        async with self._mutex:
            if not self.holds(hold):
                return
            conn = self._holding(hold)
            del self._held[hold.keys]
            if last is not None:
                with contextlib.suppress(asyncpg.PostgresError):
                    await last(conn)
            await conn.execute(
                UNLOCK_SQL, *hold.keys, freed_channel(hold.keys[0]), str(hold.keys[1])
            )

    def _holding(self, hold: Hold) -> asyncpg.Connection:
        if not self.holds(hold):
            raise LockLost(f"the member lock {hold.keys} is no longer held")
        assert self._conn is not None
        return self._conn

    async def close(self) -> None:
        """Close the lock connection: the server frees every lock on it."""
        async with self._mutex:
            conn, self._conn = self._conn, None
            self._held.clear()
            self._waiters.clear()
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close(timeout=2)
