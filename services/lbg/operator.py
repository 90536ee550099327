"""What the operator commands (`lbg status`, `lbg route`, `lbg move`) need, and planned moves.

A planned move pins a queue to a chosen member of a dynamic group. It travels on the group's
control channel next to the heartbeats, as two kinds of message that `Heartbeat.decode`
rejects (they have no member and state):

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
  too, so one that missed this catches up from the others).

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

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import orjson

from lbg.broker.base import Broker, BrokerError, QueueStatus, Resize
from lbg.membership import Heartbeat, MemberState, parse_generation
from lbg.model.assignment import balanced_assignment
from lbg.model.group import GroupConfig
from lbg.model.messages import MalformedMessage, check_key
from lbg.settings import (
    BrokerSettings,
    ClientSettings,
    GroupSettings,
    PublisherSettings,
    ValidatorSettings,
)

MOVE = "move"
OVERRIDES = "overrides"
PROBE = "probe"
RESIZED = "resized"
GOSSIP_SECONDS = 1.0
IDLE_CHECK_SECONDS = 0.5
MEMBER_CHARS = 200


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    """What the operator commands read from --config: any daemon's config file will do (only
    [broker], [group] name and [client] heartbeat_interval are used)."""

    broker: BrokerSettings = dataclasses.field(default_factory=BrokerSettings)
    group: GroupSettings = dataclasses.field(default_factory=GroupSettings)
    client: ClientSettings = dataclasses.field(default_factory=ClientSettings)
    publisher: PublisherSettings = dataclasses.field(default_factory=PublisherSettings)
    validator: ValidatorSettings = dataclasses.field(default_factory=ValidatorSettings)


# ---------------------------------------------------------------------------------------------
# Control messages


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
class Resized:
    """The group's config now has this generation (a new size): members read it now."""

    generation: int


ControlMessage = Move | OverrideGossip | Probe | Resized


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


def encode_resized(generation: int) -> bytes:
    return orjson.dumps({RESIZED: generation})


async def resize_group(broker: Broker, group: str, queue_count: int) -> tuple[Resize, str | None]:
    """Resize a running group, then tell its members at once; returns what was done and, if
    the members could not be told, why (they then read the new size within seconds)."""
    done = await broker.resize_group(group, queue_count)
    try:
        await broker.publish_control(group, encode_resized(done.after.generation))
    except BrokerError as exc:
        return done, str(exc)
    return done, None


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


def decode_control(body: bytes) -> ControlMessage | None:
    """Parse an operator control message; None if the body is not one (e.g. a heartbeat),
    MalformedMessage if it says it is one but is not well-formed."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
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
    if RESIZED in obj:
        try:
            return Resized(parse_generation(obj[RESIZED]))
        except ValueError as exc:
            raise MalformedMessage(f"bad resized: {exc}") from None
    return None


# ---------------------------------------------------------------------------------------------
# Overrides and the assignment


class OverrideBook:
    """One member's overrides, queue -> member, with the newest version of each queue."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: dict[int, tuple[Override, float]] = {}
        self._versions: dict[int, float] = {}
        self._dropped: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def offer(self, override: Override) -> bool:
        """Take an override newer than any seen for its queue (kept or dropped); True if so."""
        if override.at <= self._versions.get(override.queue, -math.inf):
            return False
        self._versions[override.queue] = override.at
        self._entries[override.queue] = (override, self._clock())
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


# ---------------------------------------------------------------------------------------------
# What the operator sees


