"""The contiguous finished floor of one ownership stint, for a consumer with AckPolicy all.

On such a consumer one ack of stream sequence S acknowledges every delivery up to S, so an
owner acknowledges a batch with one message instead of one per event (as parallel-consumer
does on Kafka). It may only name a delivery when every one delivered before it in the stint
has finished: the floor stops at the first unfinished one, so nothing unprocessed is ever
acknowledged, and a crash redelivers at most the finished ones above the floor.
"""

from __future__ import annotations

import collections

from lbg.broker.nats.acksubject import stream_sequence


class AckFloor:
    """Deliveries in arrival order; `take()` names the one to ack once the floor has moved."""

    def __init__(self) -> None:
        self._order: collections.deque[str] = collections.deque()
        self._finished: set[str] = set()
        self._best: tuple[int, str] | None = None

    def delivered(self, reply: str) -> None:
        """A delivery of this stint arrived (its ack subject is its identity)."""
        self._order.append(reply)

    def finish(self, reply: str) -> bool:
        """A delivery was processed; True if the floor moved (there is an ack to send)."""
        self._finished.add(reply)
        order, finished = self._order, self._finished
        moved = False
        while order and order[0] in finished:
            head = order.popleft()
            finished.discard(head)
            sequence = stream_sequence(head)
            if self._best is None or sequence > self._best[0]:
                self._best = (sequence, head)
            moved = True
        return moved

    def take(self) -> str | None:
        """The ack subject that acknowledges the floor, once (None if it has not moved since);
        the highest stream sequence, as a redelivery can arrive after later sequences."""
        best, self._best = self._best, None
        return best[1] if best is not None else None
