"""The coordinator's eviction rules, on the memory broker with a manual clock: queue 0 is
pinned to a client this member has not heard of, and this member stands by for it."""

import asyncio

from lbg.broker import connect_broker
from lbg.broker.base import Broker
from lbg.broker.memory import memory_store, reset_memory_brokers
from lbg.broker.memory.binding import MemoryQueueBinding
from lbg.client.coordinator import Coordinator
from lbg.client.steering import BindingSteering
from lbg.model.group import GroupConfig
from lbg.settings import BrokerSettings

URL = "memory://coordinator"
CONFIG = GroupConfig(hash_prefix="hp", hash_count=1, queue_count=1)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def bind(client: str, preferred: bool = False) -> tuple[Broker, MemoryQueueBinding]:
    broker = await connect_broker(BrokerSettings(url=URL), client)
    binding = await broker.bind("g", CONFIG, 0, client, preferred=preferred)
    assert isinstance(binding, MemoryQueueBinding)
    return broker, binding


async def held_by(*holders: str) -> tuple[Broker, list[MemoryQueueBinding], MemoryQueueBinding]:
    """A fresh group whose queue 0 the first of `holders` holds (the others stand by, the
    next one preferred), and this member's ("me") standby binding of it."""
    reset_memory_brokers()
    admin = await connect_broker(BrokerSettings(url=URL), "admin")
    await admin.create_group("g", CONFIG)
    held = [(await bind(holder, preferred=i > 0))[1] for i, holder in enumerate(holders)]
    broker, mine = await bind("me")
    assert held[0].active and not mine.active
    return broker, held, mine


def member(broker: Broker, mine: MemoryQueueBinding, clock: Clock) -> Coordinator:
    steering = BindingSteering({0: mine}, lambda q: None)
    return Coordinator(broker, "g", "me", steering, interval=0.15, clock=clock)


def test_a_pin_nobody_claims_is_evicted_only_after_a_lease_and_its_margin() -> None:
    clock = Clock()

    async def rounds() -> None:
        broker, (held,), mine = await held_by("not-heard-yet")
        coordinator = member(broker, mine, clock)
        await coordinator.join()
        clock.now += 0.01  # a second round right away (e.g. woken by a newcomer)
        await coordinator.tick()
        for _ in range(5):  # 0.75 s: its owner may have been cut off right after the pin
            clock.now += 0.15
            await coordinator.tick()
            assert held.active, "evicted a pin whose owner may still hold its lease"
        clock.now += 0.15
        await coordinator.tick()
        assert not held.active and mine.active, "the unclaimed pin was evicted, the queue taken"

    asyncio.run(rounds())


def test_a_member_that_hears_nothing_back_evicts_nobody_and_fences_itself() -> None:
    clock = Clock()

    async def rounds() -> None:
        broker, (held,), mine = await held_by("not-heard-yet")
        coordinator = member(broker, mine, clock)
        await coordinator.join()
        assert coordinator.lease_ok()
        memory_store("coordinator").deafen("me")  # its heartbeats come back no more
        for _ in range(10):
            clock.now += 0.15
            await coordinator.tick()
        assert held.active, "evicted on a view it could not have kept current"
        assert not coordinator.lease_ok()

    asyncio.run(rounds())


def test_a_new_unclaimed_pin_restarts_the_grace() -> None:
    clock = Clock()

    async def rounds() -> None:
        broker, (first, second), mine = await held_by("first", "second")
        coordinator = member(broker, mine, clock)
        await coordinator.join()
        clock.now += 0.5
        await first.release(0)  # the queue goes to the preferred standby: a new pin
        assert second.active
        await coordinator.tick()
        clock.now += 0.5
        await coordinator.tick()
        assert second.active, "evicted a pin seen for half a lease only"

    asyncio.run(rounds())


def test_a_call_its_client_library_cancels_does_not_end_the_heartbeat_loop() -> None:
    """aiormq cancels its pending calls when the connection closes under them: the awaiting
    heartbeat sees a CancelledError nobody asked for; the loop must beat on, not end."""

    async def rounds() -> None:
        broker, _, mine = await held_by("other")
        coordinator = Coordinator(
            broker, "g", "me", BindingSteering({0: mine}, lambda q: None), interval=0.02
        )
        await coordinator.join()
        sent = broker.publish_control
        beats: list[str] = []

        async def cancelled_once(group: str, body: bytes) -> None:
            beats.append("beat")
            if len(beats) == 1:
                pending = asyncio.get_running_loop().create_future()
                pending.cancel()  # as the library does to the calls of a closed connection
                await pending
            await sent(group, body)

        broker.publish_control = cancelled_once  # type: ignore[method-assign]
        stop = asyncio.Event()
        beating = asyncio.create_task(coordinator.run(stop))
        await asyncio.sleep(0.3)
        assert not beating.done(), "the heartbeat loop ended on a call the library cancelled"
        assert len(beats) > 3
        stop.set()
        await beating

    asyncio.run(rounds())
