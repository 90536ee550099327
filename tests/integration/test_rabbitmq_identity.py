"""RabbitMQ only: cg-admin gives the client identity (CU) access to its own group and nothing
else, and removes it with the last group that uses it."""

import asyncio
import os
import subprocess
import uuid

import pytest
from yarl import URL

from lbg.broker import connect_broker
from lbg.broker.base import BrokerError, PublishError
from lbg.destinations import OutputKind, output_destination
from lbg.local import script
from lbg.local_brokers import BrokerEndpoint
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


async def probe(url: str, own: str, other: str) -> dict[str, str]:
    """What the identity at `url` may do on its own group and on another one."""
    outcome: dict[str, str] = {}
    broker = await connect_broker(BrokerSettings(url=url), "identity-probe")
    try:
        config = await broker.read_group(own)
        binding = await broker.bind(own, config, 0, "probe")
        await binding.close()
        await broker.publish(output_destination(own, OutputKind.VALIDATION), b"{}")
        outcome["own"] = "ok"
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
        outcome = asyncio.run(probe(as_user(rabbitmq, user, "s3cret"), own, other))
        assert outcome["own"] == "ok"
        assert "not allowed" in outcome["read other"]
        assert outcome["publish other"] != "allowed"
    finally:
        admin(rabbitmq, "delete", own)
        admin(rabbitmq, "delete", other)

    with pytest.raises(BrokerError, match="cannot connect"):
        asyncio.run(
            connect_broker(
                BrokerSettings(url=as_user(rabbitmq, user, "s3cret"), connect_timeout=1), "gone"
            )
        )
