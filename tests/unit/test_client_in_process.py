"""The real client, coordinator, publisher and validator in one process on the memory broker:
order per key, planned handovers, crashes, fencing and lanes, in seconds."""

import asyncio
import contextvars
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lbg.api as api_module
import lbg.client.client as client_module
from lbg import Client, Publisher
from lbg.aio import cancel_and_wait
from lbg.broker import connect_broker
from lbg.broker.base import Broker
from lbg.broker.memory import memory_store, reset_memory_brokers
from lbg.broker.memory.binding import MemoryQueueBinding
from lbg.client.client import LbgClient
from lbg.client.coordination import DynamicRole, Role, StaticRole
from lbg.handlers import Context, Hooks, republish
from lbg.model.destinations import event_destination
from lbg.model.group import GroupConfig
from lbg.model.messages import Event
from lbg.publisher import HashedPublisher
from lbg.settings import BrokerSettings, ClientSettings
from lbg.validator import Validator

URL = "memory://inproc"
CONFIG = GroupConfig(hash_prefix="orders", hash_count=16, queue_count=6)
# Handovers ride on heartbeats; a lease this long is not lapsed by a loaded test machine.
# The last member to leave waits `leave_timeout` for a successor that never comes.
STEADY = DynamicRole(heartbeat_interval=0.03, lease=1.0, lease_margin=0.2, leave_timeout=0.3)
# Short enough that a crash or a cut-off member is replaced within a few tenths of a second.
FAST = DynamicRole(heartbeat_interval=0.03, lease=0.25, lease_margin=0.06, leave_timeout=0.3)
PRIORITY_TIMEOUT = 0.3
MEMBER: contextvars.ContextVar[str | None] = contextvars.ContextVar("member", default=None)


@pytest.fixture(autouse=True)
def quick_handovers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's standby delay and leave timeout short (seconds in production)."""
    monkeypatch.setattr(client_module, "STANDBY_DELAY", 0.02)
    monkeypatch.setattr(api_module, "DynamicRole", partial(DynamicRole, leave_timeout=0.3))


def fresh_broker() -> None:
    reset_memory_brokers()
    memory_store("inproc", priority_timeout=PRIORITY_TIMEOUT)


@dataclass(frozen=True)
class Write:
    """One handler call, as a store behind the handler would see it."""

    client: str
    key: str
    seq: int
    epoch: int
    redelivered: bool


@dataclass
class Member:
    """A running LbgClient and every task it started (its 'process')."""

    client: LbgClient
    broker: Broker
    stop: asyncio.Event
    task: asyncio.Task[Any]
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)


