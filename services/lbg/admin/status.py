"""What the operator commands see (`lbg status`, `lbg route`): the members heard on the
group's control channel combined with the broker's queue status."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import orjson

from lbg.broker.base import Broker, QueueStatus
from lbg.model.control import (
    Heartbeat,
    MemberState,
    Move,
    Override,
    OverrideGossip,
    decode_control,
    encode_probe,
)
from lbg.model.group import GroupConfig
from lbg.model.messages import MalformedMessage, check_key
from lbg.model.overrides import OverrideBook, assign_with_overrides
from lbg.settings import (
    BrokerSettings,
    ClientSettings,
    GroupSettings,
    LoggingSettings,
    MetricsSettings,
    PublisherSettings,
    ValidatorSettings,
    client_timing,
)


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    """What the operator commands read from --config: any daemon's config file will do (only
    [broker], [group] name and [client] heartbeat_interval are used; the other sections are
    checked and ignored)."""

    broker: BrokerSettings = dataclasses.field(default_factory=BrokerSettings)
    group: GroupSettings = dataclasses.field(default_factory=GroupSettings)
    client: ClientSettings = dataclasses.field(default_factory=ClientSettings)
    publisher: PublisherSettings = dataclasses.field(default_factory=PublisherSettings)
    validator: ValidatorSettings = dataclasses.field(default_factory=ValidatorSettings)
    metrics: MetricsSettings = dataclasses.field(default_factory=MetricsSettings)
    logging: LoggingSettings = dataclasses.field(default_factory=LoggingSettings)

    def validate(self) -> None:
        client_timing(self.client, self.broker)

    @property
    def heartbeat_interval(self) -> float:
        """How often the group's members beat: this config's, else its broker's default."""
        return client_timing(self.client, self.broker).interval


@dataclass(frozen=True, slots=True)
class MemberRow:
    member: str
    state: str
    serves: list[int]
    wants: list[int]
    generation: int = 0
    lease: tuple[float, float] | None = None  # (lease, margin) as it announces them


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
    # An older generation's queues still draining after a resize (broker.draining).
    draining: list[QueueStatus] = dataclasses.field(default_factory=list)

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
            "draining": [
                {
                    "name": d.name,
                    "buckets": d.buckets,
                    "backlog": d.backlog,
                    "in_flight": d.in_flight,
                }
                for d in self.draining
            ],
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
            mixed = len({m.lease for m in self.members}) > 1  # a rolling change of the lease
            for m in self.members:
                serves = " ".join(map(str, m.serves)) or "-"
                behind = (
                    f" (runs generation {m.generation})" if m.generation < cfg.generation else ""
                )
                lease = f" ({lease_text(m.lease)})" if mixed else ""
                lines.append(f"  {m.member:<{width}}  {m.state:<8} serves {serves}{behind}{lease}")
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
        for d in self.draining:
            lines.append(
                f"draining: {d.name}: buckets {short_list(d.buckets)}, backlog {d.backlog},"
                f" in flight {d.in_flight}"
            )
        return "\n".join(lines)


def lease_text(terms: tuple[float, float] | None) -> str:
    """A member's lease as `lbg status` shows it when the members' leases differ."""
    if terms is None:
        return "lease not announced: an older build"
    return f"lease {terms[0]:g}s, margin {terms[1]:g}s"


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
        MemberRow(
            hb.member,
            hb.state.value,
            sorted(hb.owns),
            sorted(hb.wants),
            hb.generation,
            (hb.terms.lease, hb.terms.margin) if hb.terms else None,
        )
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
                before = self.heartbeats.pop(heartbeat.member, None)
                self.heartbeats[heartbeat.member] = heartbeat.filled_from(before)
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
        draining = await broker.draining(group, config)
    status = group_status(group, config, statuses, listener.heartbeats, listener.book, listen)
    return dataclasses.replace(status, draining=draining)


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
