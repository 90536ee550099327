"""How long this process was just paused (SIGSTOP, swap, a frozen VM): a binding must not
process what it received before a pause past its stall limit, since the broker may have handed
its queue to another member meanwhile."""

from __future__ import annotations

import asyncio
import time

from lbg.aio import cancel_and_wait, sleep_to_multiple

# Ticks per stall limit: a live loop is taken for paused only once it runs most of the limit
# late, and the limit's default (1 s) gives 0.2 s ticks, on multiples of the 0.1 s polls.
TICKS_PER_LIMIT = 5


class PauseClock:
    """Notes the time on the wall clock's multiples of `stall_limit / TICKS_PER_LIMIT`, with the
    process's other periodic work (sleep_to_multiple); the time since the last note is at most
    a tick plus the loop's lag unless the process stopped, so a pause past the limit is seen."""

    def __init__(self, stall_limit: float) -> None:
        self._period = stall_limit / TICKS_PER_LIMIT
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
