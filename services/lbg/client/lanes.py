"""Per-key lanes: different keys run concurrently, each key strictly one event after another.

This keeps a queue's throughput independent of how long one event takes, and one slow or
stuck key does not hold up the others, while every key's events are handled in order. If an
event of a key does not complete, the rest of that key's lane is skipped, and each skipped
work's `skipped` callback runs: the caller must make those events come again, in order
(the client fences the queue so the broker redelivers them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial

Work = Callable[[], Awaitable[bool]]
Skipped = Callable[[], None]


class KeyLanes:
    """Runs at most `window` works at once; works of one key run in submission order."""

    def __init__(self, window: int) -> None:
        self._slots = asyncio.Semaphore(max(1, window))
        self._tails: dict[str, asyncio.Task[bool]] = {}
        self._running: set[asyncio.Task[bool]] = set()

    async def submit(self, key: str, work: Work, skipped: Skipped | None = None) -> None:
        """Queue `work` behind the key's previous work; waits while the window is full.

        If the previous work did not complete, `work` does not run and `skipped` is called.
        """
        await self._slots.acquire()
        task = asyncio.create_task(self._run(self._tails.get(key), work, skipped))
        self._tails[key] = task
        self._running.add(task)
        task.add_done_callback(partial(self._finished, key))

    @staticmethod
    async def _run(
        previous: asyncio.Task[bool] | None, work: Work, skipped: Skipped | None
    ) -> bool:
        if previous is not None and not await _completed(previous):
            if skipped is not None:
                skipped()
            return False
        return await work()

    def _finished(self, key: str, task: asyncio.Task[bool]) -> None:
        self._slots.release()
        self._running.discard(task)
        if self._tails.get(key) is task:
            del self._tails[key]

    @property
    def busy(self) -> int:
        """Works submitted and not finished."""
        return len(self._running)

    async def drain(self) -> None:
        """Wait until every submitted work has finished."""
        while self._running:
            await asyncio.gather(*self._running, return_exceptions=True)


async def _completed(work: asyncio.Task[bool]) -> bool:
    """Whether a work completed; one that raised did not (its key's later works must wait)."""
    try:
        return await work
    except Exception:
        return False
