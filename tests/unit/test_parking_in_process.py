"""Ordered dead letters in process on the memory broker: a key whose handler fails for good (or
hangs) is parked with all its later events while the other keys flow, and an unpark replays it
in order, through crashes and handovers, in seconds."""

import asyncio
from dataclasses import replace

from tests.unit.test_client_in_process import (
    STEADY,
    URL,
    Group,
    quick_handovers,  # noqa: F401 (the fixture, applied to these tests too)
    run,
    until,
)

from lbg.admin.parking import list_parked, unpark, wait_unparked
from lbg.broker import connect_broker
from lbg.broker.base import Broker, BrokerError, ParkedEvent, PublishError, UndeliverableEvent
from lbg.broker.memory import memory_store
from lbg.broker.memory.adapter import MemoryBroker
from lbg.client import client as client_module
from lbg.client import parking as parking_module
from lbg.client.coordination import DynamicRole
from lbg.client.parking import KeyParking
from lbg.handlers import Context
from lbg.model.destinations import OutputKind
from lbg.model.messages import Event
from lbg.model.parking import PARKED, SKIPPED_HEADER
from lbg.settings import BrokerSettings

POISON = ("key-3", 5)
KEYS = 12


class PoisonGroup(Group):
    """A group whose handler fails (or hangs) on POISON while `broken` is set."""

    def __init__(self, role: DynamicRole = STEADY, hang: bool = False) -> None:
        super().__init__(role)
        self.broken = True
        self.hang = hang
        self.attempts = 0

    async def handle(self, event: Event, context: Context) -> None:
        if self.broken and (event.key, event.seq) == POISON:
            self.attempts += 1
            if self.hang:
                await asyncio.Event().wait()
            raise RuntimeError("cannot apply this event")
        await super().handle(event, context)

    async def admin(self):
        return await connect_broker(BrokerSettings(url=URL), "operator")

    def others_done(self) -> bool:
        handled = self.handled()
        return all(handled.get(k) == n for k, n in self.published.items() if k != POISON[0])


def lot_of(key: str) -> list[ParkedEvent]:
    return memory_store("inproc").parked["g"].lots.get(key, [])


def parked_seqs() -> list[int]:
    """The seqs of the poison key's parked events, in lot order."""
    return [int(e.headers["Lbg-Seq"]) for e in lot_of(POISON[0])]


async def park_the_poison_key(group: PoisonGroup) -> None:
    """Publish 10 events per key; the poison key's 5th fails for good: it and the 6..10 after
    it are parked, in order, while every other key is handled to its end."""
    await group.publish(10 * KEYS, keys=KEYS)
    await until(group.others_done)
    await until(lambda: group.handled().get(POISON[0]) == 4)
    await until(lambda: len(lot_of(POISON[0])) == 6)
    assert parked_seqs() == [5, 6, 7, 8, 9, 10]
    await asyncio.sleep(0.2)
    assert group.handled()[POISON[0]] == 4, "no later event of the parked key was handled"


async def three_members_park_the_poison_key(group: PoisonGroup) -> Broker:
    """Three members park the poison key; an operator's connection."""
    for name in ("a", "b", "c"):
        await group.join(name)
    await group.balanced()
    await park_the_poison_key(group)
    return await group.admin()


def check_all_once_in_order(group: Group, skipped: set[tuple[str, int]] = frozenset()) -> None:
    handled = [(w.key, w.seq) for w in group.writes]
    assert len(handled) == len(set(handled)), "an event was handled twice"
    expected = {(k, s) for k, n in group.published.items() for s in range(1, n + 1)} - skipped
    assert set(handled) == expected
    for key, writes in group.by_key().items():
        seqs = [w.seq for w in writes]
        assert seqs == sorted(seqs), f"{key}: {seqs}"


def test_a_key_failing_for_good_is_parked_listed_and_replayed_in_order() -> None:
    async def scenario(group: PoisonGroup) -> None:
        admin = await three_members_park_the_poison_key(group)
        [listed] = await list_parked(admin, "g")
        assert (listed.key, listed.state, listed.events) == (POISON[0], PARKED, 6)
        assert "cannot apply this event" in listed.reason
        group.broken = False
        await unpark(admin, "g", POISON[0], skip_first=False, who="ops")
        assert await wait_unparked(admin, "g", POISON[0], timeout=5.0) is None
        await group.publish(KEYS, keys=KEYS)  # the key flows again after its replay
        await group.settle()
        assert await list_parked(admin, "g") == []

    group = PoisonGroup()
    run(scenario, group)
    check_all_once_in_order(group)
    assert group.attempts == 4, "--retries 3: four attempts, then parked"


def test_a_parked_key_stays_parked_when_its_member_crashes_and_its_queue_moves() -> None:
    async def scenario(group: PoisonGroup) -> None:
        await group.join("a")
        await group.join("b")
        await group.balanced()
        await park_the_poison_key(group)
        owner = next(w.client for w in group.writes if w.key == POISON[0])
        await group.crash(owner)
        await group.publish(KEYS, keys=KEYS)  # key-3's 11th goes to its parking lot too
        await until(group.others_done)
        await until(lambda: len(lot_of(POISON[0])) == 7)
        assert group.handled()[POISON[0]] == 4
        group.broken = False
        admin = await group.admin()
        await unpark(admin, "g", POISON[0], skip_first=False, who="ops")
        assert await wait_unparked(admin, "g", POISON[0], timeout=5.0) is None
        await group.settle()

    group = PoisonGroup(role=replace(STEADY, lease=0.5, lease_margin=0.1))
    run(scenario, group)
    check_all_once_in_order(group)