class Group:
    """Members of group 'g' on the memory broker, a publisher, and the log of handler calls."""

    def __init__(self, role: DynamicRole = STEADY, window: int = 64) -> None:
        self.role = role
        self.window = window
        self.writes: list[Write] = []
        self.members: dict[str, Member] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.delay = 0.0
        self.backoff = 0.2
        self.published: dict[str, int] = {}
        self._publisher: HashedPublisher | None = None

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_task_factory(self._tag)
        admin = await connect_broker(BrokerSettings(url=URL), "admin")
        await admin.create_group("g", CONFIG)
        self._publisher = HashedPublisher(admin, "g", CONFIG, "pub")

    def _tag(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kw: Any):
        """Task factory: remember which member started a task, so a crash can cancel them all."""
        task = asyncio.Task(coro, loop=loop, **kw)
        member = MEMBER.get()
        if member is not None and member in self.members:
            self.members[member].tasks.append(task)
        return task

    async def handle(self, event: Event, context: Context) -> None:
        """Work a random while, write (what order and fencing are judged by), then wait at
        the member's gate if it has one."""
        if self.delay:
            await asyncio.sleep(random.uniform(0, self.delay))
        self.writes.append(
            Write(context.client, event.key, event.seq or 0, context.epoch, context.redelivered)
        )
        gate = self.gates.get(context.client)
        if gate is not None:
            await gate.wait()

    async def join(self, name: str, role: Role | None = None, hooks: Hooks | None = None) -> None:
        broker = await connect_broker(BrokerSettings(url=URL), name)
        role = role or self.role
        client = LbgClient(
            broker,
            "g",
            CONFIG,
            name,
            self.handle,
            role,
            cycle_seconds=0.1,
            window=self.window,
            hooks=hooks,
            retry_backoff=self.backoff,
        )
        stop = asyncio.Event()
        token = MEMBER.set(name)
        try:
            task = asyncio.create_task(client.run(stop))
        finally:
            MEMBER.reset(token)
        self.members[name] = Member(client, broker, stop, task)

    async def balanced(self) -> None:
        """Wait until the members share the queues evenly (joining takes a few heartbeats)."""
        share = CONFIG.queue_count // len(self.members)
        await until(lambda: all(len(m.client.stats.active) == share for m in self.members.values()))

    async def leave(self, name: str) -> None:
        """A planned stop: the member hands its queues over and closes."""
        member = self.members.pop(name)
        member.stop.set()
        await member.task
        await member.broker.close()

    async def crash(self, name: str) -> None:
        """The member's process dies: its connection drops and its tasks stop, no goodbye."""
        member = self.members.pop(name)
        memory_store("inproc").kill(name)
        for task in [member.task, *member.tasks]:
            await cancel_and_wait(task)

    async def publish(self, count: int, keys: int = 12) -> None:
        assert self._publisher is not None
        for i in range(count):
            key = f"key-{i % keys}"
            self.published[key] = await self._publisher.publish(key, b"{}")

    async def settle(self, timeout: float = 5.0) -> None:
        """Wait until every published event was handled, then stop every member cleanly."""
        await until(lambda: self.handled() == self.published, timeout)
        for name in list(self.members):
            await self.leave(name)

    def handled(self) -> dict[str, int]:
        """The highest seq handled per key."""
        highest: dict[str, int] = {}
        for write in self.writes:
            highest[write.key] = max(highest.get(write.key, 0), write.seq)
        return highest

    def by_key(self) -> dict[str, list[Write]]:
        keys: dict[str, list[Write]] = {}
        for write in self.writes:
            keys.setdefault(write.key, []).append(write)
        return keys

    def check_in_order(self) -> None:
        """Per key: starts at 1 and never skips ahead (a replay after a crash may go back)."""
        for key, writes in self.by_key().items():
            last = 0
            for write in writes:
                assert write.seq <= last + 1, f"{key}: {write.seq} after {last}"
                last = write.seq

    def check_once(self) -> None:
        handled = [(w.key, w.seq) for w in self.writes]
        assert len(handled) == len(set(handled)) == sum(self.published.values()), "duplicates"

    def check_epochs(self) -> None:
        """No write with an older epoch after one with a newer epoch for the same key."""
        for key, writes in self.by_key().items():
            epochs = [w.epoch for w in writes]
            assert epochs == sorted(epochs), f"{key}: epochs {epochs}"


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def run(scenario: Callable[[Group], Awaitable[None]], group: Group | None = None) -> Group:
    group = group or Group()
    fresh_broker()

    async def main() -> None:
        await group.open()
        await scenario(group)

    asyncio.run(main())
    return group


def test_three_clients_handle_every_event_once_and_in_order() -> None:
    async def scenario(group: Group) -> None:
        for name in ("a", "b", "c"):
            await group.join(name)
        await group.balanced()
        await group.publish(300)
        await group.settle()

    group = run(scenario)
    group.check_once()
    group.check_in_order()
    assert {w.client for w in group.writes} == {"a", "b", "c"}, "the queues are shared"


