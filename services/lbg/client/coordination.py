"""One seam between the client and how it learns which queues to serve: a static or a dynamic
coordinator behind one small interface, chosen once when the client starts (as aiokafka picks
`NoGroupCoordinator` or `GroupCoordinator`), so the client never asks which mode it runs in.

Static mode is the original design: `client_index` and `client_count` mark the primary queues
(q mod count == index); every `cycle_seconds` the client releases the secondary queues it is
active on, so primaries reclaim them. Dynamic mode joins by itself: see coordinator.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from lbg.aio import cancel_and_wait
from lbg.broker.base import Broker, BrokerError, QueueBinding
from lbg.client.coordinator import Coordinator
from lbg.client.steering import BindingSteering
from lbg.metrics import gauge
from lbg.model.assignment import is_primary
from lbg.model.timing import DEFAULT_TIMING

if TYPE_CHECKING:
    from lbg.metrics import Family

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StaticRole:
    """The original design's fixed place in the group: this client's index among `count`."""

    index: int
    count: int

    def is_primary(self, queue: int) -> bool:
        return is_primary(queue, self.index, self.count)


@dataclass(frozen=True)
class DynamicRole:
    """Dynamic membership: heartbeats with a lease, no index or count (see coordinator).
    The member fences `lease_margin` before its lease ends, its peers evict that much after
    (see model/lease.py)."""

    heartbeat_interval: float = DEFAULT_TIMING.interval
    lease: float = DEFAULT_TIMING.lease
    stall_timeout: float = 30.0
    leave_timeout: float = 5.0
    lease_margin: float = DEFAULT_TIMING.margin


Role = StaticRole | DynamicRole


@dataclass(frozen=True)
class Seat:
    """What a coordinator needs of its client: the group, the client's live bindings (read to
    steer them), how to ask its worker to hand a queue over, and how long its oldest handler
    call has been running."""

    broker: Broker
    group: str
    client_id: str
    bindings: Mapping[int, QueueBinding]
    request_release: Callable[[int], None]
    oldest_busy: Callable[[], float]
    on_newer_generation: Callable[[int], None]


class GroupCoordinator(Protocol):
    """What the client asks of its coordinator, whichever mode it runs."""

    def prefers(self, queue: int) -> bool:
        """Whether this client binds `queue` as its preferred standby from the start."""
        ...

    def coordinates(self) -> bool:
        """Whether some live member is always made preferred for every queue (the bindings'
        set_coordinated)."""
        ...

    def describe(self, queue: int) -> str:
        """How this client holds `queue`, for its log lines (primary, secondary, dynamic)."""
        ...

    def may_process(self) -> bool:
        """Whether the member as a whole may process and ack now (its lease holds)."""
        ...

    def changed(self, queue: int) -> None:
        """The queue's binding became active or stopped being so."""
        ...

    def stands_ready(self, queue: int) -> None:
        """The queue's binding started to wait for it (QueueBinding.tell_when_waiting)."""
        ...

    async def serve(self, stop: asyncio.Event) -> None:
        """Steer the bindings until `stop` is set, then start handing the queues over."""
        ...

    def adopt(self, generation: int, queue_count: int) -> None:
        """The group was resized: run the new queue count from now on."""
        ...

    async def close(self) -> None:
        """Release what the coordinator holds at the broker (its control subscription)."""
        ...

    def metric_families(self) -> Iterator[Family]:
        """The coordinator's own gauges for a Prometheus scrape."""
        ...


