"""The LBG client: binds every queue of its group and processes what the broker makes it active for.

Dynamic mode (no index or count) joins by itself: see coordinator.py. Static mode is the
original design: `client_index` and `client_count` mark its primary
queues (q mod count == index); every `cycle_seconds` it releases the secondary queues it is
active on, so primaries reclaim them. One worker per queue hands each message to its key's
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial

from prometheus_client import Histogram

from lbg.aio import cancel_and_wait
from lbg.assignment import is_primary
from lbg.broker.base import Broker, BrokerError, Delivery, QueueBinding
from lbg.coordinator import Coordinator
from lbg.destinations import EventAddress, OutputKind, output_destination
from lbg.group import GroupConfig
from lbg.handlers import AsyncHandler, Context, Hooks
from lbg.hashing import HashKeyError
from lbg.lanes import KeyLanes
from lbg.messages import (
    REASON_HEADER,
    Event,
    MalformedMessage,
    dead_letter_headers,
    read_event,
)
from lbg.metrics import HANDLER_SECONDS, HANDOVER_SECONDS, Family, counter, gauge

log = logging.getLogger(__name__)

POLL_SECONDS = 0.2
STANDBY_DELAY = 0.5
CONFIG_CHECK_SECONDS = 2.0
CONFIG_READ_GAP = 0.2
MISROUTED_KEYS_LOGGED = 1000
LEASE_LAPSED = "a delivery came while this member's lease had lapsed"
EARLIER_EVENT_FAILED = "an earlier event of the same key did not complete"


@dataclass(frozen=True)
class StaticRole:
    """The original design's fixed place in the group: this client's index among `count`."""

    index: int
    count: int

    def is_primary(self, queue: int) -> bool:
        return is_primary(queue, self.index, self.count)


@dataclass
class ClientStats:
    """Counters of one client's run."""

    processed: int = 0
    dead_lettered: int = 0
    handler_errors: int = 0
    fenced: int = 0
    handovers: int = 0
    wrong_bucket: int = 0
    active: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class DynamicRole:
    """Dynamic membership: heartbeats with a lease, no index or count (see coordinator).
    The member fences `lease_margin` before its lease ends, its peers evict that much after
    (see lease.py)."""

    heartbeat_interval: float = 0.15
    lease: float = 0.7
    stall_timeout: float = 30.0
    leave_timeout: float = 5.0
    lease_margin: float = 0.15