def test_idle_workers_sleep_until_a_message_or_a_handover_needs_them(monkeypatch) -> None:
    """No events, no changes: a worker looks at its binding only when woken, not on a timer
    (the idle cost must not grow with the queue count); events still flow once published."""
    looks: list[int] = []
    ready = MemoryQueueBinding.ready

    def counted(binding: MemoryQueueBinding) -> Any:
        looks.append(binding.queue)
        return ready(binding)

    async def scenario(group: Group) -> None:
        await group.join("a")
        await group.join("b")
        await group.balanced()
        await asyncio.sleep(0.3)
        looks.clear()
        await asyncio.sleep(1.0)
        idle.extend(looks)
        await group.publish(60)
        await group.settle()

    idle: list[int] = []
    monkeypatch.setattr(MemoryQueueBinding, "ready", counted)
    group = run(scenario)
    assert len(idle) <= CONFIG.queue_count, f"idle workers looked {len(idle)} times in 1 s"
    group.check_once()
    group.check_in_order()


def test_a_planned_handover_loses_and_repeats_nothing() -> None:
    async def scenario(group: Group) -> None:
        await group.join("a")
        await group.join("b")
        await group.balanced()
        group.delay = 0.01
        await group.publish(150)
        await until(lambda: len(group.writes) > 10)
        await group.leave("a")  # with events in flight: they are finished before it lets go
        left.append(len(group.writes))
        await group.publish(150)
        await group.settle()

    left: list[int] = []
    group = run(scenario)
    group.check_once()
    group.check_in_order()
    assert not any(w.redelivered for w in group.writes)
    assert {w.client for w in group.writes[left[0] :]} == {"b"}, "b serves every queue"


def test_a_crashed_members_queues_move_and_its_unacked_events_come_again_in_order() -> None:
    async def scenario(group: Group) -> None:
        await group.join("a")
        await group.join("b")
        await group.balanced()
        group.gates["a"] = asyncio.Event()  # a takes events and never finishes them
        await group.publish(120)
        await until(lambda: any(w.client == "a" for w in group.writes))
        await group.crash("a")
        await group.settle()

    group = run(scenario, Group(FAST))
    group.check_in_order()
    group.check_epochs()
    taken_by_a = {(w.key, w.seq) for w in group.writes if w.client == "a"}
    again = {(w.key, w.seq) for w in group.writes if w.client == "b" and w.redelivered}
    assert taken_by_a and taken_by_a <= again, "what a never acked came again, redelivered"


def gone_lines(caplog: pytest.LogCaptureFixture, member: str) -> list[tuple[float, str]]:
    """(time, why) of every peer's line saying `member` is gone."""
    said = f"member {member} is gone ("
    return [
        (r.created, r.getMessage().split(said, 1)[1].rstrip(")"))
        for r in caplog.records
        if said in r.getMessage()
    ]


def test_a_crashed_member_is_gone_once_its_lease_could_have_ended_not_a_margin_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", "lbg.client.coordinator")
    crashed_at = 0.0

    async def scenario(group: Group) -> None:
        nonlocal crashed_at
        await group.join("a")
        await group.join("b")
        await group.balanced()
        crashed_at = time.time()
        await group.crash("a")
        await until(lambda: bool(gone_lines(caplog, "a")))
        await group.settle()

    group = run(scenario, Group(STEADY))
    group.check_in_order()
    (at, why), *_ = gone_lines(caplog, "a")
    assert why == "connection closed", "the broker said a's connection closed"
    # Its lease could have ended lease - margin after its last heartbeat (at most an interval
    # before the crash); waiting out the lease, b would say so lease + margin after it.
    assert at - crashed_at < STEADY.lease + STEADY.lease_margin - STEADY.heartbeat_interval


def test_a_cut_off_member_is_not_taken_for_crashed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", "lbg.client.coordinator")

    async def scenario(group: Group) -> None:
        await group.join("a")
        await group.join("b")
        await group.balanced()
        memory_store("inproc").partition("a")
        await until(lambda: bool(gone_lines(caplog, "a")))
        memory_store("inproc").partition("a", cut=False)
        await group.settle()

    group = run(scenario, Group(FAST))
    group.check_in_order()
    group.check_epochs()
    assert {why for _, why in gone_lines(caplog, "a")} == {"lease lapsed"}


