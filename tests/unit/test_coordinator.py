"""The coordinator's eviction rules, on the memory broker with a manual clock: queue 0 is
pinned to a client this member has not heard of, and this member stands by for it."""

import asyncio
import contextlib
import logging
import time

from tests.support.clock import Clock

from lbg.aio import until_next
from lbg.broker import connect_broker
from lbg.broker.base import Broker, BrokerError
from lbg.broker.memory import memory_store, reset_memory_brokers
from lbg.broker.memory.binding import MemoryQueueBinding
from lbg.client import coordinator as coordinator_module
from lbg.client.coordinator import Coordinator
from lbg.client.eviction import LOOKUP_LEASES
from lbg.client.steering import BindingSteering
from lbg.model.control import Heartbeat, MemberState, decode_control, encode_sync
from lbg.model.group import GroupConfig
from lbg.model.lease import LeaseTerms
from lbg.model.messages import MalformedMessage
from lbg.settings import BrokerSettings

URL = "memory://coordinator"
CONFIG = GroupConfig(hash_prefix="hp", hash_count=1, queue_count=1)


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
    return Coordinator(broker, "g", "me", steering, interval=0.15, clock=clock, queue_count=1)


def test_a_pin_nobody_claims_is_evicted_only_after_a_lease_and_its_margin() -> None:
    clock = Clock(100)

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


def test_a_pin_nobody_claims_waits_out_the_longest_lease_a_member_announces() -> None:
    """A member on a 1.4 s lease (margin 0.3) may hold it, cut off, until 1.1 s after its last
    heartbeat: this member's own 0.7 + 0.15 s is not enough."""
    clock = Clock(100)

    async def rounds() -> None:
        broker, (held,), mine = await held_by("not-heard-yet")
        coordinator = member(broker, mine, clock)
        await coordinator.join()
        leaving = Heartbeat("slow", MemberState.LEAVING, terms=LeaseTerms(1.4, 0.3)).encode()
        clock.now += 0.01
        coordinator._receive(leaving)
        await coordinator.tick()
        for _ in range(9):  # 1.35 s
            clock.now += 0.15
            coordinator._receive(leaving)
            await coordinator.tick()
            assert held.active, "evicted a pin whose owner may still hold its lease"
        clock.now += 0.15
        await coordinator.tick()
        assert not held.active and mine.active, "the unclaimed pin was evicted, the queue taken"

    asyncio.run(rounds())


def test_a_member_that_hears_nothing_back_evicts_nobody_and_fences_itself() -> None:
    clock = Clock(100)

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
    clock = Clock(100)

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


async def idle_member(
    clock: Clock, looked: list[float], *, holding: bool = False
) -> tuple[Coordinator, MemoryQueueBinding]:
    """This member alone with queue 0, which nobody holds (as on an idle NATS) unless
    `holding` (it does), counting its questions to the broker about who holds it."""

    class CountingSteering(BindingSteering):
        async def pinned_by(self, queue: int, *, fresh: bool = False) -> str | None:
            looked.append(clock.now)
            return await super().pinned_by(queue, fresh=fresh)

    reset_memory_brokers()
    admin = await connect_broker(BrokerSettings(url=URL), "admin")
    await admin.create_group("g", CONFIG)
    broker, mine = await bind("me")
    if not holding:
        mine.suspend(True)  # it takes the queue no more: nobody holds it
        mine.state.unpin("test")
    steering = CountingSteering({0: mine}, lambda q: None)
    coordinator = Coordinator(
        broker, "g", "me", steering, interval=0.15, clock=clock, queue_count=1
    )
    await coordinator.join()
    return coordinator, mine


def test_an_idle_member_asks_the_broker_about_a_queue_nobody_holds_once_per_lookup_period() -> None:
    clock = Clock(100)
    looked: list[float] = []
    period = LOOKUP_LEASES * 0.7

    async def rounds() -> None:
        coordinator, _ = await idle_member(clock, looked)
        for _ in range(round(period / 0.15) + 2):
            clock.now += 0.15
            await coordinator.tick()

    asyncio.run(rounds())
    assert len(looked) == 2, f"asked {len(looked)} times in {period:.1f} s and a little"
    assert looked[1] - looked[0] >= period


