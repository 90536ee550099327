"""lbg.devstack.chaos: the soak's fault choices keep the pool in bounds; duplicates get a cause;
only lease alarms no fault explains count as false."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbg.devstack.alarms import EVICTED, SELF_FENCED, LeaseAlarm
from lbg.devstack.chaos import (
    ALARM_GRACE,
    BROKER_RESTART_GRACE,
    UNEXPLAINED,
    Action,
    ChaosPolicy,
    Fault,
    FaultRecord,
    choose_action,
    duplicate_cause,
    false_alarms,
    tally,
)

ALARM_KINDS = [EVICTED, SELF_FENCED]


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


def alarm(member: str, at: float, kind: str = EVICTED) -> LeaseAlarm:
    return LeaseAlarm(kind, member, at)


@given(kill_at=st.floats(0, 1e6), after=st.floats(0, 1e6), kind=st.sampled_from(ALARM_KINDS))
def test_a_killed_member_is_gone_for_good(kill_at: float, after: float, kind: str) -> None:
    faults = [FaultRecord(Fault.KILL, "client-1", kill_at)]
    assert false_alarms([alarm("client-1", kill_at + after, kind)], faults, stop_seconds=3) == []


@given(
    faults=st.lists(
        st.builds(
            FaultRecord,
            st.sampled_from([Fault.KILL, Fault.STOP, Fault.RESTART, Fault.START]),
            st.sampled_from(["client-1", "client-2"]),
            st.floats(0, 1000),
        )
    ),
    at=st.floats(0, 1000),
    kind=st.sampled_from(ALARM_KINDS),
)
def test_no_fault_of_another_member_explains_an_alarm(
    faults: list[FaultRecord], at: float, kind: str
) -> None:
    lapsed = alarm("client-3", at, kind)
    assert false_alarms([lapsed], faults, stop_seconds=3) == [lapsed]


def test_a_stop_explains_its_members_alarms_until_shortly_after_it_wakes() -> None:
    faults = [FaultRecord(Fault.STOP, "client-1", 100.0)]
    during = alarm("client-1", 101.0)
    woken = alarm("client-1", 103.0 + ALARM_GRACE - 0.1, SELF_FENCED)
    later = alarm("client-1", 103.0 + ALARM_GRACE + 0.1)
    before = alarm("client-1", 99.0)
    assert false_alarms([during, woken, later, before], faults, stop_seconds=3) == [
        later,
        before,
    ]


def test_a_broker_restart_explains_anyones_alarm_for_a_while() -> None:
    faults = [FaultRecord(Fault.BROKER_RESTART, None, 100.0)]
    soon = alarm("client-1", 100.0 + BROKER_RESTART_GRACE - 1, SELF_FENCED)
    late = alarm("client-2", 100.0 + BROKER_RESTART_GRACE + 1)
    assert false_alarms([soon, late], faults, stop_seconds=3) == [late]


def test_a_restart_explains_its_member_being_taken_for_gone_only_meanwhile() -> None:
    faults = [FaultRecord(Fault.RESTART, "client-2", 50.0)]
    meanwhile = alarm("client-2", 52.0)
    long_after = alarm("client-2", 50.0 + ALARM_GRACE + 1)
    assert false_alarms([meanwhile, long_after], faults, stop_seconds=3) == [long_after]