def test_a_cut_off_member_processes_nothing_once_its_successor_started() -> None:
    async def scenario(group: Group) -> None:
        await group.join("a")
        await group.join("b")
        await group.balanced()
        group.gates["a"] = asyncio.Event()  # a holds its first event of each key, the rest wait
        await group.publish(120)
        await until(lambda: any(w.client == "a" for w in group.writes))
        memory_store("inproc").partition("a")
        successor_started = lambda: any(  # noqa: E731
            w.client == "b" and w.redelivered for w in group.writes
        )
        await until(successor_started)
        group.gates["a"].set()  # a's handlers return: its lanes would go on without fencing
        await asyncio.sleep(0.2)
        memory_store("inproc").partition("a", cut=False)
        await group.settle()

    group = run(scenario, Group(FAST))
    group.check_in_order()
    group.check_epochs()
    assert group.members == {}


def test_static_primaries_reclaim_their_queues_from_a_secondary_with_nothing_repeated() -> None:
    async def scenario(group: Group) -> None:
        await group.join("s1", StaticRole(1, 2))
        await until(lambda: len(group.members["s1"].client.stats.active) == 6)
        group.delay = 0.005
        await group.publish(100)
        await group.join("s0", StaticRole(0, 2))
        await group.publish(100)
        await until(lambda: group.members["s0"].client.stats.active == {0, 2, 4})
        assert group.members["s1"].client.stats.active == {1, 3, 5}
        await group.settle()

    group = run(scenario)
    group.check_once()
    group.check_in_order()


def test_lanes_run_keys_concurrently_and_each_key_in_order() -> None:
    async def scenario(group: Group) -> None:
        await group.join("a")
        await group.join("b")
        group.delay = 0.003
        await group.publish(200, keys=40)
        await group.settle()

    running = 0
    peak = 0
    group = Group(window=16)
    handle = group.handle

    async def counting(event: Event, context: Context) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            await handle(event, context)
        finally:
            running -= 1

    group.handle = counting  # type: ignore[method-assign]
    run(scenario, group)
    group.check_once()
    group.check_in_order()
    assert peak > 2, "keys ran one at a time"


def test_the_in_process_api_and_validator_run_on_a_memory_url() -> None:
    fresh_broker()

    async def main() -> None:
        admin = await connect_broker(BrokerSettings(url=URL), "admin")
        await admin.create_group("g", CONFIG)
        options = ClientSettings(heartbeat_interval=0.03, lease=1.0, lease_margin=0.2)
        clients = [Client(URL, "g", republish, client_id=n, options=options) for n in "xy"]
        runs = [asyncio.create_task(c.run()) for c in clients]
        async with Publisher(URL, "g", publisher_id="p") as publisher:
            for i in range(100):
                await publisher.publish(f"k{i % 7}", b"{}")
            await publisher.send_summary()
        validator = Validator()
        reader = admin.read_output("g")

        async def consume() -> None:
            async for message in reader:
                validator.handle(message)

        consuming = asyncio.create_task(consume())
        await until(lambda: validator.complete)
        for client in clients:
            client.stop()
        await asyncio.gather(*runs)
        await cancel_and_wait(consuming)
        report = validator.report()
        assert (report.lost, report.duplicates, report.reordered, report.delivered) == (
            0,
            0,
            0,
            100,
        )

    asyncio.run(main())


def test_a_handler_hung_past_the_stall_timeout_gives_the_queues_up_until_it_returns() -> None:
    async def scenario(group: Group) -> None:
        await group.join("a", replace(STEADY, stall_timeout=0.3))
        await group.join("b")
        await group.balanced()
        group.gates["a"] = asyncio.Event()  # a's handler calls hang; its heartbeats go on
        await group.publish(120)
        a, b = (group.members[n].client.stats for n in "ab")
        await until(lambda: not a.active and len(b.active) == CONFIG.queue_count)
        group.gates["a"].set()
        await group.balanced()
        await group.settle()

    group = run(scenario)
    group.check_in_order()
    group.check_epochs()
    hung = {(w.key, w.seq) for w in group.writes if w.client == "a"}
    again = {(w.key, w.seq) for w in group.writes if w.client == "b" and w.redelivered}
    assert hung and hung <= again, "what a's hung handler held came again to b"


