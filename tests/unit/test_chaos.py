"""lbg.devstack.chaos: the soak's fault choices keep the pool in bounds; duplicates get a cause."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbg.devstack.chaos import (
    UNEXPLAINED,
    Action,
    ChaosPolicy,
    Fault,
    FaultRecord,
    choose_action,
    duplicate_cause,
    tally,
)


def live_after(live: list[str], action: Action) -> int:
    """How many clients stay live once the action is applied (a restart comes back)."""
    if action.fault in (Fault.KILL, Fault.STOP):
        return len(live) - 1
    if action.fault is Fault.START:
        return len(live) + 1
    return len(live)


@given(
    seed=st.integers(),
    min_clients=st.integers(1, 4),
    extra=st.integers(0, 4),
    live_count=st.integers(0, 9),
)
def test_the_pool_stays_within_its_bounds(
    seed: int, min_clients: int, extra: int, live_count: int
) -> None:
    policy = ChaosPolicy(min_clients, min_clients + extra)
    live = [f"client-{i}" for i in range(live_count)]
    action = choose_action(random.Random(seed), live, policy, "client-new")
    after = live_after(live, action)
    if action.fault in (Fault.KILL, Fault.STOP):
        assert after >= policy.min_clients
    if action.fault is Fault.START:
        assert action.client == "client-new"
        assert after <= policy.max_clients
    else:
        assert action.client in live


def test_every_fault_is_chosen_over_a_run() -> None:
    rng = random.Random(7)
    live = ["a", "b", "c", "d"]
    seen = {choose_action(rng, live, ChaosPolicy(2, 5), "e").fault for _ in range(200)}
    assert seen == {Fault.KILL, Fault.STOP, Fault.RESTART, Fault.START}


def test_no_client_is_killed_at_the_minimum() -> None:
    rng = random.Random(3)
    faults = {choose_action(rng, ["a", "b"], ChaosPolicy(2, 2), "c").fault for _ in range(100)}
    assert faults == {Fault.RESTART}


@pytest.mark.parametrize("low, high", [(0, 3), (3, 2)])
def test_impossible_bounds_are_refused(low: int, high: int) -> None:
    with pytest.raises(ValueError, match="min_clients"):
        ChaosPolicy(low, high)


def test_a_duplicate_is_blamed_on_the_latest_fault_of_the_previous_owner() -> None:
    faults = [
        FaultRecord(Fault.STOP, "a", 10.0),
        FaultRecord(Fault.KILL, "b", 11.0),
        FaultRecord(Fault.KILL, "a", 12.0),
    ]
    assert duplicate_cause("a", "c", 13.0, faults, window=30.0) == Fault.KILL.value
    assert duplicate_cause("a", "c", 11.5, faults, window=30.0) == Fault.STOP.value


def test_a_broker_restart_explains_any_duplicate_after_it() -> None:
    faults = [FaultRecord(Fault.BROKER_RESTART, None, 5.0)]
    assert duplicate_cause("x", "y", 6.0, faults, window=30.0) == Fault.BROKER_RESTART.value


def test_a_duplicate_with_no_fault_nearby_is_unexplained() -> None:
    faults = [FaultRecord(Fault.KILL, "a", 1.0), FaultRecord(Fault.KILL, "z", 50.0)]
    assert duplicate_cause("a", "c", 45.0, faults, window=30.0) == UNEXPLAINED
    assert duplicate_cause(None, "c", 51.0, faults, window=30.0) == UNEXPLAINED


def test_tally_counts_most_frequent_first() -> None:
    assert list(tally(["x", "y", "y", "z", "y", "x"]).items()) == [("y", 3), ("x", 2), ("z", 1)]
