"""The floor under an idle member, written on the broker's own Python client (no lbg code).

One process per member: it publishes a heartbeat-sized body to its group every interval and
hears every member's, as an lbg member does, on the same broker, through the client library
a user would pick (nats-py core subjects, aio-pika's fanout exchange and exclusive queue,
asyncpg's LISTEN and pg_notify). Message DB cannot push events, so there each process also
reads its category every poll, as any idle Message DB consumer does. What lbg's idle members
cost beyond this is the design's own (idle.py prints both).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Protocol
from urllib.parse import urlsplit

import aio_pika
import asyncpg
import click
import nats
import uvloop
from aio_pika.abc import AbstractConnection, AbstractExchange, AbstractIncomingMessage

READY = "raw member ready"
# The size of an lbg heartbeat of an idle member that says nothing new (about 80-90 bytes).
BODY_BYTES = 84
# How often an idle Message DB consumer reads its category: lbg's clients' interval (on their
# heartbeats' beat; Eventide's default poll is 0.1 s), so the floor reads as often as they do.
POLL_SECONDS = 0.15


class Beats(Protocol):
    """One member's heartbeat channel on one broker."""

    async def publish(self, body: bytes) -> None: ...

    async def close(self) -> None: ...


class NatsBeats:
    """Core NATS: one subject every member publishes to and subscribes to."""

    def __init__(self, nc: nats.NATS, subject: str) -> None:
        self._nc, self._subject = nc, subject

    @classmethod
    async def open(cls, url: str, name: str, heard: Callable[[], None]) -> NatsBeats:
        nc = await nats.connect(url)
        subject = f"_raw.{name}.beats"

        async def on_beat(_msg: object) -> None:
            heard()

        await nc.subscribe(subject, cb=on_beat)
        await nc.flush()  # the server has the subscription before any member's first beat
        return cls(nc, subject)

    async def publish(self, body: bytes) -> None:
        await self._nc.publish(self._subject, body)

    async def close(self) -> None:
        await self._nc.close()


class RabbitBeats:
    """RabbitMQ: a fanout exchange, and an exclusive queue per member bound to it."""

    def __init__(self, connection: AbstractConnection, exchange: AbstractExchange) -> None:
        self._connection, self._exchange = connection, exchange

    @classmethod
    async def open(cls, url: str, name: str, heard: Callable[[], None]) -> RabbitBeats:
        connection = await aio_pika.connect(url)
        channel = await connection.channel()
        exchange = await channel.declare_exchange(
            f"raw.{name}.beats", aio_pika.ExchangeType.FANOUT, auto_delete=True
        )
        queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        await queue.bind(exchange)

        async def on_beat(_message: AbstractIncomingMessage) -> None:
            heard()

        await queue.consume(on_beat, no_ack=True)
        return cls(connection, exchange)

    async def publish(self, body: bytes) -> None:
        await self._exchange.publish(aio_pika.Message(body), routing_key="")

    async def close(self) -> None:
        await self._connection.close()


class PostgresBeats:
    """Message DB: LISTEN and pg_notify on a channel of the group, and a reader that reads
    the category every POLL_SECONDS (Message DB has no push)."""

    def __init__(self, connections: list[asyncpg.Connection], channel: str, category: str) -> None:
        self._listener, self._sender, self._reader = connections
        self._channel = channel
        self._poller = asyncio.create_task(self._poll(category))

    @classmethod
    async def open(cls, url: str, name: str, heard: Callable[[], None]) -> PostgresBeats:
        settings = {"search_path": "message_store,public"}
        connections = [await asyncpg.connect(url, server_settings=settings) for _ in range(3)]
        channel = f"raw_{name}_beats"
        await connections[0].add_listener(channel, lambda *_: heard())
        return cls(connections, channel, f"raw{name}")

    async def _poll(self, category: str) -> None:
        while True:
            await self._reader.fetch(
                "SELECT * FROM message_store.get_category_messages($1, 1, 100)", category
            )
            await asyncio.sleep(POLL_SECONDS)

    async def publish(self, body: bytes) -> None:
        await self._sender.execute("SELECT pg_notify($1, $2)", self._channel, body.hex())

    async def close(self) -> None:
        self._poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._poller
        for conn in (self._listener, self._sender, self._reader):
            await conn.close()


CONNECT: dict[str, Callable[[str, str, Callable[[], None]], Awaitable[Beats]]] = {
    "nats": NatsBeats.open,
    "amqp": RabbitBeats.open,
    "postgresql": PostgresBeats.open,
}


async def run_member(url: str, name: str, interval: float) -> None:
    """Beat every interval and count what is heard, until SIGTERM."""
    heard = 0

    def count() -> None:
        nonlocal heard
        heard += 1

    beats = await CONNECT[urlsplit(url).scheme](url, name, count)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print(READY, flush=True)
    body = os.urandom(BODY_BYTES)
    try:
        while not stop.is_set():
            await beats.publish(body)
            await asyncio.sleep(interval)
    finally:
        await beats.close()
    print(f"heard {heard} beats", flush=True)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--broker-url", required=True, help="nats://, amqp:// or postgresql:// URL.")
@click.option("--name", required=True, help="The raw group: members of one name hear each other.")
@click.option("--interval", default=0.15, show_default=True, type=click.FloatRange(min=0.01),
              help="Seconds between a member's heartbeats (lbg's heartbeat_interval).")  # fmt: skip
def main(broker_url: str, name: str, interval: float) -> None:
    """One raw idle member: heartbeats out and in on the broker's own client."""
    if urlsplit(broker_url).scheme not in CONNECT:
        sys.exit(f"--broker-url: expected one of {', '.join(CONNECT)}, got {broker_url!r}")
    uvloop.run(run_member(broker_url, name, interval))


if __name__ == "__main__":
    main()
