"""RabbitMQ only: a member's peers ask the broker whether its heartbeat connection closed (an
exclusive queue per member), so that a crashed member is gone without waiting out its lease."""

import asyncio
import contextlib
import os
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
from tests.integration.test_rabbitmq_reconnect import drop_connections

from lbg.broker.base import Broker
from lbg.broker.rabbitmq.adapter import RabbitBroker
from lbg.broker.rabbitmq.presence import presence_queue_name
from lbg.devstack.brokers import BrokerEndpoint
from lbg.model.group import GroupConfig
from lbg.settings import BrokerSettings

pytestmark = pytest.mark.skipif(
    "rabbitmq" not in os.environ.get("LBG_TEST_BROKERS", "nats,rabbitmq"),
    reason="RabbitMQ is not among LBG_TEST_BROKERS",
)


async def eventually(probe: Callable[[], Awaitable[bool | None]], want: bool) -> bool | None:
    """The probe's answer once it is `want`, or its last answer after 5 s."""
    answer = None
    for _ in range(50):
        answer = await probe()
        if answer is want:
            break
        await asyncio.sleep(0.1)
    return answer


def holder_port(rabbitmq: BrokerEndpoint, group: str, member: str) -> int | None:
    """The client port of the connection holding `member`'s presence queue (None: no queue)."""
    url = urllib.parse.urlsplit(rabbitmq.url)
    auth = (urllib.parse.unquote(url.username or ""), urllib.parse.unquote(url.password or ""))
    path = "/api/queues/%2F/" + urllib.parse.quote(presence_queue_name(group, member), safe="")
    with httpx.Client(base_url=rabbitmq.admin_url, auth=auth, trust_env=False) as api:
        response = api.get(path)
    if response.status_code == 404:
        return None
    owner = response.raise_for_status().json()["owner_pid_details"]  # [] until its first stats
    return int(owner["peer_port"]) if owner else None


async def held_by_other_than(rabbitmq: BrokerEndpoint, group: str, port: int | None) -> int | None:
    """The port holding client-a's presence queue once it is not `port` (within 10 s)."""
    for _ in range(100):
        now = await asyncio.to_thread(holder_port, rabbitmq, group, "client-a")
        if now not in (None, port):
            return now
        await asyncio.sleep(0.1)
    return None


@contextlib.asynccontextmanager
async def two_members(rabbitmq: BrokerEndpoint) -> AsyncIterator[tuple[str, Broker, Broker]]:
    """A fresh group name and two connected members, closed on the way out."""
    settings = BrokerSettings(url=rabbitmq.url)
    first = await RabbitBroker.connect(settings, "first")
    second = await RabbitBroker.connect(settings, "second")
    try:
        yield f"t{uuid.uuid4().hex[:8]}", first, second
    finally:
        await first.close()
        await second.close()


def test_a_member_is_alive_while_its_connection_is_open_and_gone_once_it_closes(
    rabbitmq: BrokerEndpoint,
) -> None:
    async def scenario() -> None:
        async with two_members(rabbitmq) as (group, member, peer):
            assert await member.announce_presence(group, "client-a.1") is True
            assert await peer.probe_member(group, "client-a.1") is False
            assert await peer.probe_member(group, "client-b") is True, "never announced"
            too_long = "x" * 200  # its queue name would pass AMQP's 255 bytes
            assert await member.announce_presence(group, too_long) is False
            assert await peer.probe_member(group, too_long) is None
            await member.close()
            assert await eventually(lambda: peer.probe_member(group, "client-a.1"), True)

    asyncio.run(scenario())


def test_a_member_id_announced_twice_says_it_cannot_be_probed(rabbitmq: BrokerEndpoint) -> None:
    async def scenario() -> None:
        async with two_members(rabbitmq) as (group, first, second):
            assert await first.announce_presence(group, "client-a") is True
            assert await second.announce_presence(group, "client-a") is False
            assert await second.probe_member(group, "client-a") is False, "the first is alive"

    asyncio.run(scenario())


def test_a_member_whose_connection_dropped_is_told_and_present_again_once_back(
    rabbitmq: BrokerEndpoint,
) -> None:
    async def scenario() -> None:
        settings = BrokerSettings(url=rabbitmq.url, admin_url=rabbitmq.admin_url)
        group = f"t{uuid.uuid4().hex[:8]}"
        name = f"m{uuid.uuid4().hex[:6]}"  # its connections' names start with it
        member = await RabbitBroker.connect(settings, name)
        peer = await RabbitBroker.connect(settings, "peer")
        lost: list[str] = []
        await peer.create_group(group, GroupConfig(hash_prefix=group, hash_count=2, queue_count=2))
        try:
            unsubscribe = await member.subscribe_control(group, lambda _body: None)
            assert await member.announce_presence(group, "client-a") is True
            member.on_connection_lost(lambda: lost.append("lost"))
            before = await held_by_other_than(rabbitmq, group, None)
            await asyncio.to_thread(drop_connections, rabbitmq, {name})
            assert await held_by_other_than(rabbitmq, group, before), "not held again"
            assert lost, "the member was not told its heartbeat connection dropped"
            assert await peer.probe_member(group, "client-a") is False
            await unsubscribe()
        finally:
            await peer.delete_group(group)
            await member.close()
            await peer.close()

    asyncio.run(scenario())