def test_a_queue_this_member_served_and_lost_is_looked_up_at_once() -> None:
    """Rounds that hold what the last one held ask nothing; a queue of its own that it lost
    (to an eviction, say) is asked about at the next round, not a lookup period later."""
    clock = Clock(100)
    looked: list[float] = []

    async def rounds() -> None:
        coordinator, mine = await idle_member(clock, looked, holding=True)
        for _ in range(5):
            clock.now += 0.15
            await coordinator.tick()
        assert looked == [], "asked who holds a queue this member serves"
        mine.suspend(True)  # it loses the queue (evicted, say) and takes it no more
        mine.state.unpin("test")
        clock.now += 0.15
        await coordinator.tick()
        assert looked == [clock.now], "a queue it lost was not looked up at once"

    asyncio.run(rounds())


def test_a_queue_that_comes_back_to_this_member_is_looked_up_at_once() -> None:
    """A member that just left may have been pinned before it could say so: its queues'
    new owner asks who holds them at its next round, however recently it asked before."""
    clock = Clock(100)
    looked: list[float] = []

    async def rounds() -> None:
        coordinator, _ = await idle_member(clock, looked)
        clock.now += 0.15
        await coordinator.tick()
        coordinator._receive(Heartbeat("a-peer", MemberState.ACTIVE).encode())
        assert coordinator.desired[0] == "a-peer", "the test needs the peer to get queue 0"
        clock.now += 0.15
        await coordinator.tick()
        coordinator._receive(Heartbeat("a-peer", MemberState.LEAVING).encode())
        asked = len(looked)
        clock.now += 0.15
        await coordinator.tick()
        assert len(looked) == asked + 1, "queue 0 came back and was not looked up at once"

    asyncio.run(rounds())


def test_a_gone_members_queue_is_asked_of_the_broker_not_of_what_its_binding_heard() -> None:
    """Who holds a gone member's queue is asked fresh: on NATS a PINNED advisory lost or
    handled after the UNPINNED one left the binding sure the queue was free, and the gone
    owner's pin stayed until the server's priority timeout (a takeover 1-1.5 s late)."""
    clock = Clock(100)
    asked: list[tuple[int, bool]] = []

    class RecordingSteering(BindingSteering):
        async def pinned_by(self, queue: int, *, fresh: bool = False) -> str | None:
            asked.append((queue, fresh))
            return await super().pinned_by(queue, fresh=fresh)

    async def rounds() -> None:
        broker, (held,), mine = await held_by("peer")
        steering = RecordingSteering({0: mine}, lambda q: None)
        coordinator = Coordinator(
            broker, "g", "me", steering, interval=0.15, clock=clock, queue_count=1
        )
        await coordinator.join()
        assert held.pin is not None
        coordinator._receive(Heartbeat("peer", MemberState.ACTIVE, owns={0: held.pin}).encode())
        clock.now += 0.15
        await coordinator.tick()
        assert not any(fresh for _, fresh in asked), "a live owner's queue asked fresh"
        while "peer" in coordinator.view.members():  # silent from now on
            clock.now += coordinator.next_round_in()
            await coordinator.tick()
        assert (0, True) in asked, f"the gone owner's queue was not asked fresh: {asked}"
        assert not held.active and mine.active, "its pin evicted, the queue taken"

    asyncio.run(rounds())


