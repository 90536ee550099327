"""How long this process was just paused (SIGSTOP, swap, a frozen VM): a binding must not
process what it received before a pause past its stall limit, since the broker may have handed
its queue to another member meanwhile."""

from __future__ import annotations

import asyncio
import math
import time

from lbg.aio import BEAT, cancel_and_wait, sleep_to_multiple

# Ticks per stall limit at least: a live loop is taken for paused only once it runs most of
# the limit late.
TICKS_PER_LIMIT = 5


def tick_period(stall_limit: float) -> float:
    """The pause clock's period: the longest multiple of the client's BEAT that still gives
    TICKS_PER_LIMIT ticks per stall limit, so its ticks cost no wake of their own (0.15 s for
    the default 1 s limit); the limit's fraction itself if shorter than a beat."""
    fraction = stall_limit / TICKS_PER_LIMIT
    beats = math.floor(fraction / BEAT + 1e-9)
    return beats * BEAT if beats else fraction


class PauseClock:
    """Notes the time on the wall clock's multiples of `tick_period(stall_limit)`, with the
    process's other periodic work (sleep_to_multiple); the time since the last note is at most
    a tick plus the loop's lag unless the process stopped, so a pause past the limit is seen."""

    def __init__(self, stall_limit: float) -> None:
        self._period = tick_period(stall_limit)
        self._last = time.monotonic()
        self._task = asyncio.create_task(self._tick(), name="pause-clock")

    async def _tick(self) -> None:
        while True:
            self._last = time.monotonic()
            await sleep_to_multiple(self._period)

    def paused_for(self) -> float:
        """Seconds since the last tick: past the stall limit only if the process was paused."""
        return time.monotonic() - self._last

    async def close(self) -> None:
        await cancel_and_wait(self._task)
