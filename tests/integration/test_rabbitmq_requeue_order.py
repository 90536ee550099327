"""RabbitMQ only: what a planned release relies on. A single-active-consumer quorum queue whose
active consumer closes its channel with deliveries unacked (some acked out of order, as key
lanes do) gives exactly the unacked ones to the next consumer in line, in their original order
and ahead of what was published later."""

import asyncio
import os
import uuid

import aio_pika
import pytest

from lbg.devstack.brokers import BrokerEndpoint

pytestmark = pytest.mark.skipif(
    "rabbitmq" not in os.environ.get("LBG_TEST_BROKERS", "nats,rabbitmq"),
    reason="RabbitMQ is not among LBG_TEST_BROKERS",
)

EVENTS = 60
KEYS = 6


async def _received(queue: aio_pika.abc.AbstractQueue, tag: str, into: list) -> None:
    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        into.append(message)

    await queue.consume(on_message, consumer_tag=tag)


async def _wait_for(items: list, count: int, seconds: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while len(items) < count and loop.time() < deadline:
        await asyncio.sleep(0.02)


async def _requeue_order(url: str) -> tuple[list[int], list[int]]:
    connection = await aio_pika.connect(url)
    name = f"lbg-test-requeue-{uuid.uuid4().hex[:8]}"
    try:
        setup = await connection.channel(publisher_confirms=True)
        args = {"x-queue-type": "quorum", "x-single-active-consumer": True}
        await setup.declare_queue(name, durable=True, arguments=args)

        async def publish(numbers: range) -> None:
            for n in numbers:
                await setup.default_exchange.publish(aio_pika.Message(str(n).encode()), name)

        await publish(range(EVENTS))
        first_channel = await connection.channel()
        await first_channel.set_qos(prefetch_count=EVENTS)
        first: list = []
        await _received(await first_channel.get_queue(name, ensure=False), "first", first)
        second_channel = await connection.channel()
        await second_channel.set_qos(prefetch_count=EVENTS)
        second: list = []
        await _received(await second_channel.get_queue(name, ensure=False), "second", second)
        await _wait_for(first, EVENTS)
        assert [int(m.body) for m in first] == list(range(EVENTS))
        # Each key (n % KEYS) had a prefix of its events processed: key k its first k events.
        acked = [n for n in range(EVENTS) if n // KEYS < n % KEYS]
        for n in reversed(acked):
            await first[n].ack()
        await first_channel.close()
        await publish(range(EVENTS, EVENTS + 10))
        expected = [n for n in range(EVENTS + 10) if n not in set(acked)]
        await _wait_for(second, len(expected))
        return [int(m.body) for m in second], expected
    finally:
        channel = await connection.channel()
        await channel.queue_delete(name)
        await connection.close()


def test_a_closed_channel_gives_back_its_unacked_deliveries_in_order(
    rabbitmq: BrokerEndpoint,
) -> None:
    got, expected = asyncio.run(_requeue_order(rabbitmq.url))

    assert got == expected
