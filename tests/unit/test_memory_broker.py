"""The in-process broker (memory://) keeps the rules the daemons rely on: one owner per queue,
preferred standbys first, epochs, fencing, acks and in-order redelivery, the control channel."""

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbg.broker import connect_broker
from lbg.broker.base import Broker, Delivery, GroupExists, GroupNotFound, PublishError
from lbg.broker.memory import memory_store, reset_memory_brokers
from lbg.broker.memory.binding import MemoryQueueBinding
from lbg.model.destinations import OutputKind, event_destination, output_destination
from lbg.model.group import GroupConfig
from lbg.settings import BrokerSettings

CONFIG = GroupConfig(hash_prefix="hp", hash_count=4, queue_count=2)
TIMEOUT = 0.02


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    """Run a scenario on a fresh broker `memory://t` with a short priority timeout."""
    reset_memory_brokers()
    memory_store("t", priority_timeout=TIMEOUT)
    asyncio.run(scenario())


async def connect(client: str) -> Broker:
    return await connect_broker(BrokerSettings(url="memory://t"), client)


async def with_group() -> Broker:
    admin = await connect("admin")
    await admin.create_group("g", CONFIG)
    return admin


async def bind(client: str, preferred: bool = True, queue: int = 0) -> MemoryQueueBinding:
    broker = await connect(client)
    binding = await broker.bind("g", CONFIG, queue, client, preferred=preferred)
    assert isinstance(binding, MemoryQueueBinding)
    return binding


async def publish(broker: Broker, *bodies: bytes, bucket: int = 0) -> None:
    for body in bodies:
        await broker.publish(event_destination("hp", bucket, "k"), body)


async def take(binding: MemoryQueueBinding, count: int) -> list[Delivery]:
    return [await asyncio.wait_for(binding.next(), 1.0) for _ in range(count)]


def test_groups_are_stored_listed_refused_when_clashing_and_deleted() -> None:
    async def scenario() -> None:
        admin = await with_group()
        assert await admin.read_group("g") == CONFIG
        with pytest.raises(GroupExists):
            await admin.create_group("g", CONFIG)
        with pytest.raises(GroupExists, match="HP 'hp'"):
            await admin.create_group("other", CONFIG)
        assert list(await admin.list_groups()) == ["g"]
        await admin.delete_group("g")
        with pytest.raises(GroupNotFound):
            await admin.read_group("g")
        with pytest.raises(PublishError):
            await publish(admin, b"nobody takes it")

    run(scenario)


def test_one_owner_per_queue_and_a_release_goes_to_the_preferred_standby() -> None:
    async def scenario() -> None:
        admin = await with_group()
        first = await bind("a", preferred=False)
        other = await bind("b", preferred=False)
        primary = await bind("c", preferred=True)
        assert [first.active, other.active, primary.active] == [True, False, False]
        assert primary.waiting and not other.waiting
        await first.release(0.01)
        assert [first.active, other.active, primary.active] == [False, False, True]
        statuses = await admin.queue_status("g", CONFIG)
        assert [s.active_client for s in statuses] == ["c", None]
        await primary.close()
        assert first.active, "with no preferred binding left, the first standby takes the queue"

    run(scenario)


def test_a_new_owner_gets_the_unacked_events_first_in_order_under_a_higher_epoch() -> None:
    async def scenario() -> None:
        admin = await with_group()
        old = await bind("a")
        new = await bind("b")
        await publish(admin, b"1", b"2", b"3", b"4")
        one, two, three = await take(old, 3)
        assert await old.ack(two), "acks may come out of order (lanes)"
        assert [e.owner_epoch for e in (one, two, three)] == [1, 1, 1]
        await old.release(0.01)
        assert not old.owns(one) and not await old.ack(one)
        again = await take(new, 3)
        assert [d.body for d in again] == [b"1", b"3", b"4"]
        assert [d.redelivered for d in again] == [True, True, False]
        assert {d.owner_epoch for d in again} == {2}
        statuses = await admin.queue_status("g", CONFIG)
        assert (statuses[0].backlog, statuses[0].in_flight) == (0, 3)

    run(scenario)


def test_a_fenced_owner_keeps_the_pin_until_it_lapses_and_its_late_acks_do_not_count() -> None:
    async def scenario() -> None:
        admin = await with_group()
        old = await bind("a")
        new = await bind("b", preferred=False)
        await publish(admin, b"1")
        (delivery,) = await take(old, 1)
        pin = old.pin
        old.fence("lease lapsed")
        assert not old.active and await new.pinned_by() == pin, "the broker still holds the pin"
        await asyncio.sleep(TIMEOUT * 3)
        assert await new.pinned_by() != pin
        owner = new if new.active else old
        (again,) = await take(owner, 1)
        assert again.body == b"1" and again.owner_epoch == delivery.owner_epoch + 1
        assert not await old.ack(delivery)
        old.state.ack(int(str(delivery.token)), delivery.owner_epoch)  # as if it slipped out
        assert (await admin.queue_status("g", CONFIG))[0].in_flight == 1, "an old stint's ack"

    run(scenario)


def test_evict_takes_the_queue_only_from_the_pin_named() -> None:
    async def scenario() -> None:
        await with_group()
        owner = await bind("a")
        standby = await bind("b")
        assert owner.pin is not None
        assert not await standby.evict("some-older-pin")
        assert owner.active
        assert await standby.evict(owner.pin)
        assert standby.active and not owner.active

    run(scenario)