class StaticCoordinator:
    """Fixed primaries; secondaries are released every `cycle_seconds` to their primaries."""

    def __init__(self, seat: Seat, role: StaticRole, queue_count: int, cycle_seconds: float):
        self._seat = seat
        self._role = role
        self._queue_count = queue_count
        self._cycle = cycle_seconds

    def prefers(self, queue: int) -> bool:
        return self._role.is_primary(queue)

    def coordinates(self) -> bool:
        return False  # a secondary takes a dead primary's idle queue by looking

    def describe(self, queue: int) -> str:
        return "primary" if self._role.is_primary(queue) else "secondary"

    def may_process(self) -> bool:
        return True

    def changed(self, queue: int) -> None:
        return None

    def stands_ready(self, queue: int) -> None:
        return None  # a secondary takes a released queue by looking; nobody is told

    async def serve(self, stop: asyncio.Event) -> None:
        seat = self._seat
        primaries = [q for q in range(self._queue_count) if self.prefers(q)]
        log.info(
            "client %s bound %d queues of group '%s' (static); primary queues %s",
            seat.client_id,
            len(seat.bindings),
            seat.group,
            primaries or "none",
        )
        cycler = asyncio.create_task(self._cycle_secondaries(), name="secondary-cycle")
        await stop.wait()
        log.info("client %s stopping: finishing in-flight work", seat.client_id)
        await cancel_and_wait(cycler)

    async def _cycle_secondaries(self) -> None:
        """The original's periodic release of secondary bindings so primaries can reclaim them."""
        while True:
            await asyncio.sleep(self._cycle)
            for binding in list(self._seat.bindings.values()):
                if binding.active and not self.prefers(binding.queue):
                    self._seat.request_release(binding.queue)

    def adopt(self, generation: int, queue_count: int) -> None:
        self._queue_count = queue_count

    async def close(self) -> None:
        return None

    def metric_families(self) -> Iterator[Family]:
        return iter(())


class DynamicCoordinator:
    """Membership by heartbeats and a lease (coordinator.py), plus what the member does around
    it: the stall watchdog, and the planned leave that waits for its queues to move."""

    def __init__(self, seat: Seat, role: DynamicRole, queue_count: int, generation: int) -> None:
        self._seat = seat
        self._role = role
        self._steering = BindingSteering(seat.bindings, seat.request_release)
        self.membership = Coordinator(
            seat.broker,
            seat.group,
            seat.client_id,
            self._steering,
            interval=role.heartbeat_interval,
            lease=role.lease,
            margin=role.lease_margin,
            queue_count=queue_count,
            generation=generation,
            on_newer_generation=seat.on_newer_generation,
            standbys=seat.broker.line_takes_over,
        )

    def prefers(self, queue: int) -> bool:
        return False

    def coordinates(self) -> bool:
        return True

    def describe(self, queue: int) -> str:
        return "dynamic"

    def may_process(self) -> bool:
        return self.membership.lease_ok()

    def changed(self, queue: int) -> None:
        self._steering.changed(queue)

    def stands_ready(self, queue: int) -> None:
        self.membership.stands_ready(queue)

    async def serve(self, stop: asyncio.Event) -> None:
        membership, role = self.membership, self._role
        await membership.join()
        heartbeats = asyncio.Event()
        beating = asyncio.create_task(membership.run(heartbeats), name="heartbeat")
        watchdog = asyncio.create_task(self._watch_for_stalls(), name="stall-watchdog")
        try:
            await _until_stopped_or_failed(stop, beating, watchdog)
            log.info("client %s leaving: handing its queues over", self._seat.client_id)
            await membership.leave()
            deadline = time.monotonic() + role.leave_timeout
            while self._any_active() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            await cancel_and_wait(watchdog)
            heartbeats.set()
            await asyncio.gather(beating, return_exceptions=True)

    def _any_active(self) -> bool:
        return any(binding.active for binding in self._seat.bindings.values())

    async def _watch_for_stalls(self) -> None:
        """A handler hung past the stall timeout makes this member give its queues up. It
        looks when the oldest call running could first pass the timeout (a call started
        since is younger), and every heartbeat interval while stalled or about to be."""
        interval = self.membership.interval
        while True:
            oldest = self._seat.oldest_busy()
            self.membership.set_stalled(oldest > self._role.stall_timeout)
            await asyncio.sleep(max(interval, self._role.stall_timeout - oldest))

    def adopt(self, generation: int, queue_count: int) -> None:
        self.membership.adopt(generation, queue_count)

    async def close(self) -> None:
        await self.membership.close()

    def metric_families(self) -> Iterator[Family]:
        group, membership = self._seat.group, self.membership
        members = len(membership.view.members()) + 1
        yield gauge("lbg_group_members", "Members in this client's view.", group, members)
        yield gauge(
            "lbg_client_heartbeat_echo_seconds",
            "How long this member's newest heartbeat took to come back through the broker.",
            group,
            membership.own_lease.echo_delay,
        )


def coordinator_for(
    seat: Seat, role: Role, queue_count: int, generation: int, cycle_seconds: float
) -> GroupCoordinator:
    """The coordinator of `role`'s mode; the only place that asks which mode it is."""
    if isinstance(role, StaticRole):
        return StaticCoordinator(seat, role, queue_count, cycle_seconds)
    return DynamicCoordinator(seat, role, queue_count, generation)


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
