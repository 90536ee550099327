"""Planned moves and the operator's view: control messages, overrides, assignment, status."""

import asyncio
import dataclasses
from collections.abc import Iterable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.clock import Clock

from lbg.admin.move import MoveRefused, check_move
from lbg.admin.status import group_status, routes
from lbg.broker import connect_broker
from lbg.broker.base import Broker, QueueStatus
from lbg.broker.memory import reset_memory_brokers
from lbg.broker.memory.binding import MemoryQueueBinding
from lbg.client.coordinator import Coordinator
from lbg.client.steering import BindingSteering
from lbg.model.assignment import balanced_assignment
from lbg.model.control import (
    Heartbeat,
    MemberState,
    Move,
    Override,
    OverrideGossip,
    Probe,
    Resized,
    decode_control,
    encode_gossip,
    encode_move,
    encode_probe,
    encode_resized,
)
from lbg.model.group import GroupConfig
from lbg.model.hashing import bucket_for
from lbg.model.lease import LeaseTerms
from lbg.model.messages import MalformedMessage
from lbg.model.overrides import OverrideBook, assign_with_overrides
from lbg.settings import BrokerSettings


def beat(member: str, state=MemberState.ACTIVE, owns=(), wants=(), generation=0) -> Heartbeat:
    pins = {q: f"pin-{member}-{q}" for q in owns}
    return Heartbeat(member, state, pins, frozenset(wants), generation)


# --- control messages -------------------------------------------------------------------------


def test_a_move_round_trips_and_is_not_a_heartbeat() -> None:
    body = encode_move(Override(2, "client-b", 1700000000.5))
    assert decode_control(body) == Move(Override(2, "client-b", 1700000000.5))
    with pytest.raises(MalformedMessage):
        Heartbeat.decode(body)


def test_gossip_and_probe_round_trip_and_are_not_heartbeats() -> None:
    overrides = (Override(0, "a", 1.0), Override(3, "b", 2.0))
    gossip = encode_gossip("c", overrides, {1: 0.5})
    assert decode_control(gossip) == OverrideGossip("c", overrides, ((1, 0.5),))
    assert decode_control(encode_probe("lbg")) == Probe("lbg")
    assert decode_control(encode_resized(3)) == Resized(3)
    for body in (gossip, encode_probe("lbg"), encode_resized(3)):
        with pytest.raises(MalformedMessage):
            Heartbeat.decode(body)


@pytest.mark.parametrize(
    "body", [beat("a", owns=[1], wants=[2]).encode(), b"not json", b"[1, 2]", b'{"m": "a"}']
)
def test_anything_else_is_left_to_the_heartbeat_decoder(body: bytes) -> None:
    assert decode_control(body) is None


@pytest.mark.parametrize(
    "body",
    [
        b'{"move": 3}',
        b'{"move": {"queue": -1, "to": "a", "at": 1}}',
        b'{"move": {"queue": true, "to": "a", "at": 1}}',
        b'{"move": {"queue": 1, "to": "", "at": 1}}',
        b'{"move": {"queue": 1, "to": 7, "at": 1}}',
        b'{"move": {"queue": 1, "to": "a"}}',
        b'{"move": {"queue": 1, "to": "a", "at": "soon"}}',
        b'{"overrides": [], "from": "a"}',
        b'{"overrides": {"x": {"to": "a", "at": 1}}, "from": "a"}',
        b'{"overrides": {}}',
        b'{"overrides": {}, "dropped": {"1": "x"}, "from": "a"}',
        b'{"overrides": {}, "dropped": [], "from": "a"}',
        b'{"probe": 1}',
        b'{"resized": -1}',
        b'{"resized": "2"}',
        b'{"resized": true}',
    ],
)
def test_a_malformed_operator_message_is_rejected(body: bytes) -> None:
    with pytest.raises(MalformedMessage):
        decode_control(body)


# --- the override book ------------------------------------------------------------------------


