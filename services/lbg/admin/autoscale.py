"""`lbg autoscale`'s loop: poll a group's consumer lag through the broker interface, decide
with the pure rule (lbg.model.autoscale), and hand the count on: to a local stack, to a file,
and to Prometheus (`lbg_autoscale_desired_clients`, for KEDA or any external scaler)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from lbg.broker.base import Broker, QueueStatus
from lbg.metrics import gauge
from lbg.model.autoscale import (
    AutoscalePolicy,
    Decision,
    Lag,
    QueueLag,
    ScalerState,
    active_clients,
    group_lag,
    step,
)
from lbg.model.group import GroupConfig

if TYPE_CHECKING:
    from lbg.metrics import Family

log = logging.getLogger(__name__)

Scale = Callable[[int], Awaitable[None]]
Count = Callable[[], int]


def queue_lags(statuses: Iterable[QueueStatus]) -> dict[int, QueueLag]:
    """Each queue's lag: what waits plus what a busy client pulled and has not acked."""
    return {s.queue: QueueLag(s.backlog + s.in_flight, s.oldest_age) for s in statuses}


def write_count(path: Path, count: int) -> None:
    """Replace the file's content with the count (atomically: a reader never sees half)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(f"{count}\n")
    temporary.replace(path)


class Autoscaler:
    """Polls one group's lag and keeps the client count where the policy wants it."""

    def __init__(
        self,
        broker: Broker,
        group: str,
        config: GroupConfig,
        policy: AutoscalePolicy,
        count: Count | None = None,
        scale: Scale | None = None,
        desired_file: Path | None = None,
    ) -> None:
        self.broker, self.group, self.config, self.policy = broker, group, config, policy
        self._count, self._scale, self._desired_file = count, scale, desired_file
        self.state = ScalerState()
        self.lag = Lag()
        self.clients = 0
        self.desired: int | None = None
        self._since: dict[int, float] = {}
        self._noted: tuple[int, str] | None = None

    async def read_lag(self) -> tuple[Lag, int]:
        """The group's lag now, and the running clients (the broker's owners if no counter)."""
        statuses = await self.broker.queue_status(self.group, self.config)
        self.lag, self._since = group_lag(queue_lags(statuses), self._since, time.monotonic())
        running = (
            self._count() if self._count else active_clients(s.active_client for s in statuses)
        )
        return self.lag, running

    async def poll(self) -> Decision:
        """Read the lag, decide, log what changed or what holds a change back, and act. When
        only reporting, the count asked for last stands for the running one (the external
        scaler gets there), so the cool-down and the calm apply to what it was told."""
        lag, running = await self.read_lag()
        reporting = self._scale is None and self.desired is not None
        self.clients = self.desired if reporting and self.desired is not None else running
        self.state, decision = step(self.policy, self.state, self.clients, lag, time.monotonic())
        log.debug("autoscale: %d clients, %s", self.clients, decision.reason)
        if decision.held is not None:
            note = (decision.wanted, decision.held.partition(":")[0])
            if note != self._noted:
                log.info(
                    "autoscale: %d clients, wants %d (%s); held back by the %s",
                    self.clients, decision.wanted, decision.reason, decision.held,
                )  # fmt: skip
            self._noted = note
        else:
            self._noted = None
        if decision.clients != self.clients:
            log.info(
                "autoscale: %d -> %d clients (%s)", self.clients, decision.clients, decision.reason
            )
            if self._scale is not None:
                await self._scale(decision.clients)
        if decision.clients != self.desired:
            self.desired = decision.clients
            if self._desired_file is not None:
                write_count(self._desired_file, decision.clients)
        return decision

    def ready(self) -> bool:
        """Whether a first poll has set the desired count (for /readyz)."""
        return self.desired is not None

    async def run(self, stop: asyncio.Event, interval: float = 1.0) -> None:
        """Poll every `interval` seconds until `stop` is set."""
        log.info(
            "autoscale group '%s': %d-%d clients; add above %g events/client or %g s, remove "
            "below %g and %g s after %g s of calm; %g s cool-down",
            self.group, self.policy.minimum, self.policy.maximum, self.policy.high,
            self.policy.high_age, self.policy.low, self.policy.low_age, self.policy.calm,
            self.policy.cooldown,
        )  # fmt: skip
        while not stop.is_set():
            await self.poll()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    def families(self) -> list[Family]:
        """The desired count and the lag it came from, for Prometheus (a KEDA trigger)."""
        return [
            gauge("lbg_autoscale_desired_clients", "Clients the autoscaler wants running.",
                  self.group, self.desired if self.desired is not None else self.clients),
            gauge("lbg_autoscale_clients", "Clients running at the last poll.",
                  self.group, self.clients),
            gauge("lbg_group_backlog_events", "Events waiting or unacked, all queues.",
                  self.group, self.lag.backlog),
            gauge("lbg_group_oldest_unprocessed_seconds",
                  "Age of the oldest event waiting or unacked.", self.group, self.lag.oldest_age),
        ]  # fmt: skip
