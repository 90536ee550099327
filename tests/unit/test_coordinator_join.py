"""A joining member steers nothing until it has heard the group: steered by the first
heartbeat it heard, a joiner at QC 1024 on RabbitMQ stood in the lines of all 1,024 queues (a
channel each) and stepped out of most again, while its own heartbeats waited behind that."""

import asyncio

from tests.support.steering import QuietSteering

from lbg.broker import connect_broker
from lbg.broker.memory import reset_memory_brokers
from lbg.client.coordinator import Coordinator
from lbg.client.steering import Holding
from lbg.model.control import Heartbeat, MemberState, members_digest
from lbg.model.group import GroupConfig
from lbg.settings import BrokerSettings

URL = "memory://joining"
QUEUES = range(4)


class RecordingSteering(QuietSteering):
    """Holds nothing; remembers every set of queues it was told to stand ready for."""

    def __init__(self) -> None:
        self.told: list[set[int]] = []

    def holdings(self) -> dict[int, Holding]:
        return {q: Holding(False, None, False) for q in QUEUES}

    def prefer_only(self, queues) -> bool:
        self.told.append(set(queues))
        return True


def test_a_joiner_steers_nothing_on_the_first_member_it_hears() -> None:
    async def scenario() -> tuple[list[set[int]], dict[int, str]]:
        reset_memory_brokers()
        admin = await connect_broker(BrokerSettings(url=URL), "admin")
        await admin.create_group("g", GroupConfig(hash_prefix="hp", hash_count=4, queue_count=4))
        steering = RecordingSteering()
        broker = await connect_broker(BrokerSettings(url=URL), "me")
        coordinator = Coordinator(broker, "g", "me", steering, interval=0.15, queue_count=4)
        joining = asyncio.create_task(coordinator.join())
        for member, owns in (("a", {0: "a/0", 1: "a/1"}), ("b", {2: "b/2", 3: "b/3"})):
            await asyncio.sleep(0.03)  # a and b answer the newcomer one after the other
            await admin.publish_control("g", Heartbeat(member, MemberState.ACTIVE, owns).encode())
        await joining
        return steering.told, coordinator.desired

    told, desired = asyncio.run(scenario())
    mine = {q for q, member in desired.items() if member == "me"}
    assert len(mine) == 1, desired  # four queues over three members
    assert told and all(queues <= mine for queues in told), f"stood ready for {told}"


def join_time(views: dict[str, set[str]], interval: float = 2.0) -> float:
    """How long a joiner listens when peers a and b answer it with the views given (each a
    set of members; absent: the peer does not say), on a long interval."""

    async def scenario() -> float:
        reset_memory_brokers()
        admin = await connect_broker(BrokerSettings(url=URL), "admin")
        await admin.create_group("g", GroupConfig(hash_prefix="hp", hash_count=4, queue_count=4))
        broker = await connect_broker(BrokerSettings(url=URL), "me")
        coordinator = Coordinator(
            broker,
            "g",
            "me",
            QuietSteering(),
            interval=interval,
            lease=3 * interval,
            margin=0.3,
            queue_count=4,
        )
        loop = asyncio.get_running_loop()
        started = loop.time()
        joining = asyncio.create_task(coordinator.join())
        await asyncio.sleep(0.05)
        for member in ("a", "b"):
            view = members_digest(views[member]) if member in views else None
            await admin.publish_control(
                "g", Heartbeat(member, MemberState.ACTIVE, view=view).encode()
            )
        await joining
        return loop.time() - started

    return asyncio.run(scenario())


def test_a_joiner_whose_peers_all_say_its_view_stops_listening_at_once() -> None:
    everyone = {"a", "b", "me"}
    assert join_time({"a": everyone, "b": everyone}) < 0.5
    assert join_time({"a": everyone, "b": {"a", "b"}}) >= 2.0, "b has not heard the joiner yet"
    assert join_time({"a": everyone}) >= 2.0, "b does not say its view"
