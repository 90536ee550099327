"""The hashed publisher: numbers each key's events and publishes them to `<HP>/<bucket>/<key>`.

Nothing counts as sent until the broker acknowledged it. At most one publish per key is in
flight, so a retried publish can never overtake a later event of the same key; many keys
are in flight at once (up to `window`), which keeps throughput high. The body is the
producer's; the key's sequence number and publish time travel in headers.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import orjson

from lbg.broker.base import Broker, PublishError, UndeliverableEvent, why
from lbg.metrics import PUBLISH_SECONDS, counter, gauge
from lbg.model.destinations import OutputKind, event_destination, output_destination
from lbg.model.group import GroupConfig
from lbg.model.messages import MalformedMessage, check_key, encode_summaries, event_headers

if TYPE_CHECKING:
    from lbg.metrics import Family

log = logging.getLogger(__name__)

RETRIES = 8
READ_CHUNK_BYTES = 256 * 1024


class PublishFailed(Exception):
    """A publish still failed after every retry: the run stops, the summary says what was acked."""


@dataclass
class PublishStats:
    """What a publisher run achieved; `acked` counts only broker-confirmed events."""

    acked: int = 0
    retried: int = 0
    rejected_input: int = 0
    started: float = field(default_factory=time.monotonic)
    elapsed: float = 0.0
    last_seq: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.acked / self.elapsed if self.elapsed > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "acked": self.acked,
            "retried": self.retried,
            "rejected_input": self.rejected_input,
            "keys": len(self.last_seq),
            "elapsed_s": round(self.elapsed, 3),
            "rate_per_s": round(self.rate, 1),
        }


def generated_keys(count: int) -> list[str]:
    """Keys like the original test's topics: `<uuid>/<uuid>`, fresh for every run."""
    return [f"{uuid.uuid4()}/{uuid.uuid4()}" for _ in range(count)]


async def cycle_keys(keys: list[str]) -> AsyncIterator[tuple[str, bytes]]:
    """Round-robin over the keys forever, as the original publisher did (empty bodies)."""
    while True:
        for key in keys:
            yield key, b""


NOT_AN_OBJECT = 'not a JSON object (expected {"key": ..., "data": <JSON>} or "body": "<text>")'


