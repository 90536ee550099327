"""Taking over queues assigned here whose broker owner is gone, stalled or unknown.

The coordinator decides who should serve which queue; the broker's exclusivity still gives a
queue to whoever holds its pin. A pin of a member whose lease lapsed, or of a stalled member,
is evicted at once; a pin nobody claims only once it stayed unclaimed for a lease and its
margin (its owner may have just taken the queue and been cut off before saying so: its own
lease rests on a heartbeat sent no later than it saw the pin, so it has stopped by then).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

from lbg.client.membership import MembershipView
from lbg.client.steering import Holding, Steering
from lbg.model.control import Heartbeat, MemberState

# A queue assigned here but held by nobody this member knows of is looked up at the broker
# when it comes to this member, then this many leases apart (at every round once an unknown
# pin is seen, or its owner is gone or stalled), so an idle member does not keep asking the
# broker about every queue it waits for.
LOOKUP_LEASES = 10.0
# A gone member's pins and queues stay suspect this many leases after it was found gone.
GONE_LEASES = 20.0


class GoneOwners:
    """One member's lookups and evictions of the broker's owners of the queues assigned to it."""

    def __init__(
        self, view: MembershipView, steering: Steering, clock: Callable[[], float]
    ) -> None:
        self._view = view
        self._steering = steering
        self._clock = clock
        self._gone_pins: dict[str, float] = {}
        self._gone_queues: dict[int, float] = {}
        self._looked: dict[int, float] = {}
        self._lookups_due = -float("inf")  # when the next periodic lookup may be due ...
        self._held_looked: dict[int, Holding] = {}  # ... while this member holds the same
        self._unknown: dict[int, tuple[str, float]] = {}
        self._stalled_owners: tuple[int, list[Heartbeat]] = (-1, [])  # by the view's version

    def forget(self, heartbeat: Heartbeat) -> None:
        """A member is gone: the queues it served and their pins become suspect."""
        now = self._clock()
        self._gone_pins.update(dict.fromkeys(heartbeat.owns.values(), now))
        self._gone_queues.update(dict.fromkeys(heartbeat.owns, now))

    def came_here(self, queues: Collection[int]) -> None:
        """These queues were just assigned here: ask the broker who holds them at once."""
        for queue in queues:
            self._looked.pop(queue, None)
            self._lookups_due = -float("inf")

    async def evict(self, mine: tuple[int, ...], held: dict[int, Holding], lease: float) -> None:
        """Look up the queues assigned here (`mine`) that this member does not hold, and evict
        the pins of gone, stalled or long-unclaimed owners.

        The broker is asked at every round only about queues a gone or stalled member held or
        an unknown pin holds (the broker itself, not what the binding last heard of the pins:
        a lost notice must not leave a gone owner's pin to the broker's timeout); about a queue
        that just came here at once; about the others every LOOKUP_LEASES (an unknown pin on a
        queue this member waits for then waits that long more, as the broker's own timeout
        runs too). Most rounds of an idle member return at the first test: nothing is suspect,
        no lookup is due, and it holds what it held at the last lookup (a queue it served that
        it lost is looked up at once, as one that just came here)."""
        now = self._clock()
        if self._gone_queues:
            self._forget_old(now - GONE_LEASES * lease)
        stalled_owners = self._stalled()
        if (
            not (stalled_owners or self._gone_queues or self._unknown)
            and now < self._lookups_due
            and held == self._held_looked
        ):
            return
        stalled = {pin for hb in stalled_owners for pin in hb.owns.values()}
        suspects = {
            *self._gone_queues,
            *self._unknown,
            *(q for hb in stalled_owners for q in hb.owns),
        }
        not_held = [q for q in mine if not ((holding := held.get(q)) and holding.active)]
        due = [
            queue
            for queue in not_held
            if queue in suspects
            or now - self._looked.get(queue, -float("inf")) >= LOOKUP_LEASES * lease
        ]
        self._looked.update(dict.fromkeys(due, now))
        looked = (self._looked.get(queue, -float("inf")) for queue in not_held)
        self._lookups_due = min(looked, default=float("inf")) + LOOKUP_LEASES * lease
        self._held_looked = held
        if not due and not self._unknown:
            return
        live = self._view.pins()
        pins = await asyncio.gather(
            *(self._steering.pinned_by(queue, fresh=queue in suspects) for queue in due)
        )
        unclaimed_after = self._view.longest_fence_delay() + 2 * self._view.margin
        unknown: dict[int, tuple[str, float]] = {}
        for queue, pin in zip(due, pins, strict=True):
            if pin is None or (pin in live and pin not in stalled):
                continue
            seen_pin, since = self._unknown.get(queue, (pin, now))
            since = since if seen_pin == pin else now
            if pin in self._gone_pins or pin in stalled or now - since >= unclaimed_after:
                await self._steering.evict(queue, pin)
            else:
                unknown[queue] = (pin, since)
        self._unknown = unknown

    def _stalled(self) -> list[Heartbeat]:
        """The latest heartbeats of the stalled members that say they serve queues."""
        version = self._view.version
        if self._stalled_owners[0] != version:
            stalled = MemberState.STALLED
            owners = [hb for hb in self._view.heartbeats() if hb.owns and hb.state is stalled]
            self._stalled_owners = (version, owners)
        return self._stalled_owners[1]

    def _forget_old(self, before: float) -> None:
        """Gone members' pins and queues found gone before `before` are suspect no more."""
        self._gone_pins = {p: t for p, t in self._gone_pins.items() if t > before}
        self._gone_queues = {q: t for q, t in self._gone_queues.items() if t > before}
