"""The one interface the daemons need from a broker; each broker implements it in its own module.

Correctness comes from the broker's exclusivity (one active consumer per queue); the client
only decides which queues it prefers. Every adapter must therefore report, per bound queue,
whether this consumer is the active one, and fence itself when it stops being so.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from lbg.broker.adapters import ADAPTERS
from lbg.model.destinations import Destination, EventAddress, OutputKind, parse_event_topic
from lbg.model.group import GroupConfig

log = logging.getLogger(__name__)


class BrokerError(Exception):
    """A broker operation failed; the message is one line fit for an operator."""


class GroupExists(BrokerError):
    """Creating a group clashed with an existing object, named in the message."""


class GroupNotFound(BrokerError):
    """The group has no config in the broker's store."""


class PublishError(BrokerError):
    """The broker did not confirm a publish: it must not count as sent."""


class UndeliverableEvent(BrokerError):
    """An event the broker cannot take as it is (its key, its body): retrying cannot help,
    so it is refused as bad input."""


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


@dataclass(slots=True)
class Delivery:
    """One message handed to a consumer, tied to the ownership epoch it was delivered in:
    `epoch` counts this binding's stints (local), `owner_epoch` is the queue's fencing token
    (stored in the broker, higher for every new owner; 0 where the broker keeps none)."""

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


class QueueBinding(abc.ABC):
    """A consumer bound to one exclusive queue: active (receiving) or standby.

    One worker drives a binding: `next()`, handle, `ack()`, and `release()` between messages.
    """

    queue: int

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
        """True while this binding stands ready to take the queue the moment it is released."""

    @abc.abstractmethod
    def set_preferred(self, preferred: bool) -> None:
        """Whether a released queue should go to this binding rather than another standby."""

    @abc.abstractmethod
    def suspend(self, suspended: bool) -> None:
        """Stop (True) or resume (False) asking for messages at all, e.g. while stalled."""

    @abc.abstractmethod
    async def pinned_by(self) -> str | None:
        """The broker's token of whoever is active on this queue now (None: nobody)."""

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


class EpochBinding(QueueBinding):
    """What every adapter's binding shares: deliveries are buffered with the ownership epoch
    they arrived in (losing the queue bumps the epoch, so nothing older is handed out), and
    changes of the active state are logged and reported to the listener."""

    def __init__(self, queue: int, on_change: StateListener | None) -> None:
        self.queue = queue
        self._on_change = on_change
        self._buffer: asyncio.Queue[Delivery] = asyncio.Queue()
        self._epoch = 0
        self._active = False

    async def next(self) -> Delivery:
        while True:
            delivery = await self._buffer.get()
            if delivery.epoch == self._epoch:
                return delivery

    def ready(self) -> Delivery | None:
        while not self._buffer.empty():
            delivery = self._buffer.get_nowait()
            if delivery.epoch == self._epoch:
                return delivery
        return None

    def _new_epoch(self) -> None:
        """Forget what was delivered so far: it may no longer be processed or acked."""
        self._epoch += 1
        while not self._buffer.empty():
            self._buffer.get_nowait()

    def _set_active(self, active: bool, reason: str) -> None:
        if active == self._active:
            return
        self._active = active
        log.info("queue %d: %s (%s)", self.queue, "active" if active else "standby", reason)
        if self._on_change is not None:
            self._on_change(self.queue, active)


class Broker(abc.ABC):
    """Everything the daemons need from a broker: the group store, publishing, consuming."""

    # True where a group's queue count can change at run time (resize_group); the clients of
    # such a group follow its config and add or retire queues as it changes.
    resizable: ClassVar[bool] = False
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
        """Backlog and active client of each queue of the group."""

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

    @abc.abstractmethod
    def read_output(self, group: str) -> AsyncIterator[OutputMessage]:
        """Every message on the group's output destinations from the start, then new ones."""
