"""A group made before ownership epochs: clients refuse it in one line naming `cg-admin
upgrade`, which adds the missing store; then clients serve it (issue 27).

An "old" group is made by deleting the claim store after `cg-admin create`: NATS's shared
KV bucket `lbg_owners`, RabbitMQ's stream `lbg.<g>.owners`. Message DB keeps its claims in
the member position streams, which every group has: nothing to upgrade there. Solace's
claims queue is checked by test_solace_live.py (make test-solace).
"""

import asyncio
import subprocess
import time
import uuid
from collections.abc import Callable

import aio_pika
import pytest
from tests.support.processes import cli

from lbg.broker.nats.adapter import OWNERS_BUCKET, NatsBroker, events_stream
from lbg.broker.rabbitmq import topology
from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.deployment import script
from lbg.settings import BrokerSettings

STARTUP_LIMIT = 30.0
SERVING_FOR = 5.0


async def _forget_claims(broker: BrokerEndpoint, group: str) -> None:
    """Delete the group's claim store, as a group made by an older release lacks it."""
    if broker.kind == "nats":
        nats = await NatsBroker.connect(BrokerSettings(url=broker.url), "upgrade-test")
        try:
            await nats._js.delete_key_value(OWNERS_BUCKET)
        finally:
            await nats.close()
        return
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(topology.owners_stream_name(group))


def _client(broker: BrokerEndpoint, group: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            script("lbg-client"),
            "--broker-url",
            broker.url,
            *broker.config_args(),
            "--group",
            group,
            "--client-index",
            "0",
            "--client-count",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _upgrade(broker: BrokerEndpoint, group: str) -> str:
    args = ["cg-admin", "--broker-url", broker.url, *broker.admin_args(), "upgrade", group]
    return cli(*args).stdout


def test_an_old_group_is_refused_in_one_line_until_upgraded(
    broker: BrokerEndpoint, make_group: Callable[..., str]
) -> None:
    if broker.kind == "solace":
        pytest.skip("solace: test_solace_live.py upgrades a group without its claims queue")
    if broker.kind not in {"nats", "rabbitmq"}:
        pytest.skip(f"{broker.kind}: a group has no separate claim store to lack")
    group = make_group()
    asyncio.run(_forget_claims(broker, group))

    refused = _client(broker, group)
    _, stderr = refused.communicate(timeout=STARTUP_LIMIT)
    first = _upgrade(broker, group)
    again = _upgrade(broker, group)
    serving = _client(broker, group)
    time.sleep(SERVING_FOR)
    still_running = serving.poll() is None
    serving.terminate()
    _, late_stderr = serving.communicate(timeout=STARTUP_LIMIT)

    assert refused.returncode != 0
    errors = [line for line in stderr.splitlines() if "Traceback" in line or "upgrade" in line]
    assert len(errors) == 1 and f"`cg-admin upgrade {group}`" in errors[0], stderr
    assert "Traceback" not in stderr
    assert "owners" in first, first
    assert "nothing to add" in again or "owners stream" not in again, again
    assert still_running, late_stderr
    assert "upgrade" not in late_stderr, late_stderr


async def _consumer_limit(url: str, group: str, set_to: int | None = None) -> int:
    """The group's events stream's max_consumers; with `set_to`, set it first (-1: none, as
    an older release made it, which the server caps at its default of 1000)."""
    nats = await NatsBroker.connect(BrokerSettings(url=url), "upgrade-test")
    try:
        stream = (await nats._js.stream_info(events_stream(group))).config
        if set_to is not None:
            stream.max_consumers = set_to
            await nats._js.update_stream(stream)
        return int((await nats._js.stream_info(events_stream(group))).config.max_consumers)
    finally:
        await nats.close()


def test_upgrade_raises_an_old_nats_groups_consumer_cap(nats_url: str) -> None:
    group = f"cap{uuid.uuid4().hex[:8]}"
    cli("cg-admin", "--broker-url", nats_url, "create", "--group", group,
        "--hash-count", "600", "--queue-count", "4", "--queue-size", "1")  # fmt: skip
    made = asyncio.run(_consumer_limit(nats_url, group))
    asyncio.run(_consumer_limit(nats_url, group, set_to=-1))

    first = cli("cg-admin", "--broker-url", nats_url, "upgrade", group).stdout
    again = cli("cg-admin", "--broker-url", nats_url, "upgrade", group).stdout

    assert made == 1200  # two generations of buckets
    assert f"max_consumers {made}" in first, first
    assert asyncio.run(_consumer_limit(nats_url, group)) == made
    assert "nothing to add" in again, again
