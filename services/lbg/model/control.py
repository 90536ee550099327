"""The group's control channel, one wire format: heartbeats and the operator's messages.

Every member of a dynamic group publishes a `Heartbeat` on the group's control destination
(client/membership.py keeps the view built from them). Next to the heartbeats travel messages that
`Heartbeat.decode` rejects (they have no member and state):

- ``{"move": {"queue": q, "to": member, "at": version}}``, sent by `lbg move`;
- ``{"overrides": {"q": {"to": member, "at": version}, ...}, "dropped": {"q": version},
  "from": member}``, which every member that knows of overrides repeats about once a second,
  and at its next heartbeat when it hears a new member, a probe, or someone repeating an
  override it knows to be dropped or superseded, so members that join later (or missed the
  move, or were cut off while its member died) catch up;
- ``{"probe": sender}``, sent by the operator commands when they start listening, so that
  the members repeat their overrides at once rather than within the second;
- ``{"resized": generation}``, sent by `cg-admin resize` once a resizable group's new size is
  stored, so that the members read it at once (the heartbeats carry each member's generation
  too, so one that missed this catches up from the others);
- ``{"sync": member}``, sent by a member that heard `member`'s digest but does not hold the
  content it stands for (it joined later, or missed a change): `member` then sends its
  content with its next heartbeat.

A heartbeat carries the member's queues (what it serves, what it stands ready for) only when
they changed or someone asked (a newcomer, a sync, an operator's probe); otherwise only their
digest, so the control channel's bytes do not grow with the queue count.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

from lbg.model.lease import LeaseTerms
from lbg.model.messages import MalformedMessage

MOVE = "move"
OVERRIDES = "overrides"
PROBE = "probe"
RESIZED = "resized"
SYNC = "sync"
GOSSIP_SECONDS = 1.0
MEMBER_CHARS = 200


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
    which the member knows its own heartbeat when the broker relays it back. `full` False:
    it carries only `digest` of its queues, which the receiver fills in (`filled_from`).
    `probe`: the broker answers for this member's connection (Broker.probe_member), so a
    peer may ask it whether the member's connection closed instead of waiting out the lease.
    `terms`: the lease and margin the member fences itself by, which its peers evict it by
    (None from a member that does not say: the peer's own). `view`: the `members_digest` of
    the active members its member counts, itself included (None: it does not say), so that
    a newcomer knows when it has heard everyone its peers know of."""

    member: str
    state: MemberState
    owns: Mapping[int, str] = field(default_factory=dict)
    wants: frozenset[int] = frozenset()
    generation: int = 0
    beat: int = 0
    digest: int = 0
    full: bool = True
    probe: bool = False
    terms: LeaseTerms | None = None
    view: int | None = None

    def encode(self) -> bytes:
        body: dict[str, object] = {
            "m": self.member,
            "st": self.state.value,
            "g": self.generation,
            "n": self.beat,
            "d": self.digest,
        }
        if self.probe:
            body["p"] = 1
        if self.terms is not None:
            body["l"] = [self.terms.lease, self.terms.margin]
        if self.view is not None:
            body["v"] = self.view
        if self.full:
            body["o"] = {str(q): pin for q, pin in self.owns.items()}
            body["w"] = sorted(self.wants)
        return orjson.dumps(body)

    def filled_from(self, before: Heartbeat | None) -> Heartbeat:
        """This heartbeat with its queues, from the member's previous one if this one carries
        only their digest. If that one does not hold them, the queues last heard of (none if
        never) with `full` still False: the receiver should ask for a sync."""
        if self.full:
            return self
        if before is not None and before.full and before.digest == self.digest:
            return self._with_queues(before, full=True)
        return self._with_queues(before or self, full=False)

    def _with_queues(self, other: Heartbeat, full: bool) -> Heartbeat:
        """This heartbeat with `other`'s queues (`dataclasses.replace` costs several times
        more, and every member fills in every other's heartbeat several times a second)."""
        return Heartbeat(
            self.member,
            self.state,
            other.owns,
            other.wants,
            self.generation,
            self.beat,
            self.digest,
            full,
            self.probe,
            self.terms,
            self.view,
        )

    @classmethod
    def decode(cls, body: bytes) -> Heartbeat:
        """Parse a heartbeat, raising MalformedMessage if it is not one."""
        try:
            return cls._parsed(orjson.loads(body))
        except orjson.JSONDecodeError as exc:
            raise MalformedMessage(f"bad heartbeat: {exc!r}") from None

    @classmethod
    def _parsed(cls, obj: Any) -> Heartbeat:
        """A heartbeat from its parsed JSON, raising MalformedMessage if it is not one."""
        try:
            full = "d" not in obj or "o" in obj  # a sender without digests always says all
            return cls(
                member=str(obj["m"]),
                state=_STATES[obj["st"]],
                owns={int(q): str(pin) for q, pin in obj.get("o", {}).items()},
                wants=frozenset(int(q) for q in obj.get("w", ())),
                generation=parse_generation(obj.get("g", 0)),
                beat=int(obj.get("n", 0)),
                digest=int(obj.get("d", 0)),
                full=full,
                probe=bool(obj.get("p", 0)),
                terms=_terms(obj["l"]) if "l" in obj else None,
                view=int(obj["v"]) if "v" in obj else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MalformedMessage(f"bad heartbeat: {exc!r}") from None


_STATES = {state.value: state for state in MemberState}  # the enum's call is several times slower


def _terms(value: Any) -> LeaseTerms:
    """A heartbeat's `[lease, margin]`, raising ValueError if it is not valid terms."""
    lease, margin = (float(x) for x in value)
    if not (math.isfinite(lease) and math.isfinite(margin)):
        raise ValueError(f"lease terms must be finite, got {value!r}")
    return LeaseTerms(lease, margin)


def unnumbered(body: bytes) -> bytes:
    """A heartbeat's body without its number, which changes with every beat: two heartbeats of
    a member with the same unnumbered body say the same (its number comes before anything a
    member names, and a comma or quote inside a JSON string is escaped)."""
    start = body.find(b',"n":')
    if start < 0:
        return body
    end = body.find(b",", start + 5)
    return body[:start] + (body[end:] if end >= 0 else b"}")


def members_digest(members: Iterable[str]) -> int:
    """A short fingerprint of a set of member ids, the same in every process."""
    return zlib.crc32(orjson.dumps(sorted(members)))


def queues_digest(owns: Mapping[int, str], wants: frozenset[int]) -> int:
    """A short fingerprint of what a member serves and stands ready for."""
    return zlib.crc32(orjson.dumps([sorted(owns.items()), sorted(wants)]))


def parse_generation(value: object) -> int:
    """A config generation as sent in a control message: an integer >= 0, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"generation must be an integer >= 0, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Override:
    """Queue `queue` goes to member `to`; of two overrides of a queue the higher `at` wins."""

    queue: int
    to: str
    at: float


@dataclass(frozen=True, slots=True)
class Move:
    """An operator's planned move (`lbg move`)."""

    override: Override


@dataclass(frozen=True, slots=True)
class OverrideGossip:
    """One member's overrides and the versions it dropped, repeated so others catch up."""

    sender: str
    overrides: tuple[Override, ...]
    dropped: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Probe:
    """An operator command started listening: members repeat their overrides now."""

    sender: str


@dataclass(frozen=True, slots=True)
class Sync:
    """Someone heard `member`'s digest without its content: `member` sends it next beat."""

    member: str


@dataclass(frozen=True, slots=True)
class Resized:
    """The group's config now has this generation (a new size): members read it now."""

    generation: int


ControlMessage = Move | OverrideGossip | Probe | Resized | Sync


def encode_move(override: Override) -> bytes:
    return orjson.dumps({MOVE: {"queue": override.queue, "to": override.to, "at": override.at}})


def encode_gossip(
    sender: str, overrides: Iterable[Override], dropped: Mapping[int, float] | None = None
) -> bytes:
    entries = {str(o.queue): {"to": o.to, "at": o.at} for o in overrides}
    retired = {str(q): at for q, at in sorted((dropped or {}).items())}
    return orjson.dumps({OVERRIDES: entries, "dropped": retired, "from": sender})


def encode_probe(sender: str) -> bytes:
    return orjson.dumps({PROBE: sender})


def encode_sync(member: str) -> bytes:
    return orjson.dumps({SYNC: member})


def encode_resized(generation: int) -> bytes:
    return orjson.dumps({RESIZED: generation})


def _queue(queue: object) -> int:
    if isinstance(queue, str) and queue.isdigit():
        queue = int(queue)
    if not isinstance(queue, int) or isinstance(queue, bool) or queue < 0:
        raise MalformedMessage(f"override: queue must be an integer >= 0, got {queue!r}")
    return queue


def _version(queue: int, at: object) -> float:
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        raise MalformedMessage(f"override of queue {queue}: bad version {at!r}")
    return float(at)


def _override(queue: object, entry: object) -> Override:
    if not isinstance(entry, dict):
        raise MalformedMessage(f"override of queue {queue!r}: expected an object")
    number = _queue(queue)
    to = entry.get("to")
    if not isinstance(to, str) or not 0 < len(to) <= MEMBER_CHARS:
        raise MalformedMessage(f"override of queue {number}: bad member {to!r}")
    return Override(number, to, _version(number, entry.get("at")))


def decode_message(body: bytes) -> ControlMessage | Heartbeat:
    """Parse anything heard on the control channel, once (every member hears every other's
    heartbeat several times a second); MalformedMessage if it is neither."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedMessage(f"bad control message: {exc!r}") from None
    control = _control(obj) if isinstance(obj, dict) else None
    return control if control is not None else Heartbeat._parsed(obj)


def decode_control(body: bytes) -> ControlMessage | None:
    """Parse an operator control message; None if the body is not one (e.g. a heartbeat),
    MalformedMessage if it says it is one but is not well-formed."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return _control(obj) if isinstance(obj, dict) else None


def _control(obj: dict) -> ControlMessage | None:
    """An operator control message from its parsed JSON object; None if it is not one."""
    if MOVE in obj:
        move = obj[MOVE]
        if not isinstance(move, dict):
            raise MalformedMessage("bad move: expected an object")
        return Move(_override(move.get("queue"), move))
    if OVERRIDES in obj:
        entries, dropped, sender = obj[OVERRIDES], obj.get("dropped", {}), obj.get("from")
        if not (isinstance(entries, dict) and isinstance(dropped, dict)):
            raise MalformedMessage("bad overrides: expected objects")
        if not isinstance(sender, str):
            raise MalformedMessage("bad overrides: no sender")
        return OverrideGossip(
            sender,
            tuple(_override(q, e) for q, e in entries.items()),
            tuple((_queue(q), _version(_queue(q), at)) for q, at in dropped.items()),
        )
    if PROBE in obj:
        if not isinstance(obj[PROBE], str):
            raise MalformedMessage("bad probe: expected its sender")
        return Probe(obj[PROBE])
    if SYNC in obj:
        if not isinstance(obj[SYNC], str):
            raise MalformedMessage("bad sync: expected a member")
        return Sync(obj[SYNC])
    if RESIZED in obj:
        try:
            return Resized(parse_generation(obj[RESIZED]))
        except ValueError as exc:
            raise MalformedMessage(f"bad resized: {exc}") from None
    return None
