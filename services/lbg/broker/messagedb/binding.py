"""A consumer-group member on Message DB, made exclusive by a PostgreSQL session advisory lock.

Message DB lets any number of readers read a member; here only the holder of the member's
advisory lock does. The lock lives on the client's lock connection (locks.py), so the server
frees it the moment that connection dies (a crashed client), and the position writes go
through the same connection: a reader that lost the lock cannot record a position any more.
Reads go through the client's shared reader pool (shared.py), and their rows are handed out
only while the lock is still held; what every binding of the client would ask each poll (the
generations, who holds a member, whether the category has anything new) is asked once for all.

The holder reads `get_category_messages(category, position + 1, ..., member, size)` (the
group's own category, or the existing one it was created over) in global position order, hands
the messages out tagged with its ownership epoch, and records the highest position below which
everything was acked in the member's position stream (batched: a reader that crashes replays
what it had not recorded yet, duplicates the validator counts). On taking the lock it writes a
`Claimed` message there (carrying the recorded position, so the stream still reads as
positions): its global position is the fencing token of the new ownership, higher than every
earlier owner's of this queue, across generations too.

Across resizes (generations.py) queue q walks its stints: member q of each generation that
has one, plus, in the current size S, the members r >= S of older generations with r mod S = q
(so a shrunk group drains its old members even when every client runs the new size). A stint
of an older generation ends once drained up to its switch position; a stint of a newer one
starts only when every member of the generation before it is drained.

Steering: a preferred binding tries the lock when it may succeed: when the holder's release
wakes it (locks.py), when the client's one watcher of the group's holders sees the member free
(a crashed holder's session freed it without a release), and every FREED_FALLBACK_SECONDS
anyway; the others try only after seeing it free on two slower checks in a row, so a released
member goes to its primary (a coordinated one checks only once the client's one look for all
of them, every COORDINATED_LOOK_SECONDS, sees it free, or a resize wakes it).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable

import asyncpg
import orjson

from lbg.broker.base import BrokerError, Delivery, StateListener, why
from lbg.broker.bindings import UNTIL_WOKEN, LoopBinding
from lbg.broker.messagedb import generations
from lbg.broker.messagedb.locks import LOST, Hold
from lbg.broker.messagedb.positions import Positions
from lbg.broker.messagedb.rows import COLUMNS, read_row
from lbg.broker.messagedb.shared import REFRESH_SECONDS, Shared
from lbg.model.generations import Generation, members_for

log = logging.getLogger(__name__)

BATCH = 200
MAX_OUTSTANDING = 1000
FLUSH_SECONDS = 0.2
STANDBY_CHECKS = 2
STANDBY_FACTOR = 3
CLOSE_SECONDS = 5.0
# A preferred standby tries its lock this often when nothing wakes it sooner (a missed wake-up).
FREED_FALLBACK_SECONDS = 2.0
# A holder with nothing to read or record looks again this often if nothing wakes it sooner.
SETTLED_FALLBACK_SECONDS = 10.0

DB_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError)

HOLDER_SQL = """
SELECT l.pid FROM pg_locks l
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
  AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


