"""The Message DB adapter's own guarantees, on a real PostgreSQL: one active reader per member
(an advisory lock), positions recorded the Message DB way, standbys taking over (woken when
the lock is freed, not retrying), a client's locks on one connection of its own whatever its
queue count."""

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest

from lbg.aio import cancel_and_wait
from lbg.broker import connect_broker
from lbg.broker.base import Broker, Delivery, QueueBinding
from lbg.broker.messagedb import naming
from lbg.broker.messagedb.adapter import CLIENT_CONNECTIONS
from lbg.broker.messagedb.binding import FREED_FALLBACK_SECONDS
from lbg.broker.messagedb.locks import MemberLocks
from lbg.broker.messagedb.shared import HOLDERS_SQL, notify
from lbg.devstack.brokers import BrokerEndpoint
from lbg.model.destinations import event_destination
from lbg.model.group import GroupConfig
from lbg.model.messages import event_headers
from lbg.settings import BrokerSettings

CONFIG = GroupConfig("PREFIX", 8, 2)


@contextlib.asynccontextmanager
async def _two_brokers(url: str) -> AsyncIterator[tuple[Broker, Broker]]:
    """Two clients' connections, "first" and "second", closed afterwards."""
    first = await _broker(url, "first")
    second = await _broker(url, "second")
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


async def _broker(url: str, name: str) -> Broker:
    return await connect_broker(BrokerSettings(url=url), name)


