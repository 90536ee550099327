"""When a member's periodic rounds run: at multiples of their period on the wall clock.

Every member of a group then beats at the same moments, so each hears the others' heartbeats
in one burst: an event loop wakes once or twice per round instead of once per member (with 8
members idle, hearing them cost a third as much CPU: see bench/README.md, idle.py). Clocks
that disagree only put members out of step again; a round still comes at least every period.
"""

from __future__ import annotations

import asyncio
import time


def until_next(period: float, now: float | None = None) -> float:
    """Seconds from `now` (the wall clock) to the next multiple of `period`: in (0, period]."""
    now = time.time() if now is None else now
    return period - now % period


async def wait_next(period: float, wake: asyncio.Event) -> None:
    """Until the next multiple of `period` or until `wake` is set, whichever comes first (a
    timer sets `wake`: one timer handle per round rather than wait_for's task)."""
    timer = asyncio.get_running_loop().call_later(until_next(period), wake.set)
    try:
        await wake.wait()
    finally:
        timer.cancel()
