"""The raw pipeline on NATS JetStream, written on nats-py alone (no lbg code).

One stream `RAW_<name>` over `<name>.>` (the events) with one durable pull consumer that
every consumer process shares; one stream `RAW_<name>_OUT` over `_raw.<name>.records` (one
record per processed event). Publishes go out with `publish_async`, many acks pending at
once; a consumer fetches in batches, keeps several batches in flight, and acks an event once
its record's publish is acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from raw_events import record

CONSUMER = "workers"
ACK_WAIT_SECONDS = 30.0
FETCH_SECONDS = 1.0
ACK_TIMEOUT_SECONDS = 30.0
READ_BATCH = 1000


def events_stream(name: str) -> str:
    return f"RAW_{name}"


def records_stream(name: str) -> str:
    return f"RAW_{name}_OUT"


def records_subject(name: str) -> str:
    return f"_raw.{name}.records"


class RawNats:
    """One connection to the server and what the raw pipeline's roles do over it."""

    def __init__(self, nc: Client, name: str) -> None:
        self._nc = nc
        self._name = name

    @classmethod
    async def connect(cls, url: str, name: str, connection_name: str) -> RawNats:
        return cls(await nats.connect(url, name=connection_name), name)

    async def close(self) -> None:
        await self._nc.close()

    async def create(self) -> None:
        """The two streams and the shared consumer: no cap on its unacked events, since each
        consumer process caps its own."""
        js = self._nc.jetstream()
        await js.add_stream(
            StreamConfig(
                name=events_stream(self._name),
                subjects=[f"{self._name}.>"],
                storage=StorageType.FILE,
            )
        )
        await js.add_stream(
            StreamConfig(
                name=records_stream(self._name),
                subjects=[records_subject(self._name)],
                storage=StorageType.FILE,
            )
        )
        await js.add_consumer(
            events_stream(self._name),
            ConsumerConfig(
                durable_name=CONSUMER,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=ACK_WAIT_SECONDS,
                max_ack_pending=-1,
            ),
        )

    async def delete(self) -> None:
        """Both streams (and with them the consumer), whichever exist."""
        js = self._nc.jetstream()
        for stream in (events_stream(self._name), records_stream(self._name)):
            with contextlib.suppress(NotFoundError):
                await js.delete_stream(stream)

    async def publish(self, events: Iterable[tuple[str, dict[str, str]]], window: int) -> int:
        """Publish every (key, headers) with an empty body, at most `window` acks pending;
        return how many the stream acknowledged."""
        js = self._nc.jetstream(publish_async_max_pending=window)
        pending = [
            await js.publish_async(f"{self._name}.{key}", b"", headers=headers)
            for key, headers in events
        ]
        results = await asyncio.wait_for(
            asyncio.gather(*pending, return_exceptions=True), ACK_TIMEOUT_SECONDS
        )
        return sum(not isinstance(result, BaseException) for result in results)

    async def consume(
        self, client: str, batch: int, in_flight: int, ready: Callable[[], None]
    ) -> None:
        """Fetch batches from the shared consumer until cancelled; each batch is handled in
        its own task (up to in_flight / batch at once) while the next one is fetched."""
        js = self._nc.jetstream(publish_async_max_pending=in_flight)
        subscription = await js.pull_subscribe_bind(CONSUMER, stream=events_stream(self._name))
        target = records_subject(self._name)
        slots = asyncio.Semaphore(max(1, in_flight // batch))

        async def handle(messages: list[Msg]) -> None:
            try:
                acks = [
                    await js.publish_async(
                        target, record(m.subject.split(".", 1)[1], m.headers, client)
                    )
                    for m in messages
                ]
                await asyncio.wait_for(asyncio.gather(*acks), ACK_TIMEOUT_SECONDS)
                for message in messages:
                    await message.ack()
            finally:
                slots.release()

        ready()
        # A batch that fails ends the group, and with it this consumer.
        async with asyncio.TaskGroup() as batches:
            while True:
                await slots.acquire()
                try:
                    messages = await subscription.fetch(batch, timeout=FETCH_SECONDS)
                except TimeoutError:
                    slots.release()
                    continue
                batches.create_task(handle(messages))

    async def read(self, on_record: Callable[[bytes, float], None]) -> None:
        """Feed every record, from the first, with the time the stream stored it, to
        `on_record` until cancelled."""
        subscription = await self._nc.jetstream().pull_subscribe(
            records_subject(self._name),
            stream=records_stream(self._name),
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
        )
        while True:
            try:
                messages = await subscription.fetch(READ_BATCH, timeout=FETCH_SECONDS)
            except TimeoutError:
                continue
            for message in messages:
                on_record(message.data, message.metadata.timestamp.timestamp())
