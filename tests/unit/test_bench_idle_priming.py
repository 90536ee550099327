"""bench/idle.py --primed publishes one event to every queue, so every queue gets an owner the
broker knows: the keys it picks must reach each queue of any group shape exactly once."""

import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))

from idle import priming_keys
from lbg.model.group import GroupConfig


@given(
    queues=st.one_of(st.sampled_from([31, 62, 93, 961]), st.integers(min_value=1, max_value=128)),
    extra=st.integers(min_value=0, max_value=256),
    function=st.sampled_from(["java", "murmur2"]),
)
def test_the_priming_keys_reach_every_queue_once(queues: int, extra: int, function: str) -> None:
    config = GroupConfig(
        hash_prefix="hp", hash_count=queues + extra, queue_count=queues, hash_function=function
    )
    keys = priming_keys(config)
    assert [config.queue_for_key(key) for key in keys] == list(range(queues))
