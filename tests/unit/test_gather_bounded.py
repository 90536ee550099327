"""gather_bounded: never more than the limit at once, every call ends, the first failure is
raised after all of them (a client binds its queues this way)."""

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbg.aio import gather_bounded


@given(st.integers(1, 8), st.integers(0, 30), st.sets(st.integers(0, 29)))
def test_at_most_limit_at_once_and_every_call_ends(limit: int, count: int, fail: set) -> None:
    running, peak, ended = 0, 0, []

    async def call(n: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)
        running -= 1
        ended.append(n)
        if n in fail:
            raise ValueError(n)

    failing = sorted(n for n in fail if n < count)
    if failing:
        with pytest.raises(ValueError) as raised:
            asyncio.run(gather_bounded(limit, (call(n) for n in range(count))))
        assert raised.value.args == (failing[0],)
    else:
        asyncio.run(gather_bounded(limit, (call(n) for n in range(count))))
    assert peak <= limit
    assert sorted(ended) == list(range(count))
