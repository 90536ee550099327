"""A resizable group's sizes over time, and which queue reads what across them. Pure logic,
shared by every broker that resizes (Message DB, NATS JetStream).

Each resize starts a generation: a size, read from a switch point in the broker's data on
(the global position or stream sequence after the last one read under the old size).
Generation g reads `start..end`; every event at or below the switch is read under the old
size, every later one under the new size, and nothing of a generation is read before the
old readers of the same buckets are drained up to their end (the safe point). So no key is
read by two members at once, and each key stays in order across the switch.

Queue q of the current size S walks its stints in generation order: member q of each
generation that has one, plus the members r >= S of older, larger generations with
r mod S = q (which no queue of the current size has any more).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from lbg.model.group import MAX_GENERATION, GroupConfig


@dataclass(frozen=True, slots=True)
class Generation:
    """One size of the group and the global positions (or sequences) it reads."""

    index: int
    size: int
    start: int
    end: int | None  # None while it is the current generation


def members_for(queue: int, generation: Generation, size: int) -> list[int]:
    """The members of `generation` that queue `queue` of the current `size` reads."""
    members = [queue] if queue < generation.size else []
    if queue < size:
        members += [r for r in range(size, generation.size) if r % size == queue]
    return members


def sources(buckets: list[int], generation: Generation) -> list[int]:
    """The members of an older `generation` that carried any of `buckets` (bucket mod size)."""
    return sorted({bucket % generation.size for bucket in buckets})


def switched(history: list[Generation], size: int, switch: int) -> list[Generation]:
    """The history with its current generation ended at `switch` and a new one of `size`."""
    last = history[-1]
    ended = Generation(last.index, last.size, last.start, switch)
    return [*history[:-1], ended, Generation(last.index + 1, size, switch + 1, None)]


def check_queue_count(group: str, config: GroupConfig, queue_count: int, divide: bool) -> None:
    """Refuse, in one line, a new queue count the group's hash cannot take: QC <= HC always,
    and where the broker maps keys to members by hash modulo QC, a divisor of HC."""
    if queue_count == config.queue_count:
        raise ValueError(f"group '{group}' has {queue_count} queues already")
    if queue_count < 1 or queue_count > config.hash_count:
        raise ValueError(
            f"cannot resize group '{group}' to QC (queue count) {queue_count}: it must be "
            f"1..HC (hash count) {config.hash_count}, so every queue has a bucket"
        )
    if divide and config.hash_count % queue_count:
        raise ValueError(
            f"cannot resize group '{group}' to QC (queue count) {queue_count}: it must divide "
            f"HC (hash count) {config.hash_count}, so every stream keeps its bucket's member"
        )
    if config.generation + 1 > MAX_GENERATION:
        raise ValueError(f"group '{group}' was resized {MAX_GENERATION} times already")


def encode(history: list[Generation]) -> bytes:
    """The history as stored (JSON: one [size, start, end] per generation)."""
    return orjson.dumps([[g.size, g.start, g.end] for g in history])


def decode(data: bytes) -> list[Generation]:
    """A stored history; ValueError if it is not one."""
    try:
        rows = orjson.loads(data)
        return [
            Generation(i, int(s), int(a), None if e is None else int(e))
            for i, (s, a, e) in enumerate(rows)
        ]
    except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
        raise ValueError(f"stored generations are invalid: {exc}") from None