def test_the_newest_override_of_a_queue_wins_and_a_dropped_one_never_returns() -> None:
    book = OverrideBook(Clock(100))
    assert book.offer(Override(1, "a", 10.0))
    assert not book.offer(Override(1, "b", 9.0)), "an older move must not win"
    assert not book.offer(Override(1, "a", 10.0)), "a repeat changes nothing"
    assert book.offer(Override(1, "b", 11.0))
    assert book.active(["a", "b"]) == {1: "b"}
    assert book.drop_member("b") == [Override(1, "b", 11.0)]
    assert not book.offer(Override(1, "b", 11.0)), "gossip must not bring a dropped one back"
    assert book.active(["a", "b"]) == {}
    assert book.offer(Override(1, "b", 12.0)), "a newer move does"
    assert book.newest() == 12.0


def test_an_override_applies_only_while_its_member_is_among_the_members() -> None:
    book = OverrideBook(Clock(100))
    book.offer(Override(0, "a", 1.0))
    book.offer(Override(2, "c", 1.0))
    assert book.active(["a", "b"]) == {0: "a"}
    assert [o.queue for o in book.all()] == [0, 2]


def test_merging_gossip_takes_newer_overrides_retires_dropped_ones_and_spots_laggards() -> None:
    book = OverrideBook(Clock(100))
    book.offer(Override(0, "a", 5.0))
    book.offer(Override(1, "b", 5.0))
    book.drop_member("b")
    assert book.dropped() == {1: 5.0}
    taken, retired, behind = book.merge(
        OverrideGossip("x", (Override(2, "c", 1.0), Override(0, "a", 5.0)), ((0, 5.0),))
    )
    assert taken == [Override(2, "c", 1.0)]
    assert retired == [Override(0, "a", 5.0)], "the others dropped it: so does this member"
    assert behind, "the sender still repeats an override that was dropped"
    assert [o.queue for o in book.all()] == [2]
    assert not book.merge(OverrideGossip("y", (Override(2, "c", 1.0),)))[2], "same word"
    assert book.merge(OverrideGossip("y", (Override(1, "b", 5.0),)))[2]
    assert book.merge(OverrideGossip("y", (Override(2, "c", 0.5),)))[2], "superseded"


def test_an_override_of_a_member_nobody_heard_of_is_dropped_after_the_grace() -> None:
    clock = Clock(100)
    book = OverrideBook(clock)
    book.offer(Override(0, "ghost", 1.0))
    book.offer(Override(1, "a", 1.0))
    assert book.drop_unknown(lambda m: m == "a", grace=0.7) == []
    clock.now += 1.0
    assert book.drop_unknown(lambda m: m == "a", grace=0.7) == [Override(0, "ghost", 1.0)]
    assert book.active(["a", "ghost"]) == {1: "a"}


# --- assignment with overrides ----------------------------------------------------------------


@st.composite
def scenario(draw):
    queue_count = draw(st.integers(min_value=1, max_value=16))
    members = draw(st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=7, unique=True))
    current = draw(st.dictionaries(st.integers(0, queue_count - 1), st.sampled_from(members)))
    return queue_count, members, current


@given(scenario())
def test_with_no_overrides_it_is_the_balanced_assignment(case) -> None:
    queue_count, members, current = case
    assert assign_with_overrides(queue_count, members, current, {}) == balanced_assignment(
        queue_count, members, current
    )


@given(scenario(), st.data())
def test_an_overridden_queue_goes_to_its_member_and_the_rest_stays_balanced(case, data) -> None:
    queue_count, members, current = case
    pinned_members = data.draw(
        st.lists(st.sampled_from(members), unique=True, max_size=min(len(members), queue_count))
    )
    queues = data.draw(
        st.lists(
            st.integers(0, queue_count - 1),
            min_size=len(pinned_members),
            max_size=len(pinned_members),
            unique=True,
        )
    )
    overrides = dict(zip(queues, pinned_members, strict=False))
    result = assign_with_overrides(queue_count, members, current, overrides)
    assert sorted(result) == list(range(queue_count))
    assert all(result[q] == m for q, m in overrides.items())
    loads = [list(result.values()).count(m) for m in members]
    if len(members) <= queue_count:
        assert max(loads) - min(loads) <= 1, (overrides, result)
    else:
        assert max(loads) <= 1
    again = assign_with_overrides(queue_count, list(reversed(members)), result, overrides)
    assert again == result, "once reached, the assignment must stay put"