def test_hooks_tell_a_handover_in_order() -> None:
    journal: list[tuple[str, str, int]] = []

    def hooks(name: str) -> Hooks:
        async def assigned(queues: list[int]) -> None:
            journal.extend((name, "assigned", q) for q in queues)

        async def revoked(queues: list[int]) -> None:
            journal.extend((name, "revoked", q) for q in queues)

        return Hooks(on_assigned=assigned, on_revoked=revoked)

    async def scenario(group: Group) -> None:
        await group.join("a", hooks=hooks("a"))
        await until(lambda: len(group.members["a"].client.stats.active) == CONFIG.queue_count)
        group.delay = 0.005
        await group.publish(100)
        await group.join("b", hooks=hooks("b"))
        await group.balanced()
        await group.publish(100)
        await until(lambda: group.handled() == group.published)
        moved.update(group.members["b"].client.stats.active)
        await group.settle()

    moved: set[int] = set()
    group = run(scenario)
    group.check_once()
    group.check_in_order()
    assert len(moved) == CONFIG.queue_count // 2
    for queue in moved:
        revoked = journal.index(("a", "revoked", queue))
        assert revoked < journal.index(("b", "assigned", queue)), f"queue {queue}: out of order"


def test_a_foreign_producers_events_reach_the_handler_byte_for_byte_in_order() -> None:
    """No lbg headers, any bytes (not JSON, not UTF-8), the producer's own headers kept."""
    sent: dict[str, list[tuple[bytes, str | None]]] = {}
    received: dict[str, list[tuple[bytes, str | None]]] = {}

    async def recording(event: Event, context: Context) -> None:
        assert event.seq is None
        received.setdefault(event.key, []).append((event.body, event.headers.get("x-source")))

    async def scenario(group: Group) -> None:
        await group.join("a")
        await group.join("b")
        await group.balanced()
        producer = await connect_broker(BrokerSettings(url=URL), "foreign")
        rng = random.Random(7)
        for i in range(150):
            key = f"device-{i % 9}"
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
            destination = event_destination(CONFIG.hash_prefix, CONFIG.bucket_for_key(key), key)
            await producer.publish(destination, body, {"x-source": f"{key}/{i}"})
            sent.setdefault(key, []).append((body, f"{key}/{i}"))
        total = sum(len(events) for events in sent.values())
        await until(lambda: sum(len(events) for events in received.values()) == total)
        for name in list(group.members):
            await group.leave(name)

    group = Group()
    group.handle = recording  # type: ignore[method-assign]
    run(scenario, group)
    assert received == sent


# A run: steps of publishing, a member joining, leaving cleanly or crashing.
STEPS = st.lists(
    st.sampled_from(["publish", "publish", "join", "leave", "crash"]), min_size=1, max_size=6
)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STEPS)
def test_any_run_of_joins_leaves_and_crashes_keeps_every_key_complete_and_in_order(steps) -> None:
    crashed = "crash" in steps

    async def scenario(group: Group) -> None:
        names = iter(f"m{i}" for i in range(20))
        await group.join(next(names))
        for step in steps:
            if step == "publish":
                await group.publish(30, keys=6)
            elif step == "join":
                await group.join(next(names))
            elif group.members:
                victim = sorted(group.members)[0]
                await (group.crash(victim) if step == "crash" else group.leave(victim))
            await asyncio.sleep(0.05)
        if not group.members:
            await group.join(next(names))
        await group.settle()

    group = run(scenario, Group(FAST if crashed else STEADY))
    group.check_in_order()
    group.check_epochs()
    if not crashed:
        group.check_once()
