"""Crashes seen through the broker: ask whether a silent peer's connection closed.

A member fences itself `lease - margin` after its last heartbeat was sent; its peers evict
it `lease + margin` after they last heard it, since silence alone cannot tell a crash from
a slow relay. Where the broker answers for members' connections (Broker.probe_member), a
peer silent for `lease - margin` (by the terms its heartbeats announce) is asked about
once: if its connection closed, every heartbeat it sent came in before the answer, so it
stopped by now and is gone at once, a `2 x margin` sooner. A peer that is alive but silent
(stopped, cut off) gets no such answer and waits out its lease.

Where the broker's own line moves a member's queues (Broker.line_takes_over: RabbitMQ's single
active consumer), nothing a peer does with the answer moves a queue: a member found gone only
leaves the view, and the broker has already handed its queues to the next in line. There a
peer asks as soon as a beat is overdue (`early`: interval + margin / 2 of silence), so a crash
is seen that soon however long the lease.

The asks are made by a timer of their own, not by the coordinator's rounds (each round beats,
and a round due at every peer's overdue moment doubled the heartbeats): where `early` is set
the timer fires on the wall clock's multiples of `tick` (half an interval), between two rounds,
when the pause clock ticks too, so a look costs no wake-up of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from lbg.aio import until_next
from lbg.broker.base import Broker
from lbg.client.membership import MembershipView
from lbg.model.control import Heartbeat
from lbg.model.lease import OwnLease

Forget = Callable[[Heartbeat, str], None]

# A look is timed this much after a peer becomes worth asking about, so it surely has.
LOOK_SLACK = 0.005


class PresenceProbes:
    """The probes one member asks about its silent peers, once per silence."""

    def __init__(
        self,
        broker: Broker,
        group: str,
        view: MembershipView,
        own_lease: OwnLease,
        forget: Forget,
        wake: asyncio.Event,
        early: float | None = None,
        tick: float | None = None,
    ) -> None:
        self._broker = broker
        self._group = group
        self._view = view
        self._own_lease = own_lease
        self._forget = forget
        self._wake = wake
        self._early = early
        self._tick = tick
        self._timer: asyncio.TimerHandle | None = None
        self._asked: dict[str, float] = {}  # member -> when last heard, as asked about
        self._tasks: set[asyncio.Task[None]] = set()
        self._any_probeable = (-1, False)  # whether any peer may be asked about, by version

    def next_due(self) -> float | None:
        """When the next silent peer becomes worth asking about: once its own lease could
        have ended (MembershipView.fence_delay), or its beat is overdue (`early`)."""
        if not self._anyone_probeable():
            return None
        return min(
            (
                at + self._silence(member)
                for member, at in self._view.last_heard().items()
                if self._asked.get(member) != at and self._probeable(member)
            ),
            default=None,
        )

    def ask(self) -> None:
        """Ask about each probeable peer silent for long enough (`next_due`), once per
        silence."""
        if not self._anyone_probeable():  # (a broker with no probe: every round)
            self._asked.clear()
            return
        heard = self._view.last_heard()
        self._asked = {m: at for m, at in self._asked.items() if m in heard}
        now = self._view.now()
        for member, at in heard.items():
            if now - at < self._silence(member):
                continue
            if self._asked.get(member) == at or not self._probeable(member):
                continue
            self._asked[member] = at
            task = asyncio.create_task(self._probe(member, at))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def watch(self) -> None:
        """Look (`ask`) once the next silent peer becomes worth asking about (`next_due`), on
        the wall clock's next multiple of `tick` if given; called after every round, which
        asks itself, and again after each look."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        due = self.next_due()
        if due is None:
            return
        delay = max(0.0, due - self._view.now()) + LOOK_SLACK
        if self._tick is not None:
            delay += until_next(self._tick, time.time() + delay)
        self._timer = asyncio.get_running_loop().call_later(delay, self._look)

    def _look(self) -> None:
        """The timer's look: only while this member's own view is current (as in a round);
        otherwise the next round looks and watches again."""
        self._timer = None
        if self._own_lease.view_current():
            self.ask()
            self.watch()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in list(self._tasks):
            task.cancel()

    def _silence(self, member: str) -> float:
        """How long `member` must be silent to be worth asking about."""
        fence_delay = self._view.fence_delay(member)
        return fence_delay if self._early is None else min(fence_delay, self._early)

    def _anyone_probeable(self) -> bool:
        version = self._view.version
        if self._any_probeable[0] != version:
            self._any_probeable = (version, any(hb.probe for hb in self._view.heartbeats()))
        return self._any_probeable[1]

    def _probeable(self, member: str) -> bool:
        heartbeat = self._view.heartbeat_of(member)
        return heartbeat is not None and heartbeat.probe

    async def _probe(self, member: str, heard_at: float) -> None:
        """Forget the member if its connection closed and it was not heard from since (and
        this member's own view is current, as for any eviction)."""
        if not await self._broker.probe_member(self._group, member):
            return
        if not self._own_lease.view_current():
            return
        heartbeat = self._view.drop(member, heard_at)
        if heartbeat is not None:
            self._forget(heartbeat, "connection closed")
            self._wake.set()
