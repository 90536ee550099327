"""When a member's periodic rounds run: at multiples of their period on the wall clock.

Every member of a group then beats at the same moments, so each hears the others' heartbeats
in one burst: an event loop wakes once or twice per round instead of once per member (with 8
members idle, hearing them cost a third as much CPU: see bench/README.md, idle.py). Clocks
that disagree only put members out of step again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

# Rounds that ran an interval or more late (the process was blocked or starved of CPU) are
# logged at most this often, with the worst lateness since: it is what fences a live member.
LATE_LOG_SECONDS = 10.0


async def wait_until(delay: float, wake: asyncio.Event) -> None:
    """`delay` seconds, or until `wake` is set, whichever comes first (a timer sets `wake`:
    one timer handle per round rather than wait_for's task)."""
    timer = asyncio.get_running_loop().call_later(max(0.0, delay), wake.set)
    try:
        await wake.wait()
    finally:
        timer.cancel()


class ExtraRound:
    """A round sooner than the cadence, asked for between rounds: `wake` is set after the
    delay asked; asking again while one is pending changes nothing, and a round that runs
    meanwhile takes its place (`cancel`)."""

    def __init__(self, wake: asyncio.Event) -> None:
        self._wake = wake
        self._timer: asyncio.TimerHandle | None = None

    def ask(self, delay: float) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(delay, self._wake.set)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class LateRounds:
    """Warns when a member's rounds run an interval or more late: its heartbeats then go out
    late too, and a process blocked for most of a lease fences itself (or is evicted) while
    alive. At most every LATE_LOG_SECONDS, with the worst lateness since."""

    def __init__(
        self, member: str, interval: float, tolerated: float, clock: Callable[[], float]
    ) -> None:
        self._member = member
        self._interval = interval
        self._tolerated = tolerated
        self._clock = clock
        self.worst = 0.0
        self._told = -float("inf")

    def note(self, late: float) -> None:
        """A round ran `late` seconds after it was due."""
        self.worst = max(self.worst, late)
        now = self._clock()
        if self.worst < self._interval or now - self._told < LATE_LOG_SECONDS:
            return
        log.warning(
            "member %s: a heartbeat round ran %.2fs late (the process was blocked or starved"
            " of CPU); the lease tolerates %.2fs without a heartbeat",
            self._member,
            self.worst,
            self._tolerated,
        )
        self.worst, self._told = 0.0, now
