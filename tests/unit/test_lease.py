"""The confirmed lease: a member stops before any peer may evict it, whatever the network does."""

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.support.clock import Clock

from lbg.client.membership import MembershipView
from lbg.model.control import Heartbeat, MemberState
from lbg.model.lease import PENDING_BEATS, LeaseTerms, OwnLease

TERMS = LeaseTerms(lease=0.7, margin=0.15)
INTERVAL = 0.15


def test_a_lease_rests_on_echoes_not_on_sends() -> None:
    clock = Clock()
    lease = OwnLease(TERMS, clock)
    assert lease.holds(), "a new member starts as if its first heartbeat came back"
    clock.now = 0.3
    beat = lease.sent()
    clock.now = 0.31
    assert lease.echoed(beat) is False
    clock.now = 0.8
    lease.sent()  # sent but never relayed back
    assert lease.holds()
    clock.now = TERMS.fence_at(0.3)
    assert not lease.holds()


def test_the_provisional_lease_runs_from_the_start_of_heartbeats_until_the_first_echo() -> None:
    clock = Clock()
    lease = OwnLease(TERMS, clock)
    clock.now = 0.5  # the broker took a while to set the subscription up
    lease.start()
    clock.now = 0.9
    assert lease.holds()
    lease.echoed(lease.sent())
    clock.now = 2.0
    lease.start()  # no second start once an echo confirmed the lease
    assert not lease.holds()


def test_a_late_echo_after_a_lapse_tells_the_caller_to_fence() -> None:
    clock = Clock()
    lease = OwnLease(TERMS, clock)
    lease.echoed(lease.sent())
    clock.now = 0.5
    held_up = lease.sent()  # this one sits in a buffer through a partition
    clock.now = 0.9
    assert lease.echoed(held_up) is True, "the lease had lapsed at 0.55 s"
    assert lease.holds()


def test_a_lost_connection_ends_the_lease_until_a_heartbeat_sent_after_it_comes_back() -> None:
    clock = Clock()
    lease = OwnLease(TERMS, clock)
    lease.echoed(lease.sent())
    clock.now = 0.1
    buffered = lease.sent()  # in the send buffer as the connection drops
    clock.now = 0.15
    lease.lapse()
    assert not lease.holds(), "nothing is processed from the moment the connection is lost"
    clock.now = 0.2
    assert lease.echoed(buffered) is False, "flushed after the reconnect: it renews nothing"
    assert not lease.holds()
    fresh = lease.sent()
    clock.now = 0.21
    assert lease.echoed(fresh) is True, "the caller must fence what it held before"
    assert lease.holds()


@given(probe=st.booleans(), full=st.booleans())
def test_a_heartbeat_says_whether_its_member_may_be_probed(probe: bool, full: bool) -> None:
    heartbeat = Heartbeat(
        "m-1", MemberState.ACTIVE, {2: "pin"}, frozenset({3}), 4, 5, 6, full, probe
    )
    decoded = Heartbeat.decode(heartbeat.encode())
    assert decoded.probe is probe
    assert decoded.filled_from(heartbeat).probe is probe


def test_an_unknown_or_repeated_echo_changes_nothing() -> None:
    clock = Clock()
    lease = OwnLease(TERMS, clock)
    beat = lease.sent()
    assert lease.echoed(beat + 7) is False
    assert lease.confirmed == 0.0
    lease.echoed(beat)
    assert lease.echoed(beat) is False


def test_an_own_heartbeat_is_known_by_its_bytes_as_it_comes_back() -> None:
    clock = Clock()
    lease = OwnLease(TERMS, clock)
    clock.now = 0.05
    first = lease.sent()
    lease.went_out_as(first, b"first")
    clock.now = 0.1
    assert lease.echo(b"a peer's heartbeat") is None
    assert lease.echo(b"first") is False
    assert lease.confirmed == 0.05
    assert lease.echo(b"first") is None, "each heartbeat comes back once"
    clock.now = 0.5
    held_up = lease.sent()
    lease.went_out_as(held_up, b"held up")
    clock.now = 1.0
    assert lease.echo(b"held up") is True, "the lease had lapsed: the caller must fence"


def test_only_the_latest_heartbeats_are_known_by_their_bytes() -> None:
    lease = OwnLease(TERMS, Clock())
    bodies = [str(n).encode() for n in range(PENDING_BEATS + 1)]
    for body in bodies:
        lease.went_out_as(lease.sent(), body)
    assert lease.echo(bodies[0]) is None
    assert lease.echo(bodies[1]) is False


def test_terms_refuse_a_margin_that_eats_the_lease() -> None:
    with pytest.raises(ValueError):
        LeaseTerms(lease=0.2, margin=0.15)


delays = st.one_of(st.floats(0.0, 0.05), st.floats(0.05, 2.0), st.just(float("inf")))


