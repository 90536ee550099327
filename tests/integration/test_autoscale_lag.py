"""Consumer lag through the broker interface on every broker, and the autoscaler acting on it:
the backlog, the age of the oldest unprocessed event (past what was acked), the desired count."""

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from lbg.admin.autoscale import Autoscaler
from lbg.broker import connect_broker
from lbg.broker.base import Broker, QueueStatus
from lbg.devstack.brokers import BrokerEndpoint
from lbg.model.autoscale import AutoscalePolicy
from lbg.model.destinations import event_destination
from lbg.model.group import GroupConfig
from lbg.model.messages import event_headers
from lbg.settings import BrokerSettings

# Where the broker cannot tell the oldest event's age, the autoscaler estimates it.
AGE_UNKNOWN = {"rabbitmq", "solace"}
GAP = 1.5


def lag(status: QueueStatus) -> int:
    return status.backlog + status.in_flight


def young(status: QueueStatus) -> bool:
    return status.oldest_age is not None and status.oldest_age < GAP


async def settled(
    broker: Broker, group: str, config: GroupConfig, done: Callable[[list[QueueStatus]], bool]
) -> list[QueueStatus]:
    """The queues' status once `done` holds, or after 10 s."""
    deadline = time.monotonic() + 10
    while not done(statuses := await broker.queue_status(group, config)):
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    return statuses


async def lag_and_scaling(endpoint: BrokerEndpoint, group: str, folder: Path) -> None:
    settings = BrokerSettings(url=endpoint.url, admin_url=endpoint.admin_url)
    broker = await connect_broker(settings, "autoscale-test")
    config = GroupConfig(hash_prefix=group, hash_count=2, queue_count=2)
    await broker.create_group(group, config)
    try:
        bucket = config.buckets_for_queue(0)[0]

        async def publish(batch: str) -> None:
            for number in range(5):
                destination = event_destination(group, bucket, f"{batch}{number}")
                await broker.publish(destination, b"{}", event_headers(1, time.time()))

        await publish("old")
        await asyncio.sleep(GAP)
        await publish("new")
        # RabbitMQ's management API counts a little late (its statistics interval).
        first, second = await settled(broker, group, config, lambda q: lag(q[0]) == 10)
        assert (lag(first), lag(second)) == (10, 0)
        assert second.oldest_age is None, "an empty queue has no oldest event"
        if endpoint.kind in AGE_UNKNOWN:
            assert first.oldest_age is None
        else:
            assert first.oldest_age is not None and GAP <= first.oldest_age < GAP + 5

        binding = await broker.bind(group, config, 0, "worker")
        for _ in range(5):
            delivery = await asyncio.wait_for(binding.next(), 10)
            assert await binding.ack(delivery)
        now, _ = await settled(broker, group, config, lambda q: lag(q[0]) == 5 and young(q[0]))
        assert lag(now) == 5, "the acked five are no longer lag"
        if endpoint.kind not in AGE_UNKNOWN:
            assert young(now), "the oldest age is that of the first event not acked yet"

        scaled: list[int] = []

        async def scale(count: int) -> None:
            scaled.append(count)

        desired = folder / "desired"
        policy = AutoscalePolicy(minimum=1, maximum=2, high=2, low=1, cooldown=0, calm=0)
        scaler = Autoscaler(broker, group, config, policy, lambda: 1, scale, desired)
        decision = await scaler.poll()
        assert (decision.clients, scaled, desired.read_text()) == (2, [2], "2\n")
        assert scaler.lag.backlog == 5
        # Unknown ages are estimated from the autoscaler's own polls: 0 at the first one.
        assert (scaler.lag.oldest_age > 0) is (endpoint.kind not in AGE_UNKNOWN)
        families = {family.name: family.samples[0].value for family in scaler.families()}
        assert families["lbg_autoscale_desired_clients"] == 2
        assert families["lbg_group_backlog_events"] == 5
        await binding.close()
    finally:
        await broker.delete_group(group)
        await broker.close()


def test_lag_is_read_per_queue_and_drives_the_desired_count(
    broker: BrokerEndpoint, group_name: str, tmp_path: Path
) -> None:
    asyncio.run(lag_and_scaling(broker, group_name, tmp_path))
