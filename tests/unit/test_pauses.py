"""The pause clock a binding asks before processing: a pause past the stall limit is always
seen, a live loop is not taken for paused, and its ticks fall on the wall clock's multiples of
their period (with the process's other periodic work, so they cost no wake of their own)."""

import asyncio
import time

from hypothesis import given
from hypothesis import strategies as st

from lbg.aio import BEAT, sleep_to_multiple
from lbg.broker.adapters import RABBITMQ_TIMING
from lbg.broker.pauses import TICKS_PER_LIMIT, PauseClock, tick_period

LIMIT = 0.5


def test_a_live_loop_is_never_taken_for_paused_and_a_blocked_one_is() -> None:
    async def scenario() -> tuple[float, float]:
        clock = PauseClock(LIMIT)
        worst = 0.0
        for _ in range(60):
            await asyncio.sleep(0.01)
            worst = max(worst, clock.paused_for())
        time.sleep(LIMIT + 0.05)  # a SIGSTOP, as the loop sees it
        paused = clock.paused_for()
        await clock.close()
        return worst, paused

    worst, paused = asyncio.run(scenario())
    assert worst < 2 * tick_period(LIMIT), f"a live loop looked paused for {worst:.3f}s"
    assert paused > LIMIT


def test_sleep_to_multiple_wakes_on_the_wall_clocks_multiples_of_its_period() -> None:
    period = 0.05

    async def phases() -> list[float]:
        woke = []
        for _ in range(8):
            await sleep_to_multiple(period)
            woke.append(time.time() % period)
        return woke

    late = [min(phase, period - phase) for phase in asyncio.run(phases())]
    assert sorted(late)[len(late) // 2] < period / 5, f"phases {late}"


def test_the_default_stall_limit_ticks_on_the_heartbeats_beat() -> None:
    assert tick_period(1.0) == BEAT
    assert tick_period(1.0, RABBITMQ_TIMING.interval) == RABBITMQ_TIMING.interval / 2


@given(st.floats(min_value=0.01, max_value=10.0), st.floats(min_value=0.01, max_value=10.0))
def test_a_tick_shorter_than_the_beat_is_the_longest_fraction_of_it_short_enough(
    limit: float, beat: float
) -> None:
    period, longest = tick_period(limit, beat), limit / TICKS_PER_LIMIT
    assert 0 < period <= longest * (1 + 1e-9)
    if longest < beat:
        parts = round(beat / period)
        assert abs(beat / period - parts) < 1e-6, "its ticks fall on the rounds"
        assert beat / (parts - 1) > longest * (1 - 1e-9), "no longer fraction would do"


@given(st.floats(min_value=0.01, max_value=100.0))
def test_a_tick_is_a_multiple_of_the_beat_where_it_can_be_and_never_too_long(limit: float) -> None:
    period = tick_period(limit)
    assert 0 < period <= limit / TICKS_PER_LIMIT * (1 + 1e-9)
    if limit / TICKS_PER_LIMIT >= BEAT:
        beats = period / BEAT
        assert abs(beats - round(beats)) < 1e-6
        assert period + BEAT > limit / TICKS_PER_LIMIT  # the longest such multiple
