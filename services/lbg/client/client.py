"""The LBG client: binds every queue of its group and processes what the broker makes it active for.

Which queues it prefers and releases is its coordinator's business, static or dynamic, chosen
once at start (coordination.py). One worker per queue hands each message to its key's
lane (keys run concurrently up to `window`, each key in order), acks only after the handler
succeeded, and dead-letters what cannot be processed.

A resizable group (Message DB) can change its queue count at run time: the client follows its
config (see `_follow_config`), binds the queues the group gained and retires the ones it lost,
each after finishing its in-flight work; the broker's generations keep the switch safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING

from lbg.aio import cancel_and_wait, gather_bounded, sleep_to_multiple, until_next
from lbg.broker.base import Broker, BrokerError, Delivery, ParkedEvent, QueueBinding, broker_trouble
from lbg.client.cadence import wait_until
from lbg.client.coordination import (
    DynamicRole,
    GroupCoordinator,
    Role,
    Seat,
    coordinator_for,
)
from lbg.client.lanes import KeyLanes
from lbg.client.parking import REFRESH_SECONDS, HangWatch, KeyParking
from lbg.client.stats import ClientStats
from lbg.handlers import AsyncHandler, Context, Hooks
from lbg.metrics import HANDLER_SECONDS, HANDOVER_SECONDS, LatencySeries
from lbg.model.destinations import EventAddress, OutputKind, output_destination
from lbg.model.group import GroupConfig
from lbg.model.hashing import HashKeyError
from lbg.model.messages import (
    REASON_HEADER,
    Event,
    MalformedMessage,
    dead_letter_headers,
    read_event,
)
from lbg.model.parking import original_headers

if TYPE_CHECKING:
    from lbg.metrics import Family

log = logging.getLogger(__name__)

STANDBY_DELAY = 0.5
CONFIG_CHECK_SECONDS = 2.0
CONFIG_READ_GAP = 0.2
MISROUTED_KEYS_LOGGED = 1000
LEASE_LAPSED = "a delivery came while this member's lease had lapsed"
EARLIER_EVENT_FAILED = "an earlier event of the same key did not complete"
KEY_PARKED = "an earlier event of the key is parked"
# Outcome of running the handler on an event: handled (None), failed for good (why, attempts),
# or not run to its end because the queue was lost meanwhile (LOST).
LOST = ("lost", -1)
# The longest wait between a handler's tries while the broker fails it (broker_trouble).
BROKER_WAIT_CAP = 2.0


class LbgClient:
    """One member of a load-balanced group."""

    def __init__(
        self,
        broker: Broker,
        group: str,
        config: GroupConfig,
        client_id: str,
        handler: AsyncHandler,
        role: Role,
        cycle_seconds: float = 30.0,
        retries: int = 3,
        retry_backoff: float = 0.2,
        window: int = 256,
        hooks: Hooks | None = None,
        park_after_stalls: int = 2,
    ) -> None:
        self._broker = broker
        self._group = group
        self._config = config
        self.client_id = client_id
        self._handler = handler
        self._retries = retries
        self._backoff = retry_backoff
        self._window = window
        self._bindings: dict[int, QueueBinding] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._config_changed = asyncio.Event()
        self._release_requested: set[int] = set()
        self._interrupted: set[int] = set()
        self._stopping = False
        self._busy: dict[object, float] = {}
        self._hooks = hooks or Hooks()
        self._announced: set[int] = set()
        self._misrouted: set[str] = set()
        # Each queue's handler-time series, its labels bound once (looking them up for every
        # event cost more than the observation).
        self._handler_seconds: dict[int, LatencySeries] = {}
        self.stats = ClientStats()
        self._parking = KeyParking(broker, group, client_id)
        self._checked: set[int] = set()
        stall_timeout = role.stall_timeout if isinstance(role, DynamicRole) else None
        self._hangs = HangWatch(self._parking, stall_timeout)
        self._park_after_stalls = park_after_stalls
        seat = Seat(
            broker,
            group,
            client_id,
            self._bindings,
            self._request_release,
            self._oldest_busy,
            lambda _generation: self._config_changed.set(),
        )
        self._coordinator: GroupCoordinator = coordinator_for(
            seat, role, config.queue_count, config.generation, cycle_seconds
        )

    def metric_families(self) -> Iterator[Family]:
        """This client's counters and gauges for a Prometheus scrape."""
        parking = self._parking
        yield from self.stats.families(
            self._group, parking.parked_keys(), parking.parked_events, self._config.queue_count
        )
        yield from self._coordinator.metric_families()

    def _oldest_busy(self) -> float:
        """How long the longest-running handler call has been running (0 when idle)."""
        now = time.monotonic()
        return max((now - started for started in self._busy.values()), default=0.0)

    def _interrupt(self, queue: int) -> None:
        """Wake the queue's worker: it has something to do besides waiting for a message."""
        self._interrupted.add(queue)
        if (binding := self._bindings.get(queue)) is not None:
            binding.interrupt()

    def _request_release(self, queue: int) -> None:
        self._release_requested.add(queue)
        self._interrupt(queue)

    def _on_change(self, queue: int, active: bool) -> None:
        self._interrupt(queue)
        self._coordinator.changed(queue)
        if active:
            self.stats.active.add(queue)
            self.stats.handovers += 1
            self._parking.start_takeover_read(queue)
        else:
            self.stats.active.discard(queue)
            self._checked.discard(queue)
            self._parking.drop_takeover_read(queue)
        log.info(
            "client %s %s queue %d (%s); active on %s",
            self.client_id,
            "now serves" if active else "stopped serving",
            queue,
            self._coordinator.describe(queue),
            sorted(self.stats.active) or "none",
        )

    async def run(self, stop: asyncio.Event) -> ClientStats:
        """Bind every queue and work until `stop` is set, then hand over cleanly."""
        queues, started = range(self._config.queue_count), time.monotonic()
        await gather_bounded(
            self._broker.bind_concurrency, map(partial(self._bind, self._config), queues)
        )
        log.debug(
            "client %s bound %d queues in %.3fs",
            self.client_id,
            len(queues),
            time.monotonic() - started,
        )
        follower = (
            asyncio.create_task(self._follow_config(), name="config-follower")
            if self._broker.resizable
            else None
        )
        unparks = asyncio.create_task(self._follow_unparks(), name="unpark-follower")
        try:
            await self._coordinator.serve(stop)
        finally:
            await cancel_and_wait(unparks)
            if follower is not None:
                await cancel_and_wait(follower)
        self._stopping = True
        for binding in list(self._bindings.values()):
            binding.interrupt()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._parking.drop_takeover_reads()
        for binding in self._bindings.values():
            with contextlib.suppress(Exception):
                await binding.close()
        await self._coordinator.close()
        log.info("client %s stopped after %d messages", self.client_id, self.stats.processed)
        return self.stats

    async def _bind(self, config: GroupConfig, queue: int) -> None:
        """Bind one queue of the group and start its worker (once per queue)."""
        if queue in self._bindings:
            return
        self._bindings[queue] = await self._broker.bind(
            self._group,
            config,
            queue,
            self.client_id,
            preferred=self._coordinator.prefers(queue),
            on_change=self._on_change,
        )
        self._bindings[queue].tell_when_waiting(self._coordinator.stands_ready)
        self._handler_seconds[queue] = HANDLER_SECONDS.labels(self._group, str(queue))
        if self._coordinator.coordinates():
            self._bindings[queue].set_coordinated()
        self._workers.append(
            asyncio.create_task(self._work(self._bindings[queue]), name=f"worker-{queue}")
        )

    async def _follow_config(self) -> None:
        """Read the group's config when a newer generation is heard of (a member's heartbeat,
        cg-admin's control message) and every CONFIG_CHECK_SECONDS anyway; adopt a new size."""
        while True:
            await wait_until(until_next(CONFIG_CHECK_SECONDS), self._config_changed)
            self._config_changed.clear()
            try:
                config = await self._broker.read_group(self._group)
                if config.generation > self._config.generation:
                    await self._resize(config)
            except BrokerError as exc:
                log.warning("client %s: cannot follow the group's config: %s", self.client_id, exc)
            await sleep_to_multiple(CONFIG_READ_GAP)

    async def _follow_unparks(self) -> None:
        """Read the parked keys every REFRESH_SECONDS and, once an operator unparked a key,
        wake the workers of the queues this client serves (the one that owns the key queues
        its replay): workers sleep until something needs them rather than look by themselves.
        A client that serves no queue yet reads nothing (a worker reads the keys when it takes
        its queue over), so an idle member's cost follows the events."""
        while True:
            await sleep_to_multiple(REFRESH_SECONDS)
            if not self._checked:
                continue
            await self._parking.refresh_if_due()
            if self._parking.replays_waiting():
                for queue in list(self._checked):
                    self._interrupt(queue)

    async def _resize(self, config: GroupConfig) -> None:
        """Run the group's new size: bind the queues it gained; retire the ones it lost (their
        workers finish the in-flight work, record it and unbind; see `_work`)."""
        before = self._config.queue_count
        await gather_bounded(
            self._broker.bind_concurrency,
            map(partial(self._bind, config), range(before, config.queue_count)),
        )
        for queue in range(config.queue_count, before):
            if (binding := self._bindings.pop(queue, None)) is not None:
                binding.interrupt()
        self._config = config
        log.info(
            "client %s: group '%s' resized, QC %d -> %d (generation %d)",
            self.client_id,
            self._group,
            before,
            config.queue_count,
            config.generation,
        )
        self._coordinator.adopt(config.generation, config.queue_count)

    def _may_process(self, binding: QueueBinding, delivery: Delivery) -> bool:
        """The binding still owns the delivery and, in dynamic mode, this member's lease holds."""
        return self._coordinator.may_process() and binding.owns(delivery)

    def _retired(self, binding: QueueBinding) -> bool:
        """The group was resized and no longer has this binding's queue."""
        return self._bindings.get(binding.queue) is not binding

    async def _work(self, binding: QueueBinding) -> None:
        lanes = KeyLanes(self._window)
        while not self._stopping and not self._retired(binding):
            woken = binding.queue in self._interrupted
            self._interrupted.discard(binding.queue)
            if binding.queue in self._release_requested:
                self._release_requested.discard(binding.queue)
                if not binding.active:
                    continue
                left = lanes.drop_waiting() if binding.returns_unacked_in_order else 0
                handing = f"client {self.client_id} hands queue {binding.queue} over"
                log.info("%s (%d events left to the next owner)", handing, left)
                started = time.monotonic()
                await lanes.drain()
                log.debug("queue %d: in-flight work done", binding.queue)
                self._parking.forget_unstarted_replays(self._queue_of, binding.queue)
                await self._announce(binding, lanes, active=False)
                await binding.release(STANDBY_DELAY)
                HANDOVER_SECONDS.labels(self._group, str(binding.queue)).observe(
                    time.monotonic() - started - STANDBY_DELAY
                )
                continue
            await self._announce(binding, lanes, binding.active)
            if woken and binding.queue in self._checked:
                await self._start_replays(binding, lanes)
            delivery = binding.ready()
            if delivery is None and binding.queue not in self._interrupted:
                delivery = await binding.next_or_interrupted()
            if delivery is None:
                continue
            if not self._may_process(binding, delivery):
                self._give_back(binding, delivery, LEASE_LAPSED)
                continue
            await self._announce(binding, lanes, active=True)
            if binding.queue not in self._checked:
                if not await self._read_parked_keys(binding, delivery):
                    continue
                log.debug("queue %d: parked keys read", binding.queue)
                await self._start_replays(binding, lanes)
            try:
                address = self._broker.event_address(delivery.subject)
                event = read_event(address.key, delivery.body, delivery.headers)
            except MalformedMessage as exc:
                await lanes.submit(
                    "", partial(self._reject, binding, delivery, f"malformed message: {exc}", None)
                )
                continue
            await lanes.submit(
                event.key,
                partial(self._process, binding, delivery, event, self._bucket_of(address)),
                partial(self._give_back, binding, delivery, EARLIER_EVENT_FAILED),
            )
        await lanes.drain()
        await self._announce(binding, lanes, active=False)
        if self._retired(binding):
            log.info(
                "client %s retires queue %d (the group was resized)", self.client_id, binding.queue
            )
            await binding.close()

    async def _read_parked_keys(self, binding: QueueBinding, delivery: Delivery) -> bool:
        """Read the parked keys on taking a queue over, before its first event is processed
        (a key parked by the previous owner stays parked); if they cannot be read, give the
        delivery back."""
        try:
            await self._parking.takeover_read(binding.queue)
        except BrokerError as exc:
            log.error("queue %d: cannot read the parked keys: %s", binding.queue, exc)
            await asyncio.sleep(self._backoff)
            self._give_back(binding, delivery, "the parked keys could not be read")
            return False
        self._checked.add(binding.queue)
        return True

    async def _start_replays(self, binding: QueueBinding, lanes: KeyLanes) -> None:
        """Queue the replay of each key of this queue an operator unparked, in the key's lane
        (its new events wait behind the replay). Run on taking the queue over and when the
        unpark follower (which reads the registry) wakes the worker, not for every event."""
        for key in self._parking.replays_due(lambda key: self._queue_of(key) == binding.queue):
            await lanes.submit(key, partial(self._replay, binding, key))

    def _queue_of(self, key: str) -> int | None:
        try:
            return self._config.queue_for_key(key)
        except HashKeyError:
            return None

    async def _announce(self, binding: QueueBinding, lanes: KeyLanes, active: bool) -> None:
        """Call on_assigned / on_revoked when this worker's ownership of its queue changes."""
        queue = binding.queue
        if active == (queue in self._announced):
            return
        if active:
            self._announced.add(queue)
            hook = self._hooks.on_assigned
        else:
            await lanes.drain()
            self._announced.discard(queue)
            hook = self._hooks.on_revoked
        if hook is not None:
            try:
                await hook([queue])
            except Exception as exc:
                log.warning("queue %d: %s hook failed: %r", queue, hook.__name__, exc)

    def _bucket_of(self, address: EventAddress) -> int:
        """The bucket the event was published to; a bucket that is not the group's hash of the
        key (a producer hashing differently) is counted, and logged once per key."""
        try:
            expected = self._config.bucket_for_key(address.key)
        except HashKeyError:
            expected = None
        if address.bucket is None and expected is not None:
            return expected
        if address.bucket != expected:
            self.stats.wrong_bucket += 1
            if len(self._misrouted) < MISROUTED_KEYS_LOGGED and address.key not in self._misrouted:
                self._misrouted.add(address.key)
                log.warning(
                    "key %r came in bucket %s, but the group's %s hash puts it in %s: its "
                    "producer hashes differently (processed in order anyway)",
                    address.key[:80],
                    address.bucket,
                    self._config.hash_function,
                    expected,
                )
        return address.bucket if address.bucket is not None else 0

    async def _reject(
        self, binding: QueueBinding, delivery: Delivery, reason: str, key: str | None
    ) -> bool:
        """Dead-letter a message that cannot be processed, then ack it."""
        if await self._dead_letter(binding, delivery, reason, key):
            return await self._complete(binding, delivery)
        return self._abandon(binding)

    async def _process(
        self, binding: QueueBinding, delivery: Delivery, event: Event, bucket: int
    ) -> bool:
        """Run the handler (with retries, then park the key) and ack; False if not completed.
        An event of a parked key is parked behind the key's others without being handled."""
        if self._parking.is_parked(event.key):
            return await self._park(binding, delivery, event, KEY_PARKED, 0)
        suspect = self._parking.suspects(event.key)
        if suspect is not None and suspect.stalls >= self._park_after_stalls:
            reason = f"handler hung past the stall timeout {suspect.stalls} times"
            return await self._park(binding, delivery, event, reason, 0)
        context = Context(
            group=self._group,
            client=self.client_id,
            queue=binding.queue,
            bucket=bucket,
            redelivered=delivery.redelivered,
            broker=self._broker,
            epoch=delivery.owner_epoch,
        )
        failed = await self._handle(event, context, partial(self._may_process, binding, delivery))
        if failed is LOST:
            self._give_back(binding, delivery, LEASE_LAPSED)
            return False
        if failed is not None:
            reason, attempts = failed
            if self._parking.enabled:
                return await self._park(binding, delivery, event, reason, attempts)
            return await self._reject(binding, delivery, reason, event.key)
        if suspect is not None:
            with contextlib.suppress(BrokerError):
                await self._parking.handled(event.key)
        return await self._complete(binding, delivery)

    async def _handle(
        self, event: Event, context: Context, still_ours: Callable[[], bool]
    ) -> tuple[str, int] | None:
        """Run the handler on an event with retries: None once handled, (why, attempts) if
        it failed for good or hung too often, LOST if `still_ours` stopped holding first.
        A broker error out of the handler (its publish not confirmed while a stream leader is
        elected) is the broker's, not the event's: it is retried without using an attempt."""
        attempt, waits = 1, 0
        while True:
            if not still_ours():
                return LOST
            token = object()
            started = self._busy[token] = time.monotonic()
            watched = self._hangs.watch(event.key, self._park_after_stalls, started)
            try:
                await self._handler(event, context)
                self._handler_seconds[context.queue].observe(time.monotonic() - started)
                return None
            except asyncio.CancelledError:
                hung = self._hangs.hung()
                if hung is None:
                    raise
                return hung, attempt
            except Exception as exc:
                self.stats.handler_errors += 1
                if broker_trouble(exc):
                    waits += 1
                    log.warning(
                        "queue %d: the broker failed the handler on key %r seq %s (%r): retrying",
                        context.queue,
                        event.key[:80],
                        event.seq,
                        exc,
                    )
                    await asyncio.sleep(min(BROKER_WAIT_CAP, self._backoff * 2 ** min(waits, 8)))
                    continue
                if attempt > self._retries:
                    return f"handler failed {attempt} times: {exc!r}", attempt
                log.warning(
                    "queue %d: handler failed on key %r seq %s (attempt %d): %r",
                    context.queue,
                    event.key[:80],
                    event.seq,
                    attempt,
                    exc,
                )
                await asyncio.sleep(self._backoff * 2 ** (attempt - 1))
                attempt += 1
            finally:
                del self._busy[token]
                self._hangs.done(watched)

    async def _park(
        self, binding: QueueBinding, delivery: Delivery, event: Event, reason: str, attempts: int
    ) -> bool:
        """Park the key (in the registry) and the event (in the lot), then ack it."""
        if not self._may_process(binding, delivery):
            self._give_back(binding, delivery, LEASE_LAPSED)
            return False
        try:
            await self._parking.park(
                event.key,
                delivery.body,
                dict(delivery.headers),
                delivery.redelivered,
                reason,
                attempts,
                subject=delivery.subject,
                queue=str(binding.queue),
            )
        except BrokerError as exc:
            log.error("queue %d: cannot park key %r (%s)", binding.queue, event.key[:80], exc)
            await asyncio.sleep(self._backoff)
            return self._abandon(binding)
        return await self._complete(binding, delivery)

    async def _replay(self, binding: QueueBinding, key: str) -> bool:
        """Replay a key an operator unparked (in its lane); False if it stopped short."""
        bucket = self._config.bucket_for_key(key)
        context = Context(self._group, self.client_id, binding.queue, bucket, True, self._broker)

        def still_ours() -> bool:
            return binding.active and self._coordinator.may_process()

        async def run(parked: ParkedEvent) -> tuple[str, int] | None:
            headers = original_headers(parked.headers)
            event = read_event(key, parked.body, headers)
            failed = await self._handle(event, context, still_ours)
            if failed is LOST:
                raise BrokerError(f"queue {binding.queue} lost during the replay of {key!r}")
            return failed

        try:
            await self._parking.replay(key, run)
        except (BrokerError, MalformedMessage) as exc:
            log.error("queue %d: replay of key %r stopped: %s", binding.queue, key[:80], exc)
            return self._abandon(binding)
        return True

    async def _complete(self, binding: QueueBinding, delivery: Delivery) -> bool:
        if not self._may_process(binding, delivery):
            self._give_back(binding, delivery, LEASE_LAPSED)
            return False
        if await binding.ack(delivery):
            self.stats.processed += 1
            return True
        self.stats.fenced += 1
        return False

    def _give_back(self, binding: QueueBinding, delivery: Delivery, reason: str) -> None:
        """A delivery that is not processed (or not acked) now: if the queue is still ours,
        give it up, so the broker redelivers this delivery and the ones after it in order.
        Else it would sit unacked while later events of its key went ahead (a reorder)."""
        self.stats.fenced += 1
        if binding.owns(delivery):
            binding.fence(reason)

    def _abandon(self, binding: QueueBinding) -> bool:
        """A message could not be completed: give the queue up so it comes back in order."""
        if binding.active:
            binding.fence("a message could not be completed")
        return False

    async def _dead_letter(
        self, binding: QueueBinding, delivery: Delivery, reason: str, key: str | None
    ) -> bool:
        """Park a message, its body and headers as they came, with the reason and its key on
        the dead-letter destination; True once confirmed."""
        if not binding.owns(delivery):
            return False
        headers = dead_letter_headers(
            delivery.headers,
            reason,
            delivery.subject,
            key,
            client=self.client_id,
            queue=str(binding.queue),
            dead_at=f"{time.time():.3f}",
        )
        try:
            await self._broker.publish(
                output_destination(self._group, OutputKind.DEAD), delivery.body, headers
            )
        except BrokerError as exc:
            log.error(
                "queue %d: cannot dead-letter (%s); will retry on redelivery", binding.queue, exc
            )
            await asyncio.sleep(self._backoff)
            return False
        self.stats.dead_lettered += 1
        log.warning("queue %d: dead-lettered a message: %s", binding.queue, headers[REASON_HEADER])
        return True
