"""RabbitMQ only: acks are cumulative (the contiguous finished floor, basic.ack `multiple`),
and a stint that ends still acks what it finished before its channel closes, so the next
owner gets only what was never processed (dropped, they came again as duplicates)."""

import asyncio
import os
import time

import pytest
from tests.support.rabbitmq import one_queue_group

from lbg.devstack.brokers import BrokerEndpoint
from lbg.model.destinations import event_destination
from lbg.model.messages import event_headers

pytestmark = pytest.mark.skipif(
    "rabbitmq" not in os.environ.get("LBG_TEST_BROKERS", "nats,rabbitmq"),
    reason="RabbitMQ is not among LBG_TEST_BROKERS",
)


async def bodies_the_next_owner_gets(endpoint: BrokerEndpoint) -> list[bytes]:
    """Three events; the first owner finishes the second and the first, then is fenced at
    once (no turn of the event loop between); what does the next owner receive?"""
    async with one_queue_group(endpoint, "floor-first", "floor-second") as (group, config, brokers):
        first, second = brokers
        owner = await first.bind(group, config, 0, "first")
        for n in range(3):
            await first.publish(
                event_destination(group, 0, "k"), b"%d" % n, event_headers(n, time.time())
            )
        deliveries = [await asyncio.wait_for(owner.next(), 10) for _ in range(3)]
        assert [d.body for d in deliveries] == [b"0", b"1", b"2"]
        assert await owner.ack(deliveries[1])
        assert await owner.ack(deliveries[0])
        owner.fence("fenced with two deliveries finished and their ack not yet sent")
        await owner.close()
        successor = await second.bind(group, config, 0, "second")
        got = [(await asyncio.wait_for(successor.next(), 10)).body]
        with pytest.raises(TimeoutError):
            got.append((await asyncio.wait_for(successor.next(), 1.0)).body)
        await successor.close()
        return got


def test_a_fenced_stint_acks_what_it_finished_before_its_channel_closes(
    rabbitmq: BrokerEndpoint,
) -> None:
    assert asyncio.run(bodies_the_next_owner_gets(rabbitmq)) == [b"2"]
