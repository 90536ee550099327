"""Dynamic mode: every member agrees on who serves which queue, with no leader and no index.

Each member heartbeats (its state, the queues it serves with their pins, the queues it stands
ready for), keeps a view of the others, and computes the same balanced, sticky assignment.
It then only steers: it prefers the queues assigned to it, releases a queue once its new
owner stands ready (a planned handover), evicts a gone or stalled owner instead of waiting
for the broker's timeout (eviction.py), and fences itself when the broker has not relayed its own
heartbeats back for most of the lease (it was stalled or cut off): model/lease.py says why it
thereby stops before any peer may evict it. The broker's exclusivity keeps one consumer per
queue whatever the views say.

An operator's planned move (`lbg move`) pins a queue to a member on top of that assignment,
for as long as the member is alive and active; see model/overrides.py.

A resizable group's size travels the same way: each heartbeat carries the generation of the
group's config its member runs. A member that hears of a newer one (a peer's heartbeat, or
`cg-admin resize`'s control message) asks its client to read the config; the client binds or
retires queues and calls `adopt`, and the assignment then spans the new queue count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from lbg.aio import cancel_requested, until_next
from lbg.broker.base import Broker, BrokerError
from lbg.client.cadence import ExtraRound, LateRounds, wait_until
from lbg.client.eviction import GoneOwners
from lbg.client.membership import MembershipView
from lbg.client.presence import PresenceProbes
from lbg.client.steering import Holding, Steering
from lbg.model.control import (
    GOSSIP_SECONDS,
    ControlMessage,
    Heartbeat,
    MemberState,
    Move,
    Override,
    Probe,
    Resized,
    Sync,
    decode_message,
    encode_gossip,
    encode_sync,
    members_digest,
    queues_digest,
    unnumbered,
)
from lbg.model.lease import LeaseTerms, OwnLease
from lbg.model.messages import MalformedMessage
from lbg.model.overrides import OverrideBook, assign_with_overrides, standby_assignment

log = logging.getLogger(__name__)

# How often a joining member looks whether it has heard the group yet.
JOIN_LISTEN_STEP = 0.01
# A round due at a peer's lease end runs this much after it, so the lease has surely lapsed.
EXPIRY_SLACK = 0.005
# A queue is handed only to a member heard from since this many intervals before this
# member's round began: every member beats at the same moments (cadence.py), so a live one's
# beat of the round arrives just after it starts, and a member that crashed since the last
# round is still in the view but silent. (Handed to such a member, a queue waited until the
# crash was found out, 0.7-0.8 s, on brokers that move a crashed member's queues themselves.)
HEARD_THIS_ROUND_SLACK = 1 / 3
# A binding that starts to wait only after a broker round trip (RabbitMQ's registration in a
# queue's line) is said to stand ready in an extra round this many intervals after the last
# at most, a few ms after it started to wait at least (those that start together are said
# together): an owner hands a queue over only to a member whose heartbeat says it stands
# ready, and a joiner's next regular round came an interval, 0.15 s, after that.
STANDING_ROUND_SPACING = 1 / 4
STANDING_ROUND_DELAY = 0.005


class Coordinator:
    """One member's part in the group's dynamic membership and assignment."""

    def __init__(
        self,
        broker: Broker,
        group: str,
        member: str,
        steering: Steering,
        interval: float = 0.15,
        lease: float = 0.7,
        clock: Callable[[], float] = time.monotonic,
        *,
        queue_count: int,
        margin: float = 0.15,
        generation: int = 0,
        on_newer_generation: Callable[[int], None] | None = None,
        standbys: bool = False,
    ) -> None:
        self._broker = broker
        self._group = group
        self.member = member
        self._steering = steering
        self.queue_count = queue_count
        self.generation = generation
        self._on_newer_generation = on_newer_generation
        self.interval = interval
        self._clock = clock
        self.view = MembershipView(lease, clock, margin)
        self.own_lease = OwnLease(LeaseTerms(lease, margin), clock)
        self._lapse_told = False
        self._listening = False  # joining: the view is still being heard (see join)
        self.state = MemberState.ACTIVE
        self.desired: dict[int, str] = {}
        self._with_standbys = standbys
        self.standbys: dict[int, str] = {}
        self._assigned: tuple[object, ...] | None = None
        # What the last round that had nothing to steer started from, and what it returned.
        self._settled: tuple[tuple[object, ...] | None, dict[int, Holding]] = (None, {})
        self._mine: tuple[int, ...] = ()  # the queues assigned here
        self._wanted: tuple[int, ...] = ()  # and those this member stands by for
        self._gone_owners = GoneOwners(self.view, steering, clock)
        self._unsubscribe: Callable[[], object] | None = None
        self.overrides = OverrideBook(clock)
        self._last_gossip = -float("inf")
        self._gossip_soon = False
        self._wake = asyncio.Event()
        self._standing_round = ExtraRound(self._wake)
        self._sent_digest: int | None = None
        no_queues: dict[int, str] = {}
        self._beat_of = (None, no_queues, frozenset(), queues_digest(no_queues, frozenset()))
        self._full_due = True
        self._view_of: tuple[tuple[int, MemberState] | None, int] = (None, 0)
        self._syncs: set[str] = set()
        # What each active member last said in full, by its unnumbered body: the same word
        # again (most heartbeats) only renews its lease, unparsed.
        self._heard: dict[bytes, Heartbeat] = {}
        self._heard_from: dict[str, bytes] = {}
        self.late_rounds = LateRounds(member, interval, lease - margin, clock)
        self._round_at = -float("inf")  # when this member's latest round began
        # Members a handover waits to hear from this round (then it goes ahead at once).
        self._handover_waits_for: set[str] = set()
        # Whether peers may ask the broker if this member's connection closed (presence).
        self._probe_me = False
        # Where the broker's line moves a crashed member's queues, a silent peer is asked
        # about once its beat is overdue, between two rounds, not only once its lease could
        # have ended (client/presence.py).
        early = (interval + margin / 2, interval / 2) if broker.line_takes_over else (None, None)
        self._probes = PresenceProbes(
            broker, group, self.view, self.own_lease, self._forget, self._wake, *early
        )

    @property
    def lease(self) -> float:
        return self.view.lease

    def lease_ok(self) -> bool:
        """True while the broker relayed this member's heartbeats back recently enough: it
        may process and ack (a heartbeat that only sits in a send buffer counts for nothing)."""
        return self.own_lease.holds()

    async def join(self) -> None:
        """Announce this member and listen, steering nothing, until it has heard the group
        (OwnLease.heard_the_group): steered by the first member it heard, a joiner at QC 1024
        on RabbitMQ stood in the lines of all 1,024 queues, a channel each. A heartbeat the
        broker does not take is tried again next round, as in `run`: its lease says what it
        may do."""
        self._unsubscribe = await self._broker.subscribe_control(self._group, self._receive)
        with contextlib.suppress(BrokerError):
            self._probe_me = await self._broker.announce_presence(self._group, self.member)
        self._broker.on_connection_lost(self._connection_lost)
        self.own_lease.start()
        loop, self._listening = asyncio.get_running_loop(), True
        started = loop.time()
        try:
            with contextlib.suppress(BrokerError, TimeoutError):
                await self._beat()
            while not self.own_lease.heard_the_group(
                loop.time() - started, self.interval, self._view_agreed()
            ):
                await asyncio.sleep(JOIN_LISTEN_STEP)
        finally:
            self._listening = False
        log.debug(
            "member %s listened %.3fs (its own heartbeat came back after %.3fs)",
            self.member,
            loop.time() - started,
            self.own_lease.echo_delay,
        )
        with contextlib.suppress(BrokerError, TimeoutError):
            await self.tick()
        log.info("member %s joined; members %s", self.member, self._members())

    async def run(self, stop: asyncio.Event) -> None:
        """Heartbeat and rebalance every interval, in step with the other members (cadence.py),
        at a peer's lease end, or at once when woken, until `stop` is set."""
        while not stop.is_set():
            due = self._clock() + self.next_round_in()
            await wait_until(due - self._clock(), self._wake)
            self._wake.clear()
            if stop.is_set():
                return
            self.late_rounds.note(self._clock() - due)
            try:
                await self.tick()
            except (BrokerError, TimeoutError):
                pass
            except asyncio.CancelledError:
                if cancel_requested():
                    raise
                log.warning("member %s: a broker call was cancelled under it", self.member)

    def next_round_in(self) -> float:
        """Seconds until the next round: the next multiple of the interval (cadence.py), or
        less when a peer's lease lapses sooner, so a crashed member is evicted as its lease
        ends, not up to a heartbeat later. A lapse already due waits for a round anyway (the
        view was stale)."""
        cadence = until_next(self.interval)
        due = self.view.next_expiry()  # (silent peers are asked about by a timer: watch)
        if due is None:
            return cadence
        left = due + EXPIRY_SLACK - self._clock()
        return cadence if left <= 0 else min(cadence, left)

    async def leave(self) -> None:
        """Announce leaving: the others take this member's queues as it releases them."""
        self.state = MemberState.LEAVING
        self._drop_overrides(self.member, "leaving")
        self.rebalance()
        try:
            await self._beat()
        except (BrokerError, TimeoutError) as exc:  # it stops all the same: nothing is lost
            log.warning(
                "member %s: leaving not announced (%s): the others take its queues once its"
                " lease lapses",
                self.member,
                exc,
            )

    def stands_ready(self, _queue: int) -> None:
        """A binding started to wait for its queue after a registration at the broker, or
        stopped once it stepped out of the line: say so in a round soon
        (STANDING_ROUND_SPACING), so the queue's owner may hand it over (to this member, or
        to the member now alone in its line) without waiting for the next regular round."""
        if not self._listening:
            spaced = self._round_at + STANDING_ROUND_SPACING * self.interval - self._clock()
            self._standing_round.ask(max(STANDING_ROUND_DELAY, spaced))

    async def close(self) -> None:
        self._standing_round.cancel()
        self._probes.close()
        with contextlib.suppress(BrokerError, TimeoutError):  # told at leave already
            await self._beat()
        if self._unsubscribe is not None:
            with contextlib.suppress(Exception):
                await self._unsubscribe()  # type: ignore[misc]

    def adopt(self, generation: int, queue_count: int) -> None:
        """The client now runs this generation of the group's config: share its queues."""
        self.generation = generation
        self.queue_count = queue_count
        log.info("member %s: group size %d (generation %d)", self.member, queue_count, generation)
        self.rebalance()
        self._wake.set()

    def _hear_generation(self, generation: int) -> None:
        """Someone runs (or cg-admin stored) a newer config: the client should read it."""
        if generation > self.generation and self._on_newer_generation is not None:
            self._on_newer_generation(generation)

    def set_stalled(self, stalled: bool) -> None:
        """A handler hung past the stall timeout: give every queue up until it returns."""
        state = MemberState.STALLED if stalled else MemberState.ACTIVE
        if self.state is MemberState.LEAVING or state is self.state:
            return
        self.state = state
        self._steering.suspend_all(stalled, "member stalled: a handler hung past the stall timeout")
        log.warning("member %s is %s", self.member, state.value)

    async def tick(self) -> None:
        """One round: self-check, expire lapsed members, rebalance, heartbeat, evict (last,
        so the broker lookups it may need never delay the heartbeat the lease rests on).

        Expiry and eviction wait while this member's own view is stale (its heartbeats have
        not come back lately): silence it has not heard through is no proof of anyone's death.
        """
        self._standing_round.cancel()  # this round says what stands ready now
        if not self.lease_ok():
            self._lapse("own heartbeats lapsed (this member was stalled or cut off)")
        else:
            self._lapse_told = False
        self._round_at = self._clock()
        current = self.own_lease.view_current()
        for heartbeat in self.view.expire() if current else []:
            self._forget(heartbeat, "lease lapsed")
        if current:
            self._probes.ask()
            self._probes.watch()
        for override in self.overrides.drop_unknown(self._known, self.lease):
            log.info("override queue %d -> %s dropped: no such member", override.queue, override.to)
        held = self.rebalance()
        await self._beat(held)
        await self._gossip()
        await self._ask_syncs()
        if current:
            await self._gone_owners.evict(self._mine, held, self.lease)

    def _forget(self, heartbeat: Heartbeat, why: str) -> None:
        """A member is gone: its queues go to the others, its pins are evicted."""
        log.info("member %s is gone (%s)", heartbeat.member, why)
        self._gone_owners.forget(heartbeat)
        self._drop_overrides(heartbeat.member, "gone")

    def _connection_lost(self) -> None:
        """The connection dropped: peers told by the broker it closed may take this member's
        queues as soon as its lease could have ended, so it stops now and starts afresh once
        a heartbeat sent after this comes back."""
        self.own_lease.lapse()
        self._lapse("connection to the broker lost")

    def _lapse(self, reason: str) -> None:
        """This member's lease lapsed: fence every queue it holds (telling it once)."""
        if not self._lapse_told:
            log.warning(
                "member %s: %s (its newest heartbeat that came back was sent %.2fs ago);"
                " fencing its queues",
                self.member,
                reason,
                self._clock() - self.own_lease.confirmed,
            )
            self._lapse_told = True
        self._steering.fence_all(reason)
        # The others count this member as gone: so do the overrides that pin queues to it.
        self._drop_overrides(self.member, reason)

    def _receive(self, body: bytes) -> None:
        if (lapsed := self.own_lease.echo(body)) is not None:
            self._echoed(lapsed)
            return
        key = unnumbered(body)
        known = self._heard.get(key)
        if known is not None and self.view.heartbeat_of(known.member) is known:
            self.view.observe(known)
            self._hear_generation(known.generation)
            if known.member in self._handover_waits_for:
                self.rebalance()
            return
        try:
            heartbeat = decode_message(body)
        except MalformedMessage as exc:
            log.warning("ignored a control message: %s", exc)
            return
        if not isinstance(heartbeat, Heartbeat):
            self._on_control(heartbeat)
            return
        if heartbeat.member == self.member:  # (echo knows its own heartbeats' bytes)
            self._echoed(self.own_lease.echoed(heartbeat.beat))
            return
        self._hear_generation(heartbeat.generation)
        before = self.view.heartbeat_of(heartbeat.member)
        heartbeat = self._filled(heartbeat, before)
        self.view.observe(heartbeat)
        self._remember(key, heartbeat)
        if before is None:
            self._gossip_soon = True
            self._answer_newcomer()
        if heartbeat.state is MemberState.LEAVING:
            self._drop_overrides(heartbeat.member, "leaving")
        if (
            before is None
            or before.state is not heartbeat.state
            or before.wants != heartbeat.wants
            or heartbeat.member in self._handover_waits_for
        ):
            self.rebalance()

    def _echoed(self, lapsed: bool) -> None:
        """One of this member's own heartbeats came back (renewing its lease, unless that
        lapsed before)."""
        if lapsed:
            self._lapse("own lease lapsed before this heartbeat came back")

    def _remember(self, key: bytes, heartbeat: Heartbeat) -> None:
        """Keep an active member's word, once its queues are known, for when it says it again
        (a leaving member's each heartbeat drops overrides to it; an unfilled one asks a sync)."""
        dropped = self._heard_from.pop(heartbeat.member, None)
        if dropped is not None:
            del self._heard[dropped]
        if heartbeat.full and heartbeat.state is MemberState.ACTIVE:
            self._heard[key] = heartbeat
            self._heard_from[heartbeat.member] = key

    def _filled(self, heartbeat: Heartbeat, before: Heartbeat | None) -> Heartbeat:
        """The heartbeat with the member's queues; asks it for a sync if they are not known."""
        filled = heartbeat.filled_from(before)
        if not filled.full:
            self._syncs.add(heartbeat.member)
        return filled

    async def _ask_syncs(self) -> None:
        syncs, self._syncs = self._syncs, set()
        for member in sorted(syncs):
            await self._broker.publish_control(self._group, encode_sync(member))

    def _view_digest(self) -> int:
        """The digest of the members this member counts (`_members`), kept while they stay."""
        basis = (self.view.version, self.state)
        if self._view_of[0] != basis:
            self._view_of = (basis, members_digest(self._members()))
        return self._view_of[1]

    def _view_agreed(self) -> bool:
        """Whether every peer heard says the view this member has: a joiner heard them all."""
        heartbeats = self.view.heartbeats()
        mine = self._view_digest()
        return bool(heartbeats) and all(hb.view == mine for hb in heartbeats)

    def _members(self) -> list[str]:
        members = set(self.view.members())
        if self.state is MemberState.ACTIVE:
            members.add(self.member)
        return sorted(members)

    def _current(self, held: dict[int, Holding]) -> dict[int, str]:
        """Who serves which queue: the others by their word, this member by its bindings."""
        current = self.view.owners()
        current.update((queue, self.member) for queue, h in held.items() if h.active)
        return current

    def _answer_newcomer(self) -> None:
        """Run the next round now, with this member's queues in full, so a member that just
        joined learns the view at once."""
        self._full_due = True
        self._wake.set()

    def _on_control(self, control: ControlMessage) -> None:
        """An operator's move, or another member's overrides: keep the newest per queue."""
        if isinstance(control, Probe):
            self._gossip_soon = True
            self._full_due = True
            return
        if isinstance(control, Sync):
            self._full_due = self._full_due or control.member == self.member
            return
        if isinstance(control, Resized):
            self._hear_generation(control.generation)
            return
        if isinstance(control, Move):
            taken = [control.override] if self.overrides.offer(control.override) else []
            retired: list[Override] = []
        else:
            taken, retired, behind = self.overrides.merge(control)
            self._gossip_soon = self._gossip_soon or behind
        for override in taken:
            log.info("override: queue %d -> %s (planned move)", override.queue, override.to)
        for override in retired:
            log.info("override queue %d -> %s dropped by the others", override.queue, override.to)
        if taken or retired:
            self.rebalance()

    def _drop_overrides(self, member: str, why: str) -> None:
        for override in self.overrides.drop_member(member):
            log.info("override queue %d -> %s dropped: %s", override.queue, member, why)

    def _known(self, member: str) -> bool:
        return member == self.member or self.view.heartbeat_of(member) is not None

    async def _gossip(self) -> None:
        """Repeat the overrides now and then, and soon when someone needs to catch up."""
        now = self._clock()
        due = self._gossip_soon or (
            len(self.overrides) > 0 and now - self._last_gossip >= GOSSIP_SECONDS
        )
        dropped = self.overrides.dropped()
        self._gossip_soon = False
        if not due or not (self.overrides or dropped):
            return
        body = encode_gossip(self.member, self.overrides.all(), dropped)
        await self._broker.publish_control(self._group, body)
        self._last_gossip = now

    def rebalance(self) -> dict[int, Holding]:
        """Recompute the assignment and steer the bindings towards it; returns what this
        member holds once steered (read again only if a preference changed).

        A round that finds what the last one had nothing to steer from (the same view without
        clashing claims, overrides, state, size and holdings) returns at once: what it would
        compute is what the last one did, so an idle member's round costs no work per queue."""
        held = self._steering.holdings()
        if self._listening:
            return held
        basis = (self.view.version, self.overrides.version, self.state, self.queue_count)
        settled_on, settled_held = self._settled
        if basis == settled_on and (held is settled_held or held == settled_held):
            return held
        self._settled = (None, {})
        members = self._members()
        pinned = self.overrides.active(members)
        inputs = (self.queue_count, members, self._current(held), pinned)
        if inputs != self._assigned:  # the same inputs give the same assignment: skip it
            self.desired = assign_with_overrides(*inputs)
            self.standbys = standby_assignment(*inputs) if self._with_standbys else {}
            self._assigned = inputs
            mine = tuple(sorted(q for q, m in self.desired.items() if m == self.member))
            self._gone_owners.came_here(set(mine).difference(self._mine))
            self._mine = mine
            standing = (q for q, m in self.standbys.items() if m == self.member)
            self._wanted = tuple(sorted({*mine, *standing}))
        told = self._steering.prefer_only(self._wanted)
        current = inputs[2]
        self._handover_waits_for.clear()
        steered = False
        for queue, holding in held.items():
            owner = self.desired.get(queue)
            if (
                self._with_standbys
                and queue not in self._wanted
                and current.get(queue) not in (None, self.member)
            ):
                # Its line must hold only its standby or next owner (see _ready); an idle
                # queue's line is left alone, so views settling at a mass start churn nothing.
                self._steering.step_out(queue)
                steered = True
            if holding.active and owner != self.member and self._ready(owner, queue):
                steered = True
                if self._may_hand_to(owner):
                    self._steering.release(queue)
                else:
                    self._handover_waits_for.add(owner)
        held = self._steering.holdings() if told else held
        if not steered and self.view.owners_hold():
            self._settled = (basis, held)
        return held

    def _may_hand_to(self, member: str | None) -> bool:
        """Whether a queue may go to `member` now: one in the view only once it beat since
        this member's round began (HEARD_THIS_ROUND_SLACK); else the handover waits for its
        beat, which comes a moment later if it is alive."""
        heard = self.view.heard_at(member) if member is not None else None
        return heard is None or heard >= self._round_at - HEARD_THIS_ROUND_SLACK * self.interval

    def _ready(self, member: str | None, queue: int) -> bool:
        """The new owner stands ready for the queue (a release now pauses it only briefly)
        and, where the broker gives it to whoever waits first, nobody else waits for it."""
        heartbeat = self.view.heartbeat_of(member) if member else None
        if heartbeat is None:
            return self.state is MemberState.LEAVING
        if self._with_standbys and any(
            queue in other.wants for other in self.view.heartbeats() if other is not heartbeat
        ):
            return False
        return queue in heartbeat.wants

    async def _beat(self, held: dict[int, Holding] | None = None) -> None:
        holdings = self._steering.holdings() if held is None else held
        if holdings != self._beat_of[0]:  # what it holds changes rarely: say it the same way
            owns = {q: h.pin for q, h in holdings.items() if h.active and h.pin}
            wants = frozenset(q for q, h in holdings.items() if h.waiting)
            self._beat_of = (holdings, owns, wants, queues_digest(owns, wants))
        _, owns, wants, digest = self._beat_of
        full = self._full_due or digest != self._sent_digest
        self._full_due, self._sent_digest = False, digest
        beat = self.own_lease.sent()
        heartbeat = Heartbeat(
            self.member,
            self.state,
            owns,
            wants,
            self.generation,
            beat,
            digest,
            full,
            self._probe_me,
            self.own_lease.terms,
            self._view_digest(),
        )
        body = heartbeat.encode()
        self.own_lease.went_out_as(beat, body)
        await self._broker.publish_control(self._group, body)
