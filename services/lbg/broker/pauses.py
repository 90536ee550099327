"""How long this process was just paused (SIGSTOP, swap, a frozen VM): a binding must not
process what it received before a pause past its stall limit, since the broker may have handed
its queue to another member meanwhile."""

from __future__ import annotations

import asyncio
import math
import time

from lbg.aio import BEAT, until_next

# Ticks per stall limit at least: a live loop is taken for paused only once it runs three
# quarters of the limit late.
TICKS_PER_LIMIT = 4


def tick_period(stall_limit: float, beat: float = BEAT) -> float:
    """The pause clock's period: the longest multiple of the client's beat (its broker's
    default heartbeat interval) that still gives TICKS_PER_LIMIT ticks per stall limit, so its
    ticks cost no wake of their own (0.15 s for the default 1 s limit); where a beat is longer
    than that, the longest even fraction of the beat short enough (0.25 s on RabbitMQ's 0.5 s
    beat), so one tick in every few falls on a round."""
    fraction = stall_limit / TICKS_PER_LIMIT
    beats = math.floor(fraction / beat + 1e-9)
    return beats * beat if beats else beat / math.ceil(beat / fraction - 1e-9)


class PauseClock:
    """Notes the time on the wall clock's multiples of `tick_period(stall_limit)`, with the
    process's other periodic work (as sleep_to_multiple); the time since the last note is at
    most a tick plus the loop's lag unless the process stopped, so a pause past the limit is
    seen. A chain of timer callbacks, not a task: a tick resumes no coroutine and makes no
    future, several times a second in every idle client."""

    def __init__(self, stall_limit: float, beat: float = BEAT) -> None:
        self._period = tick_period(stall_limit, beat)
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._tick()

    def _tick(self) -> None:
        self._last = time.monotonic()
        self._timer = self._loop.call_later(until_next(self._period), self._tick)

    def paused_for(self) -> float:
        """Seconds since the last tick: past the stall limit only if the process was paused."""
        return time.monotonic() - self._last

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
