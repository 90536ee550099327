"""The coordinator's eviction rules, with a fake broker, fake bindings and a manual clock."""

import asyncio
from collections.abc import Callable

from lbg.broker.base import QueueBinding
from lbg.client.coordinator import Coordinator


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeBroker:
    """Relays control messages back to the subscriber at once (while `relaying`), as a broker
    relays a member's own heartbeats."""

    def __init__(self) -> None:
        self.handler: Callable[[bytes], None] | None = None
        self.relaying = True

    async def publish_control(self, group: str, body: bytes) -> None:
        if self.handler is not None and self.relaying:
            self.handler(body)

    async def subscribe_control(self, group: str, handler: Callable[[bytes], None]):
        self.handler = handler

        async def unsubscribe() -> None:
            return None

        return unsubscribe


class FakeBinding(QueueBinding):
    """A standby binding of a queue the broker has pinned to `holder`."""

    def __init__(self, queue: int, holder: str | None) -> None:
        self.queue = queue
        self.holder = holder
        self.evicted: list[str] = []

    active = False
    pin = None
    waiting = True

    def set_preferred(self, preferred: bool) -> None:
        return None

    def suspend(self, suspended: bool) -> None:
        return None

    async def pinned_by(self) -> str | None:
        return self.holder

    async def evict(self, pin: str) -> bool:
        self.evicted.append(pin)
        self.holder = None
        return True

    async def next(self):
        raise NotImplementedError

    def owns(self, delivery) -> bool:
        return False

    async def ack(self, delivery) -> bool:
        return False

    def fence(self, reason: str) -> None:
        return None

    async def release(self, standby_delay: float) -> None:
        return None

    async def close(self) -> None:
        return None


def test_a_pin_nobody_claims_is_evicted_only_after_a_lease_and_its_margin() -> None:
    clock = Clock()
    binding = FakeBinding(0, holder="pin-of-a-member-not-heard-yet")
    coordinator = Coordinator(
        FakeBroker(), "g", "me", {0: binding}, lambda q: None, interval=0.15, clock=clock
    )

    async def rounds() -> None:
        await coordinator.join()
        clock.now += 0.01  # a second round right away (e.g. woken by a newcomer)
        await coordinator.tick()
        for _ in range(5):  # 0.75 s: its owner may have been cut off right after the pin
            clock.now += 0.15
            await coordinator.tick()
            assert binding.evicted == [], "evicted a pin whose owner may still hold its lease"
        clock.now += 0.15
        await coordinator.tick()

    asyncio.run(rounds())
    assert binding.evicted == ["pin-of-a-member-not-heard-yet"]


def test_a_member_that_hears_nothing_back_evicts_nobody_and_fences_itself() -> None:
    clock = Clock()
    broker = FakeBroker()
    binding = FakeBinding(0, holder="pin-of-a-member-not-heard-yet")
    coordinator = Coordinator(
        broker, "g", "me", {0: binding}, lambda q: None, interval=0.15, clock=clock
    )

    async def rounds() -> None:
        await coordinator.join()
        assert coordinator.lease_ok()
        broker.relaying = False  # cut off: heartbeats go into a buffer, none comes back
        for _ in range(10):
            clock.now += 0.15
            await coordinator.tick()

    asyncio.run(rounds())
    assert binding.evicted == [], "evicted on a view it could not have kept current"
    assert not coordinator.lease_ok()


def test_a_new_unclaimed_pin_restarts_the_grace() -> None:
    clock = Clock()
    binding = FakeBinding(0, holder="first")
    coordinator = Coordinator(
        FakeBroker(), "g", "me", {0: binding}, lambda q: None, interval=0.15, clock=clock
    )

    async def rounds() -> None:
        await coordinator.join()
        clock.now += 0.5
        binding.holder = "second"
        await coordinator.tick()
        clock.now += 0.5
        await coordinator.tick()

    asyncio.run(rounds())
    assert binding.evicted == []