def test_a_move_is_a_swap_when_the_target_must_shed_a_queue() -> None:
    current = {0: "a", 1: "a", 2: "b", 3: "b"}
    result = assign_with_overrides(4, ["a", "b"], current, {0: "b"})
    assert result == {0: "b", 1: "a", 2: "b", 3: "a"}


def test_a_move_to_an_idle_member_moves_only_that_queue() -> None:
    current = {0: "a", 1: "a", 2: "b", 3: "b"}
    result = assign_with_overrides(4, ["a", "b", "c"], current, {3: "c"})
    assert result == {0: "a", 1: "a", 2: "b", 3: "c"}


def test_overrides_of_absent_members_or_queues_out_of_range_are_ignored() -> None:
    current = {0: "a", 1: "b"}
    assert assign_with_overrides(2, ["a", "b"], current, {0: "gone", 5: "a"}) == current


# --- the coordinator applies moves ------------------------------------------------------------


URL = "memory://operator"
# Room for the queues a resize adds (4..7); the coordinator is told how many it runs.
MEMORY_GROUP = GroupConfig(hash_prefix="ops", hash_count=8, queue_count=8)


async def bind_queues(
    broker: Broker, queues: Iterable[int], active: Iterable[int]
) -> dict[int, MemoryQueueBinding]:
    """This member's bindings of `queues` on the memory broker: active on `active`, standby
    elsewhere (another client holds those queues)."""
    holder = await connect_broker(BrokerSettings(url=URL), "someone-else")
    bindings: dict[int, MemoryQueueBinding] = {}
    for queue in queues:
        if queue not in active:
            await holder.bind("g", MEMORY_GROUP, queue, "someone-else", preferred=False)
        binding = await broker.bind("g", MEMORY_GROUP, queue, "me", preferred=False)
        assert isinstance(binding, MemoryQueueBinding) and binding.active is (queue in active)
        bindings[queue] = binding
    return bindings


def beat_for(coord: Coordinator, clock: Clock, seconds: float) -> None:
    """Let `seconds` pass with this member heartbeating (and hearing itself) as it would."""
    for _ in range(round(seconds / coord.interval)):
        clock.now += coord.interval
        asyncio.run(coord.tick())


def coordinator(clock: Clock, active: tuple[int, ...] = (), **kwargs):
    """A coordinator over four queues of a fresh memory broker, hearing the group's control
    channel, with every control message sent recorded in `sent`."""
    reset_memory_brokers()
    sent: list[bytes] = []

    async def setup() -> tuple[Broker, dict[int, MemoryQueueBinding]]:
        admin = await connect_broker(BrokerSettings(url=URL), "admin")
        await admin.create_group("g", MEMORY_GROUP)
        await admin.subscribe_control("g", sent.append)
        broker = await connect_broker(BrokerSettings(url=URL), "me")
        return broker, await bind_queues(broker, range(4), active)

    broker, bindings = asyncio.run(setup())
    released: list[int] = []
    coord = Coordinator(
        broker,
        "g",
        "me",
        BindingSteering(bindings, released.append),
        interval=0.15,
        lease=0.7,
        clock=clock,
        queue_count=4,
        **kwargs,
    )
    asyncio.run(broker.subscribe_control("g", coord._receive))
    return coord, sent, bindings, released


def test_a_member_hears_of_a_newer_size_from_a_heartbeat_or_cg_admin() -> None:
    heard: list[int] = []
    coord, _sent, _bindings, _released = coordinator(
        Clock(100), generation=1, on_newer_generation=heard.append
    )
    coord._receive(beat("other", generation=1).encode())
    coord._receive(beat("old", generation=0).encode())
    assert heard == [], "only a newer generation than its own asks for the config"
    coord._receive(beat("other", generation=2).encode())
    coord._receive(encode_resized(3))
    assert heard == [2, 3]


