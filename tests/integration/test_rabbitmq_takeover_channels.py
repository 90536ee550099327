"""RabbitMQ only: a member opens the channels a takeover needs (the epoch claim's, the
records') while it starts, so its first takeover waits for no channel to open (issue 19: each
opening is two broker round trips, tenths of a second on a loaded node, in the handover)."""

import asyncio
import os
import time

import pytest
from tests.support.rabbitmq import one_queue_group

from lbg.devstack.brokers import BrokerEndpoint
from lbg.model.destinations import OutputKind, event_destination, output_destination
from lbg.model.messages import event_headers

pytestmark = pytest.mark.skipif(
    "rabbitmq" not in os.environ.get("LBG_TEST_BROKERS", "nats,rabbitmq"),
    reason="RabbitMQ is not among LBG_TEST_BROKERS",
)


async def channels_opened_by_a_takeover(endpoint: BrokerEndpoint) -> tuple[int, int]:
    """Channels opened from the binding standing in line until its first record confirmed,
    and the taken-over delivery's ownership epoch."""
    async with one_queue_group(endpoint, "takeover-channels", "takeover-producer") as (
        group,
        config,
        (broker, producer),
    ):
        binding = await broker.bind(group, config, 0, "member")
        for _ in range(100):
            if binding.waiting and broker._warming is not None and broker._warming.done():
                break
            await asyncio.sleep(0.05)
        opened = 0
        open_channel = broker._open_channel

        async def counted(confirms: bool = False):
            nonlocal opened
            opened += 1
            return await open_channel(confirms)

        broker._open_channel = counted  # type: ignore[method-assign]
        event = event_destination(group, 0, "k")
        await producer.publish(event, b"{}", event_headers(1, time.time()))
        delivery = await asyncio.wait_for(binding.next(), 10)
        await broker.publish(output_destination(group, OutputKind.VALIDATION), b"{}")
        assert await binding.ack(delivery)
        await binding.close()
        return opened, delivery.owner_epoch


def test_a_first_takeover_opens_no_channel(rabbitmq: BrokerEndpoint) -> None:
    opened, epoch = asyncio.run(channels_opened_by_a_takeover(rabbitmq))

    assert epoch > 0, "the delivery went out without its stint's epoch"
    assert opened == 0, f"the takeover opened {opened} channel(s) on the way to its first record"
