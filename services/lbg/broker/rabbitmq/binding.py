"""An exclusive queue on RabbitMQ: a single-active-consumer quorum queue, one channel per stint.

RabbitMQ delivers to the first registered consumer; the others wait in line. No signal says
a consumer became active: receiving a message is the signal. A registration lives on its own
channel, because closing the channel (not basic.cancel) is the order-safe way to give a
queue up: the broker puts the unacked messages back at the head, in order, for the next
consumer in line. So release, fence and stand-back all close the channel.

Steering: a preferred binding registers at once; the others register only while the queue
has no consumer at all, and step out of the line again while someone else is there, so a
released queue goes to its preferred client. A dynamic member keeps each queue's next owner
preferred (its standby, who gets the queue the moment its owner's connection drops); one no
longer preferred steps out of a held queue's line when its coordinator says so (step_out).

A client's bindings join and leave lines a few at a time (`line_gate`, shared): a burst of
hundreds of channel changes at a join delayed every heartbeat behind it.

Idle, a binding costs nothing per second: in the line and preferred, or active, its loop
sleeps until its channel closes (the channel's close callback) or it is told something; only
a standby that looks by itself wakes on a timer. A coordinated one counts the queue's
consumers every `coordinated_look_seconds` while out of the line, and leaves a line it is no
longer preferred in LINE_SETTLE_SECONDS after joining it (no count tells it whether someone
else waits there).

Acks are cumulative (basic.ack with `multiple`): the contiguous floor of finished deliveries,
one frame per turn of the event loop rather than one per event (see ackfloor.py).

On the first delivery of a stint the binding claims the queue's next ownership epoch (the
fencing token); the stint's deliveries are held back until the claim is in, and a claim that
fails gives the queue up, so no delivery goes out without its stint's epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from lbg.broker.ackfloor import FloorAcks
from lbg.broker.base import Delivery, StateListener, WaitListener, why
from lbg.broker.bindings import UNTIL_WOKEN, LoopBinding

log = logging.getLogger(__name__)

# Unacked deliveries per queue: enough for the queue's keys to run side by side (each key's
# events one after another, each waiting for its record's confirm), and no more, since every
# handover returns them to the broker and the next owner gets them again in one burst (at 200
# that burst delayed the new owner's epoch claim and heartbeats by tenths of a second).
PREFETCH = 32
# A coordinated standby that is not preferred counts the queue's consumers this seldom (not
# every poll): its coordinator makes another member preferred when one goes (at QC 256 x 8
# the counts were thousands of queue declarations a second) ...
COORDINATED_LOOK_SECONDS = 30.0
# ... and a client's coordinated standbys together count about this many times a second at
# most (every 30 s each, 7 members' standbys of QC 256 made 60 a second, 1.7 % of the broker).
COORDINATED_LOOKS_PER_SECOND = 1.0
# A coordinated standby no longer preferred leaves a line once it has stood in it this long
# (idle lines are left alone while the views of a mass start settle, about a second).
LINE_SETTLE_SECONDS = 2.0
# A client joins or leaves this many queues' lines at once at most (a channel each, opened
# with its prefetch and consumer, or closed): a joiner at QC 1024 stood in hundreds of lines
# at once, and its heartbeats waited behind that burst, in its event loop and at the broker,
# until it fenced itself; the members it took queues from did the same on a smaller scale.
LINE_CHANGES_AT_ONCE = 16


def coordinated_look_seconds(queue_count: int) -> float:
    """How seldom each coordinated standby of a group of `queue_count` queues counts its
    queue's consumers: a client's looks cost the broker the same at any queue count."""
    return max(COORDINATED_LOOK_SECONDS, queue_count / COORDINATED_LOOKS_PER_SECOND)


OpenChannel = Callable[[], Awaitable[AbstractChannel]]
CountConsumers = Callable[[str], Awaitable[int]]
# Records this consumer (its tag) as the queue's new owner; returns the ownership epoch.
ClaimEpoch = Callable[[str], Awaitable[int]]


@dataclass(eq=False)
class _Stint:
    """One registration in the queue's line: its channel and consumer tag."""

    channel: AbstractChannel
    tag: str
    since: float
    # Told to leave the line (step_out), and not gone yet.
    leaving: bool = False
    owner_epoch: int | None = None
    held: list[Delivery] = field(default_factory=list)
    claiming: asyncio.Task[None] | None = None


