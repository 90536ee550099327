"""What an idle NATS queue costs the server: the owner's pulls reuse one reply inbox, a
non-preferred standby waits for the server's UNPINNED advisory instead of asking who owns the
queue every second (a coordinated one asks only after an advisory), yet still takes over a
silent owner's queue once its pin lapses, and a waiting preferred standby keeps one long pull
open rather than one per third of a priority timeout, which it ends when it is demoted, and
sends again as soon as its connection comes back from a server restart; and who holds an idle
queue is known from the PINNED and UNPINNED advisories, not asked of the server."""

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from lbg.broker import connect_broker
from lbg.broker.base import Broker, BrokerError, QueueBinding
from lbg.broker.nats.adapter import consumer_name, events_stream
from lbg.broker.nats.binding import NatsQueueBinding
from lbg.broker.nats.direct import subscribe_direct
from lbg.devstack.embedded import EmbeddedNats
from lbg.model.group import GroupConfig
from lbg.publisher import HashedPublisher
from lbg.settings import BrokerSettings

PRIORITY_TIMEOUT = 0.6
IDLE_SECONDS = 6 * PRIORITY_TIMEOUT
QUIET_TIMEOUTS = 3
QUIET_SECONDS = QUIET_TIMEOUTS * PRIORITY_TIMEOUT + 1


