"""The membership view: leases, leaving, stalled members and owner claims."""

import contextlib
from dataclasses import replace

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.clock import Clock

from lbg.client.membership import MembershipView
from lbg.model.control import Heartbeat, MemberState, members_digest, queues_digest, unnumbered
from lbg.model.lease import LeaseTerms
from lbg.model.messages import MalformedMessage


def beat(member: str, state=MemberState.ACTIVE, owns=None, wants=()) -> Heartbeat:
    return Heartbeat(member, state, owns or {}, frozenset(wants))


def test_a_member_is_gone_when_its_lease_lapses() -> None:
    clock = Clock(100)
    view = MembershipView(lease=0.6, clock=clock)
    view.observe(beat("a"))
    view.observe(beat("b"))
    clock.now += 0.5
    view.observe(beat("b"))
    clock.now += 0.2
    assert [heartbeat.member for heartbeat in view.expire()] == ["a"]
    assert view.members() == ["b"]


def test_a_leaving_member_gets_no_queues_but_keeps_its_claims_while_it_drains() -> None:
    view = MembershipView(lease=10, clock=Clock(100))
    view.observe(beat("a", owns={2: "pin-a"}))
    view.observe(beat("a", MemberState.LEAVING, owns={2: "pin-a"}))
    assert view.members() == []
    assert view.owners() == {2: "a"}
    view.observe(beat("a", MemberState.LEAVING))
    assert view.owners() == {}


def test_a_stalled_member_gets_no_queues_but_its_claims_still_count() -> None:
    view = MembershipView(lease=10, clock=Clock(100))
    view.observe(beat("a", MemberState.STALLED, owns={0: "pin-a"}))
    view.observe(beat("b"))
    assert view.members() == ["b"]
    assert view.owners() == {0: "a"}
    assert view.pins() == {"pin-a": "a"}


def test_the_latest_claim_of_a_queue_wins() -> None:
    clock = Clock(100)
    view = MembershipView(lease=10, clock=clock)
    view.observe(beat("a", owns={1: "p1"}))
    clock.now += 0.1
    view.observe(beat("b", owns={1: "p2"}))
    assert view.owners() == {1: "b"}


states = st.sampled_from(list(MemberState))
terms = st.none() | st.builds(
    lambda lease, share: LeaseTerms(lease, lease * share),
    st.floats(0.01, 600.0),
    st.floats(0.0, 0.49),
)


@given(
    st.text(max_size=8),
    states,
    st.dictionaries(st.integers(0, 999), st.text(max_size=8), max_size=5),
    st.frozensets(st.integers(0, 999), max_size=5),
    st.integers(0, 65535),
    terms,
    st.none() | st.integers(0, 2**32 - 1),
)
def test_heartbeats_round_trip(member, state, owns, wants, generation, terms, view) -> None:
    heartbeat = Heartbeat(member, state, owns, wants, generation, terms=terms, view=view)
    assert Heartbeat.decode(heartbeat.encode()) == heartbeat


@given(st.lists(st.text(max_size=8), max_size=6), st.randoms())
def test_a_members_digest_does_not_depend_on_their_order(members, random) -> None:
    shuffled = list(members)
    random.shuffle(shuffled)
    assert members_digest(shuffled) == members_digest(members)
    assert members_digest([*members, "\x00new"]) != members_digest(members)


@pytest.mark.parametrize("terms", [b"[1, 0.5]", b"[1]", b'"x"', b"7", b"[1, -0.1]", b"[1, 2, 3]"])
def test_lease_terms_a_member_could_not_run_are_a_malformed_heartbeat(terms: bytes) -> None:
    with pytest.raises(MalformedMessage, match=r"lease|margin|values|float|iterable"):
        Heartbeat.decode(b'{"m": "a", "st": "active", "l": ' + terms + b"}")


def test_a_member_on_a_longer_lease_is_evicted_by_its_own_terms() -> None:
    """Its peer evicts it once it surely stopped: its lease minus its margin after it was
    last heard, plus twice the peer's own margin (the peer's view may lag that much)."""
    clock = Clock(100)
    view = MembershipView(lease=0.7, clock=clock, margin=0.15)
    view.observe(Heartbeat("slow", MemberState.ACTIVE, terms=LeaseTerms(1.4, 0.3)))
    view.observe(Heartbeat("same", MemberState.ACTIVE))
    assert view.next_expiry() == pytest.approx(100 + 0.85)
    clock.now += 0.9
    assert [heartbeat.member for heartbeat in view.expire()] == ["same"]
    assert view.next_expiry() == pytest.approx(100 + 1.1 + 0.3)
    clock.now = 100 + 1.41
    assert [heartbeat.member for heartbeat in view.expire()] == ["slow"]


