"""What every adapter's binding shares: deliveries buffered with the ownership epoch they
arrived in (EpochBinding), and one background loop that drives the binding (LoopBinding)."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import itertools
import logging
import math
from typing import ClassVar

from lbg.aio import cancel_and_wait, cancel_requested
from lbg.broker.base import Delivery, QueueBinding, StateListener

log = logging.getLogger(__name__)

# What a loop binding's round returns to sleep until something wakes it (`_wake`), with no
# timer: for a state that only an event ends (a set preference, a closed channel).
UNTIL_WOKEN = math.inf
# Every binding's epochs come from this one counter, so a delivery's epoch names the binding
# and the stint it came from: a binding that wraps others (NATS stints) needs no other tag.
_EPOCHS = itertools.count(1)


class EpochBinding(QueueBinding):
    """What every adapter's binding shares: deliveries are buffered with the ownership epoch
    they arrived in (losing the queue bumps the epoch, so nothing older is handed out), and
    changes of the active state are logged and reported to the listener."""

    def __init__(self, queue: int, on_change: StateListener | None) -> None:
        self.queue = queue
        self._on_change = on_change
        # None in the buffer is an interruption (`interrupt`), not a delivery.
        self._buffer: asyncio.Queue[Delivery | None] = asyncio.Queue()
        self._epoch = next(_EPOCHS)
        self._active = False

    @property
    def active(self) -> bool:
        return self._active

    async def next(self) -> Delivery:
        while True:
            delivery = await self._buffer.get()
            if delivery is not None and delivery.epoch == self._epoch:
                return delivery

    async def next_or_interrupted(self) -> Delivery | None:
        while True:
            delivery = await self._buffer.get()
            if delivery is None or delivery.epoch == self._epoch:
                return delivery

    def interrupt(self) -> None:
        self._buffer.put_nowait(None)

    def ready(self) -> Delivery | None:
        while not self._buffer.empty():
            delivery = self._buffer.get_nowait()
            if delivery is not None and delivery.epoch == self._epoch:
                return delivery
        return None

    def _hand_out(self, held: list[Delivery], owner_epoch: int) -> None:
        """Buffer what was held back until its ownership was claimed, tagged with its epoch."""
        for delivery in held:
            delivery.owner_epoch = owner_epoch
            self._buffer.put_nowait(delivery)
        held.clear()

    def _new_epoch(self) -> None:
        """Forget what was delivered so far: it may no longer be processed or acked (an
        interruption stays, so a worker waiting for it is still woken)."""
        self._epoch = next(_EPOCHS)
        interrupted = False
        while not self._buffer.empty():
            interrupted = self._buffer.get_nowait() is None or interrupted
        if interrupted:
            self.interrupt()

    def _set_active(self, active: bool, reason: str) -> None:
        if active == self._active:
            return
        self._active = active
        log.info("queue %d: %s (%s)", self.queue, "active" if active else "standby", reason)
        if self._on_change is not None:
            self._on_change(self.queue, active)


class LoopBinding(EpochBinding):
    """A binding that one background task drives (a pull or poll loop): the loop, release,
    suspend, fence and close are the same for all of them; an adapter supplies only its
    broker calls: `_step` (one round of the loop), `_lose` (stop owning
    now), `_give_up` (hand the queue back to the broker) and `_failed` (after a failed round).

    `_running` is clear while the binding must not ask for messages (suspended, handing
    over); `_wake` cuts the loop's wait short when something changed.
    """

    # How long close() lets the loop finish its round (e.g. record what was acked).
    close_grace: ClassVar[float] = 0.0

    def __init__(self, queue: int, on_change: StateListener | None, preferred: bool) -> None:
        super().__init__(queue, on_change)
        self._preferred = preferred
        self._running = asyncio.Event()
        self._running.set()
        self._wake = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task[None] | None = None

    def _start(self, name: str) -> None:
        """Start the loop; called last by the adapter's constructor, once its state is set."""
        self._task = asyncio.create_task(self._run(), name=name)

    @abc.abstractmethod
    async def _step(self) -> float:
        """One round of the loop; returns how long to wait (unless woken) before the next,
        UNTIL_WOKEN to wait for `_wake` alone."""

    @abc.abstractmethod
    async def _failed(self, exc: Exception) -> float:
        """A round failed (the connection, mostly): recover; returns the wait before the next."""

    @abc.abstractmethod
    def _lose(self, reason: str) -> None:
        """Stop owning the queue now: nothing delivered so far may be processed or acked."""

    @abc.abstractmethod
    async def _give_up(self, reason: str) -> None:
        """Stop owning the queue and hand it back to the broker for the next owner."""

    def _stall(self) -> str | None:
        """Why this binding can no longer trust that it owns the queue (stalled), if it cannot."""
        return None

    def _stop_asking(self) -> None:
        """Stop asking for messages while suspended; by default by giving up ownership."""
        self._lose("suspended")

    async def _run(self) -> None:
        while not self._closed:
            self._wake.clear()
            try:
                delay = await self._step()
            except asyncio.CancelledError:
                if cancel_requested():
                    raise
                delay = await self._failed(ConnectionError("a broker call was cancelled under it"))
            except Exception as exc:
                delay = await self._failed(exc)
            if delay == UNTIL_WOKEN:
                await self._wake.wait()
            elif delay:  # a timeout scope, not wait_for: no task per wait
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()

    async def _stop(self) -> None:
        """End the loop (on close), letting it finish its round for up to `close_grace` s."""
        if self._task is None:
            return
        if self.close_grace:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), self.close_grace)
        await cancel_and_wait(self._task)

    def set_preferred(self, preferred: bool) -> None:
        if preferred != self._preferred:
            self._preferred = preferred
            self._wake.set()

    def suspend(self, suspended: bool) -> None:
        if suspended:
            self._running.clear()
            self._stop_asking()
        elif not self._closed:
            self._running.set()

    def owns(self, delivery: Delivery) -> bool:
        if delivery.epoch != self._epoch or not self._active:
            return False
        stall = self._stall()
        if stall is not None:
            self._lose(stall)
            return False
        return True

    def fence(self, reason: str) -> None:
        self._lose(reason)

    async def release(self, standby_delay: float) -> None:
        self._running.clear()
        await self._give_up("released for handover")
        await asyncio.sleep(standby_delay)
        if not self._closed:
            self._running.set()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._running.set()
        self._wake.set()
        await self._stop()
        await self._give_up("closed")