def test_a_crashed_owner_is_replaced_after_the_priority_timeout() -> None:
    async def scenario() -> None:
        admin = await with_group()
        await bind("a")
        standby = await bind("b")
        memory_store("t").kill("a")
        assert not standby.active
        await asyncio.sleep(TIMEOUT * 3)
        assert standby.active
        assert [s.active_client for s in await admin.queue_status("g", CONFIG)] == ["b", None]

    run(scenario)


def test_a_cut_off_owner_gets_nothing_and_learns_it_lost_the_queue_when_healed() -> None:
    async def scenario() -> None:
        admin = await with_group()
        cut = await bind("a")
        standby = await bind("b")
        memory_store("t").partition("a")
        await publish(admin, b"1")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(cut.next(), TIMEOUT)
        assert cut.active, "cut off, it cannot know yet"
        assert standby.active
        memory_store("t").partition("a", cut=False)
        assert not cut.active

    run(scenario)


def test_the_control_channel_reaches_every_subscriber_but_not_from_a_cut_off_member() -> None:
    async def scenario() -> None:
        a, b = await connect("a"), await connect("b")
        heard: dict[str, list[bytes]] = {"a": [], "b": []}
        await a.subscribe_control("g", heard["a"].append)
        unsubscribe = await b.subscribe_control("g", heard["b"].append)
        await a.publish_control("g", b"one")
        await a.publish_control("other-group", b"elsewhere")
        memory_store("t").partition("a")
        await a.publish_control("g", b"lost")
        memory_store("t").partition("a", cut=False)
        memory_store("t").deafen("b")
        await a.publish_control("g", b"not to b")
        memory_store("t").deafen("b", deaf=False)
        await unsubscribe()
        await a.publish_control("g", b"two")
        assert heard == {"a": [b"one", b"not to b", b"two"], "b": [b"one"]}

    run(scenario)


def test_read_output_gives_everything_from_the_start_then_new_messages() -> None:
    async def scenario() -> None:
        admin = await with_group()
        await admin.publish(output_destination("g", OutputKind.VALIDATION), b"v1")
        reader = admin.read_output("g")
        assert (await anext(reader)).body == b"v1"
        await admin.publish(output_destination("g", OutputKind.DEAD), b"d1", {"r": "x"})
        late = await asyncio.wait_for(anext(reader), 1.0)
        assert (late.kind, late.body, late.headers) == (OutputKind.DEAD, b"d1", {"r": "x"})
        await reader.aclose()

    run(scenario)


def test_each_url_name_is_its_own_broker_and_reset_empties_them() -> None:
    async def scenario() -> None:
        await with_group()
        other = await connect_broker(BrokerSettings(url="memory://elsewhere"), "x")
        assert await other.list_groups() == {}
        reset_memory_brokers()
        assert await (await connect("y")).list_groups() == {}

    run(scenario)


# Operations on one queue by three bindings: publish, take-and-ack, take only, release,
# fence, suspend/resume, close/rebind.
OPS = st.lists(
    st.tuples(
        st.sampled_from(["publish", "ack", "take", "release", "fence", "suspend", "rebind"]),
        st.integers(0, 2),
    ),
    max_size=40,
)


@settings(max_examples=25, deadline=None)
@given(OPS)
def test_any_interleaving_keeps_one_owner_rising_epochs_and_in_order_redelivery(ops) -> None:
    async def scenario() -> None:
        admin = await with_group()
        brokers = [await connect(c) for c in "abc"]
        bindings = [
            await b.bind("g", CONFIG, 0, "x", preferred=i == 0) for i, b in enumerate(brokers)
        ]
        acked: set[bytes] = set()
        published: list[bytes] = []
        stint: dict[int, list[bytes]] = {}
        epochs: list[int] = []
        for op, i in ops:
            binding = bindings[i]
            if op == "publish":
                published.append(str(len(published)).encode())
                await publish(admin, published[-1])
            elif op in ("ack", "take") and binding.active:
                try:
                    delivery = await asyncio.wait_for(binding.next(), 0.001)
                except TimeoutError:
                    continue
                if not epochs or epochs[-1] != delivery.owner_epoch:
                    assert not epochs or delivery.owner_epoch > epochs[-1], "epochs only rise"
                    epochs.append(delivery.owner_epoch)
                    unacked = [b for b in published if b not in acked]
                    assert delivery.body == unacked[0], "a new owner starts at the oldest unacked"
                taken = stint.setdefault(delivery.owner_epoch, [])
                expected = [b for b in published if b not in acked and b not in taken]
                assert delivery.body == expected[0], "in order within a stint"
                taken.append(delivery.body)
                if op == "ack" and await binding.ack(delivery):
                    acked.add(delivery.body)
            elif op == "release":
                await binding.release(0)
            elif op == "fence":
                binding.fence("test")
                await asyncio.sleep(TIMEOUT * 1.5)
            elif op == "suspend":
                binding.suspend(not binding._suspended)
            elif op == "rebind":
                await binding.close()
                bindings[i] = await brokers[i].bind("g", CONFIG, 0, "x", preferred=i == 0)
            assert sum(b.active for b in bindings) <= 1, "one active consumer per queue"

    run(scenario)