Role = StaticRole | DynamicRole


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
    ) -> None:
        self._broker = broker
        self._group = group
        self._config = config
        self.client_id = client_id
        self._handler = handler
        self._role = role
        self._cycle = cycle_seconds
        self._retries = retries
        self._backoff = retry_backoff
        self._window = window
        self._bindings: dict[int, QueueBinding] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._config_changed = asyncio.Event()
        self._release_requested: set[int] = set()
        self._stopping = False
        self._coordinator: Coordinator | None = None
        self._busy: dict[object, float] = {}
        self._hooks = hooks or Hooks()
        self._announced: set[int] = set()
        self._misrouted: set[str] = set()
        self._handler_seconds: dict[int, Histogram] = {}
        self.stats = ClientStats()

    def metric_families(self) -> Iterator[Family]:
        """This client's counters and gauges for a Prometheus scrape."""
        g, s = self._group, self.stats
        yield counter("lbg_client_processed", "Messages handled and acked.", g, s.processed)
        yield counter("lbg_client_dead_lettered", "Messages dead-lettered.", g, s.dead_lettered)
        yield counter("lbg_client_handler_errors", "Failed handler attempts.", g, s.handler_errors)
        yield counter("lbg_client_fenced", "Deliveries dropped: ownership lost first.", g, s.fenced)
        yield counter(
            "lbg_client_handovers", "Queues this client became active on.", g, s.handovers
        )
        yield counter(
            "lbg_client_wrong_bucket",
            "Events whose topic's bucket is not the group's hash of their key.",
            g,
            s.wrong_bucket,
        )
        yield gauge("lbg_client_queues_active", "Queues this client serves now.", g, len(s.active))
        yield gauge(
            "lbg_group_queues",
            "The group's queue count (QC) this client runs.",
            g,
            self._config.queue_count,
        )
        if self._coordinator is not None:
            members = len(self._coordinator.view.members()) + 1
            yield gauge("lbg_group_members", "Members in this client's view.", g, members)
            yield gauge(
                "lbg_client_heartbeat_echo_seconds",
                "How long this member's newest heartbeat took to come back through the broker.",
                g,
                self._coordinator.own_lease.echo_delay,
            )

    def _preferred(self, queue: int) -> bool:
        return isinstance(self._role, StaticRole) and self._role.is_primary(queue)

    def _on_change(self, queue: int, active: bool) -> None:
        if active:
            self.stats.active.add(queue)
            self.stats.handovers += 1
        else:
            self.stats.active.discard(queue)
        if isinstance(self._role, StaticRole):
            how = "primary" if self._role.is_primary(queue) else "secondary"
        else:
            how = "dynamic"
        log.info(
            "client %s %s queue %d (%s); active on %s",
            self.client_id,
            "now serves" if active else "stopped serving",
            queue,
            how,
            sorted(self.stats.active) or "none",
        )

    async def run(self, stop: asyncio.Event) -> ClientStats:
        """Bind every queue and work until `stop` is set, then hand over cleanly."""
        for queue in range(self._config.queue_count):
            await self._bind(self._config, queue)
        follower = (
            asyncio.create_task(self._follow_config(), name="config-follower")
            if self._broker.resizable
            else None
        )
        try:
            if isinstance(self._role, StaticRole):
                await self._run_static(stop)
            else:
                await self._run_dynamic(stop, self._role)
        finally:
            if follower is not None:
                await cancel_and_wait(follower)
        self._stopping = True
        await asyncio.gather(*self._workers, return_exceptions=True)
        for binding in self._bindings.values():
            with contextlib.suppress(Exception):
                await binding.close()
        if self._coordinator is not None:
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
            preferred=self._preferred(queue),
            on_change=self._on_change,
        )
        self._workers.append(
            asyncio.create_task(self._work(self._bindings[queue]), name=f"worker-{queue}")
        )

    async def _follow_config(self) -> None:
        """Read the group's config when a newer generation is heard of (a member's heartbeat,
        cg-admin's control message) and every CONFIG_CHECK_SECONDS anyway; adopt a new size."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._config_changed.wait(), CONFIG_CHECK_SECONDS)
            self._config_changed.clear()
            try:
                config = await self._broker.read_group(self._group)
                if config.generation > self._config.generation:
                    await self._resize(config)
            except BrokerError as exc:
                log.warning("client %s: cannot follow the group's config: %s", self.client_id, exc)
            await asyncio.sleep(CONFIG_READ_GAP)

    async def _resize(self, config: GroupConfig) -> None:
        """Run the group's new size: bind the queues it gained; retire the ones it lost (their
        workers finish the in-flight work, record it and unbind; see `_work`)."""
        before = self._config.queue_count
        for queue in range(before, config.queue_count):
            await self._bind(config, queue)
        for queue in range(config.queue_count, before):
            self._bindings.pop(queue, None)
        self._config = config
        log.info(
            "client %s: group '%s' resized, QC %d -> %d (generation %d)",
            self.client_id,
            self._group,
            before,
            config.queue_count,
            config.generation,
        )
        if self._coordinator is not None:
            self._coordinator.adopt(config.generation, config.queue_count)

    async def _run_static(self, stop: asyncio.Event) -> None:
        primaries = [q for q in range(self._config.queue_count) if self._preferred(q)]
        log.info(
            "client %s bound %d queues of group '%s' (static); primary queues %s",
            self.client_id,
            len(self._bindings),
            self._group,
            primaries or "none",
        )
        cycler = asyncio.create_task(self._cycle_secondaries())
        await stop.wait()
        log.info("client %s stopping: finishing in-flight work", self.client_id)
        await cancel_and_wait(cycler)

    async def _run_dynamic(self, stop: asyncio.Event, role: DynamicRole) -> None:
        coordinator = Coordinator(
            self._broker,
            self._group,
            self.client_id,
            self._bindings,
            self._release_requested.add,
            interval=role.heartbeat_interval,
            lease=role.lease,
            margin=role.lease_margin,
            queue_count=self._config.queue_count,
            generation=self._config.generation,
            on_newer_generation=lambda _generation: self._config_changed.set(),
        )
        self._coordinator = coordinator
        await coordinator.join()
        heartbeats = asyncio.Event()
        beating = asyncio.create_task(coordinator.run(heartbeats), name="heartbeat")
        watchdog = asyncio.create_task(
            self._watch_for_stalls(coordinator, role), name="stall-watchdog"
        )
        await _until_stopped_or_failed(stop, beating, watchdog)
        log.info("client %s leaving: handing its queues over", self.client_id)
        await coordinator.leave()
        deadline = time.monotonic() + role.leave_timeout
        while any(b.active for b in self._bindings.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await cancel_and_wait(watchdog)
        heartbeats.set()
        await beating

    async def _watch_for_stalls(self, coordinator: Coordinator, role: DynamicRole) -> None:
        """A handler hung past the stall timeout makes this member give its queues up."""
        while True:
            await asyncio.sleep(coordinator.interval)
            now = time.monotonic()
            oldest = max((now - started for started in self._busy.values()), default=0.0)
            coordinator.set_stalled(oldest > role.stall_timeout)

    def _may_process(self, binding: QueueBinding, delivery: Delivery) -> bool:
        """The binding still owns the delivery and, in dynamic mode, this member's lease holds."""
        if self._coordinator is not None and not self._coordinator.lease_ok():
            return False
        return binding.owns(delivery)

    async def _cycle_secondaries(self) -> None:
        """The original's periodic release of secondary bindings so primaries can reclaim them."""
        while True:
            await asyncio.sleep(self._cycle)
            for binding in list(self._bindings.values()):
                if binding.active and not self._preferred(binding.queue):
                    self._release_requested.add(binding.queue)

    def _retired(self, binding: QueueBinding) -> bool:
        """The group was resized and no longer has this binding's queue."""
        return self._bindings.get(binding.queue) is not binding

    async def _work(self, binding: QueueBinding) -> None:
        lanes = KeyLanes(self._window)
        while not self._stopping and not self._retired(binding):
            if binding.queue in self._release_requested:
                self._release_requested.discard(binding.queue)
                if not binding.active:
                    continue
                log.info("client %s hands queue %d over", self.client_id, binding.queue)
                started = time.monotonic()
                await lanes.drain()
                await self._announce(binding, lanes, active=False)
                await binding.release(STANDBY_DELAY)
                HANDOVER_SECONDS.labels(self._group, str(binding.queue)).observe(
                    time.monotonic() - started - STANDBY_DELAY
                )
                continue
            await self._announce(binding, lanes, binding.active)
            delivery = binding.ready() or await _next_within(binding, POLL_SECONDS)
            if delivery is None:
                continue
            if not self._may_process(binding, delivery):
                self._give_back(binding, delivery, LEASE_LAPSED)
                continue
            await self._announce(binding, lanes, active=True)
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
        """Run the handler (with retries, then dead-letter) and ack; False if not completed."""
        context = Context(
            group=self._group,
            client=self.client_id,
            queue=binding.queue,
            bucket=bucket,
            redelivered=delivery.redelivered,
            broker=self._broker,
            epoch=delivery.owner_epoch,
        )
        for attempt in range(1, self._retries + 2):
            if not self._may_process(binding, delivery):
                self._give_back(binding, delivery, LEASE_LAPSED)
                return False
            token = object()
            started = self._busy[token] = time.monotonic()
            try:
                await self._handler(event, context)
                self._handler_timer(binding.queue).observe(time.monotonic() - started)
                break
            except Exception as exc:
                self.stats.handler_errors += 1
                if attempt > self._retries:
                    return await self._reject(
                        binding, delivery, f"handler failed {attempt} times: {exc!r}", event.key
                    )
                log.warning(
                    "queue %d: handler failed on key %r seq %s (attempt %d): %r",
                    binding.queue,
                    event.key[:80],
                    event.seq,
                    attempt,
                    exc,
                )
                await asyncio.sleep(self._backoff * 2 ** (attempt - 1))
            finally:
                del self._busy[token]
        return await self._complete(binding, delivery)

    async def _complete(self, binding: QueueBinding, delivery: Delivery) -> bool:
        if not self._may_process(binding, delivery):
            self._give_back(binding, delivery, LEASE_LAPSED)
            return False
        if await binding.ack(delivery):
            self.stats.processed += 1
            return True
        self.stats.fenced += 1
        return False

    def _handler_timer(self, queue: int) -> Histogram:
        """The queue's handler-time histogram, its labels bound once (looking them up for
        every event cost more than the observation)."""
        timer = self._handler_seconds.get(queue)
        if timer is None:
            timer = self._handler_seconds[queue] = HANDLER_SECONDS.labels(self._group, str(queue))
        return timer

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


async def _next_within(binding: QueueBinding, seconds: float) -> Delivery | None:
    """The binding's next delivery, or None if none came within `seconds`."""
    try:
        async with asyncio.timeout(seconds):
            return await binding.next()
    except TimeoutError:
        return None


async def _until_stopped_or_failed(stop: asyncio.Event, *loops: asyncio.Task[None]) -> None:
    """Wait for `stop`; if a loop the member depends on ends first, raise its error, so the
    process exits and its connection (with every queue it holds) goes, rather than live on
    holding queues it no longer serves."""
    stopping = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({stopping, *loops}, return_when=asyncio.FIRST_COMPLETED)
    if stopping in done:
        return
    await cancel_and_wait(stopping)
    failed = done.pop()
    reason = failed.exception() if not failed.cancelled() else "cancelled"
    raise BrokerError(f"membership loop {failed.get_name()} ended: {reason!r}")