def test_heartbeats_carry_the_queues_only_when_they_change_or_someone_asks() -> None:
    clock = Clock(100)
    beats: list[Heartbeat] = []

    def hear(body: bytes) -> None:
        with contextlib.suppress(MalformedMessage):
            if decode_control(body) is None and (hb := Heartbeat.decode(body)).member == "me":
                beats.append(hb)

    async def rounds() -> None:
        reset_memory_brokers()
        admin = await connect_broker(BrokerSettings(url=URL), "admin")
        await admin.create_group("g", CONFIG)
        broker, mine = await bind("me", preferred=True)
        await admin.subscribe_control("g", hear)
        coordinator = member(broker, mine, clock)
        await coordinator.join()
        for _ in range(4):
            clock.now += 0.15
            await coordinator.tick()
        assert beats[0].full and beats[0].owns, "the first says what it serves"
        assert not any(hb.full for hb in beats[1:]), "then only the digest"
        await admin.publish_control("g", encode_sync("me"))  # someone missed it
        clock.now += 0.15
        await coordinator.tick()
        assert beats[-1].full and beats[-1].owns == beats[0].owns
        await mine.release(0)  # what it serves changes: the next one says so
        clock.now += 0.15
        await coordinator.tick()
        assert beats[-1].full and beats[-1].digest != beats[0].digest


