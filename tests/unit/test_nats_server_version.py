"""A nats-server too old for pinned_client priority groups is refused at connect, by name.

Such a server (Debian 12 packages 2.9.10) accepts the group's consumers but drops their
priority fields, so without this check every pull of every client just times out.
"""

import asyncio

import orjson
import pytest

from lbg.broker import connect_broker
from lbg.broker.base import BrokerError
from lbg.broker.nats.jsapi import server_too_old
from lbg.settings import BrokerSettings


@pytest.mark.parametrize(
    ("version", "too_old"),
    [
        ("2.9.10", True),
        ("2.11.4", True),
        ("2.13.99", True),
        ("1.4.1", True),
        ("2.14.0", False),
        ("2.15.1", False),
        ("2.14.0-RC.1", False),
        ("v2.16.0", False),
        ("3.0.0", False),
        ("", False),
        ("dev", False),
    ],
)
def test_server_too_old(version: str, too_old: bool) -> None:
    assert server_too_old(version) is too_old


async def _connect_to_a_server_announcing(version: str) -> str:
    """Speak just enough of the NATS protocol (INFO, then PONG to PING) to announce a version."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        info = {"server_id": "old", "version": version, "proto": 1, "max_payload": 1 << 20}
        writer.write(b"INFO " + orjson.dumps(info) + b"\r\n")
        while line := await reader.readline():
            if line.startswith(b"PING"):
                writer.write(b"PONG\r\n")
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"nats://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        try:
            broker = await connect_broker(BrokerSettings(url=url, connect_timeout=3), "t")
        except BrokerError as refused:
            return str(refused).replace(url, "URL")
        await broker.close()
        return "connected"


def test_an_old_server_is_refused_naming_its_version() -> None:
    assert asyncio.run(_connect_to_a_server_announcing("2.9.10")) == (
        "URL runs nats-server 2.9.10; sticky-lbg needs 2.14 or newer"
        " (pinned_client priority groups, consumer reset)"
    )


def test_a_current_server_is_not_refused() -> None:
    assert asyncio.run(_connect_to_a_server_announcing("2.15.1")) == "connected"
