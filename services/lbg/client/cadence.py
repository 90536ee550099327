"""When a member's periodic rounds run: at multiples of their period on the wall clock.

Every member of a group then beats at the same moments, so each hears the others' heartbeats
in one burst: an event loop wakes once or twice per round instead of once per member (with 8
members idle, hearing them cost a third as much CPU: see bench/README.md, idle.py). Clocks
that disagree only put members out of step again.
"""

from __future__ import annotations

import asyncio
import time

# A multiple of the period closer than this fraction of it is skipped for the one after: an
# event loop's timer may fire up to a millisecond early (uvloop rounds to milliseconds), and
# a round run just before its multiple must not be followed by another just after it.
MIN_GAP = 1 / 20


def until_next(period: float, now: float | None = None) -> float:
    """Seconds from `now` (the wall clock) to the next multiple of `period` at least
    MIN_GAP periods away: so rounds are at most (1 + MIN_GAP) periods apart."""
    now = time.time() if now is None else now
    delay = period - now % period
    return delay if delay >= MIN_GAP * period else delay + period


async def wait_until(delay: float, wake: asyncio.Event) -> None:
    """`delay` seconds, or until `wake` is set, whichever comes first (a timer sets `wake`:
    one timer handle per round rather than wait_for's task)."""
    timer = asyncio.get_running_loop().call_later(max(0.0, delay), wake.set)
    try:
        await wake.wait()
    finally:
        timer.cancel()