class RabbitQueueBinding(LoopBinding):
    """One client's consumer on one queue, active (receiving) or waiting in line."""

    # Closing the channel requeues the unacked deliveries in the order they were delivered
    # (tests/integration/test_rabbitmq_requeue_order.py).
    returns_unacked_in_order = True

    def __init__(
        self,
        queue: int,
        queue_name: str,
        tag_prefix: str,
        open_channel: OpenChannel,
        count_consumers: CountConsumers,
        exclusive: bool,
        poll_seconds: float,
        paused_for: Callable[[], float],
        stall_limit: float,
        preferred: bool = True,
        on_change: StateListener | None = None,
        claim: ClaimEpoch | None = None,
        look_seconds: float = COORDINATED_LOOK_SECONDS,
        line_gate: asyncio.Semaphore | None = None,
    ) -> None:
        super().__init__(queue, on_change, preferred)
        self._claim = claim
        self._name = queue_name
        self._tag_prefix = tag_prefix
        self._open_channel = open_channel
        self._count_consumers = count_consumers
        self._exclusive = exclusive
        self._poll = poll_seconds
        self._look_seconds = look_seconds
        self._line_gate = line_gate or asyncio.Semaphore(LINE_CHANGES_AT_ONCE)
        self._paused_for = paused_for
        self._stall_limit = stall_limit
        self._stint: _Stint | None = None
        self._acks: FloorAcks[AbstractIncomingMessage] = FloorAcks(
            queue, delivery_tag, ack_up_to, ack_one
        )
        self._stints = 0
        self._on_waiting: WaitListener | None = None
        self._coordinated = False
        self._next_look = 0.0
        self._start(f"consume-{queue_name}")

    @property
    def pin(self) -> str | None:
        return self._stint.tag if self._active and self._stint else None

    @property
    def waiting(self) -> bool:
        """Preferred and in the queue's line, or told to step out of it and not gone yet:
        either way the broker may hand it the queue next."""
        stint = self._stint
        return (
            stint is not None
            and bool(stint.tag)
            and not self._active
            and (self._preferred or stint.leaving)
        )

    def step_out(self) -> None:
        stint = self._stint
        if stint is not None and not self._preferred and not self._active:
            stint.leaving = True
            self._wake.set()

    def tell_when_waiting(self, listener: WaitListener) -> None:
        self._on_waiting = listener

    def set_coordinated(self) -> None:
        self._coordinated = True
        # Spread, so that a client's standbys bound together do not all count at once.
        self._next_look = time.monotonic() + random.uniform(0.5, 1.5) * self._look_seconds

    async def pinned_by(self, *, fresh: bool = False) -> str | None:
        """AMQP cannot tell who the active consumer is; the broker moves a crashed owner's
        queue itself (connection closed) and a stalled one's after the heartbeat timeout."""
        return None

    async def evict(self, pin: str) -> bool:
        return False

    def _stall(self) -> str | None:
        if self._paused_for() > self._stall_limit:
            return "this process was paused past the heartbeat timeout (stalled)"
        return None

    async def ack(self, delivery: Delivery) -> bool:
        if not self.owns(delivery):
            return False
        self._acks.finish(delivery.token)  # type: ignore[arg-type]
        return True

    async def _give_up(self, reason: str) -> None:
        self._lose(reason)
        await self._leave_line()

    def _lose(self, reason: str) -> None:
        """Stop owning the queue: nothing buffered is processed or acked; the channel goes
        (by the loop) so the broker hands the unacked messages to the next in line."""
        self._new_epoch()
        if self._stint is not None:
            self._stint.tag = ""
        self._set_active(False, reason)
        self._wake.set()

    async def _leave_line(self) -> None:
        """Close the stint's channel, acking its floor first: a lost stint's finished
        deliveries were processed while it owned the queue, and an ack on its own channel
        covers no other consumer's (the close would hand them to the next owner again)."""
        stint, self._stint = self._stint, None
        if stint is not None and not stint.channel.is_closed:
            await self._acks.flush(every_finished=True)
            with contextlib.suppress(Exception):
                async with self._line_gate:
                    await stint.channel.close()
            log.debug("queue %d: left the line (channel closed)", self.queue)

    async def _failed(self, exc: Exception) -> float:
        log.warning("queue %d: %s", self.queue, why(exc))
        await self._leave_line()
        await asyncio.sleep(self._poll)
        return 0.0

    async def _step(self) -> float:
        """Join the line, leave it, or stay, as the steering rules say; then wait for what can
        change that: only a standby out of the line or not preferred in it looks on a timer."""
        stint = self._stint
        if not self._running.is_set():
            if self._active:
                self._lose("stopped consuming")
            await self._leave_line()
            await self._running.wait()
            return self._poll
        if stint is not None and not stint.tag:
            await self._leave_line()
            return self._poll
        if stint is not None and stint.channel.is_closed:
            self._stint = None
            self._lose("channel closed by the broker")
            return self._poll
        if stint is None:
            if not (self._preferred or not self._exclusive or await self._nobody_there()):
                return self._until_look(None)
            await self._join_line()
        elif self._looks_by_itself() and await self._crowded(stint):
            told = stint.leaving
            await self._leave_line()
            if told and self._on_waiting is not None:  # the owner waited for it to step out
                self._on_waiting(self.queue)
            return self._poll
        if self._looks_by_itself():
            return self._until_look(self._stint)
        # Nothing to look at: a closed channel, a preference, a step out, a stop or a loss
        # wakes the loop (a poll per binding was QC x CC wake-ups every 0.25 s, issue 25).
        return UNTIL_WOKEN

    def _looks_by_itself(self) -> bool:
        """A standby not preferred on an exclusive queue: nothing tells it whether to join
        or leave the line, so it looks now and then."""
        return self._exclusive and not self._preferred and not self._active

    def _until_look(self, stint: _Stint | None) -> float:
        """The wait of a standby that looks by itself: a poll, or a coordinated one's wait
        until its next count (out of the line) or until it leaves the line (in it)."""
        if not self._coordinated:
            return self._poll
        due = self._next_look if stint is None else stint.since + LINE_SETTLE_SECONDS
        return max(due - time.monotonic(), self._poll)

    async def _crowded(self, stint: _Stint) -> bool:
        """Whether a standby not preferred should step out of the line: at once if its
        coordinator says so; a coordinated one once it has stood in line LINE_SETTLE_SECONDS,
        since its coordinator keeps another member preferred (left alone, the lines of idle
        queues kept 4-5 consumers, a channel each, per queue at QC 256 x 8 after a mass
        start); else once another consumer is there. (Left to the count, a standby stayed in
        line behind the queue's owner: a single-active-consumer quorum queue counts its active
        consumer only.)"""
        if stint.leaving:
            return True
        if self._coordinated:
            return time.monotonic() - stint.since >= LINE_SETTLE_SECONDS
        return time.monotonic() - stint.since > self._poll and await self._consumers() > 1

    async def _consumers(self) -> int:
        return await self._count_consumers(self._name)

    async def _nobody_there(self) -> bool:
        """Whether the queue has no consumer at all; a coordinated standby asks only every
        `coordinated_look_seconds` (False meanwhile)."""
        if self._coordinated and not self._look():
            return False
        return not await self._consumers()

    def _look(self) -> bool:
        """Whether a coordinated standby's next look is due (then the one after is set)."""
        now = time.monotonic()
        if now < self._next_look:
            return False
        self._next_look = now + self._look_seconds
        return True

    async def _join_line(self) -> None:
        async with self._line_gate:
            await self._register()

    async def _register(self) -> None:
        """Open the stint's channel and stand in the queue's line on it."""
        channel = await self._open_channel()
        channel.close_callbacks.add(self._wake_on_close)
        await channel.set_qos(prefetch_count=PREFETCH)
        self._stints += 1
        stint = _Stint(channel, f"{self._tag_prefix}.{self._stints}", time.monotonic())
        queue = await channel.get_queue(self._name, ensure=False)
        self._stint = stint
        self._acks.restart()
        epoch = self._epoch

        async def on_message(message: AbstractIncomingMessage) -> None:
            if self._stint is not stint or not stint.tag or self._epoch != epoch:
                return
            if not self._running.is_set():
                # Left unprocessed: the stint ends, so no later (cumulative) ack covers it.
                self._lose("stopped consuming")
                return
            if not self._active:
                self._set_active(True, "receiving: first in the queue's line")
                stint.claiming = asyncio.create_task(self._claim_for(stint, epoch))
            headers = {k: header_text(v) for k, v in (message.headers or {}).items()}
            delivery = Delivery(
                body=message.body,
                subject=message.routing_key or "",
                headers=headers,
                redelivered=bool(message.redelivered),
                epoch=self._epoch,
                token=message,
            )
            self._acks.delivered(message)
            if stint.owner_epoch is None:
                stint.held.append(delivery)
            else:
                delivery.owner_epoch = stint.owner_epoch
                self._buffer.put_nowait(delivery)

        await queue.consume(on_message, consumer_tag=stint.tag)
        if self.waiting and self._on_waiting is not None:
            self._on_waiting(self.queue)

    def _wake_on_close(self, *_: object) -> None:
        """A stint's channel closed (by the broker, a lost connection or this binding): the
        loop sees to it now, not at its next poll."""
        self._wake.set()

    async def _claim_for(self, stint: _Stint, epoch: int) -> None:
        """Claim the stint's ownership epoch, then release what it held back, tagged."""
        try:
            owner_epoch = await self._claim(stint.tag) if self._claim is not None else 0
        except Exception as exc:  # aiormq also raises a bare Exception on a closing connection
            if self._stint is stint and self._epoch == epoch:
                self._lose(f"cannot claim the ownership epoch: {why(exc)}")
            return
        if self._stint is not stint or self._epoch != epoch:
            return
        stint.owner_epoch = owner_epoch
        log.debug("queue %d: epoch %d claimed, %d held", self.queue, owner_epoch, len(stint.held))
        self._hand_out(stint.held, owner_epoch)


def header_text(value: object) -> str:
    """An AMQP header value as text (aio-pika gives bytes for long strings)."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def delivery_tag(message: AbstractIncomingMessage) -> int:
    """A delivery's place on its channel: `multiple` acks every tag up to the one sent."""
    return message.delivery_tag or 0


async def ack_up_to(message: AbstractIncomingMessage) -> None:
    """Acknowledge this delivery and every earlier one on its channel, in one frame."""
    await message.ack(multiple=True)


async def ack_one(message: AbstractIncomingMessage) -> None:
    """Acknowledge this delivery alone."""
    await message.ack()
