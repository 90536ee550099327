"""A group's parking lot on RabbitMQ: one stream, `lbg.<g>.parked`, bound to the group's
exchange under `_lbgpark.<g>`, holds everything, append-only (records, parked events and trims,
folded as broker/parkfold.py says; a stream offset is an event's position in the lot). One
reader per group folds the stream into the current registry and lots. A read that must see
every write confirmed before it (a member taking a queue over, an operator command) first
publishes a sync marker and waits until the reader has passed it; the periodic look of a
member reads what the reader has.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import aiormq.exceptions
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from lbg.broker.base import BrokerError
from lbg.broker.parkfold import SYNC_HEADER, FoldedParkingLot, ParkFold, park_headers
from lbg.broker.rabbitmq.topology import parked_routing_key, parked_stream_name

SYNC_TIMEOUT = 10.0
READER_PREFETCH = 1000

OpenChannel = Callable[[], Awaitable[AbstractChannel]]
# Publishes a body to an exchange under a routing key with the given headers, confirmed.
Publish = Callable[[str, str, bytes, dict[str, str]], Awaitable[None]]


@dataclass
class _Folded(ParkFold):
    """The stream read so far, and the syncs waited for."""

    syncs: dict[str, asyncio.Future[None]] = field(default_factory=dict)

    def take(self, message: AbstractIncomingMessage) -> None:
        headers = {name: str(value) for name, value in (message.headers or {}).items()}
        sync = self.syncs.get(headers.get(SYNC_HEADER, ""))
        if sync is not None and not sync.done():
            sync.set_result(None)
        self.apply(headers, message.body, int(headers.get("x-stream-offset", "0")))


class RabbitParkingLot(FoldedParkingLot):
    """One group's registry and lot, through one connection's reader of its stream."""

    def __init__(
        self, group: str, exchange: str, open_channel: OpenChannel, publish: Publish
    ) -> None:
        self._group = group
        self._exchange = exchange
        self._open_channel = open_channel
        self._publish = publish
        self._channel: AbstractChannel | None = None
        self._folded = _Folded()
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await self._channel.close()

    async def _reader(self) -> _Folded:
        """The folded stream, its reader started (again, after a lost channel: from the
        first offset, into a fresh fold) when needed."""
        async with self._lock:
            if self._channel is not None and not self._channel.is_closed:
                return self._folded
            folded = self._folded = _Folded()
            channel = self._channel = await self._open_channel()

            async def on_message(message: AbstractIncomingMessage) -> None:
                folded.take(message)
                if not channel.is_closed:
                    await message.ack()

            try:
                await channel.set_qos(prefetch_count=READER_PREFETCH)
                stream = await channel.get_queue(parked_stream_name(self._group), ensure=False)
                await stream.consume(on_message, arguments={"x-stream-offset": "first"})
            except aiormq.exceptions.ChannelNotFoundEntity:
                raise BrokerError(
                    f"group '{self._group}' has no parking stream '"
                    f"{parked_stream_name(self._group)}' (made before parking existed: "
                    "recreate it with cg-admin)"
                ) from None
            except aiormq.exceptions.ChannelAccessRefused:
                raise BrokerError(
                    f"group '{self._group}': not allowed to read its parking stream"
                ) from None
            return folded

    async def _send(self, op: str, key: str, body: bytes, headers: Mapping[str, str]) -> None:
        try:
            await self._publish(
                self._exchange,
                parked_routing_key(self._group),
                body,
                park_headers(op, key, headers),
            )
        except (TimeoutError, aiormq.exceptions.AMQPError, ConnectionError) as exc:
            reason = exc or "no confirm"
            raise BrokerError(f"parking ({op}) of key {key[:80]!r}: {reason}") from None

    async def _current(self) -> _Folded:
        """The fold once it includes every write confirmed before this call."""
        folded = await self._reader()
        nonce = uuid.uuid4().hex
        done = folded.syncs[nonce] = asyncio.get_running_loop().create_future()
        try:
            routing_key = parked_routing_key(self._group)
            await self._publish(self._exchange, routing_key, b"", {SYNC_HEADER: nonce})
            await asyncio.wait_for(done, SYNC_TIMEOUT)
        except (TimeoutError, aiormq.exceptions.AMQPError, ConnectionError) as exc:
            raise BrokerError(
                f"group '{self._group}': parking stream not read in time ({exc or 'timeout'})"
            ) from None
        finally:
            folded.syncs.pop(nonce, None)
        return folded

    async def _fold(self, current: bool) -> ParkFold:
        return await (self._current() if current else self._reader())
