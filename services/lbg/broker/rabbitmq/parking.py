"""A group's parking lot on RabbitMQ: one stream, `lbg.<g>.parked`, bound to the group's
exchange under `_lbgpark.<g>`, holds everything, append-only:
- a registry record of a key (`Lbg-Park-Op: record`; an empty body deletes it: last value wins),
- a parked event (`event`; its stream offset is its position in the lot),
- a trim of a key's events up to a position (`trim`).
Each carries its key (base64url) in `Lbg-Park-Key`. One reader per group folds the stream into
the current registry and lots. A read that must see every write confirmed before it (a member
taking a queue over, an operator command) first publishes a sync marker and waits until the
reader has passed it; the periodic look of a member reads what the reader has.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import aiormq.exceptions
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from lbg.broker.base import BrokerError, ParkedEvent, ParkingLot
from lbg.broker.rabbitmq.topology import parked_routing_key, parked_stream_name
from lbg.model.messages import MalformedMessage
from lbg.model.parking import key_of, token

OP_HEADER = "Lbg-Park-Op"
KEY_HEADER = "Lbg-Park-Key"
THROUGH_HEADER = "Lbg-Park-Through"
SYNC_HEADER = "Lbg-Park-Sync"
SYNC_TIMEOUT = 10.0
READER_PREFETCH = 1000

OpenChannel = Callable[[], Awaitable[AbstractChannel]]
# Publishes a body to an exchange under a routing key with the given headers, confirmed.
Publish = Callable[[str, str, bytes, dict[str, str]], Awaitable[None]]


@dataclass
class _Folded:
    """The stream read so far: the registry and every key's lot, and syncs waited for."""

    records: dict[str, bytes] = field(default_factory=dict)
    lots: dict[str, list[ParkedEvent]] = field(default_factory=dict)
    syncs: dict[str, asyncio.Future[None]] = field(default_factory=dict)

    def apply(self, message: AbstractIncomingMessage) -> None:
        headers = {name: str(value) for name, value in (message.headers or {}).items()}
        sync = self.syncs.get(headers.get(SYNC_HEADER, ""))
        if sync is not None and not sync.done():
            sync.set_result(None)
        op = headers.get(OP_HEADER)
        try:
            key = key_of(headers.get(KEY_HEADER, ""))
        except MalformedMessage:
            return
        if op == "record":
            if message.body:
                self.records[key] = message.body
            else:
                self.records.pop(key, None)
        elif op == "event":
            position = int(headers["x-stream-offset"])
            own = {n: v for n, v in headers.items() if not n.startswith(("Lbg-Park-", "x-"))}
            self.lots.setdefault(key, []).append(ParkedEvent(message.body, own, position))
        elif op == "trim":
            through = int(headers.get(THROUGH_HEADER, "0"))
            kept = [e for e in self.lots.get(key, []) if e.position > through]
            if kept:
                self.lots[key] = kept
            else:
                self.lots.pop(key, None)


class RabbitParkingLot(ParkingLot):
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
                folded.apply(message)
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
                {**headers, OP_HEADER: op, KEY_HEADER: token(key)},
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

    async def records(self, current: bool = True) -> dict[str, bytes]:
        folded = await (self._current() if current else self._reader())
        return dict(folded.records)

    async def put(self, key: str, record: bytes) -> None:
        await self._send("record", key, record, {})

    async def delete(self, key: str) -> None:
        await self._send("record", key, b"", {})

    async def append(self, key: str, body: bytes, headers: Mapping[str, str]) -> None:
        await self._send("event", key, body, headers)

    async def events(self, key: str) -> list[ParkedEvent]:
        return list((await self._current()).lots.get(key, []))

    async def trim(self, key: str, through: int) -> None:
        await self._send("trim", key, b"", {THROUGH_HEADER: str(through)})
