"""An exclusive queue on NATS JetStream: a durable pull consumer with a pinned_client group.

The server delivers to one pinned pull at a time. This binding keeps a pull open at all
times (so an idle or busy owner keeps its pin), RESETs the consumer when it becomes the
owner (so the previous owner's unacked messages come first, in order), claims the queue's
next ownership epoch (the fencing token its deliveries carry), and fences itself on a 423
or when the server has not answered a pull sent within most of `priority_timeout` (a stalled
or cut-off owner: a pull only buffered by the client proves nothing, as the server unpins
`priority_timeout` after the last pull it received). On a consumer with AckPolicy all (the
exclusive ones lbg creates) it acks the contiguous floor of finished deliveries, one ack per
turn of the event loop rather than one per event (see ackfloor.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from lbg.aio import until_next
from lbg.broker.ackfloor import FloorAcks
from lbg.broker.base import Delivery, StateListener
from lbg.broker.bindings import UNTIL_WOKEN, LoopBinding
from lbg.broker.nats import jsapi
from lbg.broker.nats.acksubject import consumer_sequence, delivery_count, stream_sequence
from lbg.broker.nats.direct import subscribe_direct
from lbg.broker.nats.generations import is_end

log = logging.getLogger(__name__)

PRIORITY_GROUP = "lbg"
PIN_HEADER = "Nats-Pin-Id"
FENCE_FRACTION = 0.8
PULL_BATCH = 200
# A standby woken by UNPINNED advisories still looks this many priority timeouts after its
# last look, in case an advisory was lost (core NATS delivers them at most once); a waiting
# one's pull lasts as long (it keeps no pin: the server starts a pin's timeout when it
# assigns the pin, so only an owner must pull every priority_timeout/3).
ADVISED_LOOK_TIMEOUTS = 5
# A coordinated standby (set_coordinated) that is not preferred looks after an advisory, else
# only when the stream's shared look (unpins.PinWatch, one listing of every consumer this
# many priority timeouts) finds its consumer free: its coordinator makes another member
# preferred when one goes (at QC 256 x 8, looks every 5 timeouts were 179 requests/s; each
# standby looking for itself every 30 timeouts, a third of an idle client's CPU at QC 1024).
# A coordinated waiting one's pull lasts as long, and it looks for orphaned deliveries as
# rarely unless advised (a lost advisory: the ack wait redelivers them meanwhile); after a
# reconnect it pulls and looks again at once (the server may have lost the pull).
COORDINATED_LOOK_TIMEOUTS = 30
# A coordinated owner that was sent nothing for this many priority timeouts, and acked all it
# was sent, hands its pin back and waits with one long pull as its queue's preferred standby,
# which the server pins again with the next event: else it pulls every third of a priority
# timeout per queue, for ever, to keep a pin it does not use (a quiet group that had served
# traffic, QC 1024 x 4: a third of its members' idle CPU, and most of the server's).
QUIET_TIMEOUTS = 15

# Records this client as the queue's owner under `pin`; returns the new ownership epoch.
ClaimEpoch = Callable[[str], Awaitable[int]]
# The stream sequence of the marker that ended this consumer's generation, if one did.
FindEnd = Callable[[], Awaitable[int | None]]


@dataclass(eq=False)
class _Pull:
    """One outstanding pull request; `ended` once the server said it is done with it (no
    more messages can come for it)."""

    done: asyncio.Event = field(default_factory=asyncio.Event)
    remaining: int = 0
    takeover_pin: str | None = None
    pinned_at: float = 0.0
    sent: float = 0.0
    ended: bool = False


class NatsQueueBinding(LoopBinding):
    """One client's binding to one queue (durable consumer); exclusive when `pinned`."""

    def __init__(
        self,
        nc: Client,
        stream: str,
        consumer: str,
        queue: int,
        pinned: bool,
        priority_timeout: float,
        preferred: bool = True,
        on_change: StateListener | None = None,
        claim: ClaimEpoch | None = None,
        ack_all: bool = False,
        advised: bool = False,
        ends: tuple[str, int, FindEnd] | None = None,
    ) -> None:
        super().__init__(queue, on_change, preferred)
        self._advised = advised
        # Where the group can be resized: the marker subject, this consumer's generation, and
        # how to find its end marker when taking over (a former owner may have acked it).
        self._ends = ends
        self.end: int | None = None
        self._ack_all = ack_all
        self._acks = FloorAcks(queue, stream_sequence, self._send_ack)
        self._last_delivery: int | None = None
        self._quiet_since = (time.monotonic(), self._last_delivery)
        self._unpin_after_pull: str | None = None
        self._claim = claim
        self._owner_epoch = 0
        self._nc = nc
        self._stream = stream
        self._consumer = consumer
        self._pinned = pinned
        self._timeout = priority_timeout
        self._expires = priority_timeout / 3
        self._pin: str | None = None
        self._active = not pinned
        self._last_pull = time.monotonic()
        self._pull = _Pull()
        self._inbox: Subscription | None = None
        self._rewind_due = False
        self._looked = -math.inf  # the first empty pull looks for orphans
        self._lookers: set[asyncio.Task[None]] = set()
        self._coordinated = False
        self._look_due = False  # a coordinated standby in the background looks next round
        # When the server was last known to hold no pin here (an answer or an UNPINNED
        # advisory, with no PINNED advisory since); None: unknown or pinned. Kept only where
        # this connection hears both advisories (`hear_pins`).
        self._free_since: float | None = None
        self._pins_heard = False
        self._pinnings = 0  # PINNED advisories heard: an answer asked before one is stale
        self._start(f"pull-{consumer}")

    @property
    def active(self) -> bool:
        return self._active and not self._stalled()

    @property
    def pin(self) -> str | None:
        return self._pin if self._active else None

    @property
    def waiting(self) -> bool:
        return self._pinned and self._preferred and not self._active and self._running.is_set()

    def reconnected(self) -> None:
        """The connection came back: a waiting standby's long pull may have been lost with
        the server's state, and an advisory missed: it pulls and looks again now (an owner's
        pulls are short, and must not be cut: what they bring is the queue's order)."""
        self._free_since = None  # an advisory may have been missed meanwhile
        if self.waiting:
            self._abort_pull()
            self.unpinned()

    def hear_pins(self) -> None:
        """This connection hears the consumer's PINNED and UNPINNED advisories from now on: a
        queue the server last said has no pin is taken as free without asking (pinned_by)."""
        self._pins_heard = True

    def pinned(self) -> None:
        """The server gave the queue's pin to someone: the next pinned_by asks who."""
        self._pinnings += 1
        self._free_since = None

    def unpinned(self) -> None:
        """The server says the queue lost its pin: a standby in the background looks now, a
        waiting one looks for the deliveries the last owner left unacked (now, while its
        pull stays open, else with its next pull)."""
        self._looked = -math.inf
        if self._pins_heard:
            self._free_since = time.monotonic()
        self.look_soon()
        if self.waiting and not self._pull.done.is_set():
            looker = asyncio.create_task(self._look_now())
            self._lookers.add(looker)
            looker.add_done_callback(self._lookers.discard)

    async def _look_now(self) -> None:
        try:
            if self.waiting and self._orphans_possible():
                await self._rewind_orphans()
        except Exception as exc:  # the next pull looks again
            self._looked = -math.inf
            log.warning("queue %d: no look for orphaned deliveries: %s", self.queue, exc)

    def look_soon(self) -> None:
        """The queue may be free: a standby in the background looks now (an advisory, or the
        stream's shared look found no pin and no waiting pull)."""
        self._look_due = True
        self._wake.set()

    @property
    def consumer(self) -> str:
        return self._consumer

    @property
    def look_period(self) -> float | None:
        """How often the stream's shared look should find out whether this binding's queue is
        free: None unless it is a coordinated standby in the background, which does not look
        for itself."""
        if (
            self._coordinated
            and self._pinned
            and not (self._preferred or self._active or self._closed)
        ):
            return self._timeout * COORDINATED_LOOK_TIMEOUTS
        return None

    def set_coordinated(self) -> None:
        self._coordinated = True

    def set_preferred(self, preferred: bool) -> None:
        """A demoted standby ends its waiting pull now (it lasts several priority timeouts),
        so that the queue's new preferred client wins the next pin."""
        if preferred == self._preferred:
            return
        waiting = self.waiting
        super().set_preferred(preferred)
        if waiting and not self.waiting:
            self._abort_pull()

    async def evict(self, pin: str) -> bool:
        if not self._pinned or not await self._unpin_while_held(pin):
            return False
        log.info("queue %d: evicted gone owner %s", self.queue, pin)
        return True

    async def pinned_by(self, *, fresh: bool = False) -> str | None:
        """The pin id the broker holds for this queue now, whoever owns it. None without asking
        while the advisories say the queue has no pin (an idle member's coordinator asks about
        every queue it waits for), unless that was last checked as long ago as a waiting
        standby goes without looking by itself, or the caller wants it `fresh`: a lost or
        reordered PINNED advisory would otherwise hide a gone owner's pin until the server's
        priority timeout (core NATS delivers advisories at most once, each kind on its own
        subscription)."""
        since = self._free_since
        if not fresh and since is not None and time.monotonic() - since < self._advised_look():
            return None
        pinnings, asked = self._pinnings, time.monotonic()
        pin = await self._ask_pin()
        if self._pins_heard and pin is None and pinnings == self._pinnings:
            self._free_since = asked
        return pin

    async def _ask_pin(self) -> str | None:
        """The pin id the broker holds for this queue now, asked of it."""
        info = await jsapi.consumer_info(self._nc, self._stream, self._consumer)
        pins = [g.get("pinned_client_id") for g in info.get("priority_groups") or []]
        return next((p for p in pins if p), None)

    def active_known_until(self) -> float:
        """A stall ends the activity unheard, but not before most of a priority timeout after
        the last pull the server answered (later pulls only move that on)."""
        return self._last_pull + self._timeout * FENCE_FRACTION if self._pinned else math.inf

    def _stalled(self) -> bool:
        return self._pinned and time.monotonic() - self._last_pull > self._timeout * FENCE_FRACTION

    def _stall(self) -> str | None:
        return "no pull answered for too long (stalled or cut off)" if self._stalled() else None

    def _stop_asking(self) -> None:
        """Only the pull stops: the pin lapses, or `owns` fences, once no pull is answered."""
        self._abort_pull()

    async def ack(self, delivery: Delivery) -> bool:
        if not self.owns(delivery):
            return False
        if not self._ack_all:
            await self._send_ack(str(delivery.token))
        else:
            self._acks.finish(str(delivery.token))
        return True

    async def _send_ack(self, reply: str) -> None:
        await self._nc.publish(reply, b"+ACK")

    async def release(self, standby_delay: float) -> None:
        if self._pinned:
            await super().release(standby_delay)

    async def _give_up(self, reason: str) -> None:
        """Send the ack floor, then UNPIN while the pin is still ours (if still connected)."""
        self._abort_pull()
        for looker in list(self._lookers):  # a standby's look at orphans is moot now
            looker.cancel()
        await self._drop_inbox()
        pin = self._pin if self._active else None
        connected = self._nc.is_connected
        if connected:
            await self._acks.flush()
        self._lose(reason)
        if connected:
            await self._nc.flush()
            if self._pinned and pin is not None:
                await self._unpin_if_mine(pin)

    async def _unpin_while_held(self, pin: str | None) -> bool:
        """UNPIN only while the broker still holds `pin`, so a newer owner is never unseated."""
        if pin is None or await self._ask_pin() != pin:
            return False
        await jsapi.unpin(self._nc, self._stream, self._consumer, PRIORITY_GROUP)
        return True

    async def _unpin_if_mine(self, pin: str | None) -> None:
        """Hand our own queue back (release, close); a failure only delays the next owner."""
        try:
            await self._unpin_while_held(pin)
        except (jsapi.JsApiError, TimeoutError) as exc:
            log.warning("queue %d: unpin failed: %s", self.queue, exc)

    def _lose(self, reason: str) -> None:
        """Stop owning the queue: drop what is buffered so nothing more is processed or acked."""
        self._new_epoch()
        self._acks.restart()
        self._last_delivery = None
        self._pin = None
        if self._pinned:
            self._set_active(False, reason)

    def _abort_pull(self) -> None:
        self._pull.done.set()

    async def _step(self) -> float:
        """Send the next pull and wait for it, unless this standby should stay out of the way."""
        await self._running.wait()
        if self._closed:
            return 0.0
        if (wait := await self._background_wait()) is not None:
            return wait
        if self._quiet():
            await self._give_back()
        await self._pull_once()
        return 0.0

    def _quiet(self) -> bool:
        """Whether this coordinated owner was sent nothing for QUIET_TIMEOUTS priority timeouts
        and has acked everything (it counts deliveries; a new stint starts the count anew)."""
        now = time.monotonic()
        since, seen = self._quiet_since
        if seen != self._last_delivery:
            self._quiet_since = since, seen = now, self._last_delivery
        return (
            self._coordinated
            and self._ack_all
            and self._preferred
            and self.active
            and self._acks.settled
            and now - since > self._timeout * QUIET_TIMEOUTS
        )

    async def _give_back(self) -> None:
        """Stop owning a quiet queue and wait for its next event as its preferred standby: the
        waiting pull goes out first, the UNPIN right after it (`_pull_once`), so the next event
        finds that pull, and the other members' standbys, told of the unpin, find it waiting."""
        pin = self._pin
        await self._acks.flush()
        self._lose("quiet: its pin goes back until the next event")
        self._unpin_after_pull = pin

    async def _failed(self, exc: Exception) -> float:
        log.warning("queue %d: pull failed: %s", self.queue, exc)
        await asyncio.sleep(min(self._expires, 0.5))
        return 0.0

    async def _background_wait(self) -> float | None:
        """How long a non-preferred standby stays out of the way before it looks again (None:
        it pulls now; UNTIL_WOKEN: until told to look): while the queue has a live owner, or
        another pull waits for it (its preferred client's, which must win the next pin).

        Only preferred bindings keep a standby pull waiting at all times, so a released
        queue goes to its preferred client; the others pull once the broker has unpinned
        a silent owner and no pull waits, so the queue is still taken over when no
        preferred client is left. An `advised` standby then waits for the server's UNPINNED
        advisory (`unpinned`), or ADVISED_LOOK_TIMEOUTS, rather than asking every half
        timeout: an idle standby costs the server nothing (a dynamic group's coordinator
        makes another member preferred when a member goes; a static group's secondary takes
        a queue whose primary died while nobody held its pin only after that long). A
        coordinated one looks only when an advisory or the stream's shared look says the
        queue may be free (`look_soon`).
        """
        if not self._pinned or self._preferred or self._active:
            return None
        if self._coordinated and not self._look_due:
            return UNTIL_WOKEN
        self._look_due = False
        info = await jsapi.consumer_info(self._nc, self._stream, self._consumer)
        pinned = any(g.get("pinned_client_id") for g in info.get("priority_groups") or [])
        if not pinned and info.get("num_waiting", 0) == 0:
            self._look_due = True  # it pulls, and looks again before its next pull
            return None
        if self._coordinated:
            return UNTIL_WOKEN
        return self._timeout * (ADVISED_LOOK_TIMEOUTS if self._advised else 0.5)

    async def _pull_inbox(self) -> str:
        """The reply subject of this binding's pulls: one subscription kept across
        pulls the server ended (an idle owner pulls every priority_timeout/3 per queue), and
        dropped with any pull that may still be open at the server, whose late messages must
        find no interest (aborted for a handover, superseded by a new pin, cut off). Its
        messages reach `_on_message` from the read loop itself (direct.py)."""
        if self._inbox is None:
            self._inbox = await subscribe_direct(self._nc, self._nc.new_inbox(), self._on_message)
        return self._inbox.subject

    async def _drop_inbox(self) -> None:
        inbox, self._inbox = self._inbox, None
        if inbox is not None:
            with contextlib.suppress(Exception):
                await inbox.unsubscribe()

    def _pull_expires(self) -> float:
        """How long the next pull lasts: the look period for a waiting standby told of unpins;
        else until the wall clock's next multiple of a third of the priority timeout, while it
        keeps a pin (the server unpins a priority timeout after the last pull it received) or
        looks for one unadvised. An idle owner's pulls of all its queues then end together
        and are sent again in one wake-up, not each at the moment its queue was taken."""
        return self._advised_look() if self._advised and self.waiting else until_next(self._expires)

    def _advised_look(self) -> float:
        """How long a waiting standby told of unpins goes without looking by itself."""
        timeouts = COORDINATED_LOOK_TIMEOUTS if self._coordinated else ADVISED_LOOK_TIMEOUTS
        return self._timeout * timeouts

    async def _pull_once(self) -> None:
        pull = _Pull(remaining=PULL_BATCH, sent=time.monotonic())
        self._pull = pull
        reply = await self._pull_inbox()
        expires = self._pull_expires()
        request: dict[str, object] = {"batch": PULL_BATCH, "expires": jsapi.nanos(expires)}
        if self._pinned:
            request["group"] = PRIORITY_GROUP
            if self._pin is not None:
                request["id"] = self._pin
        try:
            await self._nc.publish(
                jsapi.next_subject(self._stream, self._consumer),
                orjson.dumps(request),
                reply=reply,
            )
            if (pin := self._unpin_after_pull) is not None:
                self._unpin_after_pull = None
                await self._unpin_if_mine(pin)
            if self._rewind_due and self.waiting and self._orphans_possible():
                await self._rewind_orphans()
            with contextlib.suppress(TimeoutError):  # a timeout scope: no task per pull
                async with asyncio.timeout(expires * 1.5):
                    await pull.done.wait()
        finally:
            if not pull.ended:
                await self._drop_inbox()
        self._rewind_due = pull.remaining == PULL_BATCH
        if pull.takeover_pin is not None and self._running.is_set() and not self._closed:
            await self._take_over(pull.takeover_pin, pull.pinned_at)

    def _orphans_possible(self) -> bool:
        """Whether a waiting standby's empty pull may hide orphaned deliveries: always, unless
        UNPINNED advisories tell it when an owner let go (orphans appear only then), and it
        looked less than ADVISED_LOOK_TIMEOUTS ago (an advisory may be lost)."""
        now = time.monotonic()
        if not self._advised or now - self._looked >= self._advised_look():
            self._looked = now
            return True
        return False

    async def _rewind_orphans(self) -> None:
        """Nobody owns the queue, yet deliveries wait unacked (an owner let go of messages it
        had been sent but never processed): rewind to the ack floor, so they are delivered
        again, and this waiting pull pinned, now rather than after the ack wait. Done while
        our pull is registered at the server (sent first on this connection), so the
        rewound deliveries go to it and not to a pull that happens to be sent meanwhile."""
        info = await jsapi.consumer_info(self._nc, self._stream, self._consumer)
        groups = info.get("priority_groups") or []
        orphans = info.get("num_ack_pending", 0)
        if orphans and not any(g.get("pinned_client_id") for g in groups):
            await jsapi.reset(self._nc, self._stream, self._consumer)
            log.info("queue %d: nobody owns %d unacked deliveries: rewound", self.queue, orphans)

    async def _take_over(self, pin: str, pinned_at: float) -> None:
        """Become the owner: rewind to the ack floor so the old owner's unacked work comes
        first, and claim the next ownership epoch (if that fails, the pin is left to lapse).
        The pin's timeout started when the server assigned it, just before `pinned_at` (the
        waiting pull that won it may be older than a priority timeout)."""
        answer, epoch, _ = await asyncio.gather(
            jsapi.reset(self._nc, self._stream, self._consumer),
            self._claim_epoch(pin),
            self._find_end(),
        )
        log.debug("queue %d: pinned as %s; reset to %s", self.queue, pin, answer.get("reset_seq"))
        self._lose("taking over")
        self._quiet_since = (time.monotonic(), None)  # quiet as an owner from now on only
        self._owner_epoch = epoch
        self._pin = pin
        self._last_pull = max(self._last_pull, pinned_at)
        self._set_active(True, "pinned by the broker")

    async def _find_end(self) -> None:
        if self._ends is not None and self.end is None:
            self.end = await self._ends[2]()

    async def _claim_epoch(self, pin: str) -> int:
        return await self._claim(pin) if self._claim is not None else 0

    def _on_message(self, msg: Msg) -> None:
        pull = self._pull
        self._last_pull = max(self._last_pull, pull.sent)  # the server heard this pull
        if pull.done.is_set():
            return
        headers = msg.headers or {}
        status = headers.get("Status")
        if status is not None and not msg.data:
            self._on_status(pull, status, headers.get("Description", ""))
            return
        if self._pinned:
            pin = headers.get(PIN_HEADER)
            if pin is not None and pin != self._pin:
                pull.takeover_pin = pin
                pull.pinned_at = time.monotonic()
                pull.done.set()
                return
        pull.remaining -= 1
        if pull.remaining <= 0:
            pull.ended = True
            pull.done.set()
        if self._ack_all and not self._track(pull, msg.reply):
            return
        if self._ends is not None and self._past_end(msg):
            return
        self._buffer.put_nowait(
            Delivery(
                body=msg.data,
                subject=msg.subject,
                headers=headers,
                redelivered=delivery_count(msg.reply) > 1,
                epoch=self._epoch,
                token=msg.reply,
                owner_epoch=self._owner_epoch,
            )
        )

    def _past_end(self, msg: Msg) -> bool:
        """A resize's marker, or an event after the one that ended this consumer's generation
        (the next generation's consumers read it): acked unprocessed, never handed out."""
        subject, generation, _ = self._ends  # type: ignore[misc]
        if msg.subject == subject:
            if is_end(msg.headers, generation):
                sequence = stream_sequence(msg.reply)
                self.end = sequence if self.end is None else min(self.end, sequence)
        elif self.end is None or stream_sequence(msg.reply) < self.end:
            return False
        self._acks.finish(msg.reply)
        return True

    def _track(self, pull: _Pull, reply: str) -> bool:
        """Add a delivery to the ack floor; a gap in the consumer's delivery counter means
        the server sent this stint a message it never got (a reply lost with a connection, a
        pull given up): an ack above it would acknowledge it unprocessed, so the stint ends
        instead (False), and the next owner's RESET brings it again."""
        delivery = consumer_sequence(reply)
        if self._last_delivery is not None and delivery != self._last_delivery + 1:
            pull.done.set()
            self._lose(f"delivery {self._last_delivery + 1} never arrived (got {delivery})")
            return False
        self._last_delivery = delivery
        self._acks.delivered(reply)
        return True

    def _on_status(self, pull: _Pull, status: str, description: str) -> None:
        if status == "100":
            return
        log.debug("queue %d: pull status %s %s", self.queue, status, description)
        pull.ended = status in ("404", "408", "409")
        pull.done.set()
        if status == "423":
            self._lose(f"fenced by the broker: {description or 'pin id mismatch'}")
        elif status not in ("404", "408", "409"):
            log.warning("queue %d: pull status %s %s", self.queue, status, description)