def test_an_adopted_size_spans_the_assignment_and_travels_in_the_heartbeats() -> None:
    clock = Clock(100)
    coord, sent, bindings, _released = coordinator(clock, active=(0, 1, 2, 3))
    coord._receive(beat("other").encode())
    assert sorted(coord.desired) == [0, 1, 2, 3]
    bindings.update(asyncio.run(bind_queues(coord._broker, range(4, 8), active=())))
    coord.adopt(1, 8)
    assert sorted(coord.desired) == list(range(8))
    assert sorted(coord.desired.values()).count("other") == 4, "the new queues go to the idle peer"
    asyncio.run(coord.tick())
    assert Heartbeat.decode(sent[-1]).generation == 1
    del bindings[3], bindings[2]
    for q in range(4, 8):
        del bindings[q]
    coord.adopt(2, 2)
    assert sorted(coord.desired) == [0, 1]


def test_the_coordinator_applies_a_move_and_releases_to_the_ready_target() -> None:
    clock = Clock(100)
    coord, _sent, bindings, released = coordinator(clock, active=(0, 1))
    coord._receive(beat("other", owns=[2, 3]).encode())
    coord.rebalance()
    assert coord.desired == {0: "me", 1: "me", 2: "other", 3: "other"}
    coord._receive(encode_move(Override(0, "other", 5.0)))
    assert coord.desired[0] == "other"
    assert coord.desired[3] == "me", "the target sheds a queue to keep the shares even"
    assert bindings[3].preferred and not bindings[0].preferred
    assert released == [], "no release before the target stands ready"
    coord._receive(beat("other", owns=[2, 3], wants=[0]).encode())
    assert released == [0]


def test_the_coordinator_repeats_its_overrides_and_answers_a_probe() -> None:
    clock = Clock(100)
    coord, sent, _bindings, _released = coordinator(clock)
    coord._receive(beat("other").encode())
    asyncio.run(coord.tick())
    assert not [b for b in sent if decode_control(b)], "nothing to repeat yet"
    coord._receive(encode_move(Override(1, "other", 5.0)))
    asyncio.run(coord.tick())
    gossip = [decode_control(b) for b in sent if decode_control(b)]
    assert gossip == [OverrideGossip("me", (Override(1, "other", 5.0),))]
    sent.clear()
    clock.now += 0.15
    coord._receive(beat("other").encode())
    asyncio.run(coord.tick())
    assert not [b for b in sent if decode_control(b)], "at most once a second"
    coord._receive(encode_probe("lbg"))
    clock.now += 0.15
    coord._receive(beat("other").encode())
    asyncio.run(coord.tick())
    assert [b for b in sent if decode_control(b)], "a probe is answered at the next beat"


def test_a_later_member_learns_overrides_from_gossip() -> None:
    coord, _sent, _bindings, _released = coordinator(Clock(100))
    coord._receive(beat("other").encode())
    coord._receive(encode_gossip("other", [Override(2, "me", 3.0), Override(1, "other", 3.0)]))
    assert coord.desired[2] == "me" and coord.desired[1] == "other"


def test_an_override_is_dropped_when_its_member_leaves_or_dies() -> None:
    clock = Clock(100)
    coord, _sent, _bindings, _released = coordinator(clock)
    for member in ("x", "y"):
        coord._receive(beat(member).encode())
    coord._receive(encode_move(Override(0, "x", 1.0)))
    coord._receive(encode_move(Override(1, "y", 1.0)))
    coord._receive(beat("x", MemberState.LEAVING).encode())
    assert [o.to for o in coord.overrides.all()] == ["y"]
    beat_for(coord, clock, 1.0)  # y's lease lapses
    assert coord.overrides.all() == []
    assert set(coord.desired.values()) == {"me"}
    coord._receive(encode_gossip("z", [Override(1, "y", 1.0)]))
    assert coord.overrides.all() == [], "a stale repeat does not bring it back"


