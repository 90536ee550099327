"""The raw pipeline on RabbitMQ, written on aio-pika alone (no lbg code).

A topic exchange `raw.<name>`, one quorum queue `raw.<name>.events` bound to `<name>.#`
that every consumer process shares, and a stream `raw.<name>.records` (one record per
processed event) reached through the default exchange. Persistent messages and publisher
confirms throughout; many publishes are in flight at once; a consumer takes up to its
prefetch of deliveries concurrently and acks each once its record is confirmed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

import aio_pika
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage

from raw_events import record

SENT_AT_HEADER = "Raw-Sent-At"
READ_PREFETCH = 1000
CONFIRM_TIMEOUT_SECONDS = 30.0


def exchange_name(name: str) -> str:
    return f"raw.{name}"


def events_queue(name: str) -> str:
    return f"raw.{name}.events"


def records_queue(name: str) -> str:
    return f"raw.{name}.records"


class RawRabbitMQ:
    """One connection to the node and what the raw pipeline's roles do over it."""

    def __init__(self, connection: AbstractConnection, name: str) -> None:
        self._connection = connection
        self._name = name

    @classmethod
    async def connect(cls, url: str, name: str, connection_name: str) -> RawRabbitMQ:
        connection = await aio_pika.connect(
            url, client_properties={"connection_name": connection_name}
        )
        return cls(connection, name)

    async def close(self) -> None:
        await self._connection.close()

    async def create(self) -> None:
        """The exchange, the shared events queue and the records stream."""
        channel = await self._connection.channel()
        exchange = await channel.declare_exchange(
            exchange_name(self._name), aio_pika.ExchangeType.TOPIC, durable=True
        )
        queue = await channel.declare_queue(
            events_queue(self._name), durable=True, arguments={"x-queue-type": "quorum"}
        )
        await queue.bind(exchange, f"{self._name}.#")
        await channel.declare_queue(
            records_queue(self._name), durable=True, arguments={"x-queue-type": "stream"}
        )
        await channel.close()

    async def delete(self) -> None:
        """The queues and the exchange (deleting a missing one is no error on RabbitMQ)."""
        channel = await self._connection.channel()
        for queue in (events_queue(self._name), records_queue(self._name)):
            await channel.queue_delete(queue)
        await channel.exchange_delete(exchange_name(self._name))
        await channel.close()

    async def publish(self, events: Iterable[tuple[str, dict[str, str]]], window: int) -> int:
        """Publish every (key, headers) with an empty body, persistent, at most `window`
        unconfirmed; return how many the node confirmed."""
        channel = await self._connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(exchange_name(self._name), ensure=False)
        slots = asyncio.Semaphore(window)
        pending: list[asyncio.Task[object]] = []
        for key, headers in events:
            await slots.acquire()
            message = aio_pika.Message(
                b"", headers=headers, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
            )
            task = asyncio.create_task(exchange.publish(message, f"{self._name}.{key}"))
            task.add_done_callback(lambda _task: slots.release())
            pending.append(task)
        results = await asyncio.wait_for(
            asyncio.gather(*pending, return_exceptions=True), CONFIRM_TIMEOUT_SECONDS
        )
        return sum(not isinstance(result, BaseException) for result in results)

    async def consume(
        self, client: str, batch: int, in_flight: int, ready: Callable[[], None]
    ) -> None:
        """Consume the shared queue with a prefetch of `in_flight` until cancelled (`batch`
        is NATS's: deliveries come one by one here, handled concurrently)."""
        channel = await self._connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=in_flight)
        queue = await channel.get_queue(events_queue(self._name), ensure=False)
        target = records_queue(self._name)
        failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def handle(message: AbstractIncomingMessage) -> None:
            try:
                body = record((message.routing_key or "").split(".", 1)[1], message.headers, client)
                reply = aio_pika.Message(
                    body,
                    headers={SENT_AT_HEADER: f"{time.time():.6f}"},
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                )
                await channel.default_exchange.publish(reply, target)
                await message.ack()
            except Exception as exc:
                if not failed.done():
                    failed.set_exception(exc)

        await queue.consume(handle)
        ready()
        await failed

    async def read(self, on_record: Callable[[bytes, float], None]) -> None:
        """Feed every record, from the first, with the time its consumer sent it, to
        `on_record` until cancelled (RabbitMQ keeps no store time the reader can see)."""
        channel = await self._connection.channel()
        await channel.set_qos(prefetch_count=READ_PREFETCH)
        queue = await channel.get_queue(records_queue(self._name), ensure=False)

        async def handle(message: AbstractIncomingMessage) -> None:
            on_record(message.body, float(str(message.headers[SENT_AT_HEADER])))
            await message.ack()

        await queue.consume(handle, arguments={"x-stream-offset": "first"})
        await asyncio.get_running_loop().create_future()
