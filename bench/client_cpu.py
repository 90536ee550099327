"""A NATS client's CPU per event, in one process: the data path without the other processes.

A private nats-server, a group, a `HashedPublisher` that stores a backlog of events, then one
`LbgClient` (static or dynamic, the default handler) drains it; this process's CPU time from the
first processed event to the last, per event, is the figure. The machine's other work inflates
it less than the end-to-end rates of throughput.py, so it compares code versions (run each a few
times, alternating); `--profile` writes a cProfile of the drain for a closer look.
"""

from __future__ import annotations

import asyncio
import cProfile
import tempfile
import time
import uuid

import click
import uvloop

from lbg.broker import connect_broker
from lbg.client.client import LbgClient
from lbg.client.coordination import DynamicRole, Role, StaticRole
from lbg.devstack.embedded import EmbeddedNats
from lbg.handlers import republish
from lbg.model.group import GroupConfig
from lbg.publisher import HashedPublisher, cycle_keys, generated_keys
from lbg.settings import BrokerSettings

POLL_SECONDS = 0.01


async def drain(url: str, events: int, keys: int, role: Role, profile: str | None) -> None:
    """Publish `events` to a fresh group (QC 4, HC 64), then time one client draining them."""
    broker = await connect_broker(BrokerSettings(url=url), "client-cpu")
    name = f"cpu-{uuid.uuid4().hex[:8]}"
    await broker.create_group(name, GroupConfig(hash_prefix=name, hash_count=64, queue_count=4))
    config = await broker.read_group(name)
    publisher = HashedPublisher(broker, name, config, "pub", window=2000)
    await publisher.run(cycle_keys(generated_keys(keys)), count=events)
    client = LbgClient(broker, name, config, "c0", republish, role, cycle_seconds=1.0)
    stop = asyncio.Event()
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    running = asyncio.create_task(client.run(stop))
    while client.stats.processed == 0:
        await asyncio.sleep(POLL_SECONDS)
    first, cpu, wall = client.stats.processed, time.process_time(), time.monotonic()
    while client.stats.processed < events:
        await asyncio.sleep(POLL_SECONDS)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    counted = events - first
    click.echo(
        f"{events} events drained: {cpu / counted * 1e6:.0f} us CPU per event,"
        f" {counted / wall:,.0f} events/s (from the first processed event)"
    )
    stop.set()
    await running
    await broker.delete_group(name)
    await broker.close()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--events", type=click.IntRange(min=1000), default=30_000, show_default=True)
@click.option("--keys", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--dynamic", is_flag=True, help="A dynamic member (lease, hang watch), not static.")
@click.option("--profile", type=click.Path(dir_okay=False), help="Write a cProfile of the drain.")
def main(events: int, keys: int, dynamic: bool, profile: str | None) -> None:
    """One NATS client's CPU per event, draining a backlog in this process."""
    role: Role = DynamicRole() if dynamic else StaticRole(0, 1)
    with tempfile.TemporaryDirectory() as data, EmbeddedNats(data) as url:
        uvloop.run(drain(url, events, keys, role, profile))


if __name__ == "__main__":
    main()
