"""A group's generation history as one client sees it: read by one task for all the group's
queues, which wait for it to change rather than each re-reading the KV every second (the
reads grew with QC x clients although the history changes only with a resize)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from lbg.aio import cancel_and_wait, cancel_requested
from lbg.model.generations import Generation

log = logging.getLogger(__name__)

REFRESH_SECONDS = 1.0


class HistoryFeed:
    """The latest history of one group, re-read every REFRESH_SECONDS by one task; `changed`
    is the event set when the history read next differs from `history`."""

    def __init__(self, group: str, load: Callable[[], Awaitable[list[Generation]]]) -> None:
        self._group = group
        self._load = load
        self.history: list[Generation] = []
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Read the history now (a failure is the caller's), then follow it in the background."""
        self.history = await self._load()
        self._task = asyncio.create_task(self._follow(), name=f"history-{self._group}")

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            try:
                history = await self._load()
            except asyncio.CancelledError:
                if cancel_requested():
                    raise
                continue  # a client library cancelled its call (the connection went)
            except Exception as exc:  # a broker restart: the next read may succeed
                log.warning("group '%s': cannot read its history: %s", self._group, exc)
                continue
            if history != self.history:
                self.history = history
                changed, self.changed = self.changed, asyncio.Event()
                changed.set()

    async def close(self) -> None:
        if self._task is not None:
            with contextlib.suppress(Exception):
                await cancel_and_wait(self._task)
