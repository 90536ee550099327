"""What one client's bindings of a group share, so that an idle client's cost does not grow
with its queue count: its lock connection (locks.py), its reader pool, and the reads every
binding would otherwise repeat each poll (the group's generations, who holds which member
lock, how far the category goes: on a connection of its own, HeadReader), each done once
for all of them. A holder with nothing new to read sleeps until one watcher of the
category's head sees a position it waits for, or one watcher of the group's generations a
resize; a preferred standby sleeps until its holder's release wakes it (locks.py) or one
watcher of the group's holders sees its member free. While a coordinator beats, its heartbeat's
statement reads the head too (`notify`), and the head's watcher reads nothing itself: an
idle client then sends one statement a beat, not two.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Generic, TypeVar

import asyncpg

from lbg.aio import cancel_and_wait, sleep_to_multiple
from lbg.broker.messagedb import generations
from lbg.broker.messagedb.locks import MemberLocks
from lbg.model.generations import Generation

T = TypeVar("T")
log = logging.getLogger(__name__)

# How old the generations a binding reads may be: a resize is seen this late at most.
REFRESH_SECONDS = 1.0
# How often a client looks, for all its coordinated standbys not preferred together, whether
# their members are held: their coordinators make another member preferred when one goes (as
# on RabbitMQ), so this is only the last resort. Each standby looking for itself every 30 s
# was 7.5 reads of pg_locks a second per client at QC 256 x 8.
COORDINATED_LOOK_SECONDS = 30.0
# A watch fed by reads made elsewhere (Watch.fed) waits this many periods for the next one,
# then reads itself: the feed stopped (no heartbeat went out, or the feeding statement failed).
FED_WITHIN_PERIODS = 1.5

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
NOTIFY_SQL = "SELECT pg_notify($1, $2)"
NOTIFY_AND_HEAD_SQL = f"SELECT ({HEAD_SQL.replace('$1', '$3')}), pg_notify($1, $2)"


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

    def offer(self, started: float, value: T) -> None:
        """A read made elsewhere that started at `started`: kept if it is the newest."""
        if self._value is None or self._value[0] < started:
            self._value = (started, value)

    async def _fetch(self) -> None:
        started = time.monotonic()
        try:
            value = await self._read()
        finally:
            self._task = None
        self.offer(started, value)


class Watch(Generic[T]):
    """Wakes each waiter once a shared read shows what it waits for (or fails: each waiter
    then meets the failure in its own read): one read on each multiple of the period (the
    wall clock's, with the process's other periodic work) while anyone waits, however many.
    A read equal to the last one, with nobody new waiting, wakes nobody and is not put to
    each waiter: the idle case, where asking every holder's condition ten times a second
    was a third of a client's CPU at QC 1024. Reads made elsewhere a period apart (`fed`)
    stand in for the watch's own while they come: each is judged where it is made, and the
    watch's loop sleeps until they stop (a timer each feed moves), so a fed watch costs no
    wake-up of its own."""

    def __init__(self, fresh: Fresh[T], period: float, name: str) -> None:
        self._fresh = fresh
        self._period = period
        self._name = name
        self._waiting: dict[asyncio.Event, Callable[[T], bool]] = {}
        self._task: asyncio.Task[None] | None = None
        self._judged: tuple[T] | None = None  # the read every waiter left was found not ready for
        self._fed_until = -float("inf")  # feeds stand in for the watch's own reads until then
        self._unfed = asyncio.Event()  # set once they stopped (by `_stale_timer`)
        self._stale_timer: asyncio.TimerHandle | None = None

    @property
    def wanted(self) -> bool:
        """Whether anyone waits: a read fed now would be judged."""
        return bool(self._waiting)

    def fed(self, started: float, value: T) -> None:
        """A read made elsewhere, started at `started` (monotonic): judged now, as the
        watch's own would be; the watch reads for itself again FED_WITHIN_PERIODS after the
        newest feed."""
        self._fresh.offer(started, value)
        self._fed_until = max(self._fed_until, started + FED_WITHIN_PERIODS * self._period)
        if self._stale_timer is not None:
            self._stale_timer.cancel()
        self._stale_timer = asyncio.get_running_loop().call_later(
            self._fed_until - time.monotonic(), self._unfed.set
        )
        self._judge(value)

    def wake_when(self, ready: Callable[[T], bool], wake: asyncio.Event) -> None:
        self._waiting[wake] = ready
        self._judged = None
        if self._task is None:
            self._task = asyncio.create_task(self._watch(), name=self._name)

    def forget(self, wake: asyncio.Event) -> None:
        self._waiting.pop(wake, None)

    async def _watch(self) -> None:
        try:
            while self._waiting:
                if self._fed_until > time.monotonic():
                    self._unfed.clear()
                    await self._unfed.wait()
                    continue
                await sleep_to_multiple(self._period)
                if self._fed_until > time.monotonic():
                    continue  # fed meanwhile
                try:
                    value: T | None = await self._fresh.get(time.monotonic())
                except Exception:
                    value = None
                self._judge(value)
        finally:
            self._task = None

    def _judge(self, value: T | None) -> None:
        """Wake the waiters `value` is ready for (all of them if None: the read failed)."""
        if value is not None and self._judged is not None and self._judged[0] == value:
            return
        for wake, ready in list(self._waiting.items()):
            if value is None or ready(value):
                del self._waiting[wake]
                wake.set()
        self._judged = None if value is None else (value,)

    async def close(self) -> None:
        self._waiting.clear()
        if self._stale_timer is not None:
            self._stale_timer.cancel()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await cancel_and_wait(self._task)


class HeadReader:
    """Reads how far the category goes on a connection of its own, the read an idle client
    repeats most (every poll): through the pool it cost 47 us of client CPU, here 13."""

    def __init__(self, connect: Callable[[], Awaitable[asyncpg.Connection]], category: str):
        self._connect = connect
        self.category = category
        self._conn: asyncpg.Connection | None = None

    async def read(self) -> int:
        """The category's highest global position (0 if it is empty); one read at a time
        (Fresh makes sure), on a new connection once the last one closed."""
        if self._conn is None or self._conn.is_closed():
            self._conn = await self._connect()
        return int(await self._conn.fetchval(HEAD_SQL, self.category))

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)


class Shared:
    """One client's share of a group: its locks, its readers, and the shared reads."""

    def __init__(
        self,
        locks: MemberLocks,
        db: asyncpg.Pool,
        head: HeadReader,
        group: str,
        lock_class: int,
        poll_seconds: float,
    ) -> None:
        self.locks = locks
        self.db = db
        self.generations: Fresh[list[Generation]] = Fresh(lambda: generations.load(db, group))
        self.holders: Fresh[dict[int, int]] = Fresh(lambda: _holders(db, lock_class))
        self._head_reader = head
        self.head: Fresh[int] = Fresh(head.read)
        self._head_watch = Watch(self.head, poll_seconds, "messagedb-head-watcher")
        self._free_watch = Watch(self.holders, poll_seconds, "messagedb-free-watcher")
        self._look_watch = Watch(
            self.holders, COORDINATED_LOOK_SECONDS, "messagedb-coordinated-look"
        )
        self._resize_watch = Watch(self.generations, REFRESH_SECONDS, "messagedb-resize-watcher")

    @property
    def head_wanted(self) -> bool:
        """Whether a holder waits for the category's head to move (`notify` reads it then)."""
        return self._head_watch.wanted

    @property
    def category(self) -> str:
        return self._head_reader.category

    def fed_head(self, started: float, head: int) -> None:
        """The category's head as read elsewhere by a statement started at `started`."""
        self._head_watch.fed(started, head)

    def wake_past(self, position: int, wake: asyncio.Event) -> None:
        """Set `wake` once the category's head reaches `position` (or its read fails)."""
        self._head_watch.wake_when(lambda head: head >= position, wake)

    def wake_when_free(self, member_key: int, wake: asyncio.Event) -> None:
        """Set `wake` once nobody holds the member lock of that second key (or the read
        fails): what a lock freed without a release (its holder's session ended) needs."""
        self._free_watch.wake_when(lambda holders: member_key not in holders, wake)

    def wake_when_free_later(self, member_key: int, wake: asyncio.Event) -> None:
        """As `wake_when_free`, from a look every COORDINATED_LOOK_SECONDS: what a coordinated
        standby not preferred waits for."""
        self._look_watch.wake_when(lambda holders: member_key not in holders, wake)

    def wake_on_resize(self, known: list[Generation], wake: asyncio.Event) -> None:
        """Set `wake` once the group's generations differ from `known` (or the read fails):
        a settled holder need not look at them itself."""
        self._resize_watch.wake_when(lambda now: now != known, wake)

    def forget(self, wake: asyncio.Event) -> None:
        for watch in self._watches:
            watch.forget(wake)

    @property
    def _watches(self) -> tuple[Watch, ...]:
        return (self._head_watch, self._free_watch, self._look_watch, self._resize_watch)

    async def close(self) -> None:
        for watch in self._watches:
            await watch.close()
        await self._head_reader.close()