@dataclass(frozen=True, slots=True)
class MemberRow:
    member: str
    state: str
    serves: list[int]
    wants: list[int]
    generation: int = 0


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One queue as `lbg status` shows it."""

    queue: int
    buckets: list[int]
    backlog: int
    in_flight: int
    serving: str | None
    broker_active: str | None
    assigned: str | None
    marker: str
    pinned: str | None


@dataclass(frozen=True, slots=True)
class GroupStatus:
    group: str
    config: GroupConfig
    listened: float
    members: list[MemberRow]
    queues: list[QueueRow]
    overrides: list[Override]

    @property
    def dynamic(self) -> bool:
        return bool(self.members)

    def owner(self, queue: int) -> str | None:
        return self.queues[queue].serving

    def to_dict(self) -> dict[str, object]:
        return {
            "group": self.group,
            "config": orjson.loads(self.config.to_json()),
            "listened_seconds": self.listened,
            "dynamic": self.dynamic,
            "members": [dataclasses.asdict(m) for m in self.members],
            "queues": [dataclasses.asdict(q) for q in self.queues],
            "overrides": {str(o.queue): o.to for o in self.overrides},
        }

    def to_text(self) -> str:
        cfg = self.config
        lines = [
            f"group '{self.group}': HC {cfg.hash_count}, QC {cfg.queue_count}, "
            f"hash {cfg.hash_function}"
            + (f", generation {cfg.generation}" if cfg.generation else "")
        ]
        if self.members:
            lines.append(f"members ({len(self.members)} heard in {self.listened:g}s):")
            width = max(len(m.member) for m in self.members)
            for m in self.members:
                serves = " ".join(map(str, m.serves)) or "-"
                behind = (
                    f" (runs generation {m.generation})" if m.generation < cfg.generation else ""
                )
                lines.append(f"  {m.member:<{width}}  {m.state:<8} serves {serves}{behind}")
        else:
            lines.append(
                f"no dynamic members heard in {self.listened:g}s "
                "(static-mode clients, or none running); serving is the broker's active client"
            )
        rows = [("queue", "buckets", "backlog", "in-flight", "serving", "assigned", "")]
        for q in self.queues:
            serving = q.serving or "-"
            if q.broker_active and q.broker_active != q.serving and self.dynamic:
                serving += f" (broker: {q.broker_active})"
            note = q.marker + (" pinned" if q.pinned else "")
            rows.append(
                (
                    str(q.queue),
                    short_list(q.buckets),
                    str(q.backlog),
                    str(q.in_flight),
                    serving,
                    q.assigned or "-",
                    note.strip(),
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines.extend(
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
        )
        for o in self.overrides:
            lines.append(f"override: queue {o.queue} -> {o.to} (lbg move)")
        return "\n".join(lines)


def short_list(items: list[int], limit: int = 4) -> str:
    shown = ",".join(map(str, items[:limit]))
    return f"[{shown}{',...' if len(items) > limit else ''}]"


def group_status(
    group: str,
    config: GroupConfig,
    statuses: list[QueueStatus],
    heartbeats: Mapping[str, Heartbeat],
    book: OverrideBook,
    listened: float,
) -> GroupStatus:
    """Combine the heartbeats heard (latest per member, in arrival order) with the broker's
    queue status; the assignment is computed as every coordinator computes it."""
    members = [
        MemberRow(hb.member, hb.state.value, sorted(hb.owns), sorted(hb.wants), hb.generation)
        for hb in sorted(heartbeats.values(), key=lambda hb: hb.member)
    ]
    owners = {q: hb.member for hb in heartbeats.values() for q in hb.owns}
    active = sorted(m for m, hb in heartbeats.items() if hb.state is MemberState.ACTIVE)
    dynamic = bool(heartbeats)
    pins = book.active(active)
    assigned = assign_with_overrides(config.queue_count, active, owners, pins) if dynamic else {}
    rows = []
    for status in statuses:
        q = status.queue
        serving = owners.get(q) if dynamic else status.active_client
        marker = ""
        if dynamic:
            hb = heartbeats.get(serving) if serving else None
            if serving is None:
                # The broker pins a queue's consumer on delivery: an empty queue has none.
                marker = "unserved" if status.backlog or status.in_flight else "idle"
            elif hb is not None and hb.state is not MemberState.ACTIVE:
                marker = "draining"
            elif assigned.get(q) != serving:
                marker = "moving"
        rows.append(
            QueueRow(
                queue=q,
                buckets=status.buckets,
                backlog=status.backlog,
                in_flight=status.in_flight,
                serving=serving,
                broker_active=status.active_client,
                assigned=assigned.get(q),
                marker=marker,
                pinned=pins.get(q),
            )
        )
    overrides = [o for o in book.all() if o.queue < config.queue_count]
    return GroupStatus(group, config, listened, members, rows, overrides)


# ---------------------------------------------------------------------------------------------
# Listening to the control channel


@dataclass
class ControlListener:
    """Collects the group's heartbeats (latest per member) and overrides from the channel."""

    broker: Broker
    group: str
    sender: str = "lbg"
    heartbeats: dict[str, Heartbeat] = field(default_factory=dict)
    book: OverrideBook = field(default_factory=OverrideBook)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    _unsubscribe: Callable[[], object] | None = None

    def receive(self, body: bytes) -> None:
        try:
            control = decode_control(body)
            if control is None:
                heartbeat = Heartbeat.decode(body)
                self.heartbeats.pop(heartbeat.member, None)
                self.heartbeats[heartbeat.member] = heartbeat
            elif isinstance(control, Move):
                self.book.offer(control.override)
            elif isinstance(control, OverrideGossip):
                self.book.merge(control)
        except MalformedMessage:
            return
        self.changed.set()

    async def __aenter__(self) -> ControlListener:
        self._unsubscribe = await self.broker.subscribe_control(self.group, self.receive)
        await self.broker.publish_control(self.group, encode_probe(self.sender))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._unsubscribe is not None:
            with contextlib.suppress(Exception):
                await self._unsubscribe()  # type: ignore[misc]

    async def wait_change(self, timeout: float) -> None:
        self.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout)


