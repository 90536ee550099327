"""Crashes seen through the broker: ask whether a silent peer's connection closed.

A member fences itself `lease - margin` after its last heartbeat was sent; its peers evict
it `lease + margin` after they last heard it, since silence alone cannot tell a crash from
a slow relay. Where the broker answers for members' connections (Broker.probe_member), a
peer silent for `lease - margin` (by the terms its heartbeats announce) is asked about
once: if its connection closed, every heartbeat it sent came in before the answer, so it
stopped by now and is gone at once, a `2 x margin` sooner. A peer that is alive but silent
(stopped, cut off) gets no such answer and waits out its lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from lbg.broker.base import Broker
from lbg.client.membership import MembershipView
from lbg.model.control import Heartbeat
from lbg.model.lease import OwnLease

Forget = Callable[[Heartbeat, str], None]


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
    ) -> None:
        self._broker = broker
        self._group = group
        self._view = view
        self._own_lease = own_lease
        self._forget = forget
        self._wake = wake
        self._asked: dict[str, float] = {}  # member -> when last heard, as asked about
        self._tasks: set[asyncio.Task[None]] = set()
        self._any_probeable = (-1, False)  # whether any peer may be asked about, by version

    def next_due(self) -> float | None:
        """When the next silent peer becomes worth asking about: once its own lease could
        have ended (MembershipView.fence_delay)."""
        if not self._anyone_probeable():
            return None
        return min(
            (
                at + self._view.fence_delay(member)
                for member, at in self._view.last_heard().items()
                if self._asked.get(member) != at and self._probeable(member)
            ),
            default=None,
        )

    def ask(self) -> None:
        """Ask about each probeable peer silent since its lease could have ended, once per
        silence."""
        if not self._anyone_probeable():  # (a broker with no probe: every round)
            self._asked.clear()
            return
        heard = self._view.last_heard()
        self._asked = {m: at for m, at in self._asked.items() if m in heard}
        for member, at in self._view.silent_past_fence().items():
            if self._asked.get(member) == at or not self._probeable(member):
                continue
            self._asked[member] = at
            task = asyncio.create_task(self._probe(member, at))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()

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