async def notify(
    conn: asyncpg.Connection, channel: str, payload: str, shares: Iterable[Shared]
) -> bool:
    """Send a control message; in the same statement, read the category's head for each of
    `shares` whose holders wait for it (their watch is fed: `Watch.fed`). False if that read
    failed, and the message went out alone: read no heads with it any more (the watches then
    read for themselves)."""
    watched = [shared for shared in shares if shared.head_wanted]
    if not watched:
        await conn.execute(NOTIFY_SQL, channel, payload)
        return True
    started = time.monotonic()
    try:
        head = await conn.fetchval(NOTIFY_AND_HEAD_SQL, channel, payload, watched[0].category)
    except asyncpg.PostgresError as exc:
        if isinstance(exc, asyncpg.PostgresConnectionError | asyncpg.OperatorInterventionError):
            raise
        log.warning("heartbeats no longer read the category's head (%s)", exc)
        await conn.execute(NOTIFY_SQL, channel, payload)
        return False
    for shared in watched:
        shared.fed_head(started, int(head))
    return True


async def _holders(db: asyncpg.Pool, lock_class: int) -> dict[int, int]:
    """The backend pid holding each member lock of the group, by its second key."""
    return {row["member_key"]: row["pid"] for row in await db.fetch(HOLDERS_SQL, lock_class)}
