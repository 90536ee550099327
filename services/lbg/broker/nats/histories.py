"""A group's generation history as one client sees it: read by one task for all the group's
queues, which wait for it to change rather than each re-reading the KV every second (the
reads grew with QC x clients although the history changes only with a resize).

The task reads the history again only when a read of the group's config shows a newer
generation than the history it holds (`heard`): the history seen up to a config's generation
changes only with that generation (a resize stores the history, then the config), and the
client reads the config every few seconds anyway, and at once when a member or cg-admin says
it changed. Re-read every second as well, an idle NATS client's two KV reads a second were a
tenth of its CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from lbg.aio import cancel_and_wait, cancel_requested
from lbg.model.generations import Generation

log = logging.getLogger(__name__)

# After a failed read (or one that did not show the generation heard of yet), the next one
# comes this much later.
RETRY_SECONDS = 1.0


class HistoryFeed:
    """The latest history of one group, re-read by one task when a newer generation is heard
    of; `changed` is the event set when the history read next differs from `history`."""

    def __init__(self, group: str, load: Callable[[], Awaitable[list[Generation]]]) -> None:
        self._group = group
        self._load = load
        self.history: list[Generation] = []
        self.changed = asyncio.Event()
        self._stale = asyncio.Event()
        self._newest = 0  # the newest generation a read of the config found
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Read the history now (a failure is the caller's), then follow it in the background."""
        self.history = await self._load()
        self._task = asyncio.create_task(self._follow(), name=f"history-{self._group}")

    def heard(self, generation: int) -> None:
        """A read of the group's config found this generation: read the history again if it
        is newer than the history's last."""
        self._newest = max(self._newest, generation)
        if self.history and generation > self.history[-1].index:
            self._stale.set()

    async def _follow(self) -> None:
        while True:
            await self._stale.wait()
            history = await self._read()
            if history is not None and history != self.history:
                self.history = history
                changed, self.changed = self.changed, asyncio.Event()
                changed.set()
            if history is not None and history[-1].index >= self._newest:
                self._stale.clear()
            else:  # not read, or not up to the generation heard of yet: again in a while
                await asyncio.sleep(RETRY_SECONDS)

    async def _read(self) -> list[Generation] | None:
        """The history read now; None (logged) if the broker did not answer."""
        try:
            return await self._load()
        except asyncio.CancelledError:
            if cancel_requested():
                raise
            return None  # a client library cancelled its call (the connection went)
        except Exception as exc:  # a broker restart: the next read may succeed
            log.warning("group '%s': cannot read its history: %s", self._group, exc)
            return None

    async def close(self) -> None:
        if self._task is not None:
            with contextlib.suppress(Exception):
                await cancel_and_wait(self._task)
