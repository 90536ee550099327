"""NatsBroker.read_group turns what nats-py raises while JetStream restarts into one BrokerError,
so the client's config follower (which expects BrokerError) keeps following the group."""

import asyncio

import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.js.errors import KeyNotFoundError

from lbg.broker.base import BrokerError, GroupNotFound
from lbg.broker.nats.adapter import CONFIG_BUCKET, NatsBroker
from lbg.broker.nats.connection import ConnectionLog


class Configs:
    """A config bucket whose reads fail as nats-py's do."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def get(self, key: str) -> None:
        raise self.error


def read_with(error: Exception) -> None:
    async def main() -> None:
        broker = NatsBroker(Client(), ConnectionLog())
        broker._kv[CONFIG_BUCKET] = Configs(error)  # type: ignore[assignment]
        await broker.read_group("orders")

    asyncio.run(main())


def test_no_responders_while_jetstream_restarts_is_a_broker_error() -> None:
    with pytest.raises(BrokerError, match=r"cannot read its config \(nats: no responders"):
        read_with(NoRespondersError())


def test_a_missing_config_is_still_group_not_found() -> None:
    with pytest.raises(GroupNotFound):
        read_with(KeyNotFoundError())
