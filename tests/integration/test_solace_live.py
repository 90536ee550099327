"""Against a real Solace PubSub+ broker (make test-solace): create, publish, consume, fail over.

The queues are `no-access` to everyone but their owner, so the consumers connect as the group's
client username (CU), created here with a throwaway password.

Skipped unless LBG_TEST_SOLACE_URL, _VPN, _SEMP_URL, _USER, _PASSWORD, _ADMIN_USER and
_ADMIN_PASSWORD are set. The group, its queues and its client username are named uniquely
and deleted at the end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Callable

import pytest
from tests.support.solace_env import missing, solace_settings

from lbg.broker.base import BrokerError, Delivery, QueueBinding
from lbg.broker.solace.adapter import SolaceBroker, connect
from lbg.model.destinations import event_destination
from lbg.model.group import GroupConfig
from lbg.settings import BrokerSettings

pytestmark = pytest.mark.solace

EVENTS = 40
WAIT = 20.0


def live_settings() -> BrokerSettings:
    if missing():
        pytest.skip(f"no Solace broker: set {', '.join(missing())}")
    return solace_settings()


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def take(binding: QueueBinding, count: int) -> list[Delivery]:
    """Receive and ack `count` deliveries in order."""
    received = []
    for _ in range(count):
        delivery = await asyncio.wait_for(binding.next(), WAIT)
        assert binding.owns(delivery)
        assert await binding.ack(delivery)
        received.append(delivery)
    return received


def test_group_lifecycle_exclusivity_order_and_failover() -> None:
    settings = live_settings()
    group = f"t{uuid.uuid4().hex[:10]}"
    config = GroupConfig(
        hash_prefix=group, hash_count=4, queue_count=2, client_username=f"cu-{group}"
    )

    async def scenario() -> None:
        admin = await connect(settings, f"lbg-test-admin-{group}")
        first: SolaceBroker | None = None
        second: SolaceBroker | None = None
        password = uuid.uuid4().hex
        client = dataclasses.replace(settings, user=config.client_username, password=password)
        try:
            await admin.create_group(group, config, client_password=password)
            assert await admin.read_group(group) == config
            assert (await admin.list_groups())[group] == config
            bucket = config.buckets_for_queue(0)[0]
            for n in range(EVENTS):
                destination = event_destination(config.hash_prefix, bucket, "key-1")
                await admin.publish(destination, str(n).encode(), {"Lbg-Seq": str(n)})
            first = await connect(client, f"lbg-test-a-{group}")
            second = await connect(client, f"lbg-test-b-{group}")
            one = await first.bind(group, config, 0, "a")
            await wait_until(lambda: one.active, "the first binding to become active")
            two = await second.bind(group, config, 0, "b")
            half = await take(one, EVENTS // 2)
            assert not two.active, "two bindings active on one exclusive queue"
            await one.close()
            await wait_until(lambda: two.active, "failover to the second binding")
            rest = await take(two, EVENTS - EVENTS // 2)
            bodies = [int(d.body) for d in half + rest]
            assert bodies == list(range(EVENTS)), "events out of order or lost across failover"
            assert rest[0].headers.get("Lbg-Seq") == str(EVENTS // 2)
            await two.close()
        finally:
            for broker in (first, second):
                if broker is not None:
                    await broker.close()
            await admin.delete_group(group)
            assert group not in await admin.list_groups()
            await admin.close()

    asyncio.run(scenario())


def test_each_owner_of_a_queue_gets_a_higher_epoch_and_old_groups_name_the_upgrade() -> None:
    """Claims read back through the claims queue: the owner after a failover carries a higher
    RGMID-derived epoch; a group without its claims queue is refused until upgraded."""
    settings = live_settings()
    group = f"t{uuid.uuid4().hex[:10]}"
    config = GroupConfig(
        hash_prefix=group, hash_count=2, queue_count=1, client_username=f"cu-{group}"
    )

    async def scenario() -> None:
        admin = await connect(settings, f"lbg-test-admin-{group}")
        brokers: list[SolaceBroker] = []
        password = uuid.uuid4().hex
        client = dataclasses.replace(settings, user=config.client_username, password=password)
        try:
            await admin.create_group(group, config, client_password=password)
            for n in range(EVENTS):
                destination = event_destination(config.hash_prefix, 0, "key-1")
                await admin.publish(destination, str(n).encode())
            brokers += [await connect(client, f"lbg-test-{n}-{group}") for n in range(3)]
            one = await brokers[0].bind(group, config, 0, "a")
            two = await brokers[1].bind(group, config, 0, "b")
            half = await take(one, EVENTS // 2)
            await one.close()
            await wait_until(lambda: two.active, "failover to the second binding")
            rest = await take(two, EVENTS - EVENTS // 2)
            first, second = {d.owner_epoch for d in half}, {d.owner_epoch for d in rest}
            assert len(first) == len(second) == 1, "one ownership, one epoch"
            assert 0 < first.pop() < second.pop(), "the later owner's epoch is not higher"
            await two.close()
            provisioner = admin._admin()
            await provisioner.semp.delete(provisioner.paths.queue(f"lbg.{group}.owners"))
            with pytest.raises(BrokerError, match=f"cg-admin upgrade {group}"):
                await brokers[2].bind(group, config, 0, "c")
            assert await admin.upgrade_group(group, config) == [
                f"claims queue 'lbg.{group}.owners'"
            ]
            three = await brokers[2].bind(group, config, 0, "c")
            await three.close()
        finally:
            for broker in brokers:
                await broker.close()
            await admin.delete_group(group)
            await admin.close()

    asyncio.run(scenario())
