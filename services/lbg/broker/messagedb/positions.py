"""A member reader's positions: handed out, acked in order, recorded. Pure logic.

Message DB consumers record the position below which everything was processed. Deliveries
are acked out of order (keys run concurrently), so the position due for recording is the
highest one with every earlier delivery acked. Writing it takes a round trip, and acks that
land meanwhile must stay due for the next write: the reader marks recorded the value it
wrote, never whatever is acked by the time the write returns (that would leave the stream
behind and make the next reader replay processed events).
"""

from __future__ import annotations

from collections import deque


class Positions:
    """The global positions one reader handed out in its current stint, and how far they were
    acked in order and recorded."""

    def __init__(self) -> None:
        self._pending: deque[int] = deque()
        self._acked: set[int] = set()
        self.done = 0  # every position handed out up to this one was acked
        self.fetched = 0  # the last position handed out
        self.recorded = 0  # the last position written to the member's position stream

    def start(self, recorded: int) -> None:
        """A new stint, resuming after the member's recorded position."""
        self.forget_unacked()
        self.done = self.fetched = self.recorded = recorded

    def forget_unacked(self) -> None:
        """Ownership was lost: what was handed out and not acked in order is read again by
        whoever reads the member next."""
        self._pending.clear()
        self._acked.clear()

    def hand_out(self, position: int) -> None:
        self._pending.append(position)
        self.fetched = position

    def ack(self, position: int) -> None:
        self._acked.add(position)
        while self._pending and self._pending[0] in self._acked:
            self.done = self._pending.popleft()
            self._acked.discard(self.done)

    @property
    def outstanding(self) -> int:
        """Handed out and not yet acked in order."""
        return len(self._pending)

    @property
    def all_acked(self) -> bool:
        return not self._pending and self.done >= self.fetched

    def due(self) -> int | None:
        """The position to write now, if it is ahead of the recorded one."""
        return self.done if self.done > self.recorded else None

    def wrote(self, position: int) -> None:
        """`position` (a value `due` returned) is now in the position stream."""
        self.recorded = max(self.recorded, position)
