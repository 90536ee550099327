"""A RabbitMQ connection that closes while a channel opens on it is the broker's trouble (a
BrokerError the heartbeat loop rides out), not a RuntimeError that ends the member: aiormq
raises `RuntimeError('<Connection ...> closed')` there, and a QC 256 x 8 idle run under load
lost a client to it ("membership loop heartbeat ended")."""

import asyncio

import pytest

from lbg.broker.base import BrokerError
from lbg.broker.rabbitmq.adapter import RabbitBroker
from lbg.settings import BrokerSettings


class ClosingConnection:
    """A connection that looked open, and closed as a channel was asked of it."""

    is_closed = False

    def __init__(self) -> None:
        self.connected = asyncio.Event()
        self.connected.set()

    async def channel(self, **_: object) -> None:
        raise RuntimeError(f"{self!r} closed")

    async def close(self) -> None:
        pass


def test_a_heartbeat_on_a_connection_closing_under_it_is_a_broker_error() -> None:
    async def beat() -> None:
        broker = RabbitBroker(BrokerSettings(url="amqp://127.0.0.1:1/"), "member")
        for kept in (broker._connection, broker._control):  # its queues' and its heartbeats'
            kept._connection = ClosingConnection()  # type: ignore[assignment]
        try:
            with pytest.raises(BrokerError, match="heartbeat not sent"):
                await broker.publish_control("g", b"beat")
        finally:
            await broker.close()

    asyncio.run(beat())
