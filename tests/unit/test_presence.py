"""Presence probes: a silent peer is asked about once per silence, and is forgotten only if
the broker says its connection closed and nothing was heard from it meanwhile."""

import asyncio
import time
from collections.abc import Callable

from tests.support.clock import Clock

from lbg.client.membership import MembershipView
from lbg.client.presence import PresenceProbes
from lbg.model.control import Heartbeat, MemberState
from lbg.model.lease import LeaseTerms, OwnLease

TERMS = LeaseTerms(lease=0.7, margin=0.15)


class Broker:
    """Answers each probe when told to, with what it is told."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.answers: dict[str, asyncio.Future[bool | None]] = {}

    async def probe_member(self, group: str, member: str) -> bool | None:
        self.asked.append(member)
        self.answers[member] = asyncio.get_running_loop().create_future()
        return await self.answers[member]


def beat(member: str, probe: bool = True) -> Heartbeat:
    return Heartbeat(member, MemberState.ACTIVE, probe=probe)


def setup(
    clock: Callable[[], float], terms: LeaseTerms = TERMS, **timing: float
) -> tuple[Broker, MembershipView, PresenceProbes, OwnLease, list[str]]:
    """Probes of one member on `terms`; `timing`: PresenceProbes' early and tick."""
    broker = Broker()
    view = MembershipView(terms.lease, clock, terms.margin)
    own = OwnLease(terms, clock)
    forgotten: list[str] = []
    probes = PresenceProbes(
        broker,  # type: ignore[arg-type]
        "g",
        view,
        own,
        lambda heartbeat, why: forgotten.append(f"{heartbeat.member}: {why}"),
        asyncio.Event(),
        **timing,
    )
    return broker, view, probes, own, forgotten


async def asked_by(
    now: float, clock: Clock, probes: PresenceProbes, own: OwnLease, broker: Broker
) -> list[str]:
    """Whom the probes have asked about once they looked at `now`, this member's view current."""
    clock.now = now
    own.echoed(own.sent())
    probes.ask()
    await asyncio.sleep(0)
    return list(broker.asked)


def test_a_peer_silent_for_lease_minus_margin_is_asked_about_once_and_forgotten() -> None:
    async def scenario() -> None:
        clock = Clock()
        broker, view, probes, own, forgotten = setup(clock)
        view.observe(beat("a"))
        view.observe(beat("old", probe=False))
        assert probes.next_due() == TERMS.lease - TERMS.margin
        clock.now = 0.5
        probes.ask()
        assert broker.asked == []
        clock.now = 0.56
        own.echoed(own.sent())  # its own heartbeat came back: its view is current
        probes.ask()
        probes.ask()
        await asyncio.sleep(0)
        assert broker.asked == ["a"], "once per silence, never a member that is not probeable"
        broker.answers["a"].set_result(True)
        await asyncio.sleep(0)
        assert forgotten == ["a: connection closed"]
        assert view.members() == ["old"]

    asyncio.run(scenario())


def test_a_peer_heard_from_while_it_was_asked_about_stays() -> None:
    async def scenario() -> None:
        clock = Clock()
        broker, view, probes, own, forgotten = setup(clock)
        view.observe(beat("a"))
        clock.now = 0.6
        own.echoed(own.sent())  # its own heartbeat came back: its view is current
        probes.ask()
        await asyncio.sleep(0)
        view.observe(beat("a"))  # a reconnect: its heartbeat came in before the answer
        broker.answers["a"].set_result(True)
        await asyncio.sleep(0)
        assert forgotten == []
        assert view.members() == ["a"]

    asyncio.run(scenario())


def test_no_answer_or_a_stale_own_view_forgets_nobody() -> None:
    async def scenario() -> None:
        clock = Clock()
        broker, view, probes, _, forgotten = setup(clock)
        view.observe(beat("a"))
        view.observe(beat("b"))
        clock.now = 0.6
        probes.ask()  # this member's own heartbeats have not come back for 0.6 s
        await asyncio.sleep(0)
        broker.answers["a"].set_result(True)
        broker.answers["b"].set_result(None)  # b: alive but silent, nobody answered in time
        await asyncio.sleep(0)
        assert forgotten == []
        assert view.members() == ["a", "b"]

    asyncio.run(scenario())


def test_a_peer_on_a_longer_lease_is_asked_about_once_its_own_lease_could_have_ended() -> None:
    """Asked after this member's 0.55 s, a peer on a 1.4 s lease (margin 0.3) that was cut
    off but still processing would be gone while it still held its queues."""

    async def scenario() -> None:
        clock = Clock()
        broker, view, probes, own, _ = setup(clock)
        view.observe(Heartbeat("slow", MemberState.ACTIVE, probe=True, terms=LeaseTerms(1.4, 0.3)))
        assert probes.next_due() == 1.4 - 0.3
        assert await asked_by(1.0, clock, probes, own, broker) == []
        assert await asked_by(1.1, clock, probes, own, broker) == ["slow"]

    asyncio.run(scenario())


def test_where_the_line_takes_over_a_peer_is_asked_about_once_its_beat_is_overdue() -> None:
    """On RabbitMQ the broker hands a crashed member's queues to the next in line itself: a
    peer silent for `early` (interval + margin / 2) is asked about then, not only once its
    lease - margin (1.2 s here) could have ended, so a crash is seen as soon on a longer lease."""

    async def scenario() -> None:
        clock = Clock()
        broker, view, probes, own, _ = setup(clock, LeaseTerms(1.5, 0.3), early=0.8)
        view.observe(beat("a"))
        assert probes.next_due() == 0.8
        assert await asked_by(0.79, clock, probes, own, broker) == []
        assert await asked_by(0.8, clock, probes, own, broker) == ["a"], "not at 1.2 s"

    asyncio.run(scenario())


def test_a_silent_peer_is_asked_about_by_the_watch_between_rounds() -> None:
    """No round needs to run at a peer's overdue moment (each round beats): the watch's own
    timer asks, on the wall clock's multiples of its tick."""

    async def scenario() -> tuple[list[str], float]:
        broker, view, probes, own, _ = setup(
            time.monotonic, LeaseTerms(1.5, 0.3), early=0.05, tick=0.04
        )
        view.observe(beat("a"))
        own.echoed(own.sent())
        probes.watch()
        await asyncio.sleep(0.03)
        assert broker.asked == [], "not before its beat is overdue"
        for _ in range(500):  # half a second at most
            if broker.asked:
                break
            await asyncio.sleep(0.001)
        asked_at = time.time()
        probes.close()
        return broker.asked, asked_at % 0.04

    asked, phase = asyncio.run(scenario())
    assert asked == ["a"]
    assert min(phase, 0.04 - phase) < 0.01, f"{phase:.3f} s off the tick"
