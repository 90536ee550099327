"""The events stream's consumer limit: every queue of two generations fits (a resize keeps the
old queues until they are drained), and it is never below nats-server's default of 1000,
which refused a group of QC 1024."""

from hypothesis import given
from hypothesis import strategies as st

from lbg.broker.nats.adapter import SERVER_DEFAULT_CONSUMERS, consumer_limit
from lbg.model.group import MAX_HASH_COUNT, GroupConfig


@given(st.integers(1, MAX_HASH_COUNT), st.data())
def test_two_generations_of_any_valid_size_fit(hash_count: int, data: st.DataObject) -> None:
    old, new = (data.draw(st.integers(1, hash_count)) for _ in range(2))
    config = GroupConfig(hash_prefix="g", hash_count=hash_count, queue_count=old)
    assert consumer_limit(config) >= old + new
    assert consumer_limit(config) >= SERVER_DEFAULT_CONSUMERS


def test_qc_1024_is_allowed() -> None:
    config = GroupConfig(hash_prefix="g", hash_count=1024, queue_count=1024)
    assert consumer_limit(config) >= 1024 + 1024
