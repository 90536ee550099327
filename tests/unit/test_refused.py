"""A broker URL where nothing listens fails at once; anything else is left to the adapter."""

import asyncio
import socket

import pytest

from lbg.broker import connect_broker
from lbg.broker.base import BrokerError
from lbg.broker.refused import all_refused, endpoints
from lbg.devstack.embedded import free_port
from lbg.settings import BrokerSettings


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("nats://127.0.0.1:4333", [("127.0.0.1", 4333)]),
        ("nats://a,nats://b:4999", [("a", 4222), ("b", 4999)]),
        ("amqps://u:p@mq/%2F", [("mq", 5671)]),
        ("tcp://host", [("host", 55555)]),
        ("postgresql://u@db/x", [("db", 5432)]),
        ("postgresql://u@h1:5432,h2:5433/x", []),
        ("nats://127.0.0.1:notaport", []),
    ],
)
def test_endpoints(url: str, expected: list) -> None:
    assert endpoints(url) == expected


def test_a_free_port_is_refused_and_a_listening_one_is_not() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        port = listening.getsockname()[1]
        assert not asyncio.run(all_refused(f"nats://127.0.0.1:{port}"))
        assert not asyncio.run(
            all_refused(f"nats://127.0.0.1:{free_port()},nats://127.0.0.1:{port}")
        )
    assert asyncio.run(all_refused(f"nats://127.0.0.1:{free_port()}"))


def test_connecting_where_nothing_listens_fails_at_once_naming_the_url() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    with pytest.raises(BrokerError, match=f"^cannot connect to {url}: connection refused$"):
        asyncio.run(asyncio.wait_for(connect_broker(BrokerSettings(url=url), "t"), 2))
