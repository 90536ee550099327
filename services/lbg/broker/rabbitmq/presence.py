"""Whether a member's heartbeat connection is still open, asked of the broker: a crash seen at
once instead of after the lease's margins (client/presence.py).

Each member holds an exclusive queue named for it on the connection that sends its heartbeats.
RabbitMQ deletes an exclusive queue when its connection closes (a kill -9 closes the socket),
so a passive declare of it answers NOT_FOUND for a member that is gone, and RESOURCE_LOCKED
(another connection's exclusive queue) for one that is alive, stopped or cut off: its peers
then wait out its lease as before. The member consumes its queue (nothing is ever sent to
it) so that the group's members policy never expires it as unused.

A peer asks only after hearing nothing from the member for `lease - margin`, and evicts only
while its own heartbeats come back in time (OwnLease.view_current), over the same exchange
and queues: a beat the member sent before its connection closed was routed before its queue
went, and came in long before the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import aiormq.exceptions
from aio_pika.abc import AbstractChannel
from aio_pika.exceptions import AMQPError, ChannelInvalidStateError

from lbg.broker.base import BrokerError, why
from lbg.broker.rabbitmq.topology import member_queue_name

# How long a probe waits for the broker's answer: past it, the member is taken as silent.
PROBE_TIMEOUT = 0.5
# AMQP's longest queue name, in bytes: a member whose id makes a longer one is never probed.
MAX_QUEUE_NAME = 255

OpenChannel = Callable[[], Awaitable[AbstractChannel]]


def presence_queue_name(group: str, member: str) -> str:
    """The member's presence queue: among the group's private member queues (`member.<hex>`,
    which a client user may declare and consume), its id in hex."""
    return member_queue_name(group, member.encode().hex())


def probeable(group: str, member: str) -> bool:
    """A member id short enough for a presence queue name."""
    return len(presence_queue_name(group, member)) <= MAX_QUEUE_NAME


class RabbitPresence:
    """One heartbeat connection's presence: a queue held per announced member, and probes."""

    def __init__(self, open_channel: OpenChannel) -> None:
        self._open_channel = open_channel
        self._members: dict[str, str] = {}  # group -> the member announced there
        self._channels: dict[str, AbstractChannel] = {}

    async def announce(self, group: str, member: str) -> bool:
        """Hold `member`'s presence queue; False when another connection holds it (the same
        member id started twice), so that its heartbeats say it cannot be probed."""
        if not probeable(group, member):
            return False
        self._members[group] = member
        return await self._hold(group)

    async def restore(self, group: str) -> None:
        """Hold the queue again after the connection came back (it went with the old one)."""
        if group in self._members and await self._hold(group) is False:
            raise BrokerError(f"presence queue of member '{self._members[group]}' held elsewhere")

    async def _hold(self, group: str) -> bool:
        old = self._channels.pop(group, None)
        if old is not None:
            with contextlib.suppress(AMQPError, ChannelInvalidStateError, ConnectionError):
                await old.close()
        name = presence_queue_name(group, self._members[group])
        channel = await self._open_channel()
        try:
            queue = await channel.declare_queue(name, exclusive=True, auto_delete=True)
            await queue.consume(_never_called, no_ack=True)
        except aiormq.exceptions.ChannelLockedResource:
            return False
        except (AMQPError, ChannelInvalidStateError, ConnectionError) as exc:
            raise BrokerError(f"presence not announced: {why(exc)}") from None
        self._channels[group] = channel
        return True

    async def ask(self, group: str, member: str) -> bool | None:
        """Whether `member`'s heartbeat connection closed (Broker.probe_member)."""
        if not probeable(group, member):
            return None
        name = presence_queue_name(group, member)
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                channel = await self._open_channel()
                try:
                    await channel.declare_queue(name, passive=True)
                except aiormq.exceptions.ChannelNotFoundEntity:
                    return True
                except aiormq.exceptions.ChannelLockedResource:
                    return False
                finally:
                    with contextlib.suppress(AMQPError, ChannelInvalidStateError, ConnectionError):
                        await channel.close()
        except (AMQPError, ChannelInvalidStateError, ConnectionError, BrokerError, TimeoutError):
            return None
        return None  # declared: not an exclusive queue, so not a member's presence


async def _never_called(_message: object) -> None:
    """The presence queue's consumer: nothing is ever published to it."""