def test_a_heartbeat_without_a_generation_runs_the_first_one() -> None:
    assert Heartbeat.decode(b'{"m": "a", "st": "active"}').generation == 0


@pytest.mark.parametrize("generation", [b"-1", b'"2"', b"true", b"1.5", b"null"])
def test_a_bad_generation_is_a_malformed_heartbeat(generation: bytes) -> None:
    with pytest.raises(MalformedMessage, match="generation"):
        Heartbeat.decode(b'{"m": "a", "st": "active", "g": ' + generation + b"}")


@given(st.binary(max_size=200))
def test_garbage_is_a_malformed_heartbeat_or_a_heartbeat(body: bytes) -> None:
    """Decoding never fails with anything but MalformedMessage."""
    with contextlib.suppress(MalformedMessage):
        assert isinstance(Heartbeat.decode(body), Heartbeat)


def test_wrong_state_is_rejected() -> None:
    with pytest.raises(MalformedMessage):
        Heartbeat.decode(b'{"m": "a", "st": "sleeping"}')


@given(
    st.dictionaries(st.integers(0, 999), st.text(max_size=8), max_size=5),
    st.frozensets(st.integers(0, 999), max_size=5),
    st.dictionaries(st.integers(0, 999), st.text(max_size=8), max_size=5),
)
def test_a_digest_only_heartbeat_is_filled_from_the_content_it_stands_for(owns, wants, other):
    full = Heartbeat("a", MemberState.ACTIVE, owns, wants, digest=queues_digest(owns, wants))
    short = Heartbeat.decode(replace(full, beat=7, full=False).encode())
    assert not short.full and short.digest == full.digest
    assert short.filled_from(full) == replace(full, beat=7)
    assert not short.filled_from(None).full, "nothing to fill it from: ask for a sync"
    stale = Heartbeat("a", MemberState.ACTIVE, other, digest=queues_digest(other, frozenset()))
    if stale.digest != full.digest:
        filled = short.filled_from(stale)
        assert not filled.full and filled.owns == other, "the last known queues, until a sync"


def test_a_heartbeat_stays_small_while_its_queues_do_not_change() -> None:
    owns = {q: f"pin-{q:04d}-xxxxxxxxxxxxxxxx" for q in range(256)}
    digest = queues_digest(owns, frozenset())
    short = Heartbeat("a", MemberState.ACTIVE, owns, digest=digest, full=False).encode()
    assert len(short) < 100 < len(Heartbeat("a", MemberState.ACTIVE, owns).encode())


def test_an_unnumbered_heartbeat_body_leaves_out_only_its_number() -> None:
    one = Heartbeat("m", MemberState.ACTIVE, {3: "pin"}, frozenset({1}), 2, beat=7, digest=9)
    other = Heartbeat("m", MemberState.ACTIVE, {3: "pin"}, frozenset({1}), 2, beat=8, digest=9)
    assert unnumbered(one.encode()) == unnumbered(other.encode())
    assert b'"n"' not in unnumbered(one.encode())
    assert orjson.loads(unnumbered(one.encode()))["d"] == 9
    changed = Heartbeat("m", MemberState.ACTIVE, {3: "pin"}, frozenset({1}), 2, beat=8, digest=10)
    assert unnumbered(changed.encode()) != unnumbered(one.encode())


def test_what_the_view_derives_is_kept_while_members_say_the_same_and_follows_any_change() -> None:
    """An idle member hears the same words every round: its view then derives nothing anew
    (the version stays), yet a new word, a lapse or a clash of claims shows at once."""
    clock = Clock(100)
    view = MembershipView(lease=0.6, clock=clock)
    a, b = beat("a", owns={1: "pin-a"}), beat("b", owns={2: "pin-b"})
    view.observe(a)
    view.observe(b)
    version = view.version
    for _ in range(3):
        clock.now += 0.15
        view.observe(a)
        view.observe(b)
        assert view.owners() == {1: "a", 2: "b"} and view.members() == ["a", "b"]
    assert view.version == version, "the same word heard again moved the version"
    view.owners()[3] = "mutated"
    assert view.owners() == {1: "a", 2: "b"}, "a caller's change leaked into the view"
    view.observe(beat("b", MemberState.STALLED, owns={2: "pin-b"}))
    assert view.version > version and view.members() == ["a"]
    clash = beat("c", owns={1: "pin-c"})
    view.observe(clash)
    assert view.owners()[1] == "c", "the latest claim does not win the clash"
    clock.now += 0.1
    view.observe(a)
    assert view.owners()[1] == "a", "a clash's answer was kept past the next claim"
    clock.now += 0.65
    view.observe(clash)
    assert [hb.member for hb in view.expire()] == ["a", "b"]
    assert view.owners() == {1: "c"} and view.members() == ["c"]