def parse_line(line: bytes | str, where: str) -> tuple[str, bytes]:
    """One JSON-lines input record: `{"key": ..., "data": <any JSON>}` (the body is that JSON)
    or `{"key": ..., "body": "<text>"}` (the body is that text, UTF-8); MalformedMessage
    names `where`."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        if line.lstrip()[:1] not in (b"{", "{"):
            raise MalformedMessage(f"{where}: {NOT_AN_OBJECT}") from None
        raise MalformedMessage(
            f"{where}: not valid JSON ({exc.msg} at column {exc.colno})"
        ) from None
    if not isinstance(record, dict) or "key" not in record:
        raise MalformedMessage(f'{where}: expected an object with a "key" field')
    body = record.get("body")
    if body is not None and not isinstance(body, str):
        raise MalformedMessage(f'{where}: "body" must be a string, got {type(body).__name__}')
    try:
        key = check_key(record["key"])
    except MalformedMessage as exc:
        raise MalformedMessage(f"{where}: {exc}") from None
    if body is not None:
        return key, body.encode()
    return key, b"" if record.get("data") is None else orjson.dumps(record["data"])


async def read_lines(
    stream: BinaryIO, name: str, stats: PublishStats
) -> AsyncIterator[tuple[str, bytes]]:
    """Events from a JSON-lines byte stream, read in a thread; bad lines are logged and skipped."""
    number = 0
    while True:
        lines: list[bytes] = await asyncio.to_thread(stream.readlines, READ_CHUNK_BYTES)
        if not lines:
            return
        for line in lines:
            number += 1
            if not line.strip():
                continue
            try:
                yield parse_line(line, f"{name}:{number}")
            except MalformedMessage as exc:
                stats.rejected_input += 1
                log.warning("skipped input line: %s", exc)


async def read_file(path: str, stats: PublishStats) -> AsyncIterator[tuple[str, bytes]]:
    """Events from a JSON-lines file."""
    with Path(path).open("rb") as stream:
        async for item in read_lines(stream, path, stats):
            yield item


@dataclass(slots=True)
class _Pending:
    """An event numbered and queued behind its key's earlier ones; `confirmed` tells how it
    ended (True once the broker confirmed it)."""

    seq: int
    body: bytes
    headers: Mapping[str, str] | None
    confirmed: asyncio.Future[bool]


class HashedPublisher:
    """Publishes keyed events to a group with per-key sequence numbers and broker acks.

    The body is the caller's bytes, unchanged; the key's sequence number and the publish time
    travel in the `Lbg-Seq` and `Lbg-Time` headers beside the caller's own headers.
    """

    def __init__(
        self,
        broker: Broker,
        group: str,
        config: GroupConfig,
        publisher_id: str,
        window: int = 1000,
        rate: float = 0.0,
    ) -> None:
        self._broker = broker
        self._group = group
        self._config = config
        self.publisher_id = publisher_id
        self._window = asyncio.Semaphore(max(1, window))
        self._rate = rate
        self._sequence: dict[str, int] = {}
        self._waiting: dict[str, collections.deque[_Pending]] = {}
        self._senders: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None
        self._ack_seconds = PUBLISH_SECONDS.labels(group)
        self.stats = PublishStats()

    async def run(
        self,
        events: AsyncIterator[tuple[str, bytes]],
        count: int = 0,
        duration: float = 0.0,
        stop: asyncio.Event | None = None,
        progress_interval: float = 5.0,
    ) -> PublishStats:
        """Publish (key, body) pairs until they end, `count` or `duration` is reached, or
        `stop` is set."""
        stats = self.stats
        stats.started = time.monotonic()
        deadline = stats.started + duration if duration > 0 else None
        next_progress = stats.started + progress_interval
        sent = 0
        async for key, body in events:
            now = time.monotonic()
            if (stop is not None and stop.is_set()) or (deadline is not None and now >= deadline):
                break
            if count and sent >= count:
                break
            if self._failure is not None:
                break
            if now >= next_progress:
                log.info(
                    "published %d events (%.0f/s)", stats.acked, stats.acked / (now - stats.started)
                )
                next_progress = now + progress_interval
            await self._pace(sent)
            await self._submit(key, body, None)
            sent += 1
        await self.flush()
        if self._failure is not None:
            raise PublishFailed(str(self._failure))
        return stats

    async def publish(
        self, key: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> int:
        """Publish one event and return its sequence number once the broker confirmed it.

        Events of one key go out one after another, in call order; other keys' events go
        concurrently. Raises PublishFailed if the broker never confirmed it (every retry
        failed), MalformedMessage for an unusable key, UndeliverableEvent for one the broker
        cannot take (a key its destinations cannot carry, a body it cannot store)."""
        event = await self._submit(check_key(key), body, headers)
        if not await event.confirmed:
            raise PublishFailed(str(self._failure or f"key {key[:80]!r} refused by the broker"))
        return event.seq

    async def flush(self) -> None:
        """Wait until every event submitted so far is confirmed or given up."""
        while self._senders:
            await asyncio.gather(*self._senders, return_exceptions=True)
        self.stats.elapsed = time.monotonic() - self.stats.started

    async def _pace(self, sent: int) -> None:
        if self._rate > 0:
            delay = self.stats.started + sent / self._rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

    async def _submit(self, key: str, body: bytes, headers: Mapping[str, str] | None) -> _Pending:
        """Number the event and queue it behind the key's earlier ones; the key's sender (one
        task per key with events in flight, not one per event) publishes them in order."""
        await self._window.acquire()
        seq = self._sequence[key] = self._sequence.get(key, 0) + 1
        event = _Pending(seq, body, headers, asyncio.get_running_loop().create_future())
        waiting = self._waiting.get(key)
        if waiting is not None:
            waiting.append(event)
            return event
        self._waiting[key] = collections.deque((event,))
        sender = asyncio.create_task(self._send_key(key))
        self._senders.add(sender)
        sender.add_done_callback(self._senders.discard)
        return event

    async def _send_key(self, key: str) -> None:
        """Publish the key's queued events one after another until none is left; an error no
        adapter mapped stops the run (one line from PublishFailed) instead of dropping the
        event unseen, and gives up the key's events behind it."""
        waiting = self._waiting[key]
        try:
            while waiting:
                event = waiting[0]
                confirmed = self._failure is None and await self._publish(key, event)
                waiting.popleft()
                self._settle(event, confirmed)
        except Exception as exc:
            if self._failure is None:
                self._failure = exc
                log.error("publish of key %r failed: %s", key[:80], why(exc))
            while waiting:
                self._settle(waiting.popleft(), False)
        finally:
            del self._waiting[key]

    def _settle(self, event: _Pending, confirmed: bool) -> None:
        """Tell the event's caller how it ended and free its window slot."""
        if not event.confirmed.done():
            event.confirmed.set_result(confirmed)
        self._window.release()

    async def _publish(self, key: str, event: _Pending) -> bool:
        """Publish one event, retrying; True once confirmed."""
        bucket = self._config.bucket_for_key(key)
        destination = event_destination(self._config.hash_prefix, bucket, key)
        all_headers = event_headers(event.seq, time.time(), event.headers)
        seq = event.seq
        delay = 0.1
        for attempt in range(RETRIES + 1):
            started = time.monotonic()
            try:
                await self._broker.publish(destination, event.body, all_headers)
            except UndeliverableEvent as exc:
                self.stats.rejected_input += 1
                log.warning("refused key %r: %s", key[:80], exc)
                return False
            except PublishError as exc:
                if attempt == RETRIES:
                    self._failure = exc
                    log.error("giving up on key %r seq %d: %s", key[:80], seq, exc)
                    return False
                self.stats.retried += 1
                log.warning("publish of key %r seq %d failed (%s); retrying", key[:80], seq, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            else:
                self._ack_seconds.observe(time.monotonic() - started)
                self.stats.acked += 1
                self.stats.last_seq[key] = seq
                return True
        return False

    def metric_families(self) -> Iterator[Family]:
        """This publisher's counters for a Prometheus scrape."""
        g, s = self._group, self.stats
        yield counter("lbg_publisher_acked", "Events the broker confirmed.", g, s.acked)
        yield counter("lbg_publisher_retried", "Publish attempts retried.", g, s.retried)
        yield counter(
            "lbg_publisher_rejected_input", "Input lines skipped as bad.", g, s.rejected_input
        )
        yield gauge(
            "lbg_publisher_failed",
            "1 once an event was given up after every retry (the publisher stops), else 0.",
            g,
            int(self._failure is not None),
        )
        yield gauge("lbg_publisher_keys", "Keys published so far.", g, len(s.last_seq))

    async def publish_summary(self) -> int:
        """Tell the validator the last acked sequence of every key; returns the message count."""
        destination = output_destination(self._group, OutputKind.SUMMARY)
        chunks: Iterable[bytes] = encode_summaries(self.publisher_id, self.stats.last_seq)
        sent = 0
        for chunk in chunks:
            await self._broker.publish(destination, chunk)
            sent += 1
        return sent
