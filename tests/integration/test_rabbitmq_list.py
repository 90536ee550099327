"""RabbitMQ only: cg-admin's list finds a group however many other queues the vhost holds
(the management API answers in pages of 500; two groups of QC 256 fill one)."""

import asyncio
import os
import uuid

import aio_pika
import pytest
from tests.support.rabbitmq import one_queue_group

from lbg.devstack.brokers import BrokerEndpoint

pytestmark = pytest.mark.skipif(
    "rabbitmq" not in os.environ.get("LBG_TEST_BROKERS", "nats,rabbitmq"),
    reason="RabbitMQ is not among LBG_TEST_BROKERS",
)
OTHER_QUEUES = 600


def test_a_group_is_listed_behind_more_than_a_page_of_other_queues(
    rabbitmq: BrokerEndpoint,
) -> None:
    async def scenario() -> None:
        async with one_queue_group(rabbitmq, "lister") as (group, config, (admin,)):
            connection = await aio_pika.connect(rabbitmq.url)
            try:
                channel = await connection.channel()
                # Named to sort before the group's own queues; gone with the connection.
                tag = uuid.uuid4().hex[:6]
                for n in range(OTHER_QUEUES):
                    await channel.declare_queue(f"lbg.a{tag}{n:04d}", exclusive=True)
                assert (await admin.list_groups())[group] == config
            finally:
                await connection.close()

    asyncio.run(scenario())
