"""One named in-process broker: its groups, queues, output destinations and control channel,
shared by every connection to `memory://<name>` in the process (the registry below).

It keeps the rules the daemons rely on, as the NATS adapter gets them from JetStream:
- one owner (pin) per queue; a queue nobody holds goes to a pulling preferred binding first,
  then to any pulling binding, in bind order; a release or close unpins at once;
- every new owner gets the queue's next ownership epoch (monotonic: the fencing token) and is
  handed the unacked messages first, in order (the rewind of a NATS takeover);
- a pin whose holder stopped pulling with it (it fenced itself, was suspended, its connection
  closed or was cut off) lapses `priority_timeout` later, unless a peer evicts it first;
- an ack counts only within the owner's stint that received the delivery;
- control messages reach every reachable subscriber of the group, the sender included.
It does not keep: persistence, ack timeouts or delivery limits, flow control, users and
permissions, run-time resizing; and a binding does not fence itself when the broker goes
silent (the NATS binding's stall check): in dynamic mode the member's lease does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from lbg.broker.base import (
    BrokerError,
    GroupExists,
    GroupNotFound,
    OutputMessage,
    PublishError,
    QueueStatus,
)
from lbg.broker.memory.parking import ParkedState
from lbg.model.destinations import SYSTEM_PREFIX, Destination, OutputKind, level_token
from lbg.model.group import GroupConfig

log = logging.getLogger(__name__)

ControlHandler = Callable[[bytes], None]


class Puller(Protocol):
    """What a queue needs of a binding: who it is, whether it pulls (and with which pin)."""

    client: str
    preferred: bool

    def pulling(self) -> bool:
        """True while it asks for messages at all."""

    def holds(self, pin: str) -> bool:
        """True while it pulls with `pin`."""

    def pinned(self, pin: str, epoch: int) -> None:
        """The queue is now its, under `pin` and ownership epoch `epoch`."""

    def unpinned(self, reason: str) -> None:
        """The broker took the queue from it (its next pull would be refused)."""

    def wake(self) -> None:
        """Something it may be waiting for changed."""


@dataclass(slots=True)
class StoredEvent:
    """An event in a queue until acked, with how often it was handed out and when it came."""

    seq: int
    subject: str
    body: bytes
    headers: dict[str, str]
    deliveries: int = 0
    stored_at: float = field(default_factory=time.time)


class QueueState:
    """One exclusive queue: its unacked events in order, the next to hand out, its owner."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pending: dict[int, StoredEvent] = {}
        self.cursor: deque[int] = deque()
        self.bindings: list[Puller] = []
        self.owner: Puller | None = None
        self.pin: str | None = None
        self.epoch = 0

    def append(self, event: StoredEvent) -> None:
        """Queue a published event behind the others and wake the owner."""
        self.pending[event.seq] = event
        self.cursor.append(event.seq)
        if self.owner is not None:
            self.owner.wake()

    def take(self, puller: Puller) -> StoredEvent | None:
        """The next event for the owner pulling with its pin; None for anyone else."""
        if self.owner is not puller or self.pin is None or not puller.holds(self.pin):
            return None
        if not self.cursor:
            return None
        event = self.pending[self.cursor.popleft()]
        event.deliveries += 1
        return event

    def ack(self, seq: int, epoch: int) -> None:
        """Drop an acked event, if the ack comes from the stint that is still the owner's."""
        if epoch == self.epoch and self.pin is not None:
            self.pending.pop(seq, None)

    def hand_over(self, last: Puller | None = None) -> None:
        """Pin a queue nobody holds to the first pulling preferred binding, else to the first
        pulling one (`last`, the owner just unpinned, only if nobody else pulls: the others'
        pulls were waiting already); the new owner gets the next epoch and the unacked events
        first."""
        if self.owner is not None:
            return
        pulling = [b for b in self.bindings if b.pulling() and b is not last]
        if not pulling and last is not None and last.pulling():
            pulling = [last]
        chosen = next((b for b in pulling if b.preferred), pulling[0] if pulling else None)
        if chosen is None:
            return
        self.epoch += 1
        self.owner = chosen
        self.pin = f"{chosen.client}/{self.name}/{self.epoch}"
        self.cursor = deque(self.pending)
        chosen.pinned(self.pin, self.epoch)

    def unpin(self, reason: str) -> None:
        """Take the queue from its owner now and hand it to the next."""
        owner, self.owner, self.pin = self.owner, None, None
        if owner is not None:
            owner.unpinned(reason)
        self.hand_over(owner)

    def stopped_pulling(self, puller: Puller, timeout: float) -> None:
        """The owner stopped pulling with its pin: the pin lapses `timeout` later unless it
        pulls with it again (a healed partition) or it is gone already."""
        if self.owner is not puller or self.pin is None:
            return
        pin = self.pin
        asyncio.get_running_loop().call_later(timeout, self._lapse, pin)

    def _lapse(self, pin: str) -> None:
        """The priority timeout passed: unpin if the owner still does not pull with `pin`."""
        if self.pin == pin and self.owner is not None and not self.owner.holds(pin):
            log.info("queue %s: pin %s lapsed (priority timeout)", self.name, pin)
            self.unpin("priority timeout")

    def status(self, queue: int, buckets: list[int]) -> QueueStatus:
        """Backlog (not handed out yet), in flight (handed out, unacked), the owner and the
        age of the oldest unacked event."""
        in_flight = len(self.pending) - len(self.cursor)
        client = self.owner.client if self.owner is not None else None
        oldest = next(iter(self.pending.values()), None)
        age = None if oldest is None else time.time() - oldest.stored_at
        return QueueStatus(queue, self.name, buckets, len(self.cursor), in_flight, client, age)


