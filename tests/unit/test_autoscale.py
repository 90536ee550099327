"""The autoscaler's rule: one step at a time, within bounds, never inside the cool-down."""

from hypothesis import given
from hypothesis import strategies as st

from lbg.devstack.scaling import AutoscalePolicy, decide

POLICY = AutoscalePolicy(minimum=1, maximum=4, high=100, low=10, cooldown=5)


@given(
    st.integers(min_value=0, max_value=8),
    st.integers(min_value=0, max_value=10_000),
    st.floats(min_value=0, max_value=100),
)
def test_one_step_within_bounds(clients: int, backlog: int, since: float) -> None:
    target = decide(POLICY, clients, backlog, since)
    assert POLICY.minimum <= target <= POLICY.maximum
    if POLICY.minimum <= clients <= POLICY.maximum:
        assert abs(target - clients) <= 1
        if since < POLICY.cooldown:
            assert target == clients


def test_scales_up_on_backlog_and_down_when_idle() -> None:
    assert decide(POLICY, 2, 500, since_last_change=60) == 3
    assert decide(POLICY, 4, 5000, since_last_change=60) == 4, "never above the maximum"
    assert decide(POLICY, 3, 0, since_last_change=60) == 2
    assert decide(POLICY, 1, 0, since_last_change=60) == 1, "never below the minimum"
    assert decide(POLICY, 2, 100, since_last_change=60) == 2, "between low and high: stay"


def test_the_cool_down_holds_a_change_back() -> None:
    assert decide(POLICY, 2, 500, since_last_change=1) == 2
    assert decide(POLICY, 0, 0, since_last_change=1) == 1, "bounds apply at once"
