"""Planned moves as overrides on top of the balanced assignment.

Every coordinator keeps the same overrides (an `OverrideBook`): for each queue the one with
the highest version wins, and a version once dropped never comes back. An override applies
while its member is alive and active; it is dropped when that member leaves or dies (its lease
lapses; the member itself drops it when its own heartbeats lapsed), or when nobody hears of
the member within a lease of learning the override. The
assignment is then `assign_with_overrides`: every pinned queue goes to its member, and the
other queues are shared as evenly and stickily as `balanced_assignment` does, counting the
pinned queues in their members' load.

The gossip, not the broker's key-value store, carries overrides: the control channel is what
every member already listens to, it needs nothing new from the broker interface, and an
override lives exactly as long as members that know it (a stored one would outlive its
reason and need its own clean-up).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping

from lbg.model.assignment import balanced_assignment
from lbg.model.control import Override, OverrideGossip


class OverrideBook:
    """One member's overrides, queue -> member, with the newest version of each queue."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: dict[int, tuple[Override, float]] = {}
        self._versions: dict[int, float] = {}
        self._dropped: dict[int, float] = {}
        self.version = 0  # moves whenever an override is taken or dropped

    def __len__(self) -> int:
        return len(self._entries)

    def offer(self, override: Override) -> bool:
        """Take an override newer than any seen for its queue (kept or dropped); True if so."""
        if override.at <= self._versions.get(override.queue, -math.inf):
            return False
        self._versions[override.queue] = override.at
        self._entries[override.queue] = (override, self._clock())
        self.version += 1
        return True

    def behind(self, override: Override) -> bool:
        """Whoever repeats `override` missed that it was superseded or dropped."""
        mine = self._entries.get(override.queue)
        if mine is not None and mine[0].at == override.at:
            return False
        return override.at <= self._versions.get(override.queue, -math.inf)

    def merge(self, gossip: OverrideGossip) -> tuple[list[Override], list[Override], bool]:
        """Take another member's word: (overrides taken, overrides dropped, sender behind)."""
        retired = [o for q, at in gossip.dropped if (o := self.retire(q, at)) is not None]
        taken = [o for o in gossip.overrides if self.offer(o)]
        behind = any(self.behind(o) for o in gossip.overrides)
        return taken, retired, behind

    def _drop(self, gone: list[Override]) -> list[Override]:
        self.version += len(gone)
        for override in gone:
            del self._entries[override.queue]
            self._dropped[override.queue] = override.at
        return gone

    def retire(self, queue: int, at: float) -> Override | None:
        """Another member dropped version `at` of `queue`'s override: drop it (or older) too."""
        self._versions[queue] = max(self._versions.get(queue, -math.inf), at)
        self._dropped[queue] = max(self._dropped.get(queue, -math.inf), at)
        mine = self._entries.get(queue)
        if mine is None or mine[0].at > at:
            return None
        self.version += 1
        del self._entries[queue]
        return mine[0]

    def drop_member(self, member: str) -> list[Override]:
        """Drop the overrides that pin queues to `member` (it left or died)."""
        return self._drop([o for o, _ in self._entries.values() if o.to == member])

    def drop_unknown(self, known: Callable[[str], bool], grace: float) -> list[Override]:
        """Drop overrides learnt more than `grace` ago whose member is still unheard of."""
        now = self._clock()
        return self._drop(
            [o for o, at in self._entries.values() if not known(o.to) and now - at > grace]
        )

    def dropped(self) -> dict[int, float]:
        """queue -> the newest version dropped, for queues with no newer override."""
        return {q: at for q, at in self._dropped.items() if q not in self._entries}

    def all(self) -> list[Override]:
        return [o for o, _ in sorted(self._entries.values(), key=lambda e: e[0].queue)]

    def active(self, members: Iterable[str]) -> dict[int, str]:
        """queue -> member for the overrides whose member is among `members`."""
        alive = set(members)
        return {o.queue: o.to for o in self.all() if o.to in alive}

    def newest(self) -> float:
        """The highest version seen of any queue (-inf: none)."""
        return max(self._versions.values(), default=-math.inf)


def assign_with_overrides(
    queue_count: int,
    members: Iterable[str],
    current: Mapping[int, str],
    overrides: Mapping[int, str],
) -> dict[int, str]:
    """`balanced_assignment`, except that each overridden queue goes to its member.

    Overrides of queues out of range or of members not in `members` are ignored. The other
    queues are shared so that the loads (pinned queues included) differ by at most one where
    the pins allow; among equals the members holding most of them now get the larger shares,
    and each member keeps the queues it holds up to its share. Deterministic: the same inputs
    give the same result on every member.
    """
    people = sorted(set(members))
    pinned = {q: m for q, m in overrides.items() if m in people and 0 <= q < queue_count}
    if not pinned:
        return balanced_assignment(queue_count, people, current)
    rest = [q for q in range(queue_count) if q not in pinned]
    held: dict[str, list[int]] = {member: [] for member in people}
    for queue in rest:
        owner = current.get(queue)
        if owner in held:
            held[owner].append(queue)
    base = dict.fromkeys(people, 0)
    for member in pinned.values():
        base[member] += 1
    share = dict.fromkeys(people, 0)
    for _ in rest:
        # The least loaded; among equals the one holding most beyond its share so far.
        member = min(people, key=lambda m: (base[m] + share[m], share[m] - len(held[m]), m))
        share[member] += 1
    result = dict(pinned)
    load = dict.fromkeys(people, 0)
    for member in people:
        for queue in held[member][: share[member]]:
            result[queue] = member
            load[member] += 1
    for queue in rest:
        if queue not in result:
            member = min(
                (m for m in people if load[m] < share[m]),
                key=lambda m: (base[m] + load[m], m),
            )
            result[queue] = member
            load[member] += 1
    return result


def standby_assignment(
    queue_count: int,
    members: Iterable[str],
    current: Mapping[int, str],
    overrides: Mapping[int, str],
) -> dict[int, str]:
    """For each queue its owner in `assign_with_overrides` holds now, the member that would
    get it if that owner went once the group has settled: its owner in the assignment without
    that member, from the assignment rather than from what is held now. (From what was held,
    a joiner that held nothing yet had room for every queue of any member that went, and
    stood in the line of every queue of the group for the second its join took: at QC 1024,
    a thousand channels opened and most closed again.)

    A queue on the move (its assigned owner does not hold it yet) gets none, so that its line
    holds only the member it moves to. Deterministic, like the assignment.
    """
    people = sorted(set(members))
    assigned = assign_with_overrides(queue_count, people, current, overrides)
    held: dict[str, list[int]] = {}
    for queue, owner in assigned.items():
        if current.get(queue) == owner:
            held.setdefault(owner, []).append(queue)
    standbys: dict[int, str] = {}
    for owner, queues in held.items():
        others = [m for m in people if m != owner]
        without = assign_with_overrides(queue_count, others, assigned, overrides)
        standbys.update((q, without[q]) for q in queues if q in without)
    return standbys