@settings(max_examples=300, deadline=None)
@given(
    relay=st.lists(delays, min_size=5, max_size=60),
    back=st.lists(st.floats(0.0, 0.1), min_size=60, max_size=60),
    peer_lag=st.lists(st.floats(0.0, 2 * TERMS.margin * 0.99), min_size=60, max_size=60),
)
# Beat 1 is lost, beat 2 is relayed late and reaches the peer later still: the member's
# lease rests on beat 2 while the peer last heard beat 0.
@example(
    relay=[0.0, float("inf"), 0.3, float("inf"), float("inf")],
    back=[0.0] * 60,
    peer_lag=[0.0, 0.0, 0.29] + [0.0] * 57,
)
def test_a_member_stops_before_a_peer_may_evict_it(
    relay: list[float], back: list[float], peer_lag: list[float]
) -> None:
    """Beat i is sent at i x interval, relayed by the broker after relay[i] (inf: never),
    echoed to its sender back[i] later and heard by a peer peer_lag[i] after the relay (a
    peer's lag stays under 2 x margin, which its own echoes check). At no moment may the
    member still hold its first, unbroken lease while the peer counts it as gone."""
    assert_never_two_owners(relay, back, peer_lag, TERMS, TERMS)


ECONOMY = LeaseTerms(lease=1.4, margin=0.3)


@settings(max_examples=300, deadline=None)
@given(
    relay=st.lists(delays, min_size=5, max_size=60),
    back=st.lists(st.floats(0.0, 0.1), min_size=60, max_size=60),
    lag=st.lists(st.floats(0.0, 0.99), min_size=60, max_size=60),
    member_terms=st.sampled_from([TERMS, ECONOMY]),
    peer_terms=st.sampled_from([TERMS, ECONOMY]),
)
# A member on the longer lease goes silent after its first beat: a peer on the default one
# evicted it 0.85 s later, while it still processed until 1.1 s (before heartbeats said
# their member's terms).
@example(
    relay=[0.0] + [float("inf")] * 9,
    back=[0.0] * 60,
    lag=[0.0] * 60,
    member_terms=ECONOMY,
    peer_terms=TERMS,
)
def test_members_on_different_lease_terms_never_own_a_queue_at_once(
    relay: list[float],
    back: list[float],
    lag: list[float],
    member_terms: LeaseTerms,
    peer_terms: LeaseTerms,
) -> None:
    """As above, with the member and its peer each on its own config (a rolling change of the
    lease): the peer's lag stays under 2 x its own margin."""
    peer_lag = [fraction * 2 * peer_terms.margin for fraction in lag]
    assert_never_two_owners(relay, back, peer_lag, member_terms, peer_terms)


def assert_never_two_owners(
    relay: list[float],
    back: list[float],
    peer_lag: list[float],
    member_terms: LeaseTerms,
    peer_terms: LeaseTerms,
) -> None:
    """Play the member's beats (announcing its terms) and the peer's view of them; fail if the
    peer counts the member gone while its first lease still holds."""
    events: list[tuple[float, int, str, int]] = []  # (when, then by: send, echo/hear, check)
    for i, delay in enumerate(relay):
        events.append((i * INTERVAL, 0, "send", i))
        if delay != float("inf"):
            relayed = i * INTERVAL + delay
            events.append((relayed + back[i], 1, "echo", i))
            events.append((relayed + peer_lag[i], 1, "hear", i))
    end = len(relay) * INTERVAL + 3.0
    events += [(t / 100, 2, "check", -1) for t in range(int(end * 100))]
    events.sort()

    clock = Clock()
    lease = OwnLease(member_terms, clock)
    view = MembershipView(peer_terms.lease, clock, peer_terms.margin)
    beats: dict[int, int] = {}
    unbroken, evicted = True, False
    for at, _, what, i in events:
        clock.now = at
        if what == "send":
            beats[i] = lease.sent()
        elif what == "echo" and lease.echoed(beats[i]):
            unbroken = False
        elif what == "hear":
            view.observe(Heartbeat("a", MemberState.ACTIVE, beat=beats[i], terms=member_terms))
        if not lease.holds():
            unbroken = False
        evicted = evicted or bool(view.expire())
        assert not (evicted and unbroken and lease.holds()), f"two owners at {at:.2f}"


@given(
    echo_delay=st.floats(0, 2 * TERMS.lease),
    listened=st.floats(0, 2 * TERMS.lease),
    echoed=st.booleans(),
)
@example(echo_delay=0.002, listened=0.1, echoed=True)  # the old fixed listen: too short
def test_a_joiner_has_heard_the_group_after_an_interval_and_its_echo_or_a_lease(
    echo_delay: float, listened: float, echoed: bool
) -> None:
    clock = Clock()
    lease = OwnLease(TERMS, clock)
    lease.start()
    clock.now = 0.01
    beat = lease.sent()
    if echoed:
        clock.now += echo_delay
        lease.echoed(beat)
    heard = lease.heard_the_group(listened, INTERVAL)
    if listened >= TERMS.lease:
        assert heard, "a member whose heartbeats do not come back listens a lease at most"
    else:
        assert lease.echo_delay == pytest.approx(echo_delay if echoed else 0.0)
        assert heard == (echoed and listened >= INTERVAL + lease.echo_delay)
