"""Dynamic membership: who is in the group, from heartbeats with a lease.

Every member publishes a heartbeat every `interval` on the group's control destination and
keeps a view of the others from theirs. A member is gone when its lease lapses (no heartbeat
for `lease + margin` seconds: see model/lease.py for why the margin, and for the terms of a
member whose heartbeats announce other ones); one that says it is leaving or stalled gets no
more queues at once.
The view is pure logic with an injected clock; the transport is the broker's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from lbg.model.control import Heartbeat, MemberState
from lbg.model.lease import LeaseTerms


@dataclass(slots=True)
class _Seen:
    heartbeat: Heartbeat
    at: float


class MembershipView:
    """The members whose lease is current, as seen from one member."""

    def __init__(
        self, lease: float, clock: Callable[[], float] = time.monotonic, margin: float = 0.0
    ) -> None:
        self.lease = lease
        self.margin = margin
        self.terms = LeaseTerms(lease, margin)
        self._clock = clock
        self._seen: dict[str, _Seen] = {}
        self._version = 0
        # What is derived from the heartbeats alone, as of a version: most rounds of an idle
        # member find them all unchanged (the same word heard again is the same object).
        self._members: tuple[int, list[str]] = (-1, [])
        self._heartbeats: tuple[int, list[Heartbeat]] = (-1, [])
        self._owners: tuple[int, dict[int, str]] = (-1, {})

    @property
    def version(self) -> int:
        """Moves whenever a member's latest heartbeat changes or a member leaves the view (not
        when a member is heard saying the same again): what is derived from the heartbeats
        alone holds while it stays."""
        return self._version

    def observe(self, heartbeat: Heartbeat) -> None:
        """Record a heartbeat. A leaving or stalled member gets no queues, but the queues it
        still serves count as its own until it says otherwise or its lease lapses."""
        seen = self._seen.get(heartbeat.member)
        if seen is not None and seen.heartbeat is heartbeat:
            seen.at = self._clock()
        else:
            self._seen[heartbeat.member] = _Seen(heartbeat, self._clock())
            self._version += 1

    def expire(self) -> list[Heartbeat]:
        """Drop members whose lease lapsed, margin included; returns their last heartbeats."""
        now = self._clock()
        evict_after = self.terms.evict_after
        gone = [
            m for m, seen in self._seen.items() if now - seen.at > evict_after(seen.heartbeat.terms)
        ]
        if gone:
            self._version += 1
        return [self._seen.pop(member).heartbeat for member in gone]

    def now(self) -> float:
        """The view's clock: what `last_heard` is measured by."""
        return self._clock()

    def fence_delay(self, member: str) -> float:
        """How long after its last heartbeat `member` has surely stopped, if it has been cut
        off: by the terms it announces (this member's own if it does not say)."""
        seen = self._seen.get(member)
        terms = seen.heartbeat.terms if seen is not None else None
        return (terms or self.terms).fence_delay

    def longest_fence_delay(self) -> float:
        """The longest `fence_delay` of this member and every member in the view."""
        return max((self.terms.fence_delay, *(self.fence_delay(member) for member in self._seen)))

    def last_heard(self) -> dict[str, float]:
        """When each member was last heard from."""
        return {m: seen.at for m, seen in self._seen.items()}

    def drop(self, member: str, heard_at: float) -> Heartbeat | None:
        """Forget a member found gone, unless it was heard from again since `heard_at`;
        returns its last heartbeat when it was forgotten."""
        seen = self._seen.get(member)
        if seen is None or seen.at != heard_at:
            return None
        self._version += 1
        return self._seen.pop(member).heartbeat

    def next_expiry(self) -> float | None:
        """When the first current lease lapses (margin included); None with nobody seen."""
        if not self._seen:
            return None
        evict_after = self.terms.evict_after
        return min(seen.at + evict_after(seen.heartbeat.terms) for seen in self._seen.values())

    def members(self) -> list[str]:
        """Members that can be given queues: current lease and not stalled, sorted."""
        if self._members[0] != self._version:
            active = (
                m for m, seen in self._seen.items() if seen.heartbeat.state is MemberState.ACTIVE
            )
            self._members = (self._version, sorted(active))
        return list(self._members[1])

    def heartbeats(self) -> list[Heartbeat]:
        """The latest heartbeat of every member whose lease is current."""
        if self._heartbeats[0] != self._version:
            self._heartbeats = (self._version, [seen.heartbeat for seen in self._seen.values()])
        return list(self._heartbeats[1])

    def heartbeat_of(self, member: str) -> Heartbeat | None:
        seen = self._seen.get(member)
        return seen.heartbeat if seen else None

    def heard_at(self, member: str) -> float | None:
        """When `member` was last heard from (None: not in the view)."""
        seen = self._seen.get(member)
        return seen.at if seen else None

    def owners(self) -> dict[int, str]:
        """Who serves which queue by the members' own word (the latest claim wins a clash, so
        an answer with a clash holds only until the next heartbeat is heard)."""
        if self._owners[0] != self._version:
            claims = sorted(self._seen.values(), key=lambda seen: seen.at)
            owners = {q: seen.heartbeat.member for seen in claims for q in seen.heartbeat.owns}
            claimed = sum(len(seen.heartbeat.owns) for seen in claims)
            self._owners = (self._version if len(owners) == claimed else -1, owners)
        return dict(self._owners[1])

    def owners_hold(self) -> bool:
        """Whether the last `owners()` answer found no clash at this version: it holds, as all
        that is derived from the heartbeats, while the version stays."""
        return self._owners[0] == self._version

    def pins(self) -> dict[str, str]:
        """Pin id -> member, for every queue a live member says it serves."""
        return {
            pin: seen.heartbeat.member
            for seen in self._seen.values()
            for pin in seen.heartbeat.owns.values()
        }