async def until(condition, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"{what} not within {timeout} s"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


@dataclass
class Watched:
    """A fresh one-queue group, a broker connection per member, and the JetStream API requests
    to its consumer that the test counts (by kind, e.g. "MSG.NEXT": their reply subjects)."""

    group: str
    config: GroupConfig
    admin: Broker
    sides: list[Broker]
    monitor: Client
    calls: dict[str, list[str]]


@contextlib.asynccontextmanager
async def watched_group(
    url: str, prefix: str, members: tuple[str, ...], *kinds: str, queues: int = 1
):
    group = f"{prefix}{uuid.uuid4().hex[:6]}"
    settings = BrokerSettings(url=url)
    admin = await connect_broker(settings, "admin", PRIORITY_TIMEOUT)
    config = GroupConfig(hash_prefix=group, hash_count=max(4, queues), queue_count=queues)
    await admin.create_group(group, config)
    sides = [await connect_broker(settings, name, PRIORITY_TIMEOUT) for name in members]
    monitor = await nats.connect(url)
    calls: dict[str, list[str]] = {kind: [] for kind in kinds}
    consumer = f"{events_stream(group)}.{consumer_name(0)}"
    for kind, seen in calls.items():
        await monitor.subscribe(f"$JS.API.CONSUMER.{kind}.{consumer}", cb=_record(seen))
    try:
        yield Watched(group, config, admin, sides, monitor, calls)
    finally:
        await monitor.close()
        for broker in sides:
            await broker.close()
        await admin.delete_group(group)
        await admin.close()


async def idle_queue(url: str, coordinated: bool) -> None:
    async with watched_group(url, "idle", ("owner", "standby"), "MSG.NEXT", "INFO") as w:
        group, config, admin = w.group, w.config, w.admin
        owner_side, standby_side = w.sides
        pulls, looks = w.calls["MSG.NEXT"], w.calls["INFO"]
        owner = await owner_side.bind(group, config, 0, "owner", preferred=True)
        publisher = HashedPublisher(admin, group, config, "pub")
        await publisher.publish("k", b"{}")
        assert await owner.ack(await asyncio.wait_for(owner.next(), 5))
        standby = await standby_side.bind(group, config, 0, "standby", preferred=False)
        if coordinated:
            standby.set_coordinated()
        await asyncio.sleep(PRIORITY_TIMEOUT)
        pulls.clear()
        looks.clear()
        await asyncio.sleep(IDLE_SECONDS)
        assert len(pulls) >= 3, "the owner keeps pulling while idle"
        assert len(set(pulls)) == 1, f"one reply inbox for the idle pulls, got {len(set(pulls))}"
        allowed = 0 if coordinated else 1
        assert len(looks) <= allowed, f"the idle standby asked who owns it {len(looks)} times"
        assert not standby.active

        owner.suspend(True)  # the owner goes silent: its pin lapses after the priority timeout
        silent = time.monotonic()
        # An event sent while the owner's aborted pull may still be registered could go to it
        # and wait out the ack wait: send it once the pin has lapsed.
        await asyncio.sleep(1.2 * PRIORITY_TIMEOUT)
        await publisher.publish("k", b"{}")
        await until(lambda: standby.active, 10, "the standby's takeover")
        taken = time.monotonic() - silent
        assert taken < 2.5 * PRIORITY_TIMEOUT, f"takeover {taken:.2f} s after the owner went silent"
        await owner.close()
        await standby.close()


async def shared_look(url: str, look: float, listed: bool) -> None:
    async with watched_group(url, "look", ("owner", "standby"), queues=4) as w:
        group, config, admin, (owner_side, standby_side) = w.group, w.config, w.admin, w.sides
        stream = events_stream(group)
        infos: list[str] = []
        listings: list[str] = []
        await w.monitor.subscribe(f"$JS.API.CONSUMER.INFO.{stream}.*", cb=_record(infos))
        await w.monitor.subscribe(f"$JS.API.CONSUMER.LIST.{stream}", cb=_record(listings))
        queues = range(config.queue_count)
        owners = [await owner_side.bind(group, config, q, "owner") for q in queues]
        publisher = HashedPublisher(admin, group, config, "pub")
        keys = [f"k{n}" for n in range(64)]  # every queue gets some: its owner is pinned
        for key in keys:
            await publisher.publish(key, b"{}")
        for owner in owners:
            while (delivery := await _next_or_none(owner)) is not None:
                assert await owner.ack(delivery)
        standbys = []
        for queue in queues:
            standbys.append(await standby_side.bind(group, config, queue, "b", preferred=False))
            standbys[-1].set_coordinated()
        await asyncio.sleep(look)
        infos.clear()
        listings.clear()
        await asyncio.sleep(3 * look)
        if listed:
            assert not infos, f"standbys in the background asked about their own {len(infos)} times"
            assert 2 <= len(listings) <= 4, f"{len(listings)} shared looks in 3 look periods"
        else:
            assert len(infos) >= 2 * len(standbys), f"{len(infos)} looks of their own"
        assert not any(standby.active for standby in standbys)

        for owner in owners:  # the owner goes silent; its pins lapse, no advisory is heard
            owner.suspend(True)
        await asyncio.sleep(1.2 * PRIORITY_TIMEOUT)
        for key in keys:
            await publisher.publish(key, b"{}")
        await until(
            lambda: all(standby.active for standby in standbys),
            look + 3 * PRIORITY_TIMEOUT + 2,
            "every standby's takeover after a shared look",
        )
        for binding in owners + standbys:
            await binding.close()


async def _next_or_none(binding):
    with contextlib.suppress(TimeoutError):
        return await asyncio.wait_for(binding.next(), 2 * PRIORITY_TIMEOUT)
    return None


@pytest.mark.parametrize("listed", [True, False], ids=["listed", "listing-refused"])
def test_coordinated_standbys_in_the_background_share_one_look_yet_take_a_silent_owners_queues(
    nats_url: str, monkeypatch: pytest.MonkeyPatch, listed: bool
) -> None:
    """One listing of the stream's consumers per look period for all of a client's coordinated
    standbys in the background (each asked about its own queue: 768 requests a minute per
    client at QC 1024 x 4), and with every advisory lost, the listing alone still has them
    take over the queues of an owner gone silent. Where the listing fails (a user set up
    before clients could list), each looks for itself, as before."""
    look_timeouts = 3
    monkeypatch.setattr("lbg.broker.nats.binding.COORDINATED_LOOK_TIMEOUTS", look_timeouts)
    monkeypatch.setattr(NatsQueueBinding, "unpinned", lambda self: None)
    if not listed:
        monkeypatch.setattr("lbg.broker.nats.unpins.taken_consumers", _refused_listing)
    asyncio.run(shared_look(nats_url, look_timeouts * PRIORITY_TIMEOUT, listed))


async def _refused_listing(nc: Client, stream: str) -> set[str]:
    raise TimeoutError(f"no answer for $JS.API.CONSUMER.LIST.{stream}")


async def quiet_owner(url: str) -> None:
    async with watched_group(url, "quiet", ("owner", "standby"), "MSG.NEXT", "UNPIN") as w:
        group, config, admin, (owner_side, standby_side) = w.group, w.config, w.admin, w.sides
        pulls, unpins = w.calls["MSG.NEXT"], w.calls["UNPIN"]
        changes: list[bool] = []
        owner = await owner_side.bind(
            group, config, 0, "owner", on_change=lambda _q, active: changes.append(active)
        )
        owner.set_coordinated()
        standby = await standby_side.bind(group, config, 0, "standby", preferred=False)
        standby.set_coordinated()
        await asyncio.sleep(QUIET_SECONDS)  # waiting that long is not being quiet as an owner
        publisher = HashedPublisher(admin, group, config, "pub")
        await publisher.publish("k", b"0")
        first = await asyncio.wait_for(owner.next(), 5)
        await asyncio.sleep(QUIET_SECONDS)  # one delivery not yet acked: it keeps its pin
        assert owner.active and not unpins, "an owner with a delivery unacked gave its pin back"
        assert await owner.ack(first)
        await until(lambda: not owner.active, QUIET_SECONDS + 2, "the quiet owner's give-back")
        assert len(unpins) == 1, f"{len(unpins)} unpins"
        pulls.clear()
        await asyncio.sleep(IDLE_SECONDS)
        assert len(pulls) <= 1, f"{len(pulls)} pulls while the queue was given back"
        for n in range(1, 4):
            await publisher.publish("k", str(n).encode())
        started = time.monotonic()
        bodies = []
        for _ in range(3):
            delivery = await asyncio.wait_for(owner.next(), 5)
            bodies.append(delivery.body)
            assert await owner.ack(delivery)
        taken = time.monotonic() - started
        assert bodies == [b"1", b"2", b"3"], f"after the give-back: {bodies}"
        assert taken < PRIORITY_TIMEOUT, f"the next event came {taken:.2f} s after it was sent"
        assert changes == [True, False, True], f"active changes {changes}"
        assert not standby.active
        await owner.close()
        await standby.close()


def test_a_quiet_owner_gives_its_pin_back_and_takes_the_next_event_at_once(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coordinated owner that was sent nothing for QUIET_TIMEOUTS priority timeouts, with all
    it was sent acked, hands its pin back and keeps one long waiting pull instead of a pull every
    third of a priority timeout; the next events go to it at once, in order, and no other
    member's standby takes the queue meanwhile."""
    monkeypatch.setattr("lbg.broker.nats.binding.QUIET_TIMEOUTS", QUIET_TIMEOUTS)
    asyncio.run(quiet_owner(nats_url))


async def bind_all(url: str) -> None:
    async with watched_group(url, "bindall", ("client",), queues=16) as w:
        stream = events_stream(w.group)
        infos: list[str] = []
        listings: list[str] = []
        await w.monitor.subscribe(f"$JS.API.CONSUMER.INFO.{stream}.*", cb=_record(infos))
        await w.monitor.subscribe(f"$JS.API.CONSUMER.LIST.{stream}", cb=_record(listings))
        await w.monitor.flush()

        async def bind(queue: int) -> QueueBinding:  # as a dynamic client binds
            binding = await w.sides[0].bind(w.group, w.config, queue, "client", preferred=False)
            binding.set_coordinated()
            return binding

        bindings = await asyncio.gather(*map(bind, range(w.config.queue_count)))
        await w.monitor.flush()
        asked = len(infos), len(listings)
        for binding in bindings:
            await binding.close()
        assert asked == (0, 1), f"{asked[0]} consumer infos and {asked[1]} listings for 16 queues"


async def bind_all_refused(url: str) -> None:
    async with watched_group(url, "bindall", ("client",), queues=4) as w:
        stream = events_stream(w.group)
        infos: list[str] = []
        await w.monitor.subscribe(f"$JS.API.CONSUMER.INFO.{stream}.*", cb=_record(infos))
        await w.monitor.flush()
        queues = range(w.config.queue_count)
        bindings = await asyncio.gather(
            *(w.sides[0].bind(w.group, w.config, q, "client") for q in queues)
        )
        publisher = HashedPublisher(w.admin, w.group, w.config, "pub")
        for key in (f"k{n}" for n in range(16)):
            await publisher.publish(key, b"{}")
        await until(lambda: all(b.active for b in bindings), 10, "every queue served")
        await w.monitor.flush()
        assert len(infos) >= len(bindings), f"{len(infos)} consumer infos for 4 queues"
        for binding in bindings:
            await binding.close()


def test_a_client_learns_its_queues_consumers_from_one_listing(nats_url: str) -> None:
    """Binding QC queues reads the consumers' settings from one listing of the stream (a page
    per 256 consumers), not a request per queue: at QC 1024 those were a quarter of a second
    of a join."""
    asyncio.run(bind_all(nats_url))


def test_where_the_listing_goes_unanswered_each_consumer_is_asked_for(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user set up before clients could list gets no answer to the listing: each consumer's
    settings are then asked for on their own, and the queues are served as before."""
    monkeypatch.setattr("lbg.broker.nats.consumers.jsapi.consumer_infos", _unanswered_listing)
    asyncio.run(bind_all_refused(nats_url))


async def _unanswered_listing(nc: Client, stream: str, timeout: float) -> list[dict]:
    raise TimeoutError(f"no answer for $JS.API.CONSUMER.LIST.{stream}")


def _record(into: list[str]):
    async def record(msg) -> None:
        into.append(msg.reply)

    return record


@pytest.mark.parametrize("coordinated", [False, True], ids=["static", "coordinated"])
def test_an_idle_owner_reuses_its_inbox_and_an_idle_standby_waits_for_the_unpin(
    nats_url: str, coordinated: bool
) -> None:
    asyncio.run(idle_queue(nats_url, coordinated))


async def waiting_queue(url: str) -> None:
    async with watched_group(url, "wait", ("first", "second"), "MSG.NEXT") as w:
        group, config, admin, sides = w.group, w.config, w.admin, w.sides
        pulls = w.calls["MSG.NEXT"]
        first = await sides[0].bind(group, config, 0, "first", preferred=True)
        await asyncio.sleep(PRIORITY_TIMEOUT)
        pulls.clear()
        await asyncio.sleep(IDLE_SECONDS)
        assert len(pulls) <= 2, f"a waiting standby pulled {len(pulls)} times in {IDLE_SECONDS} s"

        second = await sides[1].bind(group, config, 0, "second", preferred=False)
        second.set_preferred(True)
        first.set_preferred(False)  # its long pull must not win the next pin
        await asyncio.sleep(0.3)
        publisher = HashedPublisher(admin, group, config, "pub")
        await publisher.publish("k", b"{}")
        await until(lambda: second.active, 2 * PRIORITY_TIMEOUT, "the new preferred's takeover")
        assert await second.ack(await asyncio.wait_for(second.next(), 5))
        assert not first.active
        await first.close()
        await second.close()


def test_a_waiting_standby_keeps_one_long_pull_and_ends_it_when_demoted(nats_url: str) -> None:
    asyncio.run(waiting_queue(nats_url))


async def pins_heard(url: str) -> None:
    async with watched_group(url, "pins", ("owner", "other"), "INFO") as w:
        group, config, admin, sides, monitor = w.group, w.config, w.admin, w.sides, w.monitor
        looks = w.calls["INFO"]
        owner = await sides[0].bind(group, config, 0, "owner", preferred=True)
        other = await sides[1].bind(group, config, 0, "other", preferred=False)
        consumer = f"{events_stream(group)}.{consumer_name(0)}"
        other.set_coordinated()
        await asyncio.sleep(0.2)
        await monitor.flush()
        looks.clear()
        assert [await other.pinned_by() for _ in range(5)] == [None] * 5
        await monitor.flush()
        assert len(looks) == 1, f"asked {len(looks)} times who holds an idle queue, not once"

        await HashedPublisher(admin, group, config, "pub").publish("k", b"{}")
        assert await owner.ack(await asyncio.wait_for(owner.next(), 5))
        await until(lambda: owner.pin is not None, 5, "the owner's pin")
        await asyncio.sleep(0.1)  # the PINNED advisory
        assert await other.pinned_by() == owner.pin, "a pinned queue is asked about"
        # An UNPINNED advisory handled late, after the PINNED one (or a PINNED one lost):
        await monitor.publish(f"$JS.EVENT.ADVISORY.CONSUMER.UNPINNED.{consumer}", b"{}")
        await monitor.flush()
        await asyncio.sleep(0.1)
        assert await other.pinned_by() is None, "the test needs the stale advisory to count"
        assert await other.pinned_by(fresh=True) == owner.pin, "asked fresh: the broker's pin"
        await owner.close()  # it unpins: the UNPINNED advisory says the queue is free again
        await asyncio.sleep(0.1)
        await monitor.flush()
        looks.clear()
        assert await other.pinned_by() is None
        await monitor.flush()
        assert looks == [], "asked who holds a queue the server said it unpinned"
        await other.close()


def test_who_holds_an_idle_queue_is_known_from_the_advisories(nats_url: str) -> None:
    asyncio.run(pins_heard(nats_url))


async def waiting_through_a_restart(server: EmbeddedNats) -> None:
    """A coordinated waiting standby: one pull for many priority timeouts, and a new one as
    soon as the connection comes back from a server restart (which lost the old one)."""
    group = f"wait{uuid.uuid4().hex[:6]}"
    settings = BrokerSettings(url=server.url)
    admin = await connect_broker(settings, "admin", PRIORITY_TIMEOUT)
    config = GroupConfig(hash_prefix=group, hash_count=4, queue_count=1)
    await admin.create_group(group, config)
    side = await connect_broker(settings, "standby", PRIORITY_TIMEOUT)
    monitor = await nats.connect(server.url)
    pulls: list[str] = []
    api = f"{events_stream(group)}.{consumer_name(0)}"
    await monitor.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{api}", cb=_record(pulls))
    try:
        standby = await side.bind(group, config, 0, "standby", preferred=True)
        standby.set_coordinated()
        await asyncio.sleep(PRIORITY_TIMEOUT)
        pulls.clear()
        await asyncio.sleep(IDLE_SECONDS)
        assert not pulls, f"a coordinated waiting standby pulled {len(pulls)} times"
        await monitor.close()
        await asyncio.to_thread(server.restart)
        restarted = time.monotonic()
        await publish_once_back(HashedPublisher(admin, group, config, "pub"))
        await until(lambda: standby.active, 10, "the waiting standby's takeover")
        taken = time.monotonic() - restarted
        assert taken < 5 * PRIORITY_TIMEOUT, f"taken {taken:.2f} s after the restart"
        await standby.close()
    finally:
        await side.close()
        await admin.delete_group(group)
        await admin.close()


async def publish_once_back(publisher: HashedPublisher) -> None:
    """Publish one event as soon as the broker takes it again."""
    deadline = time.monotonic() + 10
    while True:
        try:
            await publisher.publish("k", b"{}")
            return
        except BrokerError:
            assert time.monotonic() < deadline, "the broker did not come back"
            await asyncio.sleep(0.2)


def test_a_waiting_standby_pulls_again_when_the_connection_comes_back(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    try:
        asyncio.run(waiting_through_a_restart(server))
    finally:
        server.kill()


async def heard_directly(url: str) -> None:
    nc = await nats.connect(url)
    try:
        heard: list[tuple[bytes, object]] = []

        def handler(msg: Msg) -> None:
            heard.append((msg.data, asyncio.current_task()))
            if msg.data == b"bad":
                raise ValueError("a handler's bug")

        subscription = await subscribe_direct(nc, "direct.test", handler)
        for body in (b"one", b"bad", b"two"):
            await nc.publish("direct.test", body)
        await nc.flush()
        await until(lambda: len(heard) == 3, 5, "three messages")
        assert [body for body, _ in heard] == [b"one", b"bad", b"two"]
        queue_task = subscription._wait_for_msgs_task
        assert all(task is not queue_task for _, task in heard), "handled by the queue's task"
        assert nc.is_connected, "a handler's error reached the read loop"
        await subscription.unsubscribe()
    finally:
        await nc.close()


def test_control_messages_are_handed_over_by_the_read_loop_itself(nats_url: str) -> None:
    """No queue and task per message: a member hears its peers' heartbeats at the cost of the
    handler, and a handler's error costs that message only."""
    asyncio.run(heard_directly(nats_url))


async def pulls_in_step(url: str) -> None:
    async with watched_group(url, "step", ("owner",), queues=2) as w:
        group, config, admin, (side,) = w.group, w.config, w.admin, w.sides
        pulls: list[tuple[float, str]] = []

        async def record(msg) -> None:
            pulls.append((time.time(), msg.subject.rpartition(".")[2]))

        await w.monitor.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{events_stream(group)}.*", cb=record)
        publisher = HashedPublisher(admin, group, config, "pub")
        keys = {config.queue_for_key(f"k{n}"): f"k{n}" for n in range(64)}
        owned = []
        for queue in (0, 1):  # the second taken a sixth of a priority timeout after the first
            binding = await side.bind(group, config, queue, "owner", preferred=True)
            await publisher.publish(keys[queue], b"{}")
            assert await binding.ack(await asyncio.wait_for(binding.next(), 5))
            owned.append(binding)
            await asyncio.sleep(PRIORITY_TIMEOUT / 6)
        await asyncio.sleep(PRIORITY_TIMEOUT)
        pulls.clear()
        await asyncio.sleep(IDLE_SECONDS)
        by_queue = {c: [t for t, seen in pulls if seen == c] for c in map(consumer_name, (0, 1))}
        first, second = by_queue.values()
        assert len(first) >= 3 and len(second) >= 3, f"the owner keeps pulling: {by_queue}"
        apart = max(min(abs(t - u) for u in first) for t in second)
        assert apart < 0.03, f"the idle queues' pulls went out up to {apart:.3f} s apart"
        for binding in owned:
            await binding.close()


def test_an_idle_owners_pulls_of_all_its_queues_go_out_together(nats_url: str) -> None:
    """An idle owner keeps each queue's pin with a pull every third of a priority timeout:
    all of them in one wake-up, on the wall clock's multiples, not each when its queue was
    taken (at QC 256 x 8 that halved a quiet group's CPU once it had served traffic)."""
    asyncio.run(pulls_in_step(nats_url))
