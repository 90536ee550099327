"""RabbitMQ only: `cg-admin grant-publisher` lets a publisher identity publish its group's
events and summary and nothing else (no other group, no outputs of its own, no consuming);
`revoke-publisher` takes that back, with the user if grant-publisher created it."""

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
from lbg.broker.rabbitmq.management import ManagementApi, NotFound
from lbg.broker.rabbitmq.topology import exchange_name, output_queue_name, queue_name
from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.deployment import script
from lbg.model.destinations import OutputKind, output_destination
from lbg.settings import BrokerSettings

pytestmark = pytest.mark.skipif(
    "rabbitmq" not in os.environ.get("LBG_TEST_BROKERS", "nats,rabbitmq"),
    reason="RabbitMQ is not among LBG_TEST_BROKERS",
)

EVENTS = 30
PUBLISH_ARGS = ("--count", str(EVENTS), "--keys", "5", "--summary")


def admin(
    rabbitmq: BrokerEndpoint, *args: str, password: str = "", ok: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run cg-admin as the admin identity; `ok` says whether it must succeed or fail."""
    result = subprocess.run(
        [script("cg-admin"), "--broker-url", rabbitmq.url, *rabbitmq.admin_args(), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, LBG_PUBLISHER_PASSWORD=password),
        check=False,
    )
    assert (result.returncode == 0) is ok, result.stderr
    return result


def as_user(rabbitmq: BrokerEndpoint, user: str, password: str) -> str:
    return str(URL(rabbitmq.url).with_user(user).with_password(password))


def management(rabbitmq: BrokerEndpoint) -> ManagementApi:
    url = URL(rabbitmq.url)
    base = rabbitmq.admin_url or f"http://{url.host}:15672"
    return ManagementApi(base, url.user or "guest", url.password or "guest")


def create_groups(rabbitmq: BrokerEndpoint, *names: str) -> None:
    for name in names:
        admin(rabbitmq, "create", "--group", name, "--hash-prefix", name, "--queue-count", "2")


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


async def publish_refusal(url: str, exchange: str, key: str) -> str:
    """Publish one confirmed message as the identity at `url`: the refusal, or "allowed"."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        target = await channel.get_exchange(exchange, ensure=False)
        await target.publish(aio_pika.Message(b"{}"), key)
        return "allowed"
    except (aiormq.exceptions.ChannelAccessRefused, aiormq.exceptions.ChannelClosed) as exc:
        return str(exc)
    finally:
        await connection.close()


async def refusal(publish) -> str:
    try:
        await publish
        return "allowed"
    except PublishError as exc:
        return str(exc)


async def probe(url: str, own: str, other: str) -> dict[str, str]:
    """What the publisher identity at `url` may do beyond publishing its group's events."""
    outcome: dict[str, str] = {}
    broker = await connect_broker(BrokerSettings(url=url), "publisher-probe")
    try:
        await broker.read_group(own)
        for kind in (OutputKind.VALIDATION, OutputKind.DEAD):
            destination = output_destination(own, kind)
            outcome[f"publish {kind}"] = await refusal(broker.publish(destination, b"{}"))
        summary = output_destination(other, OutputKind.SUMMARY)
        outcome["publish other summary"] = await refusal(broker.publish(summary, b"{}"))
        try:
            await broker.read_group(other)
            outcome["read other"] = "allowed"
        except BrokerError as exc:
            outcome["read other"] = str(exc)
    finally:
        await broker.close()
    outcome["publish other event"] = await publish_refusal(
        url, exchange_name(other), f"{other}.0.k"
    )
    outcome["publish heartbeat"] = await publish_refusal(
        url, exchange_name(own), f"_lbgctl.{own}.m"
    )
    outcome["consume own queue"] = await consume_refusal(url, queue_name(own, 0))
    outcome["consume own output"] = await consume_refusal(url, output_queue_name(own))
    return outcome


async def arrived(rabbitmq: BrokerEndpoint, group: str) -> tuple[int, list[OutputKind]]:
    """Events waiting in the group's queues, and the kinds of its output records so far."""
    connection = await aio_pika.connect(rabbitmq.url)
    try:
        channel = await connection.channel()
        backlog = 0
        for queue in range(2):
            declared = await channel.declare_queue(queue_name(group, queue), passive=True)
            backlog += declared.declaration_result.message_count or 0
    finally:
        await connection.close()
    broker = await connect_broker(BrokerSettings(url=rabbitmq.url), "output-reader")
    kinds: list[OutputKind] = []
    try:
        outputs = aiter(broker.read_output(group))
        while True:
            try:
                kinds.append((await asyncio.wait_for(anext(outputs), 2)).kind)
            except TimeoutError:
                break
    finally:
        await broker.close()
    return backlog, kinds


def test_a_granted_publisher_publishes_its_group_only_and_goes_with_revoke(
    rabbitmq: BrokerEndpoint,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    own, other, user = f"own{suffix}", f"other{suffix}", f"pub{suffix}"
    create_groups(rabbitmq, own, other)
    try:
        admin(rabbitmq, "grant-publisher", own, "--user", user, password="s3cret")
        url = as_user(rabbitmq, user, "s3cret")
        published = subprocess.run(
            [script("hashed-publisher"), "--broker-url", url, "--group", own, *PUBLISH_ARGS],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert published.returncode == 0, published.stderr
        assert asyncio.run(arrived(rabbitmq, own)) == (EVENTS, [OutputKind.SUMMARY])

        outcome = asyncio.run(probe(url, own, other))
        for kind in ("validation", "dead", "other summary"):
            assert "ACCESS_REFUSED" in outcome[f"publish {kind}"], kind
        assert f"access to topic '_lbg.{own}.validation'" in outcome["publish validation"]
        assert f"exchange '{exchange_name(other)}'" in outcome["publish other summary"]
        assert "ACCESS_REFUSED" in outcome["publish other event"]
        assert "ACCESS_REFUSED" in outcome["publish heartbeat"]
        assert "not allowed" in outcome["read other"]
        for queue in ("queue", "output"):
            assert "ACCESS_REFUSED" in outcome[f"consume own {queue}"], queue
        assert asyncio.run(arrived(rabbitmq, own)) == (EVENTS, [OutputKind.SUMMARY])

        admin(rabbitmq, "revoke-publisher", own, "--user", user)
        with pytest.raises(BrokerError, match="cannot connect"):
            asyncio.run(connect_broker(BrokerSettings(url=url, connect_timeout=1), "gone"))
        refused = admin(rabbitmq, "revoke-publisher", own, "--user", user, ok=False)
        assert refused.stderr.strip().endswith(f"user '{user}' is not a publisher of group '{own}'")
    finally:
        admin(rabbitmq, "delete", own)
        admin(rabbitmq, "delete", other)


async def existing_user(rabbitmq: BrokerEndpoint, user: str) -> None:
    api = management(rabbitmq)
    try:
        await api.put(f"/users/{user}", {"password": "own-pw", "tags": ""})
    finally:
        await api.close()


async def permissions_of(rabbitmq: BrokerEndpoint, user: str) -> tuple[object, object]:
    """The user's vhost permissions and topic permissions, None where it has none."""
    vhost = URL(rabbitmq.url).path[1:] or "%2F"
    api = management(rabbitmq)
    found: list[object] = []
    try:
        for path in (f"/permissions/{vhost}/{user}", f"/topic-permissions/{vhost}/{user}"):
            try:
                found.append(await api.get(path))
            except NotFound:
                found.append(None)
        await api.get(f"/users/{user}")
    finally:
        await api.close()
    return found[0], found[1]


def test_an_existing_user_serves_two_groups_keeps_the_other_on_revoke_and_stays(
    rabbitmq: BrokerEndpoint,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    first, second, user = f"first{suffix}", f"second{suffix}", f"ext{suffix}"
    create_groups(rabbitmq, first, second)
    asyncio.run(existing_user(rabbitmq, user))
    try:
        refused = admin(rabbitmq, "grant-publisher", first, "--user", "lbg-client", ok=False)
        assert "is a client identity (CU)" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        refused = admin(rabbitmq, "grant-publisher", first, "--user", user, ok=False)
        assert f"user '{user}' exists and has no 'lbg-publisher' tag" in refused.stderr
        admin(rabbitmq, "grant-publisher", first, "--user", user, "--force")
        admin(rabbitmq, "grant-publisher", second, "--user", user)
        url = as_user(rabbitmq, user, "own-pw")
        assert asyncio.run(publish_refusal(url, exchange_name(second), f"{second}.1.k")) == (
            "allowed"
        )

        admin(rabbitmq, "revoke-publisher", first, "--user", user)
        assert asyncio.run(publish_refusal(url, exchange_name(second), f"{second}.1.k")) == (
            "allowed"
        )
        assert "ACCESS_REFUSED" in asyncio.run(
            publish_refusal(url, exchange_name(first), f"{first}.1.k")
        )
        assert "ACCESS_REFUSED" in asyncio.run(
            publish_refusal(url, exchange_name(second), f"_lbg.{second}.dead")
        ), "the other group's routing-key limit went with the revoked one"
        admin(rabbitmq, "revoke-publisher", second, "--user", user)
        assert asyncio.run(permissions_of(rabbitmq, user)) == (None, None)
    finally:
        admin(rabbitmq, "delete", first)
        admin(rabbitmq, "delete", second)
