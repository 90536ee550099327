"""The Locust users' publisher: a child process that publishes through the broker adapter.

Locust runs on gevent and the broker adapters on asyncio, which must not share a process; so
each Locust process starts one of these and talks JSON lines over its pipes:

    stdin:  {"i": request id, "k": key, "s": seq, "d": data}
    stdout: {"i": request id, "ms": publish-to-ack milliseconds, "n": bytes, "e": error or null}

A request is answered once the broker acknowledged the event (retried like the hashed
publisher's). At the end of stdin it publishes the summary of the last acked seq per key, so
the validator can count losses, and exits.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import click
import orjson
import uvloop

from lbg.broker import connect_broker
from lbg.broker.base import Broker, PublishError
from lbg.model.destinations import OutputKind, event_destination, output_destination
from lbg.model.group import GroupConfig
from lbg.model.messages import encode_summaries, event_headers
from lbg.publisher import RETRIES
from lbg.settings import BrokerSettings


class AckPublisher:
    """Publishes requested events, answers each with its publish-to-ack time."""

    def __init__(self, broker: Broker, config: GroupConfig, out: asyncio.StreamWriter) -> None:
        self._broker = broker
        self._config = config
        self._out = out
        self.last_seq: dict[str, int] = {}

    async def handle(self, request: dict[str, Any]) -> None:
        """Publish one event; answer with the time until the broker's ack, or the error."""
        key, seq = request["k"], request["s"]
        bucket = self._config.bucket_for_key(key)
        destination = event_destination(self._config.hash_prefix, bucket, key)
        body = b"" if request.get("d") is None else orjson.dumps(request["d"])
        headers = event_headers(seq, time.time())
        started = time.perf_counter()
        error = None
        for attempt in range(RETRIES + 1):
            try:
                await self._broker.publish(destination, body, headers)
            except PublishError as exc:
                error = str(exc)
                if attempt < RETRIES:
                    await asyncio.sleep(min(0.1 * 2**attempt, 5.0))
            else:
                error = None
                self.last_seq[key] = max(self.last_seq.get(key, 0), seq)
                break
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        answer = {"i": request["i"], "ms": elapsed_ms, "n": len(body), "e": error}
        self._out.write(orjson.dumps(answer) + b"\n")

    async def publish_summary(self, group: str, publisher_id: str) -> None:
        """Tell the validator the last acked seq of every key."""
        destination = output_destination(group, OutputKind.SUMMARY)
        for chunk in encode_summaries(publisher_id, self.last_seq):
            await self._broker.publish(destination, chunk)


async def serve(settings: BrokerSettings, group: str, publisher_id: str) -> None:
    """Answer requests from stdin until it ends, then publish the summary."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    transport, protocol = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout)
    out = asyncio.StreamWriter(transport, protocol, None, loop)
    broker = await connect_broker(settings, publisher_id)
    try:
        publisher = AckPublisher(broker, await broker.read_group(group), out)
        out.write(b'{"ready": true}\n')
        tasks: set[asyncio.Task[None]] = set()
        while line := await reader.readline():
            task = asyncio.create_task(publisher.handle(orjson.loads(line)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        await publisher.publish_summary(group, publisher_id)
    finally:
        await broker.close()
        transport.close()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--broker-url", required=True, help="Broker URL, e.g. nats://127.0.0.1:4222.")
@click.option("--group", "group_name", required=True, help="Group to publish to.")
@click.option("--id", "publisher_id", required=True, help="Publisher identity in the summary.")
def main(broker_url: str, group_name: str, publisher_id: str) -> None:
    """Publish JSON-line requests from stdin through the broker adapter; answer on stdout."""
    uvloop.run(serve(BrokerSettings(url=broker_url), group_name, publisher_id))


if __name__ == "__main__":
    main()
