"""One client's binding to one Solace queue: a persistent receiver (a flow) with client acks.

The broker tells each flow bound to an exclusive queue whether it is the active one (the
activation/passivation listener) and delivers only to that flow. The binding is active while
its flow is. Passivation fences it: the epoch is bumped and buffered deliveries are dropped,
so owns() is False for all of them; the broker hands their unacked messages to the new active
flow. A delivered message also proves its flow active: the API calls the listener and the
message handler on different threads, so the first message can overtake the activation.

Giving the queue up (release, fence while active, suspend, close) unbinds the flow, which is
Solace's order-safe hand-over: the broker puts the unacked messages back, in order, for the
next flow. Callbacks of an unbound flow are ignored. Release then waits and binds again, at
the back of the standby line, as the original's cycling of secondary connections did.

A flow the broker takes down (queue deleted or shut, a failed rebind) says so through the
API's termination listener and delivers nothing more: the binding drops it, with what it
delivered, and binds a new flow, retrying with backoff while the queue cannot be bound. The
adapter does the same to every binding while the session reconnects (`rebind`, connection.py).

Once active on an exclusive queue, the binding claims the queue's ownership epoch (the
fencing token, claims.py) and holds its deliveries back until the claim is in; a claim that
fails fences the binding (its flow is unbound, so the broker hands the queue on), and one
that comes back after the binding lost the queue is ignored.

No Solace equivalent, nearest behaviour instead: the broker shows other clients no token of
a flow's ownership, so `pinned_by` answers None (nobody known) and `evict` does nothing and
answers False: a gone owner loses its queue when the broker finds its session dead
(keepalive), not earlier. A standby cannot ask the broker to be chosen next, so
`set_preferred` only decides whether the binding reports itself as waiting for the queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from lbg.aio import cancel_and_wait
from lbg.broker.base import BrokerError, Delivery, StateListener, why
from lbg.broker.bindings import EpochBinding

log = logging.getLogger(__name__)

REBIND_BACKOFF = (0.2, 5.0)


class Flow(Protocol):
    """The part of a persistent receiver the binding uses; `start` binds it (blocking)."""

    def start(self) -> None: ...

    def ack(self, message: Any) -> None: ...

    def terminate(self, grace_period: int = ...) -> None: ...


@dataclass(frozen=True, slots=True)
class FlowEvents:
    """Where a flow reports, on the API's threads: the broker's word on whether it is the
    active flow, each message delivered, and the flow going down for good (with the reason)."""

    state: Callable[[bool], None]
    message: Callable[[Any], None]
    down: Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Inbound:
    """What the binding needs of one received message."""

    body: bytes
    subject: str
    headers: Mapping[str, str]
    redelivered: bool


# Builds a flow, not yet bound, that reports to the given events once started.
OpenFlow = Callable[[FlowEvents], Flow]
# Records this client's flow (its pin) as the queue's new owner; returns the ownership epoch.
ClaimEpoch = Callable[[str], Awaitable[int]]


class SolaceQueueBinding(EpochBinding):
    """One flow on one of the group's queues at a time, active or standing by."""

    def __init__(
        self,
        queue: int,
        open_flow: OpenFlow,
        read: Callable[[Any], Inbound],
        exclusive: bool,
        client_id: str,
        preferred: bool = True,
        on_change: StateListener | None = None,
        claim: ClaimEpoch | None = None,
    ) -> None:
        super().__init__(queue, on_change)
        self._claim = claim
        self._owner_epoch: int | None = None
        self._held: list[Delivery] = []
        self._open = open_flow
        self._read = read
        self._exclusive = exclusive
        self._client_id = client_id
        self._preferred = preferred
        self._loop = asyncio.get_running_loop()
        self._flow: Flow | None = None
        self._stint = 0
        self._active = not exclusive
        self._suspended = False
        self._closed = False
        self._bind_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        """Bind the first flow; errors reach the caller."""
        await self._bind()

    @property
    def pin(self) -> str | None:
        """A token naming this client's current flow, while it is the active one."""
        if not self._exclusive or not self.active:
            return None
        return f"{self._client_id}/{self.queue}/{self._stint}"

    @property
    def waiting(self) -> bool:
        return (
            self._exclusive
            and self._preferred
            and not self._active
            and self._flow is not None
            and not self._suspended
        )

    def set_preferred(self, preferred: bool) -> None:
        self._preferred = preferred

    def suspend(self, suspended: bool) -> None:
        """Suspended: unbind (out of the standby line too); resumed: bind again."""
        if suspended == self._suspended or self._closed:
            return
        self._suspended = suspended
        if suspended:
            self._spawn(self._terminate(self._drop_flow("suspended")))
        else:
            self._spawn(self._rebind())

    async def pinned_by(self, *, fresh: bool = False) -> str | None:
        """None: Solace does not show other clients which flow is active (see module doc)."""
        return None

    async def evict(self, pin: str) -> bool:
        """False: the messaging API cannot unbind another client's flow (see module doc)."""
        return False

    def owns(self, delivery: Delivery) -> bool:
        return delivery.epoch == self._epoch and self.active

    async def ack(self, delivery: Delivery) -> bool:
        if not self.owns(delivery):
            return False
        stint, message = delivery.token  # type: ignore[misc]
        flow = self._flow
        if flow is None or stint != self._stint:
            return False
        try:
            flow.ack(message)
        except Exception as exc:
            self.fence(f"ack failed: {exc}")
            return False
        return True

    def fence(self, reason: str) -> None:
        """Drop everything delivered so far; an active flow is unbound so the broker
        redelivers its unacked messages, then it binds again as a standby."""
        if not self.active:
            self._lose(reason)
            return
        self.rebind(reason)

    def rebind(self, reason: str) -> None:
        """Drop the flow, active or not, with everything it delivered, and bind a new one: the
        old one went down or can no longer be trusted."""
        if self._closed:
            return
        self._spawn(self._cycle(self._drop_flow(reason), 0.0))

    async def release(self, standby_delay: float) -> None:
        if not self._exclusive:
            return
        await self._cycle(self._drop_flow("released for handover"), standby_delay)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in list(self._tasks):
            await cancel_and_wait(task)
        await self._terminate(self._drop_flow("closed"))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine, name=f"solace-binding-{self.queue}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _bind(self) -> None:
        async with self._bind_lock:
            if self._flow is not None or self._closed or self._suspended:
                return
            self._stint += 1
            stint = self._stint
            loop = self._loop

            events = FlowEvents(
                state=lambda active: loop.call_soon_threadsafe(self._on_state, stint, active),
                message=lambda message: loop.call_soon_threadsafe(self._on_message, stint, message),
                down=lambda reason: loop.call_soon_threadsafe(self._on_down, stint, reason),
            )
            flow = self._open(events)
            self._flow = flow
            try:
                await asyncio.to_thread(flow.start)
            except BaseException:
                if self._flow is flow:
                    self._drop_flow("bind failed")
                raise
            if stint != self._stint:
                await self._terminate(flow)

    async def _rebind(self) -> None:
        """Bind again, retrying with backoff while the broker is unreachable."""
        delay, ceiling = REBIND_BACKOFF
        while not self._closed and not self._suspended and self._flow is None:
            try:
                await self._bind()
                return
            except BrokerError as exc:
                log.warning("queue %d: bind failed (%s); retrying in %.1fs", self.queue, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, ceiling)

    async def _cycle(self, flow: Flow | None, delay: float) -> None:
        """Unbind `flow`, wait, and stand by again."""
        await self._terminate(flow)
        await asyncio.sleep(delay)
        await self._rebind()

    async def _terminate(self, flow: Flow | None) -> None:
        if flow is None:
            return
        try:
            await asyncio.to_thread(flow.terminate, 0)
        except Exception as exc:
            log.warning("queue %d: unbind failed: %s", self.queue, exc)

    def _drop_flow(self, reason: str) -> Flow | None:
        """Stop owning and forget the flow now; its later callbacks are ignored."""
        flow, self._flow = self._flow, None
        self._stint += 1
        self._lose(reason)
        return flow

    def _lose(self, reason: str) -> None:
        """Fence: bump the epoch and drop what is buffered so nothing more is processed or acked."""
        self._new_epoch()
        self._owner_epoch = None
        self._held.clear()
        if self._exclusive:
            self._set_active(False, reason)

    def _on_state(self, stint: int, active: bool) -> None:
        if stint != self._stint:
            return
        if active:
            self._activate("activated by the broker")
        else:
            self._lose("passivated by the broker")

    def _on_down(self, stint: int, reason: str) -> None:
        if stint == self._stint:
            log.warning("queue %d: flow went down (%s); binding again", self.queue, reason)
            self.rebind(f"flow went down: {reason}")

    def _on_message(self, stint: int, message: Any) -> None:
        if stint != self._stint:
            return
        try:
            inbound = self._read(message)
        except Exception as exc:
            log.warning("queue %d: unreadable message handed on empty: %s", self.queue, exc)
            inbound = Inbound(b"", "", {}, False)
        if not self._active:
            self._activate("the broker delivers to this flow")
        delivery = Delivery(
            body=inbound.body,
            subject=inbound.subject,
            headers=inbound.headers,
            redelivered=inbound.redelivered,
            epoch=self._epoch,
            token=(stint, message),
        )
        if self._claims() and self._owner_epoch is None:
            self._held.append(delivery)
            return
        delivery.owner_epoch = self._owner_epoch or 0
        self._buffer.put_nowait(delivery)

    def _claims(self) -> bool:
        """Whether this binding's deliveries carry an ownership epoch it claims."""
        return self._exclusive and self._claim is not None

    def _activate(self, reason: str) -> None:
        """Become the active flow and, once per ownership, claim its epoch."""
        if self._active:
            return
        self._set_active(True, reason)
        if self._claims():
            self._spawn(self._claim_for(self._stint, self._epoch))

    async def _claim_for(self, stint: int, epoch: int) -> None:
        """Claim this ownership's epoch, then release what was held back, tagged with it."""
        assert self._claim is not None
        try:
            owner_epoch = await self._claim(f"{self._client_id}/{self.queue}/{stint}")
        except Exception as exc:
            if self._stint == stint and self._epoch == epoch:
                self.fence(f"cannot claim the ownership epoch: {why(exc)}")
            return
        if self._stint != stint or self._epoch != epoch:
            return
        self._owner_epoch = owner_epoch
        self._hand_out(self._held, owner_epoch)