@dataclass(eq=False)
class Connection:
    """One client's connection: closed when its process ends, cut off in a partition."""

    store: MemoryStore
    client: str
    priority_timeout: float
    alive: bool = True
    cut: bool = False
    deaf: bool = False
    bindings: list[BindingHandle] = field(default_factory=list)
    subscriptions: list[tuple[str, ControlHandler]] = field(default_factory=list)
    # (group, member) pairs this connection answers presence probes for.
    presence: set[tuple[str, str]] = field(default_factory=set)

    @property
    def reachable(self) -> bool:
        """True while the broker hears this connection (open, not cut off)."""
        return self.alive and not self.cut

    def check(self) -> None:
        """Fail a request the broker cannot answer: closed, or cut off."""
        if not self.alive:
            raise BrokerError(f"memory://{self.store.name}: connection closed")
        if self.cut:
            raise BrokerError(f"memory://{self.store.name}: cut off from the broker")

    def close(self) -> None:
        """The connection goes (process exit): its pins lapse after the priority timeout."""
        self.alive = False
        self.subscriptions.clear()
        self.presence.clear()
        for binding in self.bindings:
            binding.state.stopped_pulling(binding, self.priority_timeout)


class BindingHandle(Puller, Protocol):
    """A binding as its connection sees it: its queue, and how it learns of a healed cut."""

    state: QueueState

    def resync(self) -> None:
        """The connection is back: learn whether the broker took the queue meanwhile."""