def test_skip_first_drops_the_poison_event_and_records_it_as_skipped() -> None:
    async def scenario(group: PoisonGroup) -> None:
        await group.join("a")
        await park_the_poison_key(group)
        admin = await group.admin()
        await unpark(admin, "g", POISON[0], skip_first=True, who="ops")
        assert await wait_unparked(admin, "g", POISON[0], timeout=5.0) is None
        await group.settle()

    group = PoisonGroup()
    run(scenario, group)
    check_all_once_in_order(group, skipped={POISON})
    dead = [m for m in memory_store("inproc").outputs["g"] if m.kind is OutputKind.DEAD]
    assert [(m.headers["Lbg-Seq"], m.headers[SKIPPED_HEADER]) for m in dead] == [("5", "ops")]


def test_a_key_failing_again_during_its_replay_is_parked_again_with_nothing_lost() -> None:
    async def scenario(group: PoisonGroup) -> None:
        await group.join("a")
        await park_the_poison_key(group)
        admin = await group.admin()
        await unpark(admin, "g", POISON[0], skip_first=False, who="ops")
        record = await wait_unparked(admin, "g", POISON[0], timeout=5.0)
        assert record is not None and record.state == PARKED
        assert parked_seqs() == [5, 6, 7, 8, 9, 10]
        group.broken = False
        await unpark(admin, "g", POISON[0], skip_first=False, who="ops")
        assert await wait_unparked(admin, "g", POISON[0], timeout=5.0) is None
        await group.settle()

    group = PoisonGroup()
    run(scenario, group)
    check_all_once_in_order(group)


def test_a_handler_hanging_on_one_event_parks_its_key_instead_of_stalling_the_group() -> None:
    async def scenario(group: PoisonGroup) -> None:
        admin = await three_members_park_the_poison_key(group)
        [listed] = await list_parked(admin, "g")
        assert listed.stalls == 2 and "hung" in listed.reason

    group = PoisonGroup(role=replace(STEADY, stall_timeout=0.6), hang=True)
    run(scenario, group)
    assert group.attempts == 2, "hung on two members, then parked"


def test_on_a_broker_without_a_parking_lot_a_failing_event_is_dead_lettered_as_before(
    monkeypatch,
) -> None:
    def no_lot(self, group: str):
        raise BrokerError(f"group '{group}': this broker keeps no parking lot")

    monkeypatch.setattr(MemoryBroker, "parking", no_lot)

    async def scenario(group: PoisonGroup) -> None:
        await group.join("a")
        await group.publish(10 * KEYS, keys=KEYS)
        await until(lambda: group.handled() == group.published)

    group = PoisonGroup()
    run(scenario, group)
    dead = [m for m in memory_store("inproc").outputs["g"] if m.kind is OutputKind.DEAD]
    assert [m.headers["Lbg-Seq"] for m in dead] == ["5"]
    check_all_once_in_order(group, skipped={POISON})


class BrokerFailsGroup(PoisonGroup):
    """A group whose handler's publish of POISON fails `failures` times with `error`."""

    def __init__(self, error: BrokerError, failures: int) -> None:
        super().__init__()
        self.backoff = 0.02
        self.error = error
        self.failures = failures

    async def handle(self, event: Event, context: Context) -> None:
        if (event.key, event.seq) == POISON and self.failures:
            self.failures -= 1
            raise self.error
        await Group.handle(self, event, context)


def test_a_handler_the_broker_fails_is_retried_past_the_retries_and_never_parks_its_key() -> None:
    async def scenario(group: BrokerFailsGroup) -> None:
        await group.join("a")
        await group.publish(10 * KEYS, keys=KEYS)
        await group.settle()

    group = BrokerFailsGroup(PublishError("no acknowledgement in time"), failures=6)
    run(scenario, group)
    check_all_once_in_order(group)
    assert group.failures == 0 and lot_of(POISON[0]) == []


def test_an_event_the_broker_refuses_as_it_is_parks_its_key_after_the_retries() -> None:
    async def scenario(group: BrokerFailsGroup) -> None:
        await group.join("a")
        await park_the_poison_key(group)

    group = BrokerFailsGroup(UndeliverableEvent("body too large"), failures=100)
    run(scenario, group)
    assert group.failures == 100 - 4, "--retries 3: four attempts, then parked"


def test_a_member_that_serves_no_queue_reads_no_parked_keys(monkeypatch) -> None:
    """The parked keys are followed for the queues a member serves: an idle one reads none
    (it reads them on taking a queue over), one that processed events follows them."""
    monkeypatch.setattr(client_module, "REFRESH_SECONDS", 0.02)
    monkeypatch.setattr(parking_module, "REFRESH_SECONDS", 0.02)
    reads: list[bool] = []
    refresh = KeyParking.refresh

    async def counted(self: KeyParking, current: bool = True) -> None:
        reads.append(current)
        await refresh(self, current)

    monkeypatch.setattr(KeyParking, "refresh", counted)

    async def scenario(group: Group) -> None:
        await group.join("a")
        await asyncio.sleep(0.3)
        idle_reads = reads.count(False)  # the follower's (a takeover reads them current)
        assert idle_reads == 0, f"an idle member followed the parked keys {idle_reads} times"
        await group.publish(KEYS, keys=KEYS)
        await until(lambda: sum(group.handled().values()) == KEYS)
        await until(lambda: reads.count(False) >= 3)  # followed once it serves queues

    run(scenario)
