"""lbg.retry: capped, jittered exponential backoff and the start-up retry budget."""

import asyncio
import logging
import time

import pytest

from lbg.broker.base import BrokerError, GroupNotFound
from lbg.retry import (
    FIRST_DELAY,
    MAX_DELAY,
    StartupBudget,
    StartupStopped,
    backoff,
    retry,
)


def test_backoff_doubles_from_the_first_delay_up_to_the_cap() -> None:
    ceilings = [backoff(attempt, rng=lambda: 1.0) for attempt in range(1, 10)]
    assert ceilings[:4] == [FIRST_DELAY, 2 * FIRST_DELAY, 4 * FIRST_DELAY, 8 * FIRST_DELAY]
    assert ceilings[-1] == MAX_DELAY
    assert backoff(10_000, rng=lambda: 1.0) == MAX_DELAY


def test_backoff_jitters_between_half_and_all_of_the_ceiling() -> None:
    assert backoff(3, rng=lambda: 0.0) == 2 * FIRST_DELAY
    delays = {backoff(3) for _ in range(50)}
    assert len(delays) > 1
    assert all(2 * FIRST_DELAY <= d <= 4 * FIRST_DELAY for d in delays)


class FailsThenWorks:
    """An action that raises `error` for its first `failures` calls, then returns the count."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    async def __call__(self) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return self.calls


def run_retry(action: FailsThenWorks, seconds: float, stop: asyncio.Event | None = None) -> int:
    async def main() -> int:
        return await retry(
            action,
            GroupNotFound,
            lambda exc: f"waiting ({exc})",
            lambda exc: f"failed ({exc})",
            StartupBudget(seconds, stop),
        )

    return asyncio.run(main())


def test_retry_warns_once_then_logs_each_attempt_as_info_and_returns_the_result(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "lbg.startup")
    assert run_retry(FailsThenWorks(3, GroupNotFound("gone")), 10) == 4
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["WARNING", "INFO", "INFO"]
    first = lines[0][1]
    assert first.startswith("waiting (gone); retrying for up to 10 s (--connect-retry), next in ")
    assert first.endswith("(attempt 1)")
    assert lines[1][1].startswith("waiting (gone); retrying in ")
    assert lines[2][1].endswith("(attempt 3)")


def test_zero_budget_fails_at_once_with_the_reason() -> None:
    action = FailsThenWorks(1, GroupNotFound("gone"))
    with pytest.raises(BrokerError, match=r"^failed \(gone\)$"):
        run_retry(action, 0)
    assert action.calls == 1


def test_a_spent_budget_says_how_long_it_tried() -> None:
    started = time.monotonic()
    with pytest.raises(BrokerError, match=r"^failed \(gone\); gave up after \d+ attempts in 1 s"):
        run_retry(FailsThenWorks(100, GroupNotFound("gone")), 1.2)
    assert time.monotonic() - started < 3


def test_other_errors_are_not_retried() -> None:
    action = FailsThenWorks(1, BrokerError("denied"))
    with pytest.raises(BrokerError, match=r"^denied$"):
        run_retry(action, 10)
    assert action.calls == 1


def test_a_stop_request_ends_the_wait_at_once() -> None:
    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, stop.set)
        await retry(
            FailsThenWorks(100, GroupNotFound("gone")),
            GroupNotFound,
            str,
            str,
            StartupBudget(60, stop),
        )

    started = time.monotonic()
    with pytest.raises(StartupStopped):
        asyncio.run(main())
    assert time.monotonic() - started < 2
