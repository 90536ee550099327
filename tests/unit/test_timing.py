"""model/timing.py: the heartbeat timing's rules, each broker's defaults, a config's overrides."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbg.broker.adapters import RABBITMQ_TIMING, heartbeat_timing
from lbg.model.lease import LeaseTerms
from lbg.model.timing import DEFAULT_TIMING, HeartbeatTiming

seconds = st.floats(0.001, 10.0)


@given(interval=seconds, lease=seconds, margin=seconds)
def test_a_timing_that_passes_its_check_is_one_the_lease_model_accepts(
    interval: float, lease: float, margin: float
) -> None:
    timing = HeartbeatTiming(interval, lease, margin)
    try:
        timing.check()
    except ValueError as exc:
        assert str(exc).partition(":")[0] in ("lease", "lease_margin")
        return
    terms = LeaseTerms(lease, margin)  # raises if 2 x margin >= lease
    assert terms.fence_delay >= 2 * interval, "a live member fences before two heartbeats"
    assert interval < 2 * margin, "its own heartbeat may come back within 2 x margin"


def test_every_adapters_default_timing_passes_its_check() -> None:
    for url in ("nats://h", "amqp://h", "amqps://h", "postgresql://h", "tcp://h", "memory://"):
        heartbeat_timing(url).check()


def test_rabbitmq_members_beat_less_often_than_the_others_by_default() -> None:
    assert heartbeat_timing("amqp://guest@h:5672/%2F") == RABBITMQ_TIMING
    assert heartbeat_timing("nats://h:4222") == DEFAULT_TIMING
    assert heartbeat_timing("postgresql://h/db") == DEFAULT_TIMING
    assert RABBITMQ_TIMING.interval > DEFAULT_TIMING.interval


def test_a_config_overrides_any_default_and_the_rest_still_apply() -> None:
    assert RABBITMQ_TIMING.given(0.3, None, None) == HeartbeatTiming(0.3, 1.5, 0.3)
    assert DEFAULT_TIMING.given(None, 0.9, None) == HeartbeatTiming(0.15, 0.9, 0.15)
    with pytest.raises(ValueError, match=r"^lease: must be >= 3 x heartbeat_interval \(0.9\)"):
        DEFAULT_TIMING.given(0.3, None, None)
