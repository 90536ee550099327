"""The coordinator's hold on the client's queues: it reads what each queue's binding holds and
tells the client what to prefer, release, fence, suspend or evict, without touching a binding
itself (the client owns its bindings; the coordinator only steers).

A round reads only the bindings that may hold something (active or waiting ones, the
preferred ones, the ones whose state changed), not every queue: an idle member's rounds cost
what it holds, not the queue count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from typing import NamedTuple, Protocol

from lbg.broker.base import QueueBinding


class Holding(NamedTuple):
    """What this member holds of one queue: active (with the broker's pin), or waiting for it.
    A tuple: every round makes one per queue held (a frozen dataclass costs several times more)."""

    active: bool
    pin: str | None
    waiting: bool


WAITING = Holding(active=False, pin=None, waiting=True)


class Steering(Protocol):
    """What a dynamic coordinator may read of and ask of its client's queues."""

    def holdings(self) -> dict[int, Holding]:
        """The queues the client holds something of now (active or waiting), and what; it
        holds nothing of the other queues it is bound to."""
        ...

    def changed(self, queue: int) -> None:
        """The queue's binding became active or stopped being so: read it next time."""
        ...

    def prefer_only(self, queues: Collection[int]) -> bool:
        """Stand ready for exactly these queues as their preferred next owner; True if that
        changed anything."""
        ...

    def release(self, queue: int) -> None:
        """Hand `queue` over after finishing its in-flight work (a planned handover)."""
        ...

    def step_out(self, queue: int) -> None:
        """Leave `queue`'s line if only waiting in it, not preferred (someone else holds it)."""
        ...

    def fence_all(self, reason: str) -> None:
        """Stop processing every queue now (the member's lease lapsed)."""
        ...

    def suspend_all(self, suspended: bool, reason: str) -> None:
        """Give every queue up and stop pulling (a stalled member), or pull again."""
        ...

    async def pinned_by(self, queue: int, *, fresh: bool = False) -> str | None:
        """The pin the broker holds for `queue` now, whoever holds it (`fresh`: asked of the
        broker, whatever the binding last heard)."""
        ...

    async def evict(self, queue: int, pin: str) -> bool:
        """Unseat `pin` from `queue` if the broker still holds it; True if it did."""
        ...


class BindingSteering:
    """Steering over a client's live bindings and its workers' release requests.

    Only a preferred binding waits, and a binding that becomes active says so (`changed`, from
    the client's state listener); what was held is read again until it holds nothing. Every
    binding is read once per FULL_READ_SECONDS anyway, for what no listener reports (a
    non-exclusive group's binding is active from the start; a pin of this member's that it
    does not claim meanwhile is an unclaimed pin to the others, evicted as such).

    A preferred binding found waiting whose waiting is steady (`steady_waiting`: NATS) is
    taken as still waiting, without reading it, for WAITING_READ_SECONDS (an idle member's
    rounds read every queue it waits for otherwise): it stops waiting by becoming active (it
    says so), by being told otherwise (here), or by being replaced or having its consumer
    switched in a resize (seen within that time); one that does not wait yet is read every
    round, so a new standby is heard of at once. Where every binding found holding something
    is steady so and nothing changed or was asked of them since, a round reads none of them
    until the waiting read is due, or an active one's activity may end unheard (its
    `active_known_until`: never on Message DB, most of a priority timeout after the last
    answered pull on NATS): what an idle member holds is then a lookup, not a read of each
    queue it serves or waits for."""

    FULL_READ_SECONDS = 5.0
    WAITING_READ_SECONDS = 1.0

    def __init__(
        self,
        bindings: Mapping[int, QueueBinding],
        request_release: Callable[[int], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._bindings = bindings
        self._request_release = request_release
        self._clock = clock
        self._preferred: dict[int, QueueBinding] = {}  # the bindings told to stand ready
        self._watched: set[int] = set()  # held something at the last read, or changed since
        self._waiting: dict[int, QueueBinding] = {}  # found waiting at the last read
        self._read_all = self._read_waiting = -float("inf")
        self._held: dict[int, Holding] = {}  # what the last read found
        # ... and until when it holds unless a change is heard (or the waiting read is due)
        self._steady_until = -float("inf")

    def holdings(self) -> dict[int, Holding]:
        now = self._clock()
        if now < self._steady_until and now - self._read_waiting < self.WAITING_READ_SECONDS:
            return self._held
        known: dict[int, QueueBinding] = {}
        if now - self._read_all >= self.FULL_READ_SECONDS:
            self._read_all = self._read_waiting = now
            queues: Collection[int] = list(self._bindings)
        elif now - self._read_waiting >= self.WAITING_READ_SECONDS:
            self._read_waiting = now
            queues = self._watched | self._preferred.keys() | self._waiting.keys()
        else:
            bindings, preferred = self._bindings, self._preferred
            known = {
                queue: binding
                for queue, binding in self._waiting.items()
                if binding.steady_waiting
                and preferred.get(queue) is binding
                and bindings.get(queue) is binding
                and queue not in self._watched
            }
            queues = (self._watched | preferred.keys() | self._waiting.keys()).difference(known)
        held = dict.fromkeys(known, WAITING)
        for queue in queues:
            binding = self._bindings.get(queue)
            if binding is None:
                continue
            if binding.active:
                held[queue] = Holding(True, binding.pin, waiting=False)
            elif binding.waiting:
                held[queue] = WAITING  # no pin while not active
        self._watched = {queue for queue, holding in held.items() if holding.active}
        self._waiting = {q: self._bindings[q] for q, h in held.items() if h.waiting}
        self._held, self._steady_until = held, self._steady_for(held)
        return held

    def _steady_for(self, held: dict[int, Holding]) -> float:
        """Until when what `held` says can only change with a word from a binding or a request
        of the steering's (-inf: at any time): every preferred binding holds something, each
        one waiting waits steadily as preferred, and each active one stays so unheard until
        its `active_known_until`."""
        preferred = self._preferred
        if not preferred.keys() <= held.keys():
            return -float("inf")
        until = float("inf")
        for queue, holding in held.items():
            binding = self._bindings[queue]
            if holding.active:
                until = min(until, binding.active_known_until())
            elif not (binding.steady_waiting and preferred.get(queue) is binding):
                return -float("inf")
        return until

    def changed(self, queue: int) -> None:
        self._watched.add(queue)
        self._steady_until = -float("inf")

    def prefer_only(self, queues: Collection[int]) -> bool:
        told, changed, wanted = self._preferred, False, set(queues)
        for queue in [q for q in told if q not in wanted]:
            binding = told.pop(queue)
            if self._bindings.get(queue) is binding:
                binding.set_preferred(False)
                changed = True
        for queue in queues:
            binding = self._bindings.get(queue)
            if binding is not None and told.get(queue) is not binding:
                binding.set_preferred(True)
                told[queue] = binding
                changed = True
        if changed:
            self._steady_until = -float("inf")
        return changed

    def release(self, queue: int) -> None:
        self._steady_until = -float("inf")
        self._request_release(queue)

    def step_out(self, queue: int) -> None:
        self._steady_until = -float("inf")
        if (binding := self._bindings.get(queue)) is not None:
            binding.step_out()

    def fence_all(self, reason: str) -> None:
        self._steady_until = -float("inf")
        for binding in list(self._bindings.values()):
            if binding.active:
                binding.fence(reason)

    def suspend_all(self, suspended: bool, reason: str) -> None:
        self._read_waiting = -float("inf")  # a suspended binding no longer waits
        self._steady_until = -float("inf")
        for binding in list(self._bindings.values()):
            if suspended:
                binding.fence(reason)
            binding.suspend(suspended)

    async def pinned_by(self, queue: int, *, fresh: bool = False) -> str | None:
        binding = self._bindings.get(queue)
        return await binding.pinned_by(fresh=fresh) if binding is not None else None

    async def evict(self, queue: int, pin: str) -> bool:
        binding = self._bindings.get(queue)
        return await binding.evict(pin) if binding is not None else False
