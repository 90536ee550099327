"""An exclusive queue of the in-process broker, as one client's binding sees it: it pulls while
it runs, is pinned by the queue (store.py) and loses the queue as a NATS binding does."""

from __future__ import annotations

import asyncio
import logging

from lbg.broker.base import Delivery, StateListener
from lbg.broker.bindings import EpochBinding
from lbg.broker.memory.store import Connection, QueueState

log = logging.getLogger(__name__)


class MemoryQueueBinding(EpochBinding):
    """One client's binding to one queue of a `memory://` broker."""

    def __init__(
        self,
        connection: Connection,
        state: QueueState,
        queue: int,
        preferred: bool,
        on_change: StateListener | None,
    ) -> None:
        super().__init__(queue, on_change)
        self.client = connection.client
        self.preferred = preferred
        self.state = state
        self._connection = connection
        self._pin: str | None = None
        self._owner_epoch = 0
        self._suspended = False
        self._holding = False
        self._closed = False
        self._wake = asyncio.Event()
        self._interrupted = False

    @property
    def pin(self) -> str | None:
        return self._pin if self._active else None

    @property
    def waiting(self) -> bool:
        return self.preferred and not self._active and self.pulling()

    def pulling(self) -> bool:
        """True while it asks for messages: running, not handing over, its connection up."""
        running = not (self._closed or self._suspended or self._holding)
        return running and self._connection.reachable

    def holds(self, pin: str) -> bool:
        """True while it pulls with `pin` (the broker keeps a pin only while it does)."""
        return self.pulling() and self._pin == pin

    def pinned(self, pin: str, epoch: int) -> None:
        """The broker made it the owner: a new stint, under the queue's next epoch."""
        self._new_epoch()
        self._pin = pin
        self._owner_epoch = epoch
        self._set_active(True, "pinned by the broker")
        self.wake()

    def unpinned(self, reason: str) -> None:
        """The broker took the queue: its next pull hears so (once reachable again)."""
        if self._connection.reachable:
            self._lose(f"fenced by the broker: {reason}")

    def resync(self) -> None:
        """Back from a cut: drop the queue if the broker moved it meanwhile, else go on."""
        if self._pin is not None and self.state.pin != self._pin:
            self._lose("fenced by the broker: the queue moved while cut off")
        elif self._pin is not None:
            self.wake()

    def wake(self) -> None:
        """Let a waiting `next()` look again."""
        self._wake.set()

    def interrupt(self) -> None:
        self._interrupted = True
        self.wake()

    def ready(self) -> Delivery | None:
        event = self.state.take(self) if self._active else None
        if event is None:
            return None
        return Delivery(
            body=event.body,
            subject=event.subject,
            headers=event.headers,
            redelivered=event.deliveries > 1,
            epoch=self._epoch,
            token=event.seq,
            owner_epoch=self._owner_epoch,
        )

    async def next(self) -> Delivery:
        while True:
            self._wake.clear()
            if (delivery := self.ready()) is not None:
                return delivery
            await self._wake.wait()

    async def next_or_interrupted(self) -> Delivery | None:
        while not self._interrupted:
            self._wake.clear()
            if (delivery := self.ready()) is not None:
                return delivery
            await self._wake.wait()
        self._interrupted = False
        return None

    def owns(self, delivery: Delivery) -> bool:
        return delivery.epoch == self._epoch and self._active

    async def ack(self, delivery: Delivery) -> bool:
        if not self.owns(delivery):
            return False
        if self._connection.reachable:
            self.state.ack(int(str(delivery.token)), delivery.owner_epoch)
        return True

    def set_preferred(self, preferred: bool) -> None:
        if preferred != self.preferred:
            self.preferred = preferred
            self.state.hand_over()

    def suspend(self, suspended: bool) -> None:
        if self._closed or suspended == self._suspended:
            return
        self._suspended = suspended
        if suspended:
            self.state.stopped_pulling(self, self._connection.priority_timeout)
        else:
            self.state.hand_over()
        self.wake()

    async def pinned_by(self, *, fresh: bool = False) -> str | None:
        self._connection.check()
        return self.state.pin

    async def evict(self, pin: str) -> bool:
        self._connection.check()
        if self.state.pin != pin:
            return False
        log.info("queue %d: evicted gone owner %s", self.queue, pin)
        self.state.unpin("evicted")
        return True

    def fence(self, reason: str) -> None:
        self._lose(reason)

    async def release(self, standby_delay: float) -> None:
        self._holding = True
        self._unpin_if_mine("released for handover")
        await asyncio.sleep(standby_delay)
        self._holding = False
        if not self._closed:
            self.state.hand_over()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._unpin_if_mine("closed")
        if self in self.state.bindings:
            self.state.bindings.remove(self)
        self.wake()

    def _unpin_if_mine(self, reason: str) -> None:
        """Give the queue back at once if the broker still holds our pin (release, close)."""
        pin = self._pin if self._active else None
        self._lose(reason)
        if pin is not None and self._connection.reachable and self.state.pin == pin:
            self.state.unpin(reason)

    def _lose(self, reason: str) -> None:
        """Stop owning the queue: nothing delivered so far may be processed or acked."""
        had_pin = self._pin is not None
        self._new_epoch()
        self._pin = None
        self._set_active(False, reason)
        if had_pin:
            self.state.stopped_pulling(self, self._connection.priority_timeout)
