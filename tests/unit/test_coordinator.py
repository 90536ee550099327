"""The coordinator's eviction rules, with a fake broker, fake bindings and a manual clock."""

import asyncio
from collections.abc import Callable

from lbg.broker.base import QueueBinding
from lbg.coordinator import Coordinator


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeBroker:
    """Control messages go nowhere; that is all the coordinator needs here."""

    async def publish_control(self, group: str, body: bytes) -> None:
        return None

    async def subscribe_control(self, group: str, handler: Callable[[bytes], None]):
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


def test_a_pin_nobody_claims_is_evicted_only_after_two_heartbeat_intervals() -> None:
    clock = Clock()
    binding = FakeBinding(0, holder="pin-of-a-member-not-heard-yet")
    coordinator = Coordinator(
        FakeBroker(), "g", "me", {0: binding}, lambda q: None, interval=0.15, clock=clock
    )

    async def rounds() -> None:
        await coordinator.tick()
        clock.now += 0.01  # a second round right away (e.g. woken by a newcomer)
        await coordinator.tick()
        assert binding.evicted == [], "evicted a pin whose owner may not have said so yet"
        clock.now += 0.3
        await coordinator.tick()

    asyncio.run(rounds())
    assert binding.evicted == ["pin-of-a-member-not-heard-yet"]


def test_a_new_unclaimed_pin_restarts_the_grace() -> None:
    clock = Clock()
    binding = FakeBinding(0, holder="first")
    coordinator = Coordinator(
        FakeBroker(), "g", "me", {0: binding}, lambda q: None, interval=0.15, clock=clock
    )

    async def rounds() -> None:
        await coordinator.tick()
        clock.now += 0.2
        binding.holder = "second"
        await coordinator.tick()
        clock.now += 0.2
        await coordinator.tick()

    asyncio.run(rounds())
    assert binding.evicted == []