class MessageDbBinding(LoopBinding):
    """One client's reader of one consumer-group member: active (lock holder) or standby."""

    close_grace = CLOSE_SECONDS
    # A standby waits by being preferred, running and not active: it stands in no line at the
    # broker that a lost connection could drop it from.
    steady_waiting = True
    # It stops being active only through `_lose` (its lock connection's end included), which
    # its listener hears; its pin is that connection's pid, the same while it is active.
    steady_active = True

    def __init__(
        self,
        queue: int,
        group: str,
        hash_prefix: str,
        category: str,
        shared: Shared,
        poll_seconds: float,
        paused_for: Callable[[], float],
        stall_limit: float,
        preferred: bool = True,
        on_change: StateListener | None = None,
    ) -> None:
        super().__init__(queue, on_change, preferred)
        self._group = group
        self._hash_prefix = hash_prefix
        self._category = category
        self._shared = shared
        self._locks = shared.locks
        self._db = shared.db
        self._poll = poll_seconds
        self._paused_for = paused_for
        self._stall_limit = stall_limit
        self._generations: list[Generation] = []
        self._refreshed = 0.0
        self._floor = 0
        self._ready: set[int] = set()
        self._stint: tuple[Generation, int] | None = None
        self._hold: Hold | None = None
        self._next = 1
        self._owner_epoch = 0
        self._positions = Positions()
        self._last_flush = 0.0
        self._free_seen = 0
        self._coordinated = False
        self._start(f"messagedb-{group}/q{queue}")

    @property
    def pin(self) -> str | None:
        pid = self._locks.pid
        return str(pid) if self._active and pid is not None else None

    @property
    def waiting(self) -> bool:
        return self._preferred and not self._active and self._running.is_set() and not self._closed

    def set_coordinated(self) -> None:
        self._coordinated = True

    def set_preferred(self, preferred: bool) -> None:
        if preferred != self._preferred:
            self._free_seen = 0
        super().set_preferred(preferred)

    async def pinned_by(self, *, fresh: bool = False) -> str | None:
        try:
            pid = await self._shared_holder()
        except DB_ERRORS as exc:
            raise BrokerError(f"queue {self.queue}: cannot tell who holds it: {exc}") from None
        return None if pid is None else str(pid)

    async def evict(self, pin: str) -> bool:
        """Terminate the holder's backend: the server then frees its locks at once (every
        member that client held: its locks share that connection)."""
        if not pin.isdigit() or int(pin) == self._locks.pid:
            return False
        try:
            async with self._db.acquire() as conn:
                if await self._holder(conn) != int(pin):
                    return False
                terminated = bool(await conn.fetchval("SELECT pg_terminate_backend($1)", int(pin)))
        except DB_ERRORS as exc:
            raise BrokerError(f"queue {self.queue}: cannot evict {pin}: {exc}") from None
        if terminated:
            log.info("queue %d: evicted the reader with backend pid %s", self.queue, pin)
            self._wake.set()
        return terminated

    def _stall(self) -> str | None:
        if self._paused_for() > self._stall_limit:
            return "this process was paused past the stall limit (stalled)"
        return None

    async def ack(self, delivery: Delivery) -> bool:
        if not self.owns(delivery):
            return False
        self._positions.ack(int(delivery.token))  # type: ignore[call-overload]
        if time.monotonic() - self._last_flush >= FLUSH_SECONDS or not self._positions.outstanding:
            self._wake.set()
        return True

    # -- ownership ---------------------------------------------------------------------------

    def _lose(self, reason: str) -> None:
        """Stop owning the member now: nothing delivered so far is processed or acked; the
        loop records what was acked before and frees the lock."""
        self._shared.forget(self._wake)
        self._new_epoch()
        self._positions.forget_unacked()
        self._set_active(False, reason)
        self._wake.set()

    def _lock_lost(self, reason: str) -> None:
        """The lock connection closed under this binding's lock (locks.py)."""
        if self._active:
            self._lose(reason)

    def _keys(self) -> tuple[int, int]:
        """The lock of the current stint, else of this queue's member now."""
        if self._stint is not None:
            generation, member = self._stint
            return generations.lock_keys(self._hash_prefix, member, generation.index)
        index = self._generations[-1].index if self._generations else 0
        return generations.lock_keys(self._hash_prefix, self.queue, index)

    async def _holder(self, conn: asyncpg.Connection) -> int | None:
        return await conn.fetchval(HOLDER_SQL, *self._keys())

    async def _shared_holder(self) -> int | None:
        """Who holds the member's lock, from the client's shared look at most a poll old."""
        holders = await self._shared.holders.get(time.monotonic() - self._poll)
        return holders.get(self._keys()[1])

    async def _give_up(self, reason: str) -> None:
        self._lose(reason)
        await self._unlock()

    async def _unlock(self) -> None:
        """Record the acked position, then free the lock (the next reader starts there)."""
        hold, self._hold = self._hold, None
        if hold is not None:
            with contextlib.suppress(*DB_ERRORS):
                await self._locks.release(hold, self._record)

    async def _record(self, conn: asyncpg.Connection) -> None:
        """Write the position due, on the lock connection (called through the locks)."""
        position = self._positions.due()
        if position is not None and self._stint is not None:
            generation, member = self._stint
            await conn.execute(
                "SELECT message_store.write_message($1, $2, 'Recorded', $3::jsonb)",
                str(uuid.uuid4()),
                generations.position_stream(self._hash_prefix, member, generation.index),
                orjson.dumps({"position": position}).decode(),
            )
            self._positions.wrote(position)
        self._last_flush = time.monotonic()

    async def _claim(self, conn: asyncpg.Connection) -> int:
        """Mark the new ownership in the member's position stream; its global position is
        the ownership epoch (see the module docstring)."""
        assert self._stint is not None
        generation, member = self._stint
        stream = generations.position_stream(self._hash_prefix, member, generation.index)
        await conn.execute(
            "SELECT message_store.write_message($1, $2, 'Claimed', $3::jsonb)",
            str(uuid.uuid4()),
            stream,
            orjson.dumps({"position": self._positions.recorded}).decode(),
        )
        return int(
            await conn.fetchval(
                "SELECT global_position FROM message_store.get_last_stream_message($1)", stream
            )
        )

    # -- the loop ------------------------------------------------------------------------------

    async def _failed(self, exc: Exception) -> float:
        if self._active:
            self._lose(f"connection lost: {why(exc)}")
        else:
            log.warning("queue %d: %s", self.queue, why(exc))
        await self._unlock()
        return self._poll * STANDBY_FACTOR

    async def _step(self) -> float:
        """One round: give up, take the lock, or read; returns how long to wait after it."""
        if not self._running.is_set() or (self._hold is not None and not self._active):
            await self._unlock()
            if not self._running.is_set():
                await self._running.wait()
            return 0.0
        if time.monotonic() - self._refreshed >= REFRESH_SECONDS or not self._generations:
            await self._refresh()
        if self._hold is None:
            return await self._take()
        if time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            await self._locks.run(self._hold, self._record)
        if self._positions.outstanding >= MAX_OUTSTANDING:
            return self._poll
        return await self._read(self._hold)

    async def _refresh(self, now: bool = False) -> None:
        """Reload the group's generations (a resize may have ended the current one): `now`
        for a read that starts after this call, else one at most REFRESH_SECONDS old."""
        asked = time.monotonic()
        since = asked if now else asked - REFRESH_SECONDS
        self._generations = await self._shared.generations.get(since)
        self._refreshed = asked
        if self._stint is not None:
            self._stint = (self._generations[self._stint[0].index], self._stint[1])

    def _members(self, generation: Generation) -> list[int]:
        """The members this queue reads in a generation (model/generations.py)."""
        return members_for(self.queue, generation, self._generations[-1].size)

    async def _next_stint(self) -> tuple[Generation, int] | None:
        """The first stint of this queue not drained yet, from the lowest generation on."""
        for generation in self._generations[self._floor :]:
            pending = [
                member
                for member in self._members(generation)
                if not await generations.drained(
                    self._db, self._hash_prefix, self._category, member, generation
                )
            ]
            if pending:
                return generation, pending[0]
            if generation.end is not None and self._floor == generation.index:
                self._floor += 1
        return None

    async def _safe_to_start(self, generation: Generation) -> bool:
        """Every member of the generation before this one is drained (the safe point)."""
        if generation.index == 0 or generation.index in self._ready:
            return True
        before = self._generations[generation.index - 1]
        for member in range(before.size):
            if not await generations.drained(
                self._db, self._hash_prefix, self._category, member, before
            ):
                return False
        self._ready.add(generation.index)
        return True

    async def _take(self) -> float:
        self._shared.forget(self._wake)  # (a watch left from a try before this one)
        stint = await self._next_stint()
        if stint is None or not await self._safe_to_start(stint[0]):
            self._stint = None
            return self._poll * STANDBY_FACTOR
        self._stint = stint
        if not self._preferred:
            if await self._shared_holder() is not None:
                self._free_seen = 0
                if not self._coordinated:
                    return self._poll * STANDBY_FACTOR
                # Woken by the client's one look for all of them, or by a resize.
                self._shared.wake_when_free_later(self._keys()[1], self._wake)
                self._shared.wake_on_resize(self._generations, self._wake)
                return UNTIL_WOKEN
            self._free_seen += 1
            if self._free_seen < STANDBY_CHECKS:
                return self._poll * STANDBY_FACTOR
        wake = self._wake if self._preferred else None  # woken when the holder releases it
        hold = await self._locks.try_lock(self._keys(), self._lock_lost, wake)
        if hold is None and self._preferred:
            self._shared.wake_when_free(self._keys()[1], self._wake)
            return FREED_FALLBACK_SECONDS
        if hold is None:
            return self._poll
        self._hold = hold
        self._positions.start(self._positions.recorded)  # nothing of an earlier stint is due
        self._free_seen = 0
        await self._refresh(now=True)
        generation, member = self._stint
        if await generations.drained(
            self._db, self._hash_prefix, self._category, member, generation
        ):
            await self._unlock()
            self._stint = None
            return 0.0
        self._positions.start(
            await generations.recorded(self._db, self._hash_prefix, member, generation)
        )
        self._owner_epoch = await self._locks.run(hold, self._claim)
        self._next = self._positions.done + 1
        self._last_flush = time.monotonic()
        where = f"member {member} of {generation.size}, from position {self._next}"
        self._set_active(True, f"holds the member lock ({where})")
        return 0.0

    async def _read(self, hold: Hold) -> float:
        assert self._stint is not None
        head: int | None = None
        if self._stint[0].end is None:
            head = await self._shared.head.get(time.monotonic() - self._poll)
            if head < self._next:
                # Nothing new in the category: the client's one watcher wakes this loop,
                # and so does the next flush while anything is left to record; once nothing
                # is, a resize (the client's one watcher of the generations) or a fallback.
                self._shared.wake_past(self._next, self._wake)
                if self._positions.outstanding or self._positions.due() is not None:
                    return FLUSH_SECONDS
                self._shared.wake_on_resize(self._generations, self._wake)
                return SETTLED_FALLBACK_SECONDS
        epoch = self._epoch
        rows = await self._db.fetch(
            f"SELECT {COLUMNS} FROM message_store.get_category_messages($1, $2, $3, NULL, $4, $5)",
            self._category,
            self._next,
            BATCH,
            self._stint[1],
            self._stint[0].size,
        )
        if rows and self._stint[0].end is None:
            # A resize committed before any of these rows was written: cut them at its switch.
            await self._refresh(now=True)
        if not self._locks.holds(hold):
            self._lock_lost(LOST)
        if epoch != self._epoch or not self._active:
            return 0.0
        generation, member = self._stint
        end = generation.end
        taken = 0
        for row in rows:
            position = int(row["global_position"])
            if end is not None and position > end:
                break
            body, headers = read_row(row)
            self._positions.hand_out(position)
            self._next = position + 1
            taken += 1
            self._buffer.put_nowait(
                Delivery(
                    body=body,
                    subject=row["stream_name"],
                    headers=headers,
                    redelivered=False,
                    epoch=epoch,
                    token=position,
                    owner_epoch=self._owner_epoch,
                )
            )
        if taken == BATCH:
            return 0.0
        if end is None and head is not None:
            # Every position up to the head read before this query was committed by then (Message
            # DB writes a category in order, under its lock), so this member's were all in the
            # rows: the next read waits for a later event, not for one of another member.
            self._next = max(self._next, head + 1)
        if end is not None:
            # Nothing at or below the switch position can appear any more: all of it was read.
            self._next = max(self._next, end + 1)
        if end is not None and self._positions.all_acked:
            await self._locks.run(hold, self._record)
            await self._unlock()
            self._stint = None
            self._lose(
                f"member {member} of {generation.size} drained up to position {end} "
                f"(recorded {self._positions.recorded})"
            )
            return 0.0
        return self._poll
