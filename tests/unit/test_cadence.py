"""Rounds in step: a member's heartbeat rounds fall on multiples of the interval on the wall
clock, so a group's members beat together and each hears the others in one burst; the stall
watchdog looks only when a handler call could have hung past the stall timeout."""

import asyncio
import time

from lbg.aio import until_next
from lbg.broker import connect_broker
from lbg.broker.memory import reset_memory_brokers
from lbg.client.coordination import DynamicCoordinator, DynamicRole, Seat
from lbg.client.coordinator import Coordinator
from lbg.client.steering import BindingSteering
from lbg.model.control import Heartbeat, decode_control
from lbg.settings import BrokerSettings

INTERVAL = 0.05


def test_until_next_is_the_time_to_the_next_multiple_of_the_period() -> None:
    assert abs(until_next(0.15, now=3.0) - 0.15) < 1e-9  # on a multiple: a whole period
    assert abs(until_next(0.15, now=3.1) - 0.05) < 1e-9
    assert 0 < until_next(0.15) <= 0.15 * 1.05
    # A timer that fired a little early: not another round just after the multiple.
    assert abs(until_next(0.15, now=3.0 - 0.0002) - 0.1502) < 1e-9


def test_heartbeats_fall_on_multiples_of_the_interval_whatever_the_start() -> None:
    async def rounds() -> list[float]:
        reset_memory_brokers()
        broker = await connect_broker(BrokerSettings(url="memory://cadence"), "me")
        sent: list[float] = []

        async def publish(group: str, body: bytes) -> None:
            if decode_control(body) is None:
                Heartbeat.decode(body)
                sent.append(time.time())

        broker.publish_control = publish  # type: ignore[method-assign]
        coordinator = Coordinator(
            broker, "g", "me", BindingSteering({}, lambda q: None), interval=INTERVAL,
            queue_count=1,
        )  # fmt: skip
        await asyncio.sleep(until_next(INTERVAL) + INTERVAL / 2)  # start between two multiples
        await coordinator.join()
        stop = asyncio.Event()
        beating = asyncio.create_task(coordinator.run(stop))
        await asyncio.sleep(8 * INTERVAL)
        stop.set()
        await beating
        return sent[2:]  # after join's beat and the first round's

    sent = asyncio.run(rounds())
    assert 4 <= len(sent) <= 9, f"{len(sent)} beats in 8 intervals (not counting join's)"
    late = [round(at % INTERVAL, 3) for at in sent]
    # Most, not all: on a busy machine a timer fires late now and then. Beats out of step
    # would fall in the first third of the interval a third of the time.
    in_step = sum(phase < INTERVAL / 3 for phase in late)
    assert in_step >= 0.75 * len(late), f"beats not in step: phases {late}"


def test_the_stall_watchdog_looks_when_a_call_could_have_hung_not_every_interval() -> None:
    async def watch() -> tuple[int, float | None]:
        reset_memory_brokers()
        broker = await connect_broker(BrokerSettings(url="memory://cadence"), "me")
        looks, busy_since = 0, None
        started = time.monotonic()

        def oldest_busy() -> float:
            nonlocal looks
            looks += 1
            return 0.0 if busy_since is None else time.monotonic() - busy_since

        seat = Seat(broker, "g", "me", {}, lambda q: None, oldest_busy, lambda g: None)
        role = DynamicRole(heartbeat_interval=0.01, lease=0.1, stall_timeout=0.3, lease_margin=0.02)
        dynamic = DynamicCoordinator(seat, role, queue_count=1, generation=0)
        watchdog = asyncio.create_task(dynamic._watch_for_stalls())
        await asyncio.sleep(0.2)
        idle_looks = looks
        busy_since = time.monotonic()  # a handler call starts and hangs
        stalled_at = None
        while stalled_at is None and time.monotonic() - started < 2:
            await asyncio.sleep(0.005)
            if dynamic.membership.state.value == "stalled":
                stalled_at = time.monotonic() - busy_since
        watchdog.cancel()
        return idle_looks, stalled_at

    idle_looks, stalled_at = asyncio.run(watch())
    assert idle_looks <= 2, f"the idle watchdog looked {idle_looks} times in 0.2 s"
    assert stalled_at is not None and stalled_at < 0.3 + 0.1, stalled_at
