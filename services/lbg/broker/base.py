"""The one interface the daemons need from a broker; each broker implements it in its own module.

Correctness comes from the broker's exclusivity (one active consumer per queue); the client
only decides which queues it prefers. Every adapter must therefore report, per bound queue,
whether this consumer is the active one, and fence itself when it stops being so.
"""

from __future__ import annotations

import abc
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from lbg.broker.adapters import ADAPTERS
from lbg.broker.presence import MemberPresence
from lbg.model.destinations import Destination, EventAddress, OutputKind, parse_event_topic
from lbg.model.group import GroupConfig

log = logging.getLogger(__name__)


class BrokerError(Exception):
    """A broker operation failed; the message is one line fit for an operator."""


def why(exc: BaseException) -> str:
    """An exception's text, or its type's name when it has none (aiormq raises bare ones,
    whose text is empty: `exc or <its type>` printed nothing, as an exception is always true)."""
    return str(exc) or type(exc).__name__


class GroupExists(BrokerError):
    """Creating a group clashed with an existing object, named in the message."""


class GroupNotFound(BrokerError):
    """The group has no config in the broker's store."""


def needs_upgrade(group: str, missing: str) -> BrokerError:
    """The one-line refusal of a group made before ownership epochs: what it lacks and the
    command that adds it."""
    return BrokerError(
        f"group '{group}' has no {missing} (made before ownership epochs):"
        f" run `cg-admin upgrade {group}` once, with admin rights"
    )


class PublishError(BrokerError):
    """The broker did not confirm a publish: it must not count as sent."""


class UndeliverableEvent(BrokerError):
    """An event the broker cannot take as it is (its key, its body): retrying cannot help,
    so it is refused as bad input."""


def broker_trouble(exc: BaseException) -> bool:
    """A broker error that waiting can cure (no leader, no confirmation in time), as opposed
    to an event the broker refuses as it is: the broker's failure, not the event's."""
    return isinstance(exc, BrokerError) and not isinstance(exc, UndeliverableEvent)


class UndeliverableKey(UndeliverableEvent):
    """An event's key does not fit the broker's destinations (too long once encoded):
    retrying cannot help, so its events are refused as bad input."""


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """What an operator needs to see about one queue of a group."""

    queue: int
    name: str
    buckets: list[int]
    backlog: int
    in_flight: int
    active_client: str | None
    # Seconds since the oldest unprocessed (waiting or unacked) event was stored; None where
    # the broker cannot tell cheaply (RabbitMQ quorum queues, Solace): the autoscaler then
    # estimates it from how long the backlog has not been cleared.
    oldest_age: float | None = None


@dataclass(slots=True)
class Delivery:
    """One message handed to a consumer, tied to the ownership epoch it was delivered in:
    `epoch` names the binding's stint (local, unique in the process), `owner_epoch` is the
    queue's fencing token (stored in the broker, higher for every new owner; 0 where the
    broker keeps none)."""

    body: bytes
    subject: str
    headers: Mapping[str, str]
    redelivered: bool
    epoch: int
    token: object = field(repr=False, default=None)
    owner_epoch: int = 0


@dataclass(frozen=True, slots=True)
class OutputMessage:
    """A message read back from one of the group's output destinations."""

    kind: OutputKind
    body: bytes
    headers: Mapping[str, str]
    at: float | None = None  # epoch seconds the broker stored it (or it was sent), if known


@dataclass(frozen=True, slots=True)
class Resize:
    """What a run-time resize did: the group's config before and after it, and the last
    global position still read under the old size."""

    before: GroupConfig
    after: GroupConfig
    switch_position: int


StateListener = Callable[[int, bool], None]
# Told the queue whose binding started to wait for it (see QueueBinding.tell_when_waiting).
WaitListener = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class ParkedEvent:
    """One event in a group's parking lot: as it came (body, headers with the reason and
    attempts added) and its position in the lot (increasing in the order it was parked)."""

    body: bytes
    headers: Mapping[str, str]
    position: int


