"""Per-key lanes: different keys run concurrently, each key strictly one event after another.

This keeps a queue's throughput independent of how long one event takes, and one slow or
stuck key does not hold up the others, while every key's events are handled in order. If an
event of a key does not complete, the rest of that key's lane is skipped, and each skipped
work's `skipped` callback runs: the caller must make those events come again, in order
(the client fences the queue so the broker redelivers them).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable

Work = Callable[[], Awaitable[bool]]
Skipped = Callable[[], None]


class KeyLanes:
    """Runs at most `window` works at once; works of one key run in submission order.

    A key with works pending has one task that runs them one after another (not a task per
    work): most events find their key's lane already busy, so this saves a task and an await
    on the previous one per event."""

    def __init__(self, window: int) -> None:
        self._slots = asyncio.Semaphore(max(1, window))
        self._queued: dict[str, collections.deque[tuple[Work, Skipped | None]]] = {}
        self._running: set[asyncio.Task[None]] = set()
        self._busy = 0

    async def submit(self, key: str, work: Work, skipped: Skipped | None = None) -> None:
        """Queue `work` behind the key's previous work; waits while the window is full.

        If the previous work did not complete, `work` does not run and `skipped` is called.
        """
        await self._slots.acquire()
        self._busy += 1
        queued = self._queued.get(key)
        if queued is not None:
            queued.append((work, skipped))
            return
        self._queued[key] = collections.deque(((work, skipped),))
        task = asyncio.create_task(self._run_lane(key))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run_lane(self, key: str) -> None:
        """Run the key's works in order until none is left; after one that did not complete
        (False or raised), skip the rest."""
        queued = self._queued[key]
        completed = True
        try:
            while queued:
                work, skipped = queued[0]
                if completed:
                    completed = await _completed(work)
                elif skipped is not None:
                    skipped()
                queued.popleft()
                self._busy -= 1
                self._slots.release()
        finally:
            del self._queued[key]

    @property
    def busy(self) -> int:
        """Works submitted and not finished."""
        return self._busy

    def drop_waiting(self) -> int:
        """Forget every work that has not started (each key keeps the one it runs), without
        its `skipped` callback: for a caller whose broker gives those events back in order
        anyway. Returns how many were dropped."""
        dropped = 0
        for queued in self._queued.values():
            while len(queued) > 1:
                queued.pop()
                dropped += 1
        self._busy -= dropped
        for _ in range(dropped):
            self._slots.release()
        return dropped

    async def drain(self) -> None:
        """Wait until every submitted work has finished."""
        while self._running:
            await asyncio.gather(*self._running, return_exceptions=True)


async def _completed(work: Work) -> bool:
    """Run a work; one that raised did not complete (its key's later works must wait)."""
    try:
        return await work()
    except Exception:
        return False
