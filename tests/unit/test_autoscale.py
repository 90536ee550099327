"""The autoscaler's rule: fast up, slow down, within bounds, and no flapping."""

import asyncio
import itertools
import math
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from lbg.admin.autoscale import Autoscaler
from lbg.broker import connect_broker
from lbg.broker.memory import memory_store, reset_memory_brokers
from lbg.model.autoscale import (
    AutoscalePolicy,
    Lag,
    QueueLag,
    ScalerState,
    active_clients,
    group_lag,
    step,
    wanted,
)
from lbg.model.destinations import event_destination
from lbg.model.group import GroupConfig
from lbg.settings import BrokerSettings

POLICY = AutoscalePolicy(
    minimum=1, maximum=4, high=100, low=10, high_age=5, low_age=1, cooldown=5, calm=10
)

lags = st.builds(
    Lag, st.integers(min_value=0, max_value=10_000), st.floats(min_value=0, max_value=60)
)


@given(st.integers(min_value=0, max_value=8), lags)
def test_what_the_lag_asks_for_stays_in_bounds_and_goes_down_one_step(
    clients: int, lag: Lag
) -> None:
    target, reason = wanted(POLICY, clients, lag)
    assert POLICY.minimum <= target <= POLICY.maximum
    assert f"backlog {lag.backlog}" in reason
    if POLICY.minimum < clients <= POLICY.maximum and target < clients:
        assert target == clients - 1


def test_scales_up_to_what_the_backlog_needs_at_once_and_down_one_by_one() -> None:
    assert wanted(POLICY, 1, Lag(350, 0.5))[0] == 4, "350 at 100 each: 4 clients at once"
    assert wanted(POLICY, 2, Lag(210, 0.5))[0] == 3
    assert wanted(POLICY, 4, Lag(5000, 9))[0] == 4, "never above the maximum"
    assert wanted(POLICY, 3, Lag(0, 0))[0] == 2
    assert wanted(POLICY, 1, Lag(0, 0))[0] == 1, "never below the minimum"
    assert wanted(POLICY, 2, Lag(100, 0.5))[0] == 2, "between low and high: stay"


def test_an_old_event_adds_a_client_even_with_a_small_backlog() -> None:
    assert wanted(POLICY, 2, Lag(20, 6.0))[0] == 3
    assert wanted(POLICY, 2, Lag(5, 2.0))[0] == 2, "a small backlog still too old to remove"


@given(
    st.lists(st.tuples(lags, st.floats(min_value=0.1, max_value=3)), min_size=1, max_size=60),
    st.integers(min_value=1, max_value=4),
)
def test_changes_are_never_closer_than_the_cool_down(
    polls: list[tuple[Lag, float]], clients: int
) -> None:
    state, now, changes = ScalerState(), 0.0, []
    for lag, gap in polls:
        now += gap
        state, decision = step(POLICY, state, clients, lag, now)
        if decision.clients != clients:
            changes.append((now, decision.clients - clients))
            clients = decision.clients
        assert POLICY.minimum <= clients <= POLICY.maximum
    for (before, _), (after, _) in itertools.pairwise(changes):
        assert after - before >= POLICY.cooldown
    assert all(delta >= -1 for _, delta in changes), "scaling down goes one step at a time"


def test_a_scale_down_waits_for_calm_and_a_blip_restarts_the_wait() -> None:
    state = ScalerState(last_change=0)
    state, decision = step(POLICY, state, 3, Lag(0, 0), now=100)
    assert (decision.clients, decision.wanted) == (3, 2)
    assert decision.held is not None and decision.held.startswith("calm")
    state, decision = step(POLICY, state, 3, Lag(50, 0.5), now=105)
    assert decision.clients == 3 and state.calm_since is None, "a blip of lag ends the calm"
    state, decision = step(POLICY, state, 3, Lag(0, 0), now=106)
    state, decision = step(POLICY, state, 3, Lag(0, 0), now=115)
    assert decision.clients == 3, "9 s of calm is not 10"
    state, decision = step(POLICY, state, 3, Lag(0, 0), now=116.5)
    assert decision.clients == 2 and state.last_change == 116.5


