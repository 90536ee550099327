"""The generations of a resizable group (model/generations.py): which queue reads which old
member, which old members carried a stint's buckets, and which new sizes are refused."""

import asyncio
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbg.broker.base import BrokerError
from lbg.broker.memory.adapter import MemoryBroker
from lbg.broker.memory.store import MemoryStore
from lbg.broker.rabbitmq.adapter import RabbitBroker
from lbg.model import generations
from lbg.model.generations import Generation, members_for, sources
from lbg.model.group import GroupConfig
from lbg.settings import BrokerSettings


@given(st.integers(1, 12), st.integers(1, 12))
def test_every_old_member_is_read_by_exactly_one_queue_of_the_new_size(old: int, new: int) -> None:
    generation = Generation(0, old, 1, 100)
    readers = [
        q for member in range(old) for q in range(new) if member in members_for(q, generation, new)
    ]
    assert sorted(readers) == sorted(
        {m: q for q in range(new) for m in members_for(q, generation, new)}.values()
    )
    assert len(readers) == old


@given(st.integers(1, 12), st.integers(1, 12), st.integers(12, 48))
def test_a_stints_sources_are_the_old_members_that_carried_its_buckets(
    old: int, new: int, hash_count: int
) -> None:
    generation = Generation(0, old, 1, 100)
    for queue in range(new):
        buckets = list(range(queue, hash_count, new))
        assert set(sources(buckets, generation)) == {b % old for b in buckets}


def test_a_switch_ends_the_current_generation_and_starts_the_next_after_it() -> None:
    history = generations.switched([Generation(0, 4, 1, None)], 8, 500)
    assert history == [Generation(0, 4, 1, 500), Generation(1, 8, 501, None)]
    assert generations.decode(generations.encode(history)) == history


def test_a_bad_stored_history_is_one_line() -> None:
    with pytest.raises(ValueError, match="stored generations are invalid"):
        generations.decode(b'[["x"]]')


@pytest.mark.parametrize(
    ("queues", "divide", "message"),
    [
        (4, False, "has 4 queues already"),
        (25, False, "must be 1..HC (hash count) 24"),
        (0, False, "must be 1..HC (hash count) 24"),
        (5, True, "must divide HC (hash count) 24"),
    ],
)
def test_a_size_the_hash_cannot_take_is_refused(queues: int, divide: bool, message: str) -> None:
    config = GroupConfig(hash_prefix="p", hash_count=24, queue_count=4)
    with pytest.raises(ValueError, match=re.escape(message)):
        generations.check_queue_count("g", config, queues, divide)
    generations.check_queue_count("g", config, 5, divide=False)


def test_a_broker_that_cannot_resize_says_which_can() -> None:
    broker = MemoryBroker(MemoryStore("resize"), "admin", 1.0)
    with pytest.raises(BrokerError, match=r"only NATS JetStream groups .* or Message DB groups"):
        asyncio.run(broker.resize_group("g", 2))


def test_rabbitmq_refuses_a_resize_in_one_line_saying_why() -> None:
    async def refuse() -> str:
        broker = RabbitBroker(BrokerSettings(url="amqp://127.0.0.1:1/"), "admin")
        try:
            with pytest.raises(BrokerError) as refused:
                await broker.resize_group("g", 8)
        finally:
            await broker.close()
        return str(refused.value)

    message = asyncio.run(refuse())
    assert "\n" not in message
    assert "RabbitMQ groups cannot be resized safely" in message
    assert "share no sequence" in message
