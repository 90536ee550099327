"""`lbg move`: pin a queue to a member of a dynamic group (an override, see
model/overrides.py) and wait until that member serves it."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from lbg.admin.status import ControlListener, GroupStatus, group_status
from lbg.broker.base import Broker
from lbg.model.control import GOSSIP_SECONDS, Heartbeat, MemberState, Override, encode_move

IDLE_CHECK_SECONDS = 0.5


class MoveRefused(ValueError):
    """`lbg move` was asked for something it cannot do; the message says what."""


def check_move(status: GroupStatus, queue: int, member: str) -> None:
    """Refuse a queue out of range, an unknown member, or one that cannot take queues."""
    last = status.config.queue_count - 1
    if not 0 <= queue <= last:
        raise MoveRefused(f"queue {queue} is outside 0..{last} of group '{status.group}'")
    if not status.members:
        raise MoveRefused(
            f"no dynamic members heard in group '{status.group}' in {status.listened:g}s: "
            "a move needs dynamic-mode clients"
        )
    states = {m.member: m.state for m in status.members}
    if member not in states:
        heard = ", ".join(sorted(states))
        raise MoveRefused(f"unknown member '{member}' (heard: {heard})")
    if states[member] != MemberState.ACTIVE.value:
        raise MoveRefused(f"member '{member}' is {states[member]}: it cannot take a queue")


@dataclass(frozen=True, slots=True)
class MoveResult:
    """How a move went: `done` when `to` serves the queue (or, `idle`, stands ready for an
    empty queue nobody serves); `now` is who serves it at the end."""

    queue: int
    to: str
    was: str | None
    seconds: float
    done: bool
    idle: bool
    now: str | None

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def _owner(heartbeats: Mapping[str, Heartbeat], queue: int) -> str | None:
    """Who serves `queue` by the latest heartbeats (the latest claim wins)."""
    claims = [member for member, hb in heartbeats.items() if queue in hb.owns]
    return claims[-1] if claims else None


async def move_queue(
    broker: Broker,
    group: str,
    queue: int,
    member: str,
    listen: float,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
) -> MoveResult:
    """Pin `queue` to `member` and wait until its heartbeats say it serves the queue.

    Raises MoveRefused (before sending anything) for a bad queue or member. The move is
    repeated every second while waiting: a member that missed it applies it then (a repeat
    of the same version changes nothing for the others). The broker pins a consumer only when
    it delivers a message, so an empty queue counts as moved once nobody serves it and
    `member` stands ready for it.
    """
    config = await broker.read_group(group)
    async with ControlListener(broker, group) as listener:
        await asyncio.sleep(listen)
        statuses = await broker.queue_status(group, config)
        status = group_status(group, config, statuses, listener.heartbeats, listener.book, listen)
        check_move(status, queue, member)
        was = status.owner(queue)
        # Newer than any version heard, even if this host's clock is behind the last mover's.
        override = Override(queue, member, max(time.time(), listener.book.newest() + 0.001))
        started = clock()
        sent = checked = -math.inf
        idle_since: float | None = None
        while True:
            owner = _owner(listener.heartbeats, queue)
            target = listener.heartbeats.get(member)
            elapsed = clock() - started
            if sent > -math.inf and owner == member:
                return MoveResult(queue, member, was, elapsed, True, False, member)
            waiting = owner is None and target is not None and queue in target.wants
            if sent > -math.inf and waiting and clock() - checked >= IDLE_CHECK_SECONDS:
                checked = clock()
                now = (await broker.queue_status(group, config))[queue]
                if now.active_client or now.backlog or now.in_flight:
                    idle_since = None
                elif idle_since is None:
                    idle_since = checked
                else:
                    # Empty and unpinned at two checks with no claim between: really idle.
                    return MoveResult(queue, member, was, clock() - started, True, True, None)
            elif not waiting:
                idle_since = None
            if clock() - sent >= GOSSIP_SECONDS:
                await broker.publish_control(group, encode_move(override))
                sent = clock()
            elif elapsed >= timeout:
                return MoveResult(queue, member, was, elapsed, False, False, owner)
            await listener.wait_change(min(0.1, max(0.0, timeout - elapsed)))