def test_a_member_that_missed_a_drop_learns_it_from_the_others() -> None:
    clock = Clock(100)
    coord, sent, _bindings, _released = coordinator(clock)
    coord._receive(beat("x").encode())
    coord._receive(encode_move(Override(0, "x", 1.0)))
    beat_for(coord, clock, 1.0)  # x's lease lapses: dropped here
    coord._receive(beat("late").encode())
    asyncio.run(coord.tick())
    sent.clear()
    clock.now += 0.15
    coord._receive(beat("late").encode())
    coord._receive(encode_gossip("late", [Override(0, "x", 1.0)]))  # late was cut off
    asyncio.run(coord.tick())
    replies = [m for b in sent if isinstance(m := decode_control(b), OverrideGossip)]
    assert replies == [OverrideGossip("me", (), ((0, 1.0),))]
    other, *_ = coordinator(Clock(100))
    other._receive(beat("x").encode())
    other._receive(encode_move(Override(0, "x", 1.0)))
    other._receive(encode_gossip("me", [], {0: 1.0}))
    assert other.overrides.all() == []


def test_a_member_whose_own_heartbeats_lapsed_drops_the_overrides_to_itself() -> None:
    clock = Clock(100)
    coord, _sent, _bindings, _released = coordinator(clock)
    coord._receive(encode_move(Override(0, "me", 1.0)))
    clock.now += 5.0  # SIGSTOP: the others counted it gone and dropped the override
    coord._receive(beat("other").encode())
    asyncio.run(coord.tick())
    assert coord.overrides.all() == []


def test_a_leaving_member_drops_the_overrides_that_pin_queues_to_it() -> None:
    coord, _sent, _bindings, _released = coordinator(Clock(100))
    coord._receive(beat("other").encode())
    coord._receive(encode_move(Override(0, "me", 1.0)))
    asyncio.run(coord.leave())
    assert coord.overrides.all() == []


# --- status, route, move checks ---------------------------------------------------------------

CONFIG = GroupConfig(hash_prefix="orders", hash_count=8, queue_count=4)


def statuses(active=None) -> list[QueueStatus]:
    active = active or {}
    return [
        QueueStatus(q, f"g/q{q}", CONFIG.buckets_for_queue(q), 5 * q, q, active.get(q))
        for q in range(4)
    ]


def test_status_of_a_static_group_shows_the_brokers_active_clients() -> None:
    status = group_status("g", CONFIG, statuses({0: "s0", 1: "s1"}), {}, OverrideBook(), 0.5)
    assert not status.dynamic
    assert [q.serving for q in status.queues] == ["s0", "s1", None, None]
    assert [q.assigned for q in status.queues] == [None] * 4
    assert "no dynamic members heard" in status.to_text()


def test_status_shows_each_members_lease_while_they_differ() -> None:
    longer = Heartbeat("b", MemberState.ACTIVE, terms=LeaseTerms(1.4, 0.3))
    default = Heartbeat("a", MemberState.ACTIVE, terms=LeaseTerms(0.7, 0.15))
    mixed = {"a": default, "b": longer, "c": beat("c")}
    lines = group_status("g", CONFIG, statuses({}), mixed, OverrideBook(), 0.5).to_text()
    member_lines = {line.split()[0]: line for line in lines.splitlines() if line.startswith("  ")}
    assert member_lines["a"].endswith("(lease 0.7s, margin 0.15s)")
    assert member_lines["b"].endswith("(lease 1.4s, margin 0.3s)")
    assert member_lines["c"].endswith("(lease not announced: an older build)")
    same = {"a": default, "b": dataclasses.replace(longer, terms=default.terms)}
    lines = group_status("g", CONFIG, statuses({}), same, OverrideBook(), 0.5).to_text()
    assert "lease" not in lines


