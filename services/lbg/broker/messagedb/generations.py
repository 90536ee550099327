"""Group sizes over time: how a Message DB consumer group is resized at run time, safely.

The group's config stream holds its history: `Created` (size QC, from global position 1),
then one `Resized` per resize, recorded at a switch position P (the category's newest event
then, read under its write lock so no event can land at or below P afterwards). Generation g
reads positions start_g..end_g with its own size: every event at or below P under the old
size, every later one under the new size. A generation's members have their own advisory locks
and position streams, and nobody reads generation g+1 before every member of generation g has
recorded a position past its last event at or below P (the safe point). So no stream is read
by two members at once, nothing is skipped, and each stream stays in order across the switch.
"""

from __future__ import annotations

import dataclasses
import uuid

import asyncpg
import orjson

from lbg.broker.base import BrokerError, Resize
from lbg.broker.messagedb import naming
from lbg.model.generations import Generation, check_queue_count
from lbg.model.group import GroupConfig


async def load(conn: asyncpg.Connection, group: str) -> list[Generation]:
    """The group's generations from its config stream (empty if the group does not exist)."""
    rows = await conn.fetch(
        "SELECT type, data, metadata FROM message_store.get_stream_messages($1, 0, -1)",
        naming.config_stream(group),
    )
    generations: list[Generation] = []
    for row in rows:
        size = int(orjson.loads(row["data"])["QC"])
        if row["type"] == "Resized" and generations:
            switch = int(orjson.loads(row["metadata"])["position"])
            last = generations[-1]
            generations[-1] = Generation(last.index, last.size, last.start, switch)
            generations.append(Generation(len(generations), size, switch + 1, None))
        elif not generations:
            generations.append(Generation(0, size, 1, None))
    return generations


def position_stream(hash_prefix: str, member: int, generation: int) -> str:
    """Generation 0 keeps Message DB's plain `<category>:position-<member>`."""
    stream = naming.position_stream(hash_prefix, member)
    return stream if generation == 0 else f"{stream}+{generation}"


def lock_keys(hash_prefix: str, member: int, generation: int) -> tuple[int, int]:
    first, _ = naming.lock_keys(hash_prefix, member)
    return first, generation * (naming.MAX_GROUP_SIZE + 1) + member


async def recorded(
    conn: asyncpg.Connection, hash_prefix: str, member: int, generation: Generation
) -> int:
    """The member's recorded position in that generation (start - 1 if none yet)."""
    row = await conn.fetchrow(
        "SELECT data FROM message_store.get_last_stream_message($1)",
        position_stream(hash_prefix, member, generation.index),
    )
    if row is None:
        return generation.start - 1
    return int(orjson.loads(row["data"])["position"])


async def drained(
    conn: asyncpg.Connection, hash_prefix: str, category: str, member: int, generation: Generation
) -> bool:
    """True if the member of a finished generation has nothing left at or below its end in
    `category` (the group's source category)."""
    if generation.end is None:
        return False
    after = await recorded(conn, hash_prefix, member, generation) + 1
    if after > generation.end:
        return True
    position = await conn.fetchval(
        "SELECT global_position FROM message_store.get_category_messages($1, $2, 1, NULL, $3, $4)",
        category,
        after,
        member,
        generation.size,
    )
    return position is None or position > generation.end


async def resize(conn: asyncpg.Connection, group: str, queue_count: int) -> Resize:
    """Record a switch to `queue_count` members at the category's newest position, as the
    config's next generation (GN). Events written afterwards get higher positions."""
    async with conn.transaction():
        row = await conn.fetchrow(
            "SELECT type, position, data FROM message_store.get_last_stream_message($1)",
            naming.config_stream(group),
        )
        if row is None:
            raise BrokerError(f"group '{group}' does not exist (no config stream)")
        config = GroupConfig.from_json(row["data"])
        try:
            check_queue_count(group, config, queue_count, divide=True)
        except ValueError as exc:
            raise BrokerError(str(exc)) from None
        category = naming.source_category(config)
        await conn.execute("SELECT message_store.acquire_lock($1)", f"{category}-resize")
        switch = await conn.fetchval(
            "SELECT COALESCE(max(global_position), 0) FROM message_store.messages"
        )
        new = dataclasses.replace(
            config, queue_count=queue_count, generation=int(row["position"]) + 1
        )
        await conn.execute(
            "SELECT message_store.write_message($1, $2, 'Resized', $3::jsonb, $4::jsonb, $5)",
            str(uuid.uuid4()),
            naming.config_stream(group),
            new.to_json(),
            orjson.dumps({"position": switch, "previous_queue_count": config.queue_count}).decode(),
            int(row["position"]),
        )
    return Resize(config, new, int(switch))
