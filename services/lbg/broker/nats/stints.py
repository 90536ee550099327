"""One queue of a resizable NATS group across its generations: a binding that walks stints.

Queue q serves, one after the other, the consumers model/generations.py gives it (the old
generations' first, in order), each through its own NatsQueueBinding: an old stint ends once
its consumer is drained up to its end marker (then the consumer is deleted), and a stint
starts only when the older consumers that carried any of its buckets are drained. Every
member's binding of queue q walks the same stints, so the pin of each consumer keeps it
exclusive; the client sees one binding whose active state follows the current stint. A
binding settled on its current generation's consumer sleeps until the group's history
changes (histories.py): only a resize's drains are looked at every STEP_SECONDS.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.client import Client

from lbg.aio import cancel_and_wait, cancel_requested
from lbg.broker.base import BrokerError, Delivery, QueueBinding, StateListener, why
from lbg.broker.nats import generations, jsapi
from lbg.broker.nats.binding import FindEnd, NatsQueueBinding
from lbg.broker.nats.histories import HistoryFeed
from lbg.model.generations import Generation, members_for, sources
from lbg.model.group import GroupConfig

log = logging.getLogger(__name__)

STEP_SECONDS = 0.05
REFRESH_SECONDS = 1.0
ERRORS = (BrokerError, jsapi.JsApiError, TimeoutError)

Stint = tuple[Generation, int]


@dataclass(frozen=True)
class GroupStints:
    """What a queue's stints need from the adapter: the group's events stream, its history
    (one feed for all the group's queues), a consumer's settings (priority timeout,
    cumulative acks), the owner-record claim, and the watch that wakes a binding on its
    consumer's UNPINNED advisories."""

    nc: Client
    stream: str
    config: GroupConfig
    history: HistoryFeed
    settings: Callable[[str], Awaitable[tuple[float, bool]]]
    claim: Callable[[str, str], Awaitable[int]]
    watch_unpins: Callable[[str, str, NatsQueueBinding], Awaitable[None]]

    async def open(
        self, queue: int, stint: Stint, preferred: bool, on_change: StateListener | None
    ) -> NatsQueueBinding:
        """A binding of queue `queue` to one generation's consumer."""
        generation, consumer = stint[0], self.name(stint)
        priority_timeout, ack_all = await self.settings(consumer)
        binding = NatsQueueBinding(
            self.nc,
            self.stream,
            consumer,
            queue,
            pinned=self.config.exclusive,
            priority_timeout=priority_timeout,
            preferred=preferred,
            on_change=on_change,
            claim=functools.partial(self.claim, consumer),
            ack_all=ack_all,
            advised=self.config.exclusive,
            ends=self.ends(generation) if self.config.exclusive else None,
        )
        binding.end = generation.end
        if self.config.exclusive:
            await self.watch_unpins(self.stream, consumer, binding)
        return binding

    def name(self, stint: Stint) -> str:
        return generations.consumer_name(stint[1], stint[0].index)

    def ends(self, generation: Generation) -> tuple[str, int, FindEnd]:
        """What a binding of `generation` needs to stop at its end marker (binding.py)."""

        async def find_end() -> int | None:
            if generation.end is not None:
                return generation.end
            prefix = self.config.hash_prefix
            return await generations.end_of(self.nc, self.stream, prefix, generation)

        marker = generations.marker_subject(self.config.hash_prefix)
        return marker, generation.index, find_end

    async def drained(self, stint: Stint) -> bool:
        """The consumer of a finished generation acked everything up to its end (or is gone)."""
        assert stint[0].end is not None
        return await generations.drained(self.nc, self.stream, self.name(stint), stint[0].end)

    async def delete(self, stint: Stint) -> None:
        await generations.delete_consumer(self.nc, self.stream, self.name(stint))


class StintBinding(QueueBinding):
    """A queue of the current size, served through the consumers of each generation in turn."""

    steady_waiting = True  # a waiting pull lost with the connection is sent again by itself

    def __init__(
        self,
        queue: int,
        group: GroupStints,
        preferred: bool,
        on_change: StateListener | None,
    ) -> None:
        self.queue = queue
        self._group = group
        self._history = group.history.history
        self._preferred = preferred
        self._coordinated = False
        self._on_change = on_change
        self._suspended = False
        self._drained: set[tuple[int, int]] = set()
        self._stint: Stint | None = None
        self._binding: NatsQueueBinding | None = None
        self._opened = asyncio.Event()
        self._interrupted = False
        self._woken = asyncio.Event()  # a stint opened, or an interrupt came while none was
        self._closed = False
        self._task = asyncio.create_task(self._drive(), name=f"stints-q{queue}")

    # -- the current stint's binding, as the client sees it ------------------------------

    @property
    def active(self) -> bool:
        return self._binding is not None and self._binding.active

    @property
    def pin(self) -> str | None:
        return self._binding.pin if self._binding is not None else None

    @property
    def waiting(self) -> bool:
        return self._binding is not None and self._binding.waiting

    def active_known_until(self) -> float:
        """The current stint's (a stint that starts or ends says so through the listener)."""
        return self._binding.active_known_until() if self._binding is not None else math.inf

    @property
    def consumer(self) -> str | None:
        """The consumer this queue serves now (None while it waits for older ones to drain)."""
        return self._group.name(self._stint) if self._stint is not None else None

    async def next(self) -> Delivery:
        while True:
            await self._opened.wait()
            if self._binding is not None:
                return await self._binding.next()

    async def next_or_interrupted(self) -> Delivery | None:
        """The current stint's next delivery; None once interrupted, or when its stint ends."""
        while True:
            if self._interrupted:
                self._interrupted = False
                return None
            if self._binding is not None:
                return await self._binding.next_or_interrupted()
            self._woken.clear()
            await self._woken.wait()

    def interrupt(self) -> None:
        if self._binding is not None:
            self._binding.interrupt()
        else:
            self._interrupted = True
            self._woken.set()

    def ready(self) -> Delivery | None:
        return self._binding.ready() if self._binding is not None else None

    def owns(self, delivery: Delivery) -> bool:
        """Only the current stint's binding can own a delivery: an older stint's carries an
        epoch (unique in the process) that the current binding never had."""
        binding = self._binding
        return binding is not None and binding.owns(delivery)

    async def ack(self, delivery: Delivery) -> bool:
        binding = self._binding
        return binding is not None and await binding.ack(delivery)

    def set_preferred(self, preferred: bool) -> None:
        self._preferred = preferred
        if self._binding is not None:
            self._binding.set_preferred(preferred)

    def set_coordinated(self) -> None:
        self._coordinated = True
        if self._binding is not None:
            self._binding.set_coordinated()

    def suspend(self, suspended: bool) -> None:
        self._suspended = suspended
        if self._binding is not None:
            self._binding.suspend(suspended)

    async def pinned_by(self, *, fresh: bool = False) -> str | None:
        """The current stint's owner; None if its consumer was just drained and deleted."""
        binding = self._binding
        if binding is None:
            return None
        with contextlib.suppress(jsapi.JsApiError):
            return await binding.pinned_by(fresh=fresh)
        return None

    async def evict(self, pin: str) -> bool:
        binding = self._binding
        if binding is None:
            return False
        with contextlib.suppress(jsapi.JsApiError):
            return await binding.evict(pin)
        return False

    def fence(self, reason: str) -> None:
        if self._binding is not None:
            self._binding.fence(reason)

    async def release(self, standby_delay: float) -> None:
        if self._binding is not None:
            await self._binding.release(standby_delay)

    async def close(self) -> None:
        self._closed = True
        await cancel_and_wait(self._task)
        if self._binding is not None:
            await self._binding.close()

    # -- walking the stints ----------------------------------------------------------------

    async def _drive(self) -> None:
        """Walk the stints until closed; a failed round (a broker restart answers 'no
        responders', a client library cancels a call) is logged and tried again, never the
        end of the queue's binding."""
        while not self._closed:
            changed = self._group.history.changed
            try:
                settled = await self._step()
            except asyncio.CancelledError:
                if cancel_requested():
                    raise
                log.warning("queue %d: stints: a broker call was cancelled under it", self.queue)
                await asyncio.sleep(REFRESH_SECONDS)
            except Exception as exc:
                log.warning("queue %d: stints: %s", self.queue, why(exc))
                await asyncio.sleep(REFRESH_SECONDS)
                continue
            if settled:
                await changed.wait()
            else:
                await asyncio.sleep(STEP_SECONDS)

    def _stints(self) -> list[Stint]:
        size = self._history[-1].size
        return [
            (generation, member)
            for generation in self._history
            for member in members_for(self.queue, generation, size)
            if (generation.index, member) not in self._drained
        ]

    async def _step(self) -> bool:
        """One look at the stints; True once settled on a stint that has no end yet (nothing
        changes until the history does: its end marker may come first, but the config naming
        it follows), or retired."""
        self._history = self._group.history.history
        if self._stint is not None:
            self._stint = (self._history[self._stint[0].index], self._stint[1])
            if self._stint[0].end is None:
                return True
            if await self._is_drained(self._stint):
                await self._finish()
            return False
        for stint in self._stints():
            if stint[0].end is not None and await self._is_drained(stint):
                continue
            if await self._sources_drained(stint):
                await self._start(stint)
            return False
        return True  # every stint of this queue is drained: it is retired

    async def _is_drained(self, stint: Stint) -> bool:
        """Whether an old consumer is drained; one found drained that this queue does not serve
        is deleted by whoever finds it first (its owner may be gone); `_finish` deletes the
        one it serves after letting it go."""
        key = (stint[0].index, stint[1])
        if key not in self._drained and await self._group.drained(stint):
            self._drained.add(key)
            if stint != self._stint:
                with contextlib.suppress(*ERRORS):
                    await self._group.delete(stint)
        return key in self._drained

    async def _sources_drained(self, stint: Stint) -> bool:
        """Every older consumer that carried a bucket of this stint is drained."""
        generation, member = stint
        buckets = list(range(member, self._group.config.hash_count, generation.size))
        for older in self._history[: generation.index]:
            for source in sources(buckets, older):
                if not await self._is_drained((older, source)):
                    return False
        return True

    async def _start(self, stint: Stint) -> None:
        binding = await self._group.open(self.queue, stint, self._preferred, self._on_change)
        if self._suspended:
            binding.suspend(True)
        if self._coordinated:
            binding.set_coordinated()
        self._stint, self._binding = stint, binding
        self._opened.set()
        self._woken.set()
        log.info("queue %d: serving consumer %s", self.queue, self._group.name(stint))

    async def _finish(self) -> None:
        """The stint's consumer is drained: let it go, and delete it."""
        assert self._stint is not None and self._binding is not None
        stint, binding = self._stint, self._binding
        self._stint = self._binding = None
        self._opened.clear()
        binding.interrupt()  # a worker waiting on this stint looks again, at the next one
        with contextlib.suppress(*ERRORS):
            await binding.close()
        await self._group.delete(stint)
        log.info("queue %d: consumer %s drained and deleted", self.queue, self._group.name(stint))
