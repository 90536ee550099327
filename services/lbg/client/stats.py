"""What one client counts over its run, and how it shows it to a Prometheus scrape."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lbg.metrics import counter, gauge

if TYPE_CHECKING:
    from lbg.metrics import Family


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

    def families(
        self, group: str, parked_keys: int, parked_events: int, queue_count: int
    ) -> Iterator[Family]:
        """The counters and gauges, with the parking figures and the group size beside them."""
        g = group
        yield counter("lbg_client_processed", "Messages handled and acked.", g, self.processed)
        yield counter("lbg_client_dead_lettered", "Messages dead-lettered.", g, self.dead_lettered)
        yield counter(
            "lbg_client_handler_errors", "Failed handler attempts.", g, self.handler_errors
        )
        yield counter(
            "lbg_client_fenced", "Deliveries dropped: ownership lost first.", g, self.fenced
        )
        yield counter(
            "lbg_client_handovers", "Queues this client became active on.", g, self.handovers
        )
        yield counter(
            "lbg_client_wrong_bucket",
            "Events whose topic's bucket is not the group's hash of their key.",
            g,
            self.wrong_bucket,
        )
        yield gauge("lbg_client_parked_keys", "Keys parked now.", g, parked_keys)
        yield counter("lbg_client_parked_events", "Events this client parked.", g, parked_events)
        yield gauge(
            "lbg_client_queues_active", "Queues this client serves now.", g, len(self.active)
        )
        yield gauge(
            "lbg_group_queues", "The group's queue count (QC) this client runs.", g, queue_count
        )