class ParkingLot(abc.ABC):
    """A group's parked keys: the registry (one record per key, read by every member that
    takes a queue over) and the lot (each parked key's events, durable, in order)."""

    @abc.abstractmethod
    async def records(self, current: bool = True) -> dict[str, bytes]:
        """Every key's registry record (see model/parking.py), by key: with `current`, every
        record confirmed before the call (a member taking a queue over); else possibly a
        moment old (a member's periodic look, where a broker makes `current` cost a write)."""

    @abc.abstractmethod
    async def put(self, key: str, record: bytes) -> None:
        """Store a key's record, confirmed before it returns (a member parks a key in the
        registry before it acks the poison event)."""

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Forget a key's record (it is unparked)."""

    @abc.abstractmethod
    async def append(self, key: str, body: bytes, headers: Mapping[str, str]) -> None:
        """Park one more event of `key` behind its others, confirmed before it returns."""

    @abc.abstractmethod
    async def events(self, key: str) -> list[ParkedEvent]:
        """The key's parked events in the order they were parked."""

    @abc.abstractmethod
    async def trim(self, key: str, through: int) -> None:
        """Drop the key's parked events up to and including position `through` (replayed
        or skipped); doing it twice does no harm."""


class QueueBinding(abc.ABC):
    """A consumer bound to one exclusive queue: active (receiving) or standby.

    One worker drives a binding: `next()`, handle, `ack()`, and `release()` between messages.
    """

    queue: int
    # A release gives every delivery not acked back to the broker, in its original order and
    # ahead of later ones: the worker may leave what it has not started to the next owner.
    returns_unacked_in_order: ClassVar[bool] = False
    # `waiting` stops only when the binding becomes active (its listener hears it) or is told
    # to (set_preferred, suspend), or in a resize: a coordinator may take a binding it found
    # waiting as still waiting for a while without reading it (client/steering.py). Not where
    # a lost connection or consumer ends the wait by itself.
    steady_waiting: ClassVar[bool] = False
    # `active` and `pin` change only as its state listener hears (it becomes active or stops
    # being so): a coordinator may take a binding it found active as still active, with the
    # same pin, for a while without reading it. Not where a computed condition (a stall)
    # ends the activity unheard.
    steady_active: ClassVar[bool] = False

    def active_known_until(self) -> float:
        """Until when (on time.monotonic) `active` and `pin` can change only as the state
        listener hears: forever where `steady_active`; else at no time, unless the binding
        knows when its computed condition could end the activity first (NATS: a stall)."""
        return math.inf if self.steady_active else -math.inf

    @property
    @abc.abstractmethod
    def active(self) -> bool:
        """True while the broker delivers this queue to this consumer."""

    @abc.abstractmethod
    async def next(self) -> Delivery:
        """Wait for the next message; only the active consumer receives any."""

    def ready(self) -> Delivery | None:
        """The next message if one is already here, without waiting (and without the timer a
        bounded wait costs per message); None if none is, or the binding cannot tell."""
        return None

    @abc.abstractmethod
    async def next_or_interrupted(self) -> Delivery | None:
        """Like `next()`, but None once `interrupt()` was called: a worker sleeps until a
        message or something else needs it, rather than waking on a timer to check."""

    @abc.abstractmethod
    def interrupt(self) -> None:
        """Make the pending (or the next) `next_or_interrupted()` return None."""

    @abc.abstractmethod
    def owns(self, delivery: Delivery) -> bool:
        """True if the delivery may still be processed: the binding has not lost the queue since."""

    @abc.abstractmethod
    async def ack(self, delivery: Delivery) -> bool:
        """Acknowledge a processed delivery; False (and nothing sent) if ownership was lost."""

    @property
    @abc.abstractmethod
    def pin(self) -> str | None:
        """The broker's token for this consumer's ownership, while it is the active one."""

    @property
    @abc.abstractmethod
    def waiting(self) -> bool:
        """True while this binding stands ready to take the queue the moment it is released:
        only a preferred binding that is not active waits (the coordinator reads no other)."""

    @abc.abstractmethod
    def set_preferred(self, preferred: bool) -> None:
        """Whether a released queue should go to this binding rather than another standby."""

    def step_out(self) -> None:
        """Someone else holds the queue and another member stands next in its line: a standby
        not preferred leaves the line now (where the broker gives a queue to whoever waits
        first). By default nothing: a standby that is not preferred does not wait."""
        return None

    def tell_when_waiting(self, listener: WaitListener) -> None:
        """Call `listener(queue)` whenever this binding starts to wait after a round trip to
        the broker (a registration in the queue's line), or stops once it stepped out of the
        line as told (`step_out`), so its coordinator says so at once: the queue's owner hands
        it over only once its next owner stands ready and, where the broker gives it to
        whoever waits first, nobody else waits. By default never: a binding that waits as
        soon as it is preferred is found waiting by the coordinator's own round."""
        return None

    def set_coordinated(self) -> None:
        """A coordinator keeps some live member preferred for every queue (dynamic
        membership): a standby that is not preferred may leave ownerless queues to it rather
        than look for them by itself (where looking costs the broker something)."""
        return None  # by default a standby looks as it would anyway

    @abc.abstractmethod
    def suspend(self, suspended: bool) -> None:
        """Stop (True) or resume (False) asking for messages at all, e.g. while stalled."""

    @abc.abstractmethod
    async def pinned_by(self, *, fresh: bool = False) -> str | None:
        """The broker's token of whoever is active on this queue now (None: nobody); `fresh`
        asks the broker even where what this client heard says the queue is free (its owner
        is suspected gone: a lost or late notice must not hide its token)."""

    @abc.abstractmethod
    async def evict(self, pin: str) -> bool:
        """Take the queue from a gone owner holding `pin` without waiting for the broker's
        timeout; True if the broker released it."""

    @abc.abstractmethod
    def fence(self, reason: str) -> None:
        """Stop owning the queue now: nothing delivered so far may be processed or acked."""

    @abc.abstractmethod
    async def release(self, standby_delay: float) -> None:
        """Hand the queue over: flush acks, give up being active, wait, then stand by again."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Unbind for good (after in-flight work was acked)."""


