"""A fresh one-queue RabbitMQ group for the adapter's own tests, with a connection per name."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

from lbg.broker.rabbitmq.adapter import RabbitBroker
from lbg.devstack.brokers import BrokerEndpoint
from lbg.model.group import GroupConfig
from lbg.settings import BrokerSettings


@contextlib.asynccontextmanager
async def one_queue_group(
    endpoint: BrokerEndpoint, *names: str
) -> AsyncIterator[tuple[str, GroupConfig, list[RabbitBroker]]]:
    """The group's name, its config (one queue, one bucket) and a connected broker per name;
    the group is deleted and the connections closed afterwards."""
    settings = BrokerSettings(url=endpoint.url, admin_url=endpoint.admin_url)
    brokers = [await RabbitBroker.connect(settings, name) for name in names]
    group = f"t{uuid.uuid4().hex[:8]}"
    config = GroupConfig(hash_prefix=group, hash_count=1, queue_count=1)
    await brokers[0].create_group(group, config)
    try:
        yield group, config, brokers
    finally:
        await brokers[0].delete_group(group)
        for broker in brokers:
            await broker.close()
