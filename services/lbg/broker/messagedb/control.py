"""One client's control connection: its heartbeats go out on it and every group's come back
on it (LISTEN), so its own come back with the reply to the statement that sent them, in one
wake-up, and it holds one connection less than with one each way."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable

import asyncpg

from lbg.aio import cancel_and_wait
from lbg.broker.messagedb.shared import Shared, notify

Listener = Callable[[object, int, str, str], None]


class ControlLine:
    """The control connection, opened when first used and again once it closed (a restart
    between two beats included); `lost` and `regained` hear of each such loss."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        errors: tuple[type[BaseException], ...],
        lost: Callable[[BaseException], None],
        regained: Callable[[], None],
    ) -> None:
        self._connect = connect
        self._errors = errors
        self._lost = lost
        self._regained = regained
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()
        self._hearing: dict[str, Listener] = {}  # channel -> its listener
        self._keeper: asyncio.Task[None] | None = None

    async def send(self, channel: str, payload: str, shares: Iterable[Shared]) -> bool:
        """Notify `channel` (reading the head for `shares` with it: shared.notify)."""
        async with self._lock:
            return await notify(await self._line(), channel, payload, shares)

    async def listen(self, channel: str, deliver: Listener) -> Callable[[], Awaitable[None]]:
        """Hear `channel` from now on, again after every reconnect; returns the unsubscribe."""
        async with self._lock:
            conn = await self._line()
            await conn.add_listener(channel, deliver)
            self._hearing[channel] = deliver
        if self._keeper is None:
            self._keeper = asyncio.create_task(self._keep(), name="messagedb-control")

        async def unsubscribe() -> None:
            if self._hearing.pop(channel, None) is not None and self._conn is not None:
                with contextlib.suppress(*self._errors):
                    await self._conn.remove_listener(channel, deliver)

        return unsubscribe

    async def close(self) -> None:
        if self._keeper is not None:
            await cancel_and_wait(self._keeper)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=2)

    async def _line(self) -> asyncpg.Connection:
        """The open connection (under `_lock`), listening to every channel heard."""
        conn = self._conn
        if conn is not None and not conn.is_closed():
            return conn
        if conn is not None:
            self._lost(ConnectionError("the control connection closed"))
        conn = await self._connect()
        try:
            for channel, deliver in self._hearing.items():
                await conn.add_listener(channel, deliver)
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)
            raise
        self._conn = conn
        return conn

    async def _keep(self) -> None:
        """Listen again as soon as the connection goes (a database restart), whether or not
        a heartbeat goes out meanwhile."""
        while True:
            if (conn := self._conn) is not None and not conn.is_closed():
                await _closed(conn)
            try:
                async with self._lock:
                    await self._line()
                self._regained()
            except self._errors as exc:
                self._lost(exc)
                await asyncio.sleep(1.0)


async def _closed(conn: asyncpg.Connection) -> None:
    """Return once `conn` has closed: asyncpg calls its termination listeners then, so an idle
    process does not wake to ask (it asked three times a second)."""
    closed = asyncio.Event()
    conn.add_termination_listener(lambda _conn: closed.set())
    if not conn.is_closed():
        await closed.wait()