def test_a_scale_up_waits_only_for_the_cool_down() -> None:
    state, decision = step(POLICY, ScalerState(last_change=10), 1, Lag(500, 0), now=12)
    assert decision.clients == 1
    assert decision.held is not None and decision.held.startswith("cool-down")
    state, decision = step(POLICY, state, 1, Lag(500, 0), now=15)
    assert decision.clients == 4
    assert step(POLICY, ScalerState(last_change=14), 0, Lag(0, 0), 15)[1].clients == 1, (
        "the bounds apply at once"
    )


@given(
    st.dictionaries(
        st.integers(min_value=0, max_value=7),
        st.builds(
            QueueLag,
            st.integers(min_value=0, max_value=1000),
            st.none() | st.floats(min_value=0, max_value=100),
        ),
    ),
    st.dictionaries(st.integers(min_value=0, max_value=7), st.floats(min_value=0, max_value=50)),
)
def test_the_group_lag_sums_backlogs_and_estimates_unknown_ages(
    queues: dict[int, QueueLag], since: dict[int, float]
) -> None:
    now = 100.0
    lag, tracked = group_lag(queues, since, now)
    assert lag.backlog == sum(q.backlog for q in queues.values())
    assert set(tracked) == {q for q, queue in queues.items() if queue.backlog > 0}
    for q, started in tracked.items():
        assert started == since.get(q, now), "a backlog keeps the time it was first seen"
        queue = queues[q]
        age = queue.oldest_age if queue.oldest_age is not None else now - started
        assert lag.oldest_age >= age
    if not tracked:
        assert lag.oldest_age == 0


def test_an_unknown_age_is_the_time_since_the_backlog_was_last_empty() -> None:
    lag, since = group_lag({0: QueueLag(5, None), 1: QueueLag(0, None)}, {0: 90.0, 1: 10}, 100)
    assert (lag.backlog, lag.oldest_age, since) == (5, 10.0, {0: 90.0})


def test_policies_without_a_gap_between_the_thresholds_are_refused() -> None:
    assert POLICY.problem() is None
    assert "low backlog" in str(AutoscalePolicy(high=10, low=10).problem())
    assert "low age" in str(AutoscalePolicy(high_age=1, low_age=2).problem())
    assert "minimum" in str(AutoscalePolicy(minimum=5, maximum=4).problem())
    assert math.isinf(ScalerState().last_change)


def test_the_running_count_seen_from_the_broker_is_the_distinct_owners() -> None:
    assert active_clients(["a", "b", "a", None]) == 2


def test_reporting_only_the_count_told_stands_for_the_running_one(tmp_path: Path) -> None:
    """On memory://, with nobody to scale: the cool-down applies to the count it reported."""

    async def scenario() -> None:
        reset_memory_brokers()
        memory_store("autoscale")
        broker = await connect_broker(BrokerSettings(url="memory://autoscale"), "scaler")
        config = GroupConfig(hash_prefix="hp", hash_count=4, queue_count=4)
        await broker.create_group("g", config)
        for number in range(500):
            await broker.publish(event_destination("hp", number % 4, f"k{number}"), b"{}")
        desired = tmp_path / "desired"
        scaler = Autoscaler(broker, "g", config, POLICY, desired_file=desired)
        first = await scaler.poll()
        assert (first.clients, desired.read_text()) == (4, "4\n"), "500 at 100 each, at most 4"
        assert scaler.lag.backlog == 500 and scaler.lag.oldest_age >= 0
        second = await scaler.poll()
        assert (second.clients, second.held) == (4, None), "not 0 -> 4 again: 4 were asked for"

    asyncio.run(scenario())


@given(
    st.lists(
        st.tuples(
            st.floats(min_value=POLICY.low, max_value=POLICY.high),
            st.floats(min_value=0, max_value=POLICY.high_age),
            st.floats(min_value=0.1, max_value=3),
        ),
        min_size=1,
        max_size=60,
    ),
    st.integers(min_value=1, max_value=4),
)
def test_a_lag_wandering_between_the_marks_never_changes_the_count(
    polls: list[tuple[float, float, float]], clients: int
) -> None:
    """The hysteresis: between the low and the high marks nothing moves, however it wanders."""
    state, now = ScalerState(), 0.0
    for per_client, age, gap in polls:
        now += gap
        lag = Lag(math.ceil(per_client * clients), age)
        state, decision = step(POLICY, state, clients, lag, now)
        assert decision.clients == clients, (lag, decision)
