"""The bench's raw mode: its pipeline on the broker's own Python client, without lbg.

    publisher (broker acks) -> one shared queue -> N consumer processes (one record per
    event republished with acks, then the event acked) -> records -> reader (counts)

No per-key order, membership, fencing or dead letters: what nats-py or aio-pika alone reach
on the same broker is the yardstick for the sticky and competing modes. The publisher and
the consumers are this CLI's roles (separate processes, like the lbg daemons); the bench
creates the topology and reads the records in its own process.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

import click
import orjson
import uvloop

from raw_events import events, generated_keys
from raw_nats import RawNats
from raw_rabbitmq import RawRabbitMQ

BATCH = 250
IN_FLIGHT = 1000
WINDOW = 2000
READY = "consumer ready"


class RawBroker(Protocol):
    """What each broker's raw pipeline offers over one connection."""

    async def close(self) -> None: ...

    async def create(self) -> None: ...

    async def delete(self) -> None: ...

    async def publish(self, events: Iterable[tuple[str, dict[str, str]]], window: int) -> int: ...

    async def consume(
        self, client: str, batch: int, in_flight: int, ready: Callable[[], None]
    ) -> None: ...

    async def read(self, on_record: Callable[[bytes, float], None]) -> None: ...


def supports(kind: str) -> bool:
    """Whether there is a raw pipeline for this broker kind."""
    return kind in ("nats", "rabbitmq")


async def connect(url: str, name: str, connection_name: str) -> RawBroker:
    """The raw pipeline `name` on the broker at `url` (amqp:// is RabbitMQ, else NATS)."""
    if url.startswith(("amqp://", "amqps://")):
        return await RawRabbitMQ.connect(url, name, connection_name)
    return await RawNats.connect(url, name, connection_name)


def run_role(role: Callable[[], Awaitable[None]]) -> None:
    """Run one role on uvloop; SIGTERM ends it like Ctrl-C, with the connection closed."""

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await role()

    uvloop.run(main())


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--broker-url", required=True, help="nats://... or amqp://...")
@click.option("--name", required=True, help="The pipeline's name (the bench creates it).")
@click.pass_context
def cli(ctx: click.Context, broker_url: str, name: str) -> None:
    """One role of the raw pipeline."""
    ctx.obj = (broker_url, name)


@cli.command()
@click.option(
    "--keys", type=click.IntRange(min=1), default=200, show_default=True, help="Distinct keys."
)
@click.option("--count", type=click.IntRange(min=1), required=True, help="Events to publish.")
@click.option(
    "--window",
    type=click.IntRange(min=1),
    default=WINDOW,
    show_default=True,
    help="Publishes awaiting their ack at most.",
)
@click.pass_obj
def publish(obj: tuple[str, str], keys: int, count: int, window: int) -> None:
    """Publish COUNT events round-robin over fresh keys; print JSON stats on the last line."""
    url, name = obj

    async def role() -> None:
        broker = await connect(url, name, "raw-publisher")
        try:
            drawn = events(generated_keys(keys), count)
            started = time.monotonic()
            acked = await broker.publish(drawn, window)
            elapsed = time.monotonic() - started
        finally:
            await broker.close()
        stats = {
            "acked": acked,
            "elapsed_s": round(elapsed, 3),
            "rate_per_s": round(acked / elapsed, 1),
        }
        click.echo(orjson.dumps(stats))
        if acked != count:
            sys.exit(f"only {acked} of {count} events acknowledged")

    run_role(role)


@cli.command()
@click.option("--id", "client", required=True, help="Names this consumer in its records.")
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=BATCH,
    show_default=True,
    help="NATS: events per fetch.",
)
@click.option(
    "--in-flight",
    type=click.IntRange(min=1),
    default=IN_FLIGHT,
    show_default=True,
    help="Events taken but not yet acked (NATS: in batches of --batch; RabbitMQ: prefetch).",
)
@click.pass_obj
def consume(obj: tuple[str, str], client: str, batch: int, in_flight: int) -> None:
    """Republish one record per event, then ack it, until SIGTERM."""
    url, name = obj

    async def role() -> None:
        broker = await connect(url, name, client)
        try:
            await broker.consume(client, batch, in_flight, lambda: click.echo(READY, err=True))
        finally:
            await broker.close()

    run_role(role)


if __name__ == "__main__":
    cli()
