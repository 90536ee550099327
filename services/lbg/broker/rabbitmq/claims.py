"""Ownership epochs on RabbitMQ: claims in a group's owners stream, matched to their offsets.

A new owner publishes a claim (with a confirm) to the stream `lbg.<g>.owners` and waits for
it on a consumer that reads the stream from `next`: the claim's offset + 1 is the queue's
new epoch, since a stream's offsets only grow. One reader per group serves every claim of
this client, so a claim costs a confirmed publish and its delivery, not a new consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiormq.exceptions
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from lbg.broker.base import BrokerError, needs_upgrade
from lbg.broker.rabbitmq import topology

log = logging.getLogger(__name__)

CLAIM_TIMEOUT = 5.0
CLAIM_HEADER = "Lbg-Claim"
READER_PREFETCH = 1000

OpenChannel = Callable[[], Awaitable[AbstractChannel]]
# Publishes a claim's body under its routing key with the given headers, confirmed.
PublishClaim = Callable[[str, str, bytes, dict[str, str]], Awaitable[None]]


@dataclass(eq=False)
class _Reader:
    """A group's owners stream, read from `next`; claims waiting for their offsets by nonce."""

    channel: AbstractChannel
    waiting: dict[str, asyncio.Future[int]] = field(default_factory=dict)


class OwnerClaims:
    """This client's claims of ownership epochs, one stream reader per group."""

    def __init__(self, open_channel: OpenChannel, publish: PublishClaim) -> None:
        self._open_channel = open_channel
        self._publish = publish
        self._readers: dict[str, _Reader] = {}
        self._lock = asyncio.Lock()

    async def prepare(self, group: str) -> None:
        """Start the group's reader ahead of the first claim (a takeover then waits only for
        the claim's publish and delivery); a group without an owners stream is refused now,
        other failures are left for the first claim to retry."""
        try:
            await self._reader_or_refusal(group)
        except BrokerError:
            raise
        except Exception as exc:  # aiormq also raises a bare Exception on a closing connection
            log.warning("group '%s': owners stream not read yet: %s", group, exc)

    async def claim(self, group: str, queue: int, record: bytes) -> int:
        """The queue's new epoch, once the claim is in the stream."""
        reader = await self._reader_or_refusal(group)
        nonce = uuid.uuid4().hex
        found = reader.waiting[nonce] = asyncio.get_running_loop().create_future()
        try:
            await self._publish(
                topology.exchange_name(group),
                topology.owners_routing_key(group, queue),
                record,
                {CLAIM_HEADER: nonce},
            )
            return await asyncio.wait_for(found, CLAIM_TIMEOUT)
        finally:
            reader.waiting.pop(nonce, None)

    async def close(self) -> None:
        for reader in self._readers.values():
            with contextlib.suppress(Exception):
                await reader.channel.close()
        self._readers.clear()

    async def _reader_or_refusal(self, group: str) -> _Reader:
        """The group's reader; needs_upgrade if the group has no owners stream this client
        may read (made before epochs, or its permissions granted before them)."""
        try:
            return await self._reader(group)
        except (
            aiormq.exceptions.ChannelNotFoundEntity,
            aiormq.exceptions.ChannelAccessRefused,
        ):
            stream = topology.owners_stream_name(group)
            raise needs_upgrade(group, f"owners stream '{stream}' it may read") from None

    async def _reader(self, group: str) -> _Reader:
        """The group's reader, started (again, after a lost channel) when needed."""
        async with self._lock:
            reader = self._readers.get(group)
            if reader is not None and not reader.channel.is_closed:
                return reader
            channel = await self._open_channel()
            reader = _Reader(channel)

            async def on_message(message: AbstractIncomingMessage) -> None:
                if not channel.is_closed:
                    await message.ack()
                nonce = str((message.headers or {}).get(CLAIM_HEADER, ""))
                found = reader.waiting.get(nonce)
                if found is not None and not found.done():
                    offset = int(message.headers["x-stream-offset"])  # type: ignore[arg-type]
                    found.set_result(offset + 1)  # offsets start at 0, epochs at 1

            try:
                await channel.set_qos(prefetch_count=READER_PREFETCH)
                stream = await channel.get_queue(topology.owners_stream_name(group), ensure=False)
                await stream.consume(on_message, arguments={"x-stream-offset": "next"})
            except BaseException:
                with contextlib.suppress(Exception):
                    await channel.close()
                raise
            self._readers[group] = reader
            return reader
