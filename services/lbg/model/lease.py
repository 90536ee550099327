"""A member's right to process, from evidence that the broker heard it: the confirmed lease.

A heartbeat counts only once it came back (every member hears its own heartbeats through
the broker): then the broker relayed it, so every peer that listens got it, no earlier than
it was sent. The member fences itself at `last confirmed send + lease - margin`; its peers
evict it at `last heard + lease + margin`. So the member stops 2 x margin before the
earliest eviction, as long as a peer's view lags the broker by less than that: a peer
evicts only while its own heartbeats come back within 2 x margin (`view_current`).

Members whose configs differ (a rolling change of the lease) stay safe: a heartbeat says its
member's lease and margin, and a peer evicts it after that lease minus that margin plus twice
its own margin (`LeaseTerms.evict_after`), never before it stopped.

A lease that lapsed stays lapsed until the member fenced what it held: a confirmation that
arrives late (a partition healed) renews it only after the caller dropped every queue, so
nothing buffered before the gap is processed under the renewed lease.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# Beats whose echo has not come back are forgotten once this many are newer.
PENDING_BEATS = 64


@dataclass(frozen=True, slots=True)
class LeaseTerms:
    """The group's lease and the margin on each side of it."""

    lease: float
    margin: float

    def __post_init__(self) -> None:
        if not 0 <= 2 * self.margin < self.lease:
            raise ValueError(f"margin {self.margin:g} must be >= 0 and < lease/2 ({self.lease:g})")

    @property
    def fence_delay(self) -> float:
        """How long after its last confirmed heartbeat was sent a member on these terms stops."""
        return self.lease - self.margin

    def fence_at(self, confirmed: float) -> float:
        """When a member whose last confirmed heartbeat was sent at `confirmed` stops (peers
        evict it `lease + margin` after they last heard it: MembershipView)."""
        return confirmed + self.fence_delay

    def evict_after(self, peer: LeaseTerms | None = None) -> float:
        """The silence after which a member on these terms may evict a peer on `peer`'s (its
        heartbeats say them; None: the same as these). The peer stops `peer.fence_delay` after
        its last confirmed heartbeat, and this member evicts only while its own view lags
        the broker by under 2 x its own margin: `lease + margin` when both run the same terms,
        and never before a peer on longer ones has stopped (a group whose members' configs
        differ, as in a rolling change of the lease)."""
        return (peer or self).fence_delay + 2 * self.margin


class OwnLease:
    """This member's lease: renewed by the echoes of its own heartbeats, by beat number.

    A new member starts with the lease a heartbeat echoed at once would give, from when the
    broker took its subscription to heartbeats (`start`): no peer has heard of it, so none
    evicts it before its unclaimed pins wait out a lease and its margin (client/coordinator.py);
    this spares the queues it was given at start a needless fence while a loaded broker
    sets the subscription up.
    """

    def __init__(self, terms: LeaseTerms, clock: Callable[[], float] = time.monotonic) -> None:
        self.terms = terms
        self._clock = clock
        self._sent: dict[int, float] = {}
        self._bodies: dict[bytes, int] = {}  # what each pending heartbeat went out as
        self._next = 0
        self.confirmed: float = clock()
        self.echo_delay = 0.0  # of the newest echo: what the margin must stay well above
        self._lapsed = False
        self._echoes = 0

    def start(self) -> None:
        """The member is subscribed and about to send its first heartbeat: the provisional
        lease runs from now, unless an echo already confirmed one."""
        if self._echoes == 0 and not self._lapsed:
            self.confirmed = self._clock()

    def sent(self) -> int:
        """Note a heartbeat about to be sent (its send time is now); returns its number."""
        self._next += 1
        self._sent[self._next] = self._clock()
        self._sent.pop(self._next - PENDING_BEATS, None)
        return self._next

    def went_out_as(self, beat: int, body: bytes) -> None:
        """Heartbeat `beat` is sent as `body`: its echo is known by these bytes (`echo`), so
        a member need not parse its own heartbeats as they come back, several a second."""
        self._bodies[body] = beat
        if len(self._bodies) > PENDING_BEATS:
            del self._bodies[next(iter(self._bodies))]

    def echo(self, body: bytes) -> bool | None:
        """A control message came back: None if it is none of this member's pending
        heartbeats (`went_out_as`), else as `echoed`."""
        beat = self._bodies.pop(body, None)
        return None if beat is None else self.echoed(beat)

    def echoed(self, beat: int) -> bool:
        """The broker relayed heartbeat `beat` back. True when a lease held before had lapsed
        by this renewal: the caller must fence every queue it held (see the module doc)."""
        sent_at = self._sent.pop(beat, None)
        if sent_at is None:
            return False
        lapsed = not self.holds()
        self._echoes += 1
        if sent_at > self.confirmed:
            self.confirmed = sent_at
            self.echo_delay = self._clock() - sent_at
        self._lapsed = False
        return lapsed

    def heard_the_group(self, listened: float, interval: float, agreed: bool = False) -> bool:
        """Whether a member that has listened `listened` s since it subscribed has heard every
        live peer's next heartbeat: its own came back, and either every peer it heard says
        the view it now has (`agreed`: each answers a newcomer at once) or an interval plus
        that echo's delay passed (each peer beats once an interval); or a lease passed (its
        own heartbeats may not come back at all)."""
        if listened >= self.terms.lease:
            return True
        return self._echoes > 0 and (agreed or listened >= interval + self.echo_delay)

    def lapse(self) -> None:
        """End the lease now (the connection to the broker was lost): nothing is processed until
        a heartbeat sent from here on comes back, after the caller fenced what it held. A
        peer told by the broker that the connection closed evicts this member as soon as its
        lease could have ended; whatever this member sent before can no longer renew it."""
        self._lapsed = True
        self._sent.clear()

    def holds(self) -> bool:
        """True while this member may process and ack."""
        if self._lapsed:
            return False
        if self._clock() >= self.terms.fence_at(self.confirmed):
            self._lapsed = True
            return False
        return True

    def view_current(self) -> bool:
        """Whether this member's view of the others is fresh enough to evict anyone: its own
        heartbeat came back recently, so it has heard everything the broker relayed until
        then, no more than 2 x margin ago."""
        return self._clock() - self.confirmed < 2 * self.terms.margin
