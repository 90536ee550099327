"""Standbys in line (brokers whose line takes a crashed owner's queue over by itself): each
queue's standby waits for it, and a planned handover waits until only the new owner does."""

import asyncio

import pytest
from tests.support.clock import Clock
from tests.support.steering import QuietSteering

from lbg.broker import connect_broker
from lbg.broker.memory import reset_memory_brokers
from lbg.client.coordinator import Coordinator
from lbg.client.steering import Holding
from lbg.model.control import Heartbeat, MemberState, Override, encode_move
from lbg.model.group import GroupConfig
from lbg.settings import BrokerSettings

URL = "memory://standbys"


class FakeSteering(QuietSteering):
    """Queues 0 and 1; what this member holds of each, and what it was told."""

    def __init__(self, active: set[int]) -> None:
        self.active = active
        self.preferred: set[int] = set()
        self.released: list[int] = []
        self.stepped_out: set[int] = set()
        self.told = 0  # how many rounds told it which queues to stand ready for

    def holdings(self) -> dict[int, Holding]:
        return {q: Holding(q in self.active, f"me/{q}", False) for q in (0, 1)}

    def prefer_only(self, queues) -> bool:
        self.told += 1
        changed = self.preferred != set(queues)
        self.preferred = set(queues)
        return changed

    def release(self, queue: int) -> None:
        self.released.append(queue)

    def step_out(self, queue: int) -> None:
        self.stepped_out.add(queue)

    def fence_all(self, reason: str) -> None:
        self.active.clear()


async def setup(steering: FakeSteering, standbys: bool, clock: Clock) -> tuple:
    reset_memory_brokers()
    admin = await connect_broker(BrokerSettings(url=URL), "admin")
    await admin.create_group("g", GroupConfig(hash_prefix="hp", hash_count=2, queue_count=2))
    broker = await connect_broker(BrokerSettings(url=URL), "me")
    coordinator = Coordinator(
        broker, "g", "me", steering, interval=0.15, clock=clock, queue_count=2, standbys=standbys
    )
    await coordinator.join()
    return admin, coordinator


async def beat(admin, coordinator, clock, member: str, owns: dict, wants=frozenset()) -> None:
    heartbeat = Heartbeat(member, MemberState.ACTIVE, owns, frozenset(wants))
    await admin.publish_control("g", heartbeat.encode())
    clock.now += 0.15
    await coordinator.tick()


@pytest.mark.parametrize(("standbys", "preferred"), [(True, {0, 1}), (False, {1})])
def test_a_member_waits_in_line_for_the_queue_it_would_get_if_its_owner_went(
    standbys: bool, preferred: set[int]
) -> None:
    clock = Clock(100)
    steering = FakeSteering({1})

    async def rounds() -> None:
        admin, coordinator = await setup(steering, standbys, clock)
        await beat(admin, coordinator, clock, "a", {0: "a/0"})

    asyncio.run(rounds())
    assert steering.preferred == preferred
    assert steering.stepped_out == set(), "this member waits only for what it may get"


def test_a_member_steps_out_of_a_held_queues_line_once_not_its_standby() -> None:
    clock = Clock(100)
    steering = FakeSteering({1})

    async def rounds() -> None:
        admin, coordinator = await setup(steering, True, clock)
        await beat(admin, coordinator, clock, "a", {0: "a/0"})
        assert coordinator.standbys == {0: "me", 1: "a"}
        assert steering.stepped_out == set()
        await beat(admin, coordinator, clock, "b", {})  # b holds nothing: the next in line
        assert coordinator.standbys == {0: "b", 1: "b"}

    asyncio.run(rounds())
    assert steering.preferred == {1}
    assert steering.stepped_out == {0}


def test_a_handover_waits_until_nobody_but_the_new_owner_waits_for_the_queue() -> None:
    """... and until the new owner is heard from this round: a member that crashed is in the
    view until its lease lapses, and where the broker moves a crashed member's queues itself
    the assignment changes at once and may name it (a queue waited 0.7-0.8 s on RabbitMQ)."""
    clock = Clock(100)
    steering = FakeSteering({0, 1})

    async def rounds() -> None:
        admin, coordinator = await setup(steering, True, clock)
        # "b" joins and gets one queue; "c" still stands in its line from before.
        await beat(admin, coordinator, clock, "b", {})
        moving = next(q for q, owner in coordinator.desired.items() if owner == "b")
        await beat(admin, coordinator, clock, "c", {}, {moving})
        await beat(admin, coordinator, clock, "b", {}, {moving})
        assert steering.released == [], "released while another member stood first in line"
        await beat(admin, coordinator, clock, "c", {})  # "b" has not beat this round
        assert coordinator.desired[moving] == "b"
        assert steering.released == [], "handed to a member not heard since the round began"
        clock.now += 0.15
        await coordinator.tick()
        assert steering.released == [], "handed to a member silent for a whole round"
        await beat(admin, coordinator, clock, "b", {}, {moving})
        assert steering.released and set(steering.released) == {moving}

    asyncio.run(rounds())


def test_a_round_that_finds_nothing_new_steers_nothing_and_a_move_is_steered_at_once() -> None:
    """An idle member's rounds, hearing the same word from the same members while holding the
    same, compute nothing and tell its bindings nothing; an operator's move, heard alone,
    is steered in the next round."""
    clock = Clock(100)
    steering = FakeSteering({0})

    async def rounds() -> None:
        admin, coordinator = await setup(steering, True, clock)
        for _ in range(2):
            await beat(admin, coordinator, clock, "a", {1: "a/1"}, {0})
        told = steering.told
        for _ in range(5):
            await beat(admin, coordinator, clock, "a", {1: "a/1"}, {0})
        assert steering.told == told, "rounds that found nothing new steered again"
        assert steering.released == []
        await admin.publish_control("g", encode_move(Override(0, "a", at=clock.now)))
        await beat(admin, coordinator, clock, "a", {1: "a/1"}, {0})
        assert steering.released == [0], "a move heard in an idle group was not steered"

    asyncio.run(rounds())


def test_while_two_members_claim_a_queue_each_round_follows_the_latest_claim() -> None:
    """Two members saying the same again, each that it serves queue 0 (one was cut off and
    has not heard yet): every round takes the latest word, not what an earlier one found."""
    clock = Clock(100)
    steering = FakeSteering(set())

    async def rounds() -> None:
        admin, coordinator = await setup(steering, True, clock)
        for _ in range(3):
            await beat(admin, coordinator, clock, "a", {0: "a/0"})
            assert coordinator.desired[0] == "a"
            await beat(admin, coordinator, clock, "b", {0: "b/0"})
            assert coordinator.desired[0] == "b"

    asyncio.run(rounds())
