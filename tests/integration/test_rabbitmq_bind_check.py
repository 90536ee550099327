"""RabbitMQ only: a client checks that its group's queues exist before binding them, all in
one round trip, and names the queue that is missing."""

import asyncio
import os
import uuid

import aio_pika
import pytest

from lbg.broker.base import BrokerError
from lbg.broker.rabbitmq.adapter import RabbitBroker
from lbg.broker.rabbitmq.topology import queue_name
from lbg.devstack.brokers import BrokerEndpoint
from lbg.model.group import GroupConfig
from lbg.settings import BrokerSettings

pytestmark = pytest.mark.skipif(
    "rabbitmq" not in os.environ.get("LBG_TEST_BROKERS", "nats,rabbitmq"),
    reason="RabbitMQ is not among LBG_TEST_BROKERS",
)


def test_binding_names_a_missing_queue_of_the_group_and_binds_a_whole_one(
    rabbitmq: BrokerEndpoint,
) -> None:
    async def scenario() -> None:
        settings = BrokerSettings(url=rabbitmq.url, admin_url=rabbitmq.admin_url)
        broker = await RabbitBroker.connect(settings, "checker")
        whole, broken = f"t{uuid.uuid4().hex[:8]}", f"t{uuid.uuid4().hex[:8]}"
        configs = {
            name: GroupConfig(hash_prefix=name, hash_count=8, queue_count=8)
            for name in (whole, broken)
        }
        for name, config in configs.items():
            await broker.create_group(name, config)
        try:
            connection = await aio_pika.connect(rabbitmq.url)
            try:
                channel = await connection.channel()
                await channel.queue_delete(queue_name(broken, 5))
            finally:
                await connection.close()
            with pytest.raises(BrokerError, match=f"queue '{queue_name(broken, 5)}' does not"):
                await broker.bind(broken, configs[broken], 0, "c1")
            bindings = [await broker.bind(whole, configs[whole], q, "c1") for q in range(8)]
            assert [binding.queue for binding in bindings] == list(range(8))
            for binding in bindings:
                await binding.close()
        finally:
            for name in (whole, broken):
                await broker.delete_group(name)
            await broker.close()

    asyncio.run(scenario())