async def _until(check: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def _take(binding: QueueBinding, count: int) -> list[Delivery]:
    return [await asyncio.wait_for(binding.next(), 10) for _ in range(count)]


def _run(
    url: str,
    scenario: Callable[[Broker, GroupConfig, str], Awaitable[None]],
    shape: GroupConfig = CONFIG,
) -> None:
    async def main() -> None:
        group = f"m{uuid.uuid4().hex[:10]}"
        config = GroupConfig(group, shape.hash_count, shape.queue_count)
        admin = await _broker(url, "test-admin")
        await admin.create_group(group, config)
        try:
            await scenario(admin, config, group)
        finally:
            await admin.delete_group(group)
            await admin.close()

    asyncio.run(main())


async def _publish_to_queue(broker: Broker, config: GroupConfig, queue: int, count: int) -> list:
    """Publish `count` events on keys of `queue`; their bodies in order."""
    keys = [k for k in (f"k{i}" for i in range(200)) if config.queue_for_key(k) == queue][:3]
    bodies = []
    for i in range(count):
        key = keys[i % len(keys)]
        body = f'{{"n":{i}}}'.encode()
        await broker.publish(
            event_destination(config.hash_prefix, config.bucket_for_key(key), key), body
        )
        bodies.append(body)
    return bodies


@pytest.fixture(scope="module")
def url(messagedb: BrokerEndpoint) -> str:
    return messagedb.url


def test_one_reader_per_member_and_a_standby_resumes_at_the_recorded_position(url: str) -> None:
    async def scenario(admin: Broker, config: GroupConfig, group: str) -> None:
        bodies = await _publish_to_queue(admin, config, 1, 30)
        async with _two_brokers(url) as (first, second):
            a = await first.bind(group, config, 1, "client-a")
            await _until(lambda: a.active)
            b = await second.bind(group, config, 1, "client-b")
            taken = await _take(a, 10)
            assert [d.body for d in taken] == bodies[:10]
            for delivery in taken:
                assert await a.ack(delivery)
            await asyncio.sleep(0.5)
            assert not b.active and b.waiting
            assert await b.pinned_by() == a.pin
            await a.close()
            await _until(lambda: b.active)
            rest = await _take(b, 20)
            assert [d.body for d in rest] == bodies[10:]
            await b.close()

    _run(url, scenario)


def test_evicting_a_holder_hands_the_member_over_and_replays_what_it_had_not_recorded(
    url: str,
) -> None:
    async def scenario(admin: Broker, config: GroupConfig, group: str) -> None:
        bodies = await _publish_to_queue(admin, config, 0, 12)
        async with _two_brokers(url) as (first, second):
            a = await first.bind(group, config, 0, "client-a")
            await _until(lambda: a.active)
            b = await second.bind(group, config, 0, "client-b")
            taken = await _take(a, 4)
            for delivery in taken:
                assert await a.ack(delivery)
            await asyncio.sleep(0.5)  # recorded
            more = await _take(a, 2)
            assert await a.ack(more[0])
            pin = await b.pinned_by()
            assert pin == a.pin
            a.set_preferred(False)
            assert await b.evict(pin)
            await _until(lambda: b.active and not a.active)
            assert not await a.ack(more[1]), "a reader that lost the lock acked"
            rest = await _take(b, 8)
            assert [d.body for d in rest] == bodies[4:]
            await b.close()
            await a.close()

    _run(url, scenario)


def test_positions_are_a_message_db_position_stream(url: str) -> None:
    async def scenario(admin: Broker, config: GroupConfig, group: str) -> None:
        await _publish_to_queue(admin, config, 1, 5)
        reader = await _broker(url, "reader")
        try:
            binding = await reader.bind(group, config, 1, "client-a")
            for delivery in await _take(binding, 5):
                assert await binding.ack(delivery)
            await binding.close()
        finally:
            await reader.close()
        conn = await asyncpg.connect(url, server_settings={"search_path": "message_store,public"})
        try:
            row = await conn.fetchrow(
                "SELECT type, data FROM get_last_stream_message($1)",
                naming.position_stream(config.hash_prefix, 1),
            )
            last = await conn.fetchval(
                "SELECT max(global_position) FROM get_category_messages($1, 1, -1, NULL, 1, 2)",
                naming.event_category(config.hash_prefix),
            )
        finally:
            await conn.close()
        assert row["type"] == "Recorded"
        assert f'"position": {last}' in row["data"]

    _run(url, scenario)


def test_an_event_published_again_is_stored_once(url: str) -> None:
    """A retried publish (a rerun Spark task: same key and sequence, a later publish time)
    writes nothing more; the next sequence of the key is written."""

    async def scenario(admin: Broker, config: GroupConfig, group: str) -> None:
        key = "order-1"
        destination = event_destination(config.hash_prefix, config.bucket_for_key(key), key)
        for seq, at in ((1, 10.0), (1, 99.0), (2, 99.5)):
            await admin.publish(destination, b'{"step":1}', event_headers(seq, at))
        conn = await asyncpg.connect(url, server_settings={"search_path": "message_store,public"})
        try:
            stream = naming.event_stream(config, config.bucket_for_key(key), key)
            count = await conn.fetchval(
                "SELECT count(*) FROM messages WHERE stream_name = $1", stream
            )
        finally:
            await conn.close()
        assert count == 2

    _run(url, scenario)


async def _sql(url: str, query: str, *args: object) -> object:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(query, *args)
    finally:
        await conn.close()


def test_a_client_holds_a_few_connections_whatever_its_queue_count(url: str) -> None:
    """QC 32: every member lock on one connection (each queue held its own before)."""

    async def scenario(admin: Broker, config: GroupConfig, group: str) -> None:
        wide = await _broker(url, "wide")
        try:
            bindings = [
                await wide.bind(group, config, q, "wide-client") for q in range(config.queue_count)
            ]
            await _until(lambda: all(b.active for b in bindings))
            assert len({b.pin for b in bindings}) == 1, "the locks are not on one connection"
            connections = await _sql(
                url,
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'wide%'",
            )
            assert connections <= CLIENT_CONNECTIONS, f"{connections} connections for QC 32"
            for binding in bindings:
                await binding.close()
        finally:
            await wide.close()

    _run(url, scenario, GroupConfig("PREFIX", 64, 32))


def test_a_client_whose_lock_connection_dies_stops_every_queue_before_another_takes_them(
    url: str,
) -> None:
    async def scenario(admin: Broker, config: GroupConfig, group: str) -> None:
        bodies = {q: await _publish_to_queue(admin, config, q, 6) for q in (0, 1)}
        first = await _broker(url, "first")
        second = await _broker(url, "second")
        changes: list[tuple[str, int, bool]] = []

        async def bind_both(broker: Broker, name: str) -> list[QueueBinding]:
            """Bind `client-<name>` to queues 0 and 1, noting every change of theirs."""
            return [
                await broker.bind(
                    group,
                    config,
                    q,
                    f"client-{name}",
                    on_change=lambda q, on: changes.append((name, q, on)),
                )
                for q in (0, 1)
            ]

        try:
            a = await bind_both(first, "a")
            await _until(lambda: all(b.active for b in a))
            b = await bind_both(second, "b")
            held = [await _take(binding, 3) for binding in a]
            for binding in a:
                binding.set_preferred(False)
            pin = a[0].pin
            assert pin is not None
            assert await _sql(url, "SELECT pg_terminate_backend($1)", int(pin))
            await _until(lambda: not any(binding.active for binding in a), 2.0)
            for binding, deliveries in zip(a, held, strict=True):
                assert not await binding.ack(deliveries[0]), "a reader without its lock acked"
            await _until(lambda: all(binding.active for binding in b))
            stops = [i for i, (who, _, on) in enumerate(changes) if who == "a" and not on]
            starts = [i for i, (who, _, on) in enumerate(changes) if who == "b" and on]
            assert len(stops) == 2 and max(stops) < min(starts), changes
            for q, binding in zip((0, 1), b, strict=True):
                rest = await _take(binding, 6)
                assert [d.body for d in rest] == bodies[q], "not replayed in order"
            for binding in (*a, *b):
                await binding.close()
        finally:
            await first.close()
            await second.close()

    _run(url, scenario)


def test_two_bindings_of_one_client_never_both_hold_a_member(url: str) -> None:
    """Session locks are reentrant: on the client's one lock connection a second taking of the
    same member would succeed (as a queue draining an old member and its successor might)."""

    async def scenario(admin: Broker, config: GroupConfig, group: str) -> None:
        client = await _broker(url, "twice")
        try:
            pair = [await client.bind(group, config, 1, "client-a") for _ in range(2)]
            await _until(lambda: any(b.active for b in pair))
            await asyncio.sleep(0.5)
            assert sum(b.active for b in pair) == 1
            holder, other = sorted(pair, key=lambda b: not b.active)
            await holder.close()
            await _until(lambda: other.active)
            await other.close()
        finally:
            await client.close()

    _run(url, scenario)


async def _takeover_seconds(binding: QueueBinding) -> float:
    """How long until `binding` holds its member (at most 2 fallback periods)."""
    started = asyncio.get_running_loop().time()
    await _until(lambda: binding.active, 2 * FREED_FALLBACK_SECONDS)
    return asyncio.get_running_loop().time() - started


def _with_a_waiting_standby(
    url: str, free: Callable[[QueueBinding, QueueBinding], Awaitable[None]]
) -> float:
    """A holder and a preferred standby that tried its lock in vain and waits; `free(holder,
    standby)` frees the member: how long the standby then took to hold it."""
    took: list[float] = []

    async def scenario(admin: Broker, config: GroupConfig, group: str) -> None:
        async with _two_brokers(url) as (first, second):
            holder = await first.bind(group, config, 1, "client-a")
            await _until(lambda: holder.active)
            standby = await second.bind(group, config, 1, "client-b")
            await asyncio.sleep(FREED_FALLBACK_SECONDS / 3)  # it tried, and waits
            assert standby.waiting and not standby.active
            await free(holder, standby)
            took.append(await _takeover_seconds(standby))
            await standby.close()
            await holder.close()

    _run(url, scenario)
    return took[0]


def test_a_released_member_wakes_its_waiting_standby_at_once(url: str) -> None:
    """The holder's release NOTIFYs the group's channel: the standby does not wait for its
    next try, FREED_FALLBACK_SECONDS after its last."""

    async def release(holder: QueueBinding, _standby: QueueBinding) -> None:
        await holder.close()

    took = _with_a_waiting_standby(url, release)
    assert took < FREED_FALLBACK_SECONDS / 4, f"took {took:.2f} s"


def test_a_member_freed_without_a_release_wakes_its_waiting_standby_within_a_poll(
    url: str,
) -> None:
    """A holder whose session ends frees its lock without a NOTIFY (a crash): the client's
    one watcher of the group's holders sees it free and wakes the standby."""

    async def end_session(holder: QueueBinding, _standby: QueueBinding) -> None:
        holder.set_preferred(False)
        assert await _sql(url, "SELECT pg_terminate_backend($1)", int(holder.pin or 0))

    took = _with_a_waiting_standby(url, end_session)
    assert took < FREED_FALLBACK_SECONDS / 4, f"took {took:.2f} s"


def test_a_release_wakes_the_other_clients_waiting_for_that_member_lock_only(url: str) -> None:
    """The release's NOTIFY on the group's channel, heard on the waiter's lock connection."""

    async def main() -> None:
        holder, waiter = (MemberLocks(lambda: asyncpg.connect(url)) for _ in range(2))
        keys, other = (1234567, 3), (1234567, 4)
        try:
            held = [await holder.try_lock(k, lambda _: None) for k in (keys, other)]
            woken, not_woken = asyncio.Event(), asyncio.Event()
            assert await waiter.try_lock(keys, lambda _: None, woken) is None
            assert await waiter.try_lock(other, lambda _: None, not_woken) is None
            assert held[0] is not None
            await holder.release(held[0])
            await asyncio.wait_for(woken.wait(), FREED_FALLBACK_SECONDS / 4)
            await asyncio.sleep(0.2)
            assert not not_woken.is_set(), "woken by another member's release"
            assert await waiter.try_lock(keys, lambda _: None) is not None
        finally:
            await holder.close()
            await waiter.close()

    asyncio.run(main())


def test_coordinated_standbys_not_preferred_look_at_their_locks_once_for_the_client(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One read of who holds what per look for all of a client's coordinated standbys that
    are not preferred (each looked by itself: 7.5 reads of pg_locks a second per client at
    QC 256 x 8), which still sees a member its holder's session freed without a release."""
    look = 1.6
    monkeypatch.setattr("lbg.broker.messagedb.shared.COORDINATED_LOOK_SECONDS", look)
    holder_reads = 0
    fetch = asyncpg.pool.Pool.fetch

    async def counted_fetch(pool: asyncpg.Pool, query: str, *args: object) -> list:
        nonlocal holder_reads
        holder_reads += query == HOLDERS_SQL
        return await fetch(pool, query, *args)

    monkeypatch.setattr(asyncpg.pool.Pool, "fetch", counted_fetch)

    async def scenario(admin: Broker, config: GroupConfig, group: str) -> None:
        async with _two_brokers(url) as (first, second):
            queues = range(config.queue_count)
            held = [await first.bind(group, config, q, "client-a") for q in queues]
            await _until(lambda: all(b.active for b in held))
            standbys = []
            for queue in queues:  # demoted at different times, as in a running group
                standbys.append(await second.bind(group, config, queue, "b", preferred=False))
                standbys[-1].set_coordinated()
                await asyncio.sleep(look / config.queue_count)
            await asyncio.sleep(look)
            before = holder_reads
            await asyncio.sleep(3 * look)
            assert holder_reads - before <= 5, f"{holder_reads - before} reads in 3 looks"
            assert not any(standby.active for standby in standbys)
            pin = int(held[0].pin or 0)
            for binding in held:  # the holder crashes: its session ends, nothing is released
                binding.set_preferred(False)
            await _sql(url, "SELECT pg_terminate_backend($1)", pin)
            for binding in held:
                await binding.close()
            await _until(lambda: all(standby.active for standby in standbys), 4 * look + 2)

    _run(url, scenario, GroupConfig("PREFIX", 32, 16))


def test_heartbeats_are_heard_again_once_the_listening_connection_is_killed(url: str) -> None:
    """The database ends the LISTEN session (a restart, an operator): the client listens
    again on a new connection, told by asyncpg that the old one closed, not by polling it."""

    async def scenario(admin: Broker, config: GroupConfig, group: str) -> None:
        listener = await _broker(url, "listener")
        heard: list[bytes] = []
        try:
            unsubscribe = await listener.subscribe_control(group, heard.append)
            await admin.publish_control(group, b"before")
            await _until(lambda: b"before" in heard)
            killed = await _sql(
                url,
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = 'listener/control'",
            )
            assert killed == 1

            async def beat_until_heard() -> None:
                while b"after" not in heard:
                    await admin.publish_control(group, b"after")
                    await asyncio.sleep(0.1)

            await asyncio.wait_for(beat_until_heard(), 5)
            await unsubscribe()
        finally:
            await listener.close()

    _run(url, scenario)


def test_a_clients_heartbeats_go_out_and_come_back_on_one_connection(url: str) -> None:
    """A client that beats and listens holds one control connection, not two: its own
    heartbeat comes back on the connection that sent it, as do the others'; once that
    connection is killed, the client listens again without waiting for a beat of its own."""

    async def control_connections(name: str) -> list[str]:
        rows = await _sql(
            url,
            "SELECT array_agg(application_name ORDER BY application_name) FROM pg_stat_activity"
            " WHERE application_name LIKE $1",
            f"{name}/%",
        )
        return [app for app in rows or [] if not app.endswith(("/head", "/locks"))]

    async def scenario(admin: Broker, _config: GroupConfig, group: str) -> None:
        name = f"member-{uuid.uuid4().hex[:6]}"
        client = await _broker(url, name)
        heard: list[bytes] = []
        try:
            unsubscribe = await client.subscribe_control(group, heard.append)
            await client.publish_control(group, b"own")
            await admin.publish_control(group, b"peer")
            await _until(lambda: {b"own", b"peer"} <= set(heard))
            assert await control_connections(name) == [f"{name}/control"]
            await _sql(
                url,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = $1",
                f"{name}/control",
            )

            async def peer_beats_until_heard() -> None:
                while b"peer again" not in heard:
                    await admin.publish_control(group, b"peer again")
                    await asyncio.sleep(0.1)

            await asyncio.wait_for(peer_beats_until_heard(), 5)
            assert await control_connections(name) == [f"{name}/control"]
            await unsubscribe()
        finally:
            await client.close()

    _run(url, scenario)


def test_a_heartbeat_connection_closed_between_beats_is_logged_as_lost_and_regained(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A database restart that falls between two beats fails no heartbeat (the next one
    connects again), yet the client says it lost the broker and is back, as it does when a
    beat fails: an operator reading the logs sees every restart."""

    async def scenario(_admin: Broker, _config: GroupConfig, group: str) -> None:
        name = f"beater-{uuid.uuid4().hex[:6]}"
        beater = await _broker(url, name)
        try:
            await beater.publish_control(group, b"before")
            killed = await _sql(
                url,
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = $1",
                f"{name}/control",
            )
            assert killed == 1
            await asyncio.sleep(0.2)  # the client sees the connection close
            with caplog.at_level(logging.INFO, logger="lbg.broker.messagedb.adapter"):
                await beater.publish_control(group, b"after")
        finally:
            await beater.close()
        said = [record.getMessage() for record in caplog.records]
        assert any(line.startswith("broker connection lost") for line in said), said
        assert "reconnected to the broker" in said

    _run(url, scenario)


def test_an_idle_holders_reads_of_the_head_ride_on_its_clients_heartbeats(url: str) -> None:
    """While its client beats, an idle holder's client sends no head read of its own (its
    head connection stays idle), yet the holder takes a new event at once; once the
    heartbeats stop, the client reads the head itself again."""

    async def head_read_at() -> object:
        return await _sql(
            url, "SELECT query_start FROM pg_stat_activity WHERE application_name = 'fed/head'"
        )

    async def scenario(admin: Broker, config: GroupConfig, group: str) -> None:
        client = await _broker(url, "fed")
        beating = asyncio.Event()
        beating.set()

        async def beat() -> None:
            while True:
                if beating.is_set():
                    await client.publish_control(group, b"beat")
                await asyncio.sleep(0.1)  # well within the watch's patience (1.5 polls)

        beats = asyncio.create_task(beat())
        try:
            binding = await client.bind(group, config, 0, "fed")
            await _until(lambda: binding.active)
            await asyncio.sleep(1.0)
            before = await head_read_at()
            await asyncio.sleep(1.0)
            assert await head_read_at() == before, "the client read the head between beats"
            sent = await _publish_to_queue(admin, config, 0, 1)
            assert [d.body for d in await _take(binding, 1)] == sent
            beating.clear()
            await asyncio.sleep(0.6)
            assert await head_read_at() != before, "no reads of its own once the beats stop"
            sent = (await _publish_to_queue(admin, config, 0, 2))[1:]  # the first is stored
            assert [d.body for d in await _take(binding, 1)] == sent
            await binding.close()
        finally:
            await cancel_and_wait(beats)
            await client.close()

    _run(url, scenario)


def test_a_heartbeat_goes_out_when_reading_the_head_with_it_fails(url: str) -> None:
    """Heartbeats never depend on the head read they carry: in a database without Message
    DB the read fails, and the message goes out alone."""

    class Holder:
        head_wanted = True
        category = "orders"

        def fed_head(self, _started: float, _head: int) -> None:
            raise AssertionError("no head can be read here")

    async def main() -> None:
        database = f"bare_{uuid.uuid4().hex[:8]}"
        await _sql(url, f"CREATE DATABASE {database}")
        bare = url.rsplit("/", 1)[0] + "/" + database
        listening, sending = await asyncpg.connect(bare), await asyncpg.connect(bare)
        heard: list[str] = []
        try:
            await listening.add_listener("beats", lambda *args: heard.append(args[-1]))
            assert await notify(sending, "beats", "alone", [Holder()]) is False
            await _until(lambda: heard == ["alone"])
        finally:
            await listening.close()
            await sending.close()
            await _sql(url, f"DROP DATABASE {database}")

    asyncio.run(main())


def test_a_holder_whose_queues_last_event_is_not_the_categorys_last_stops_reading(
    url: str,
) -> None:
    """Once a read found none of its member's events up to the category's head (the last
    event written was another queue's), the holder waits for a later event rather than query
    the category again at every poll; a new event of its own is still taken at once."""

    async def category_reads(seen: set[object]) -> None:
        conn = await asyncpg.connect(url)
        try:
            for _ in range(75):  # 1.5 s: a poll is 0.15 s
                seen.update(
                    await conn.fetch(
                        "SELECT pid, query_start FROM pg_stat_activity WHERE application_name ="
                        " 'older/read' AND query LIKE '%get_category_messages%'"
                    )
                )
                await asyncio.sleep(0.02)
        finally:
            await conn.close()

    async def scenario(admin: Broker, config: GroupConfig, group: str) -> None:
        client = await _broker(url, "older")
        try:
            binding = await client.bind(group, config, 0, "older")
            await _until(lambda: binding.active)
            sent = await _publish_to_queue(admin, config, 0, 1)
            taken = await _take(binding, 1)
            assert [d.body for d in taken] == sent
            assert await binding.ack(taken[0])
            await _publish_to_queue(admin, config, 1, 1)  # the head moves past queue 0's
            await asyncio.sleep(0.5)
            reads: set[object] = set()
            await category_reads(reads)
            assert len(reads) <= 1, f"{len(reads)} reads of the category in 1.5 s, nothing new"
            sent = (await _publish_to_queue(admin, config, 0, 2))[1:]
            assert [d.body for d in await _take(binding, 1)] == sent
            await binding.close()
        finally:
            await client.close()

    _run(url, scenario)
