"""asyncio helpers shared by the daemons."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterable

from lbg.model.timing import DEFAULT_TIMING

# The beat of a client's periodic work: the default heartbeat interval, and the period (or a
# multiple of it) of the other work an idle client does several times a second (Message DB's
# polls, the pause clock), so that its event loop wakes for all of it at once (sleep_to_multiple).
BEAT = DEFAULT_TIMING.interval
# A multiple of the period closer than this fraction of it is skipped for the one after: an
# event loop's timer may fire up to a millisecond early (uvloop rounds to milliseconds), and
# work run just before its multiple must not be followed by another run just after it.
MIN_GAP = 1 / 20


async def cancel_and_wait(task: asyncio.Task, retry_after: float = 0.5) -> None:
    """Cancel a task and wait until it is done, repeating the cancel if the task swallowed it.

    On Python 3.11 a cancel that arrives while the task is finishing a wait_for can be lost,
    which would otherwise leave a daemon hanging on shutdown.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=retry_after)


def cancel_requested() -> bool:
    """Whether the current task was asked to stop, rather than a client library having
    cancelled one of its own pending calls (aiormq does that to every call of a connection
    that closed): only the first should end a loop."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


async def gather_bounded(limit: int, calls: Iterable[Awaitable[None]]) -> None:
    """Await `calls`, at most `limit` at a time; the first failure is raised once all ended
    (none is left running behind the caller's back)."""
    gate = asyncio.Semaphore(limit)

    async def call(awaitable: Awaitable[None]) -> None:
        async with gate:
            await awaitable

    results = await asyncio.gather(*(call(c) for c in calls), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


def until_next(period: float, now: float | None = None) -> float:
    """Seconds from `now` (the wall clock) to the next multiple of `period` at least
    MIN_GAP periods away: so runs are at most (1 + MIN_GAP) periods apart."""
    now = time.time() if now is None else now
    delay = period - now % period
    return delay if delay >= MIN_GAP * period else delay + period


async def sleep_to_multiple(period: float) -> None:
    """Sleep until the wall clock's next multiple of `period`. A process's periodic tasks
    whose periods are multiples of one another then wake its event loop together, once,
    rather than each at its own moment: on a VM a wake from idle costs a few hundred
    microseconds of CPU however little is done (bench/README.md, idle.py's wake-ups)."""
    await asyncio.sleep(until_next(period))