def test_status_shows_a_resized_groups_generation_and_the_members_behind_it() -> None:
    resized = dataclasses.replace(CONFIG, generation=2)
    heartbeats = {"a": beat("a", owns=[0, 1], generation=2), "b": beat("b", generation=1)}
    lines = group_status("g", resized, statuses({}), heartbeats, OverrideBook(), 0.5).to_text()
    assert "generation 2" in lines.splitlines()[0]
    member_lines = {line.split()[0]: line for line in lines.splitlines() if line.startswith("  ")}
    assert "(runs generation 1)" in member_lines["b"]
    assert "runs generation" not in member_lines["a"]


def test_status_lists_the_old_generations_queues_still_draining() -> None:
    old = QueueStatus(3, "g/q3 (generation 0, acked up to 90 of 120)", [3, 7, 11], 4, 2, None)
    status = group_status("g", CONFIG, statuses(), {}, OverrideBook(), 0.5)
    status = dataclasses.replace(status, draining=[old])
    assert status.to_text().splitlines()[-1] == (
        "draining: g/q3 (generation 0, acked up to 90 of 120): buckets [3,7,11], backlog 4,"
        " in flight 2"
    )
    assert status.to_dict()["draining"] == [
        {"name": old.name, "buckets": [3, 7, 11], "backlog": 4, "in_flight": 2}
    ]


def test_status_marks_moving_draining_idle_and_pinned_queues() -> None:
    heartbeats = {
        "a": beat("a", owns=[0, 1, 2]),
        "b": beat("b", owns=[]),
        "c": beat("c", MemberState.LEAVING, owns=[3]),
    }
    book = OverrideBook()
    book.offer(Override(1, "b", 1.0))
    status = group_status("g", CONFIG, statuses({0: "a", 3: "c"}), heartbeats, book, 0.5)
    rows = status.queues
    assert [m.state for m in status.members] == ["active", "active", "leaving"]
    assert [q.serving for q in rows] == ["a", "a", "a", "c"]
    assert rows[1].assigned == "b" and rows[1].marker == "moving" and rows[1].pinned == "b"
    assert rows[3].marker == "draining"
    assert sorted(q.assigned for q in rows) == ["a", "a", "b", "b"]
    assert status.to_dict()["overrides"] == {"1": "b"}
    idle = group_status("g", CONFIG, statuses(), {"a": beat("a")}, OverrideBook(), 0.5)
    assert [q.marker for q in idle.queues] == ["idle", "unserved", "unserved", "unserved"]
    assert "pinned" in status.to_text()


def test_route_gives_the_bucket_queue_and_owner_of_each_key() -> None:
    status = group_status(
        "g", CONFIG, statuses(), {"a": beat("a", owns=[0, 1, 2, 3])}, OverrideBook(), 0.5
    )
    (route,) = routes(status, ["order-42"])
    assert route.bucket == bucket_for("java", "order-42", 8)
    assert route.queue == route.bucket % 4
    assert route.owner == "a"
    with pytest.raises(MalformedMessage):
        routes(status, [""])


def test_a_move_is_refused_for_a_bad_queue_an_unknown_or_inactive_member_or_a_static_group() -> (
    None
):
    heartbeats = {"a": beat("a"), "s": beat("s", MemberState.STALLED)}
    status = group_status("g", CONFIG, statuses(), heartbeats, OverrideBook(), 0.5)
    check_move(status, 3, "a")
    with pytest.raises(MoveRefused, match=r"queue 4 is outside 0\.\.3"):
        check_move(status, 4, "a")
    with pytest.raises(MoveRefused, match=r"unknown member 'z' \(heard: a, s\)"):
        check_move(status, 0, "z")
    with pytest.raises(MoveRefused, match="is stalled"):
        check_move(status, 0, "s")
    static = group_status("g", CONFIG, statuses(), {}, OverrideBook(), 0.5)
    with pytest.raises(MoveRefused, match="no dynamic members heard"):
        check_move(static, 0, "a")