class Broker(MemberPresence, abc.ABC):
    """Everything the daemons need from a broker: the group store, publishing, consuming."""

    # True where a group's queue count can change at run time (resize_group); the clients of
    # such a group follow its config and add or retire queues as it changes.
    resizable: ClassVar[bool] = False
    # How many queues a client binds at once: one by one where binding shares a channel or
    # opens a connection per queue; more where a bind is a broker round trip on one
    # connection (a NATS client of QC 1024 took 20 s to bind its queues one by one).
    bind_concurrency: ClassVar[int] = 1
    # True where the broker itself gives a queue to the next consumer waiting in its line the
    # moment the owner's connection drops (RabbitMQ's single active consumer): a dynamic member
    # then keeps the queue's standby in line, and a crash needs no lease to lapse.
    line_takes_over: ClassVar[bool] = False
    # What separates the levels of an event's topic (`<HP>.<bucket>.<key>` on NATS).
    topic_separator: ClassVar[str] = "."
    # Where a broker whose users cg-admin does not manage keeps them (grant_publisher says so).
    publisher_users_hint: ClassVar[str] = "this broker's users are not managed by cg-admin"

    def event_address(self, subject: str) -> EventAddress:
        """The key (and bucket) of a delivered event, from its subject as the broker gave it;
        MalformedMessage, the dead-letter reason, if the subject carries no usable key."""
        return parse_event_topic(subject, self.topic_separator)

    def connected(self) -> bool:
        """Whether the connection to the broker is up now (readiness, /readyz); an adapter
        that cannot tell says True and relies on its operations failing."""
        return True

    @abc.abstractmethod
    async def close(self) -> None:
        """Flush pending work and disconnect."""

    @abc.abstractmethod
    async def create_group(
        self,
        name: str,
        config: GroupConfig,
        client_password: str | None = None,
        force: bool = False,
    ) -> None:
        """Provision queues, buckets and output destinations and store the config.

        Raises GroupExists naming the first clash; creates nothing in that case. Where the
        broker keeps users, the client identity (CU) gets access to this group only, and is
        created with `client_password` if it does not exist; an existing user that cg-admin
        did not make a CU is refused unless `force`.
        """

    async def grant_publisher(
        self,
        group: str,
        config: GroupConfig,
        user: str,
        password: str | None,
        force: bool = False,
    ) -> None:
        """Let `user` publish the group's events and summary and nothing else, creating it
        with `password` if it does not exist; an existing user that cg-admin did not make a
        publisher is refused unless `force`. Only brokers that keep users do this."""
        raise BrokerError(self.publisher_users_hint)

    async def revoke_publisher(self, group: str, config: GroupConfig, user: str) -> None:
        """Take back what grant_publisher gave `user` on this group."""
        raise BrokerError(self.publisher_users_hint)

    async def upgrade_group(self, name: str, config: GroupConfig) -> list[str]:
        """Add what a group made by an older release lacks (the store of its queues'
        ownership epochs, the client's rights on it) and name each thing added; idempotent.
        Clients refuse a group without it with needs_upgrade()."""
        return []

    async def resize_group(self, name: str, queue_count: int) -> Resize:
        """Give a running group `queue_count` queues, as its config's next generation (GN);
        only a `resizable` broker can."""
        resizable = [f"{a.name} groups ({a.schemes[0]}:// URLs)" for a in ADAPTERS if a.resizable]
        raise BrokerError(
            f"group '{name}': only {' or '.join(resizable)} can be resized at run "
            "time; on this broker a group's queues are fixed when it is created"
        )

    async def draining(self, name: str, config: GroupConfig) -> list[QueueStatus]:
        """The queues of older generations that a resize left draining (none by default)."""
        return []

    @abc.abstractmethod
    async def read_group(self, name: str) -> GroupConfig:
        """Read a group's config from the broker's store (the JNDI analogue)."""

    @abc.abstractmethod
    async def list_groups(self) -> dict[str, GroupConfig]:
        """All groups in the store, by name."""

    @abc.abstractmethod
    async def delete_group(self, name: str) -> None:
        """Remove that group's objects and config, and nothing else."""

    @abc.abstractmethod
    async def queue_status(self, name: str, config: GroupConfig) -> list[QueueStatus]:
        """Backlog, age of the oldest unprocessed event and active client of each queue."""

    @abc.abstractmethod
    async def publish(
        self, destination: Destination, body: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        """Publish persistently; return once the broker confirmed it, else raise PublishError."""

    @abc.abstractmethod
    async def bind(
        self,
        group: str,
        config: GroupConfig,
        queue: int,
        client_id: str,
        preferred: bool = True,
        on_change: StateListener | None = None,
    ) -> QueueBinding:
        """Bind this client to one of the group's queues, as active or standby consumer.

        When the queue is released, the broker should hand it to a `preferred` binding
        (a primary) rather than to any other standby.
        """

    @abc.abstractmethod
    async def publish_control(self, group: str, body: bytes) -> None:
        """Send a control message (membership heartbeat) to every member; best effort, fast."""

    @abc.abstractmethod
    async def subscribe_control(
        self, group: str, handler: Callable[[bytes], None]
    ) -> Callable[[], Awaitable[None]]:
        """Receive the group's control messages; returns a coroutine function that unsubscribes."""

    def parking(self, group: str) -> ParkingLot:
        """The group's parking lot and parked-key registry."""
        raise BrokerError(f"group '{group}': this broker keeps no parking lot")

    @abc.abstractmethod
    def read_output(self, group: str) -> AsyncIterator[OutputMessage]:
        """Every message on the group's output destinations from the start, then new ones."""
