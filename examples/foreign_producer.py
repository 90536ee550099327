"""Publish keyed events to an lbg group with nothing but nats-py: what a producer in any
language does (no import of lbg).

1. Read the group's config (JSON) from the NATS KV bucket `lbg_groups`, key = the group name:
   HP (hash prefix), HC (hash count), HF (hash function).
2. bucket = HF(key) mod HC; here HF "java": Java's String.hashCode over UTF-16 code units,
   then Math.abs(h % HC).
3. Publish with JetStream (so the broker confirms it) to `<HP>.<bucket>.<key>`, the key written
   as it is except `%`, `*`, `>`, whitespace and control characters as %XX of their UTF-8
   bytes (a `.` may stay: the key then spans several tokens). The body and headers are yours.

    python examples/foreign_producer.py --url nats://127.0.0.1:4222 --group orders --count 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re

import nats

_ESCAPED = re.compile(r"[%*>\s\x00-\x1f\x7f]")


def java_bucket(key: str, hash_count: int) -> int:
    """The original Java publisher's bucket: Math.abs(key.hashCode() % hash_count)."""
    h = 0
    units = key.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    signed = h - (1 << 32) if h & 0x80000000 else h
    return abs(signed) % hash_count


def key_token(key: str) -> str:
    """The key as it goes into a subject: the characters NATS gives a meaning escaped."""
    return _ESCAPED.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), key)


def event_subject(config: dict, key: str) -> str:
    """`<HP>.<bucket>.<key>` for a group whose hash function is java."""
    if config.get("HF", "java") != "java":
        raise SystemExit(f"this example implements HF java only, the group uses {config['HF']}")
    return f"{config['HP']}.{java_bucket(key, config['HC'])}.{key_token(key)}"


async def main(url: str, group: str, count: int) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        entry = await (await js.key_value("lbg_groups")).get(group)
        config = json.loads(entry.value)
        for n in range(count):
            key = f"order-{n % 5}"
            body = json.dumps({"order_id": key, "step": n // 5}).encode()
            await js.publish(event_subject(config, key), body, headers={"source": "example"})
        print(f"published {count} events to group {group!r}")
    finally:
        await nc.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="nats://127.0.0.1:4222", help="NATS server URL")
    parser.add_argument("--group", required=True, help="the lbg group to publish to")
    parser.add_argument("--count", type=int, default=20, help="events to publish")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.group, args.count))
