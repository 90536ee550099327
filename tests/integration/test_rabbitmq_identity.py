"""RabbitMQ only: cg-admin gives the client identity (CU) access to its own group and nothing
else (no other group's queues, no events: it only consumes and writes outputs and heartbeats),
and removes it with the last group that uses it."""

import asyncio
import os
import subprocess
import uuid

import aio_pika
import aiormq.exceptions
import pytest
from aio_pika.abc import AbstractIncomingMessage
from yarl import URL

from lbg.broker import connect_broker
from lbg.broker.base import BrokerError, PublishError
from lbg.broker.rabbitmq.topology import queue_name
from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.deployment import script
from lbg.model.destinations import OutputKind, event_destination, output_destination
from lbg.settings import BrokerSettings

pytestmark = pytest.mark.skipif(
    "rabbitmq" not in os.environ.get("LBG_TEST_BROKERS", "nats,rabbitmq"),
    reason="RabbitMQ is not among LBG_TEST_BROKERS",
)


def admin(rabbitmq: BrokerEndpoint, *args: str, password: str | None = None) -> str:
    env = dict(os.environ, LBG_CLIENT_PASSWORD=password or "")
    result = subprocess.run(
        [script("cg-admin"), "--broker-url", rabbitmq.url, *rabbitmq.admin_args(), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def as_user(rabbitmq: BrokerEndpoint, user: str, password: str) -> str:
    return str(URL(rabbitmq.url).with_user(user).with_password(password))


async def ignore(message: AbstractIncomingMessage) -> None:
    """A consumer callback for probes that expect no message."""


async def consume_refusal(url: str, queue: str) -> str:
    """Try to consume `queue` as the identity at `url`: the broker's refusal, or "allowed"."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        target = await channel.get_queue(queue, ensure=False)
        await target.consume(ignore)
        return "allowed"
    except aiormq.exceptions.ChannelAccessRefused as exc:
        return str(exc)
    finally:
        await connection.close()


async def probe(url: str, own: str, other: str) -> dict[str, str]:
    """What the identity at `url` may do on its own group and on another one."""
    outcome: dict[str, str] = {}
    broker = await connect_broker(BrokerSettings(url=url), "identity-probe")
    try:
        config = await broker.read_group(own)
        binding = await broker.bind(own, config, 0, "probe")
        await binding.close()
        await broker.publish(output_destination(own, OutputKind.VALIDATION), b"{}")
        heard: asyncio.Queue[bytes] = asyncio.Queue()
        unsubscribe = await broker.subscribe_control(own, heard.put_nowait)
        await broker.publish_control(own, b"beat")
        assert await asyncio.wait_for(heard.get(), 5) == b"beat"
        await unsubscribe()
        outcome["own"] = "ok"
        try:
            await broker.publish(event_destination(config.hash_prefix, 0, "k"), b"{}")
            outcome["publish event"] = "allowed"
        except PublishError as exc:
            outcome["publish event"] = str(exc)
        outcome["consume other"] = await consume_refusal(url, queue_name(other, 0))
        try:
            await broker.read_group(other)
            outcome["read other"] = "allowed"
        except BrokerError as exc:
            outcome["read other"] = str(exc)
        try:
            await broker.publish(output_destination(other, OutputKind.VALIDATION), b"{}")
            outcome["publish other"] = "allowed"
        except PublishError as exc:
            outcome["publish other"] = str(exc)
    finally:
        await broker.close()
    return outcome


def test_client_identity_reaches_its_group_only_and_goes_with_it(
    rabbitmq: BrokerEndpoint,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    own, other, user = f"own{suffix}", f"other{suffix}", f"cu{suffix}"
    admin(
        rabbitmq,
        "create",
        "--group",
        own,
        "--hash-prefix",
        own,
        "--client-username",
        user,
        password="s3cret",
    )
    admin(rabbitmq, "create", "--group", other, "--hash-prefix", other)
    try:
        stored = admin(rabbitmq, "list", "--json")
        assert own in stored and "s3cret" not in stored, "the client password is in a group config"
        outcome = asyncio.run(probe(as_user(rabbitmq, user, "s3cret"), own, other))
        assert outcome["own"] == "ok"
        assert "not allowed" in outcome["read other"]
        assert outcome["publish other"] != "allowed"
        assert "ACCESS_REFUSED" in outcome["publish event"]
        assert f"access to queue '{queue_name(other, 0)}'" in outcome["consume other"]
        assert "refused" in outcome["consume other"]
    finally:
        admin(rabbitmq, "delete", own)
        admin(rabbitmq, "delete", other)

    with pytest.raises(BrokerError, match="cannot connect"):
        asyncio.run(
            connect_broker(
                BrokerSettings(url=as_user(rabbitmq, user, "s3cret"), connect_timeout=1), "gone"
            )
        )
