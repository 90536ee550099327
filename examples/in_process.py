"""Publish and consume a group from one asyncio program with lbg's in-process API.

    python examples/in_process.py --url nats://127.0.0.1:4222 --group orders --count 20

The Publisher numbers each key's events and waits for the broker's confirmation; the Client
is a full member of the group (membership, handover, fencing), running `handle` on the
events of the queues it is active for, each key in order.
"""

from __future__ import annotations

import argparse
import asyncio

from lbg import Client, Context, Event, Publisher


async def main(url: str, group: str, count: int) -> None:
    done = asyncio.Event()
    seen = 0

    async def handle(event: Event, context: Context) -> None:
        nonlocal seen
        seen += 1
        print(f"queue {context.queue}: {event.key} #{event.seq} {event.json()}")
        if seen == count:
            done.set()

    client = Client(url, group, handle)
    running = asyncio.create_task(client.run())
    async with Publisher(url, group) as publisher:
        for n in range(count):
            key = f"order-{n % 5}"
            await publisher.publish(key, f'{{"order_id": "{key}", "step": {n // 5}}}')
    await asyncio.wait_for(done.wait(), 30)
    client.stop()
    await running


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="nats://127.0.0.1:4222", help="broker URL")
    parser.add_argument("--group", required=True, help="the lbg group (cg-admin create)")
    parser.add_argument("--count", type=int, default=20, help="events to publish")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.group, args.count))