def test_a_call_its_client_library_cancels_does_not_end_the_heartbeat_loop() -> None:
    """aiormq cancels its pending calls when the connection closes under them: the awaiting
    heartbeat sees a CancelledError nobody asked for; the loop must beat on, not end."""

    async def rounds() -> None:
        broker, _, mine = await held_by("other")
        coordinator = Coordinator(
            broker,
            "g",
            "me",
            BindingSteering({0: mine}, lambda q: None),
            interval=0.02,
            queue_count=1,
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


def test_a_heartbeat_that_says_the_same_again_renews_the_lease_unparsed(monkeypatch) -> None:
    """Most heartbeats repeat their member's last word with a new number: they renew its
    lease without being parsed; one that says something new is parsed and acted on."""
    clock = Clock(100)
    parsed: list[bytes] = []
    decode = coordinator_module.decode_message

    def counting(body: bytes):
        parsed.append(body)
        return decode(body)

    monkeypatch.setattr(coordinator_module, "decode_message", counting)

    async def rounds() -> None:
        broker, _, mine = await held_by("other")
        coordinator = member(broker, mine, clock)
        for beat in range(1, 11):
            clock.now += 0.15
            body = Heartbeat("a-peer", MemberState.ACTIVE, {}, frozenset({0}), 0, beat).encode()
            coordinator._receive(body)
            coordinator.view.expire()
        assert len(parsed) == 1, f"{len(parsed)} of 10 repeated heartbeats parsed"
        assert coordinator.view.members() == ["a-peer"], "its lease was renewed"
        coordinator._receive(Heartbeat("a-peer", MemberState.LEAVING, beat=11).encode())
        assert len(parsed) == 2 and coordinator.view.members() == []

    asyncio.run(rounds())


def test_the_next_round_comes_when_a_silent_peers_lease_lapses_not_a_heartbeat_later() -> None:
    """A crashed peer is evicted as its lease and margin end: the round loop wakes then,
    instead of at its next heartbeat (up to an interval late)."""
    clock = Clock(100)

    async def rounds() -> None:
        broker, _, mine = await held_by("other")
        coordinator = member(broker, mine, clock)
        await coordinator.join()
        assert 0 < coordinator.next_round_in() <= coordinator.interval * 1.05, "nobody heard"
        coordinator._receive(Heartbeat("a-peer", MemberState.ACTIVE).encode())
        lapses = clock.now + coordinator.lease + coordinator.view.margin
        while "a-peer" in coordinator.view.members():  # silent from now on: rounds as they come
            step = coordinator.next_round_in()
            assert step <= max(0.0, lapses - clock.now) + 0.01, "a round after the lease lapsed"
            clock.now += step
            await coordinator.tick()
        assert clock.now - lapses < 0.01, f"expired {clock.now - lapses:.3f}s after its lease"

    asyncio.run(rounds())


def test_rounds_that_run_late_are_logged_with_what_the_lease_tolerates(caplog) -> None:
    """A process blocked for most of a lease fences itself while alive: the log says its
    heartbeat rounds ran late, and by how much, so the operator knows why."""

    async def rounds() -> None:
        broker, _, mine = await held_by("other")
        steering = BindingSteering({0: mine}, lambda q: None)
        coordinator = Coordinator(
            broker, "g", "me", steering, interval=0.02, lease=0.2, margin=0.05, queue_count=1
        )
        await coordinator.join()
        stop = asyncio.Event()
        beating = asyncio.create_task(coordinator.run(stop))
        for _ in range(2):  # twice: once may fall while a round runs, which is not late
            await asyncio.sleep(0.05)
            time.sleep(0.1)  # as a handler that blocks the event loop would
        await asyncio.sleep(0.1)
        stop.set()
        await beating

    with caplog.at_level(logging.WARNING, logger="lbg.client.cadence"):
        asyncio.run(rounds())
    late = [r.getMessage() for r in caplog.records if "round ran" in r.getMessage()]
    assert len(late) == 1, late
    assert "the lease tolerates 0.15s" in late[0]


def test_a_heartbeat_refused_as_a_member_joins_is_sent_again_at_the_next_round() -> None:
    """A connection reset while a member starts made its first heartbeat fail, and the client
    exited: the member joins all the same and beats at its next round."""
    clock = Clock(100)

    async def rounds() -> list[str]:
        broker, _, mine = await held_by("other")
        coordinator = member(broker, mine, clock)
        sent = broker.publish_control
        calls: list[str] = []

        async def refused_twice(group: str, body: bytes) -> None:
            calls.append("refused" if len(calls) < 2 else "sent")
            if calls[-1] == "refused":
                raise BrokerError("heartbeat not sent: ConnectionResetError")
            await sent(group, body)

        broker.publish_control = refused_twice  # type: ignore[method-assign]
        await coordinator.join()
        clock.now += 0.15
        await coordinator.tick()
        return calls

    assert asyncio.run(rounds()) == ["refused", "refused", "sent"]


class RegisteringStandby:
    """A standby that waits for its queue only once its registration at the broker is done,
    after the round that preferred it (RabbitMQ's consumer in the queue's line)."""

    queue = 0
    active = False
    pin = None
    steady_waiting = False

    def __init__(self) -> None:
        self.preferred = False
        self.registered = False

    @property
    def waiting(self) -> bool:
        return self.preferred and self.registered

    def set_preferred(self, preferred: bool) -> None:
        self.preferred = preferred

    def step_out(self) -> None:
        return None

    async def pinned_by(self, *, fresh: bool = False) -> str | None:
        return None


def test_a_standby_that_starts_to_wait_after_its_round_says_so_soon_not_a_round_later() -> None:
    """An owner hands a queue over once the new owner's heartbeat says it stands ready: a
    joiner whose standby registered after its round waited an interval for the next one."""
    interval = 0.4
    heard: list[tuple[float, frozenset[int]]] = []

    def hear(body: bytes) -> None:
        with contextlib.suppress(MalformedMessage):
            if decode_control(body) is None and (hb := Heartbeat.decode(body)).member == "me":
                heard.append((time.monotonic(), hb.wants))

    async def rounds() -> float:
        reset_memory_brokers()
        admin = await connect_broker(BrokerSettings(url=URL), "admin")
        await admin.create_group("g", CONFIG)
        await admin.subscribe_control("g", hear)
        broker = await connect_broker(BrokerSettings(url=URL), "me")
        standby = RegisteringStandby()
        steering = BindingSteering({0: standby}, lambda q: None)  # type: ignore[dict-item]
        coordinator = Coordinator(
            broker, "g", "me", steering, interval=interval, lease=3.0, queue_count=1
        )
        await coordinator.join()
        stop = asyncio.Event()
        beating = asyncio.create_task(coordinator.run(stop))
        await asyncio.sleep(until_next(interval) + 0.02)  # just after a regular round
        assert standby.preferred and not heard[-1][1], "preferred, not standing yet"
        standby.registered = True
        registered = time.monotonic()
        coordinator.stands_ready(0)
        while not heard[-1][1] and time.monotonic() - registered < 2 * interval:
            await asyncio.sleep(0.005)
        stop.set()
        await beating
        return heard[-1][0] - registered

    said_after = asyncio.run(rounds())
    assert said_after < interval / 2, f"stood ready {said_after:.3f}s before saying so"