class MemoryStore:
    """The broker's state; fault injection (`partition`, `kill`) acts on a client's connections."""

    def __init__(self, name: str, priority_timeout: float | None = None) -> None:
        self.name = name
        self.priority_timeout = priority_timeout
        self.groups: dict[str, GroupConfig] = {}
        self.queues: dict[str, list[QueueState]] = {}
        self.outputs: dict[str, list[OutputMessage]] = {}
        self.parked: dict[str, ParkedState] = {}
        self.connections: list[Connection] = []
        self._readers: set[asyncio.Event] = set()
        self._seq = 0

    def connect(self, client: str, priority_timeout: float) -> Connection:
        """A new connection of `client`; the store's own priority timeout wins if it has one."""
        timeout = self.priority_timeout if self.priority_timeout is not None else priority_timeout
        connection = Connection(self, client, timeout)
        self.connections.append(connection)
        return connection

    def partition(self, client: str, cut: bool = True) -> None:
        """Cut a client's connections off from the broker (True) or heal them (False)."""
        for connection in self._of(client):
            connection.cut = cut
            for binding in connection.bindings:
                if cut:
                    binding.state.stopped_pulling(binding, connection.priority_timeout)
                else:
                    binding.resync()
                    binding.state.hand_over()

    def deafen(self, client: str, deaf: bool = True) -> None:
        """Let a client's control subscriptions hear nothing (a lost or lagging subscription:
        its own heartbeats stop coming back) while its requests still work."""
        for connection in self._of(client):
            connection.deaf = deaf

    def kill(self, client: str) -> None:
        """Close a client's connections as a crash would, without unpinning anything."""
        for connection in self._of(client):
            connection.close()

    def _of(self, client: str) -> list[Connection]:
        return [c for c in self.connections if c.client == client and c.alive]

    def create_group(self, name: str, config: GroupConfig) -> None:
        """Store the config and make its queues and outputs; refuse a clash as NATS does."""
        if name in self.groups:
            raise GroupExists(f"group '{name}' exists")
        for other, existing in self.groups.items():
            if existing.hash_prefix == config.hash_prefix:
                raise GroupExists(f"HP '{config.hash_prefix}' is group '{other}'s")
        self.groups[name] = config
        self.queues[name] = [QueueState(f"{name}.q{q}") for q in range(config.queue_count)]
        self.outputs[name] = []
        self.parked[name] = ParkedState()

    def read_group(self, name: str) -> GroupConfig:
        """The group's config; GroupNotFound if there is none."""
        if name not in self.groups:
            raise GroupNotFound(f"group '{name}' not found on memory://{self.name}")
        return self.groups[name]

    def delete_group(self, name: str) -> None:
        """Forget the group's config, queues and outputs."""
        self.read_group(name)
        del self.groups[name], self.queues[name], self.outputs[name], self.parked[name]

    def queue(self, group: str, queue: int) -> QueueState:
        """One queue of a group, checked to exist."""
        config = self.read_group(group)
        if not 0 <= queue < config.queue_count:
            raise BrokerError(f"group '{group}' has no queue {queue}")
        return self.queues[group][queue]

    def queue_status(self, name: str) -> list[QueueStatus]:
        """Every queue's status, in queue order."""
        config = self.read_group(name)
        return [
            state.status(q, config.buckets_for_queue(q))
            for q, state in enumerate(self.queues[name])
        ]

    def publish(self, destination: Destination, body: bytes, headers: dict[str, str]) -> None:
        """Store an output message, or route an event to its queue by bucket."""
        levels = destination.levels
        if levels[0] == SYSTEM_PREFIX:
            self._publish_output(levels, body, headers)
            return
        bucket = int(levels[1]) if len(levels) > 2 and levels[1].isdigit() else -1
        targets = [
            (name, config)
            for name, config in self.groups.items()
            if config.hash_prefix == levels[0] and 0 <= bucket < config.hash_count
        ]
        if not targets:
            raise PublishError(f"no group takes events published to {destination}")
        subject = ".".join(level_token(level) for level in levels)
        for name, config in targets:
            self._seq += 1
            event = StoredEvent(self._seq, subject, body, dict(headers))
            self.queues[name][config.queue_for_bucket(bucket)].append(event)

    def _publish_output(
        self, levels: tuple[str, ...], body: bytes, headers: dict[str, str]
    ) -> None:
        kinds = {kind.value: kind for kind in OutputKind}
        if len(levels) != 3 or levels[1] not in self.outputs or levels[2] not in kinds:
            raise PublishError(f"no output destination {'/'.join(levels)}")
        message = OutputMessage(kinds[levels[2]], body, dict(headers), time.time())
        self.outputs[levels[1]].append(message)
        for reader in self._readers:
            reader.set()

    def add_reader(self, wake: asyncio.Event) -> None:
        """Set `wake` whenever an output message is stored (read_output waits on it)."""
        self._readers.add(wake)

    def remove_reader(self, wake: asyncio.Event) -> None:
        """Stop waking a reader that is gone."""
        self._readers.discard(wake)

    def publish_control(self, connection: Connection, group: str, body: bytes) -> None:
        """Relay a control message to every reachable subscriber at once; a cut-off sender's
        is lost (it only reached its send buffer)."""
        if not connection.reachable:
            return
        for other in self.connections:
            if not other.reachable or other.deaf:
                continue
            for subscribed, handler in list(other.subscriptions):
                if subscribed != group:
                    continue
                try:
                    handler(body)
                except Exception:
                    log.exception("control handler of %s failed", other.client)

    def probe(self, connection: Connection, group: str, member: str) -> bool | None:
        """What a presence probe tells: True when no open connection answers for the member
        (control messages are relayed at once, so every one it sent was heard first), False
        when one that hears the broker does, None when it is cut off or deaf (no answer)."""
        connection.check()
        holders = [c for c in self.connections if c.alive and (group, member) in c.presence]
        if not holders:
            return True
        return False if any(c.reachable and not c.deaf for c in holders) else None


_STORES: dict[str, MemoryStore] = {}


def memory_store(name: str, priority_timeout: float | None = None) -> MemoryStore:
    """The in-process broker called `name`, created on first use; `priority_timeout` (when
    given at creation) overrides what connections ask for, so tests can keep it short."""
    store = _STORES.get(name)
    if store is None:
        store = _STORES[name] = MemoryStore(name, priority_timeout)
    return store


def reset_memory_brokers() -> None:
    """Forget every in-process broker, so the next connection finds an empty one."""
    _STORES.clear()