async def read_status(broker: Broker, group: str, listen: float) -> GroupStatus:
    """Listen for `listen` seconds, then combine what was heard with the broker's status."""
    config = await broker.read_group(group)
    async with ControlListener(broker, group) as listener:
        await asyncio.sleep(listen)
        statuses = await broker.queue_status(group, config)
    return group_status(group, config, statuses, listener.heartbeats, listener.book, listen)


@dataclass(frozen=True, slots=True)
class Route:
    key: str
    bucket: int
    queue: int
    owner: str | None


def routes(status: GroupStatus, keys: Iterable[str]) -> list[Route]:
    """Bucket, queue and current owner of each key (MalformedMessage or HashKeyError on a key
    no publisher would send)."""
    result = []
    for key in keys:
        check_key(key)
        bucket = status.config.bucket_for_key(key)
        queue = status.config.queue_for_bucket(bucket)
        result.append(Route(key, bucket, queue, status.owner(queue)))
    return result


class MoveRefused(ValueError):
    """`lbg move` was asked for something it cannot do; the message says what."""


def check_move(status: GroupStatus, queue: int, member: str) -> None:
    """Refuse a queue out of range, an unknown member, or one that cannot take queues."""
    last = status.config.queue_count - 1
    if not 0 <= queue <= last:
        raise MoveRefused(f"queue {queue} is outside 0..{last} of group '{status.group}'")
    if not status.members:
        raise MoveRefused(
            f"no dynamic members heard in group '{status.group}' in {status.listened:g}s: "
            "a move needs dynamic-mode clients"
        )
    states = {m.member: m.state for m in status.members}
    if member not in states:
        heard = ", ".join(sorted(states))
        raise MoveRefused(f"unknown member '{member}' (heard: {heard})")
    if states[member] != MemberState.ACTIVE.value:
        raise MoveRefused(f"member '{member}' is {states[member]}: it cannot take a queue")


@dataclass(frozen=True, slots=True)
class MoveResult:
    """How a move went: `done` when `to` serves the queue (or, `idle`, stands ready for an
    empty queue nobody serves); `now` is who serves it at the end."""

    queue: int
    to: str
    was: str | None
    seconds: float
    done: bool
    idle: bool
    now: str | None

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def _owner(heartbeats: Mapping[str, Heartbeat], queue: int) -> str | None:
    """Who serves `queue` by the latest heartbeats (the latest claim wins)."""
    claims = [member for member, hb in heartbeats.items() if queue in hb.owns]
    return claims[-1] if claims else None


async def move_queue(
    broker: Broker,
    group: str,
    queue: int,
    member: str,
    listen: float,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
) -> MoveResult:
    """Pin `queue` to `member` and wait until its heartbeats say it serves the queue.

    Raises MoveRefused (before sending anything) for a bad queue or member. The move is
    repeated every second while waiting: a member that missed it applies it then (a repeat
    of the same version changes nothing for the others). The broker pins a consumer only when
    it delivers a message, so an empty queue counts as moved once nobody serves it and
    `member` stands ready for it.
    """
    config = await broker.read_group(group)
    async with ControlListener(broker, group) as listener:
        await asyncio.sleep(listen)
        statuses = await broker.queue_status(group, config)
        status = group_status(group, config, statuses, listener.heartbeats, listener.book, listen)
        check_move(status, queue, member)
        was = status.owner(queue)
        # Newer than any version heard, even if this host's clock is behind the last mover's.
        override = Override(queue, member, max(time.time(), listener.book.newest() + 0.001))
        started = clock()
        sent = checked = -math.inf
        idle_since: float | None = None
        while True:
            owner = _owner(listener.heartbeats, queue)
            target = listener.heartbeats.get(member)
            elapsed = clock() - started
            if sent > -math.inf and owner == member:
                return MoveResult(queue, member, was, elapsed, True, False, member)
            waiting = owner is None and target is not None and queue in target.wants
            if sent > -math.inf and waiting and clock() - checked >= IDLE_CHECK_SECONDS:
                checked = clock()
                now = (await broker.queue_status(group, config))[queue]
                if now.active_client or now.backlog or now.in_flight:
                    idle_since = None
                elif idle_since is None:
                    idle_since = checked
                else:
                    # Empty and unpinned at two checks with no claim between: really idle.
                    return MoveResult(queue, member, was, clock() - started, True, True, None)
            elif not waiting:
                idle_since = None
            if clock() - sent >= GOSSIP_SECONDS:
                await broker.publish_control(group, encode_move(override))
                sent = clock()
            elif elapsed >= timeout:
                return MoveResult(queue, member, was, elapsed, False, False, owner)
            await listener.wait_change(min(0.1, max(0.0, timeout - elapsed)))
