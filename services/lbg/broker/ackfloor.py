"""Cumulative acks: the contiguous finished floor of one ownership stint, sent once per turn.

Where one ack acknowledges every delivery up to it (a NATS consumer with AckPolicy all, an
AMQP basic.ack with `multiple`), an owner acknowledges a batch with one message instead of one
per event (as parallel-consumer does on Kafka). It may only name a delivery when every one
delivered before it in the stint has finished: the floor stops at the first unfinished one, so
nothing unprocessed is ever acknowledged, and a crash redelivers at most the finished ones
above the floor.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

Token = TypeVar("Token", bound=Hashable)


class AckFloor(Generic[Token]):
    """Deliveries in arrival order; `take()` names the one to ack once the floor has moved.
    `rank` orders the tokens as the broker's cumulative ack does (a stream sequence, an AMQP
    delivery tag)."""

    def __init__(self, rank: Callable[[Token], int]) -> None:
        self._rank = rank
        self._order: collections.deque[Token] = collections.deque()
        self._finished: set[Token] = set()
        self._best: tuple[int, Token] | None = None

    def delivered(self, token: Token) -> None:
        """A delivery of this stint arrived."""
        self._order.append(token)

    def finish(self, token: Token) -> bool:
        """A delivery was processed; True if the floor moved (there is an ack to send)."""
        self._finished.add(token)
        order, finished = self._order, self._finished
        moved = False
        while order and order[0] in finished:
            head = order.popleft()
            finished.discard(head)
            rank = self._rank(head)
            if self._best is None or rank > self._best[0]:
                self._best = (rank, head)
            moved = True
        return moved

    @property
    def settled(self) -> bool:
        """Every delivery of this stint was finished and its ack taken."""
        return not self._order and self._best is None

    def take_finished_above(self) -> list[Token]:
        """The finished deliveries the floor has not reached (an unfinished one comes first),
        in arrival order, once."""
        above = [token for token in self._order if token in self._finished]
        self._finished.difference_update(above)
        return above

    def take(self) -> Token | None:
        """The token whose ack acknowledges the floor, once (None if it has not moved since);
        the highest rank, as a redelivery can arrive after later ones."""
        best, self._best = self._best, None
        return best[1] if best is not None else None


class FloorAcks(Generic[Token]):
    """One binding's cumulative acks: the floor of its current stint, sent at the end of the
    event loop's turn in which it moved, so the acks finished in one turn go as one."""

    def __init__(
        self,
        queue: int,
        rank: Callable[[Token], int],
        send: Callable[[Token], Awaitable[None]],
        send_one: Callable[[Token], Awaitable[None]] | None = None,
    ) -> None:
        self._queue = queue
        self._rank = rank
        self._send = send
        self._send_one = send_one
        self._floor: AckFloor[Token] = AckFloor(rank)
        self._due = False
        self._senders: set[asyncio.Task[None]] = set()

    def restart(self) -> None:
        """A new stint: the old one's floor is dropped unsent (its deliveries come again)."""
        self._floor = AckFloor(self._rank)

    @property
    def settled(self) -> bool:
        """Every delivery of this stint was finished and acked (or its ack is being sent)."""
        return self._floor.settled

    def delivered(self, token: Token) -> None:
        self._floor.delivered(token)

    def finish(self, token: Token) -> None:
        """A delivery is done with: ack the floor soon if it moved."""
        if self._floor.finish(token) and not self._due:
            self._due = True
            sender = asyncio.create_task(self._flush_soon())
            self._senders.add(sender)
            sender.add_done_callback(self._senders.discard)

    async def flush(self, *, every_finished: bool = False) -> None:
        """Send the floor's ack now (before a handover or a close, so nothing comes again);
        `every_finished`: also each finished delivery above the floor, one ack each (where
        the broker takes `send_one`): a stint that ends with deliveries it will not process
        (a handover drops those still waiting) would otherwise hand the next owner again
        what it processed after them. A failure is logged, not raised: the next owner gets
        those deliveries again."""
        token = self._floor.take()
        above = self._floor.take_finished_above() if every_finished and self._send_one else []
        try:
            if token is not None:
                await self._send(token)
            for one in above:
                await self._send_one(one)  # type: ignore[misc]
        except Exception as exc:  # aiormq also raises a bare Exception on a closing connection
            log.warning("queue %d: the ack floor was not sent: %s", self._queue, exc)

    async def _flush_soon(self) -> None:
        await asyncio.sleep(0)
        self._due = False
        await self.flush()
