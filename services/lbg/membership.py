"""Dynamic membership: who is in the group, from heartbeats with a lease.

Every member publishes a heartbeat every `interval` on the group's control destination and
keeps a view of the others from theirs. A member is gone when its lease lapses (no heartbeat
for `lease + margin` seconds: see lease.py for why the margin); one that says it is leaving
or stalled gets no more queues at once.
The view is pure logic with an injected clock; the transport is the broker's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import orjson

from lbg.model.messages import MalformedMessage


class MemberState(StrEnum):
    """What a member says about itself in its heartbeat."""

    ACTIVE = "active"
    LEAVING = "leaving"
    STALLED = "stalled"


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """One member's word: its state, the queues it serves (with the broker's pin for each),
    the queues it is ready to take (a standby pull is waiting), the generation of the
    group's config it runs (a resizable group's size changes with it) and its number, by
    which the member knows its own heartbeat when the broker relays it back."""

    member: str
    state: MemberState
    owns: Mapping[int, str] = field(default_factory=dict)
    wants: frozenset[int] = frozenset()
    generation: int = 0
    beat: int = 0

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "m": self.member,
                "st": self.state.value,
                "o": {str(q): pin for q, pin in self.owns.items()},
                "w": sorted(self.wants),
                "g": self.generation,
                "n": self.beat,
            }
        )

    @classmethod
    def decode(cls, body: bytes) -> Heartbeat:
        """Parse a heartbeat, raising MalformedMessage if it is not one."""
        try:
            obj = orjson.loads(body)
            return cls(
                member=str(obj["m"]),
                state=MemberState(obj["st"]),
                owns={int(q): str(pin) for q, pin in obj.get("o", {}).items()},
                wants=frozenset(int(q) for q in obj.get("w", [])),
                generation=parse_generation(obj.get("g", 0)),
                beat=int(obj.get("n", 0)),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MalformedMessage(f"bad heartbeat: {exc!r}") from None


def parse_generation(value: object) -> int:
    """A config generation as sent in a control message: an integer >= 0, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"generation must be an integer >= 0, got {value!r}")
    return value


@dataclass
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
        self._clock = clock
        self._seen: dict[str, _Seen] = {}

    def observe(self, heartbeat: Heartbeat) -> None:
        """Record a heartbeat. A leaving or stalled member gets no queues, but the queues it
        still serves count as its own until it says otherwise or its lease lapses."""
        self._seen[heartbeat.member] = _Seen(heartbeat, self._clock())

    def expire(self) -> list[Heartbeat]:
        """Drop members whose lease lapsed, margin included; returns their last heartbeats."""
        now = self._clock()
        gone = [m for m, seen in self._seen.items() if now - seen.at > self.lease + self.margin]
        return [self._seen.pop(member).heartbeat for member in gone]

    def members(self) -> list[str]:
        """Members that can be given queues: current lease and not stalled, sorted."""
        return sorted(
            m for m, seen in self._seen.items() if seen.heartbeat.state is MemberState.ACTIVE
        )

    def heartbeat_of(self, member: str) -> Heartbeat | None:
        seen = self._seen.get(member)
        return seen.heartbeat if seen else None

    def owners(self) -> dict[int, str]:
        """Who serves which queue by the members' own word (the latest claim wins a clash)."""
        claims = sorted(self._seen.values(), key=lambda seen: seen.at)
        return {q: seen.heartbeat.member for seen in claims for q in seen.heartbeat.owns}

    def pins(self) -> dict[str, str]:
        """Pin id -> member, for every queue a live member says it serves."""
        return {
            pin: seen.heartbeat.member
            for seen in self._seen.values()
            for pin in seen.heartbeat.owns.values()
        }
