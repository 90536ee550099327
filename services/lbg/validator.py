"""The validation client: reads every processed record and checks each key's sequence.

It reads the group's output destinations from the start: processed records (from the LBG
clients), dead letters (skipped events among them), the parking lot's events, and the
publishers' summaries (the last sequence per key), which
turn "delivered" into "lost". It logs sequence errors and shard moves like the original.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lbg.aio import cancel_and_wait
from lbg.broker.base import Broker, BrokerError, OutputMessage
from lbg.metrics import counter, gauge
from lbg.model.destinations import OutputKind
from lbg.model.messages import (
    REASON_HEADER,
    SEQ_HEADER,
    MalformedMessage,
    decode_processed,
    decode_summary,
    read_dead_letter,
)
from lbg.model.parking import SKIPPED_HEADER
from lbg.model.sequence import Observation, Outcome, Report, SequenceChecker

if TYPE_CHECKING:
    from lbg.metrics import Family

log = logging.getLogger(__name__)
shard_log = logging.getLogger(__name__ + ".shards")
PARKED_READ_SECONDS = 5.0

QueueChange = Callable[[int, str | None, str, float | None], None]
ObservationHook = Callable[[Observation], None]


@dataclass
class SummaryParts:
    """The chunks of one publisher's summary received so far."""

    parts: int
    last: dict[str, int] = field(default_factory=dict)
    received: set[int] = field(default_factory=set)

    @property
    def complete(self) -> bool:
        return len(self.received) == self.parts


class Validator:
    """Checks per-key order and completeness of everything the group processed."""

    def __init__(
        self,
        on_queue_change: QueueChange | None = None,
        on_observation: ObservationHook | None = None,
    ) -> None:
        self.checker = SequenceChecker()
        self.summaries: dict[str, SummaryParts] = {}
        self.dead: dict[str, set[int]] = {}
        # Not lost, reported apart: skipped by an operator's unpark --skip-first (a dead letter
        # marked so), and waiting in the parking lot (read from the broker by run_validator).
        self.skipped: dict[str, set[int]] = {}
        self.parked: dict[str, set[int]] = {}
        self.dead_unparsed = 0
        self.unsequenced = 0
        self.malformed_records = 0
        self.last_message = time.monotonic()
        self.last_record_time: float | None = None
        self._on_queue_change = on_queue_change
        self._on_observation = on_observation
        self.key_lag: dict[str, float] = {}

    def handle(self, message: OutputMessage) -> None:
        """Account for one message from the group's output destinations."""
        self.last_message = time.monotonic()
        self.last_record_time = time.time()
        try:
            if message.kind is OutputKind.VALIDATION:
                self._processed(message)
            elif message.kind is OutputKind.SUMMARY:
                self._summary(message)
            elif message.kind is OutputKind.DEAD:
                self._dead(message)
        except MalformedMessage as exc:
            self.malformed_records += 1
            log.warning("ignored a malformed %s record: %s", message.kind.value, exc)

    def _processed(self, message: OutputMessage) -> None:
        record = decode_processed(message.body)
        if record.seq is None:
            self.unsequenced += 1
            return
        if record.published_at is not None and message.at is not None:
            self.key_lag[record.key] = max(0.0, message.at - record.published_at)
        owner = self.checker.queue_owner(record.queue)
        observation = self.checker.observe(record.key, record.seq, record.client, record.queue)
        if self._on_observation is not None:
            self._on_observation(observation)
        if owner != record.client:
            log.info(
                "queue %d now served by client %s (was %s)", record.queue, record.client, owner
            )
            if self._on_queue_change is not None:
                self._on_queue_change(record.queue, owner, record.client, message.at)
        if observation.outcome is not Outcome.IN_ORDER:
            log.warning(
                "Sequence number error (%s). key %s expected %d but received %d :: client %s",
                observation.outcome.value,
                record.key,
                self._expected(record.seq, observation.outcome),
                record.seq,
                record.client,
            )
        if observation.reassigned:
            shard_log.info(
                "Shard assigned new client. key %s was %s now %s",
                record.key,
                observation.previous_client,
                record.client,
            )

    @staticmethod
    def _expected(seq: int, outcome: Outcome) -> int:
        return seq - 1 if outcome is Outcome.GAP else seq + 1

    def _summary(self, message: OutputMessage) -> None:
        summary = decode_summary(message.body)
        parts = self.summaries.setdefault(summary.publisher, SummaryParts(summary.parts))
        parts.last.update(summary.last)
        parts.received.add(summary.part)
        if parts.complete:
            log.info(
                "publisher %s finished: %d keys, %d events",
                summary.publisher,
                len(parts.last),
                sum(parts.last.values()),
            )

    def _dead(self, message: OutputMessage) -> None:
        reason = message.headers.get(REASON_HEADER, "no reason given")
        numbered = read_dead_letter(message.headers)
        if numbered is None:
            self.dead_unparsed += 1
            log.warning("dead letter (no key and sequence): %s", reason)
            return
        key, seq = numbered
        if SKIPPED_HEADER in message.headers:
            self.skipped.setdefault(key, set()).add(seq)
            log.warning("skipped: key %r seq %d: %s", key[:80], seq, reason)
            return
        self.dead.setdefault(key, set()).add(seq)
        log.warning("dead letter: key %r seq %d: %s", key[:80], seq, reason)

    def published(self) -> dict[str, int] | None:
        """Last sequence per key over all publishers whose summary is complete (None: none yet)."""
        complete = [p for p in self.summaries.values() if p.complete]
        if not complete:
            return None
        merged: dict[str, int] = {}
        for parts in complete:
            for key, last in parts.last.items():
                merged[key] = max(merged.get(key, 0), last)
        return merged

    def report(self) -> Report:
        """The current report; `lost` is known once at least one publisher's summary is in."""
        excused: dict[str, set[int]] = {}
        for apart in (self.dead, self.skipped, self.parked):
            for key, seqs in apart.items():
                excused[key] = excused.get(key, set()) | seqs
        report = self.checker.report(self.published(), excused)
        report.unsequenced = self.unsequenced
        report.dead_lettered = sum(len(seqs) for seqs in self.dead.values())
        report.skipped = sum(len(seqs) for seqs in self.skipped.values())
        report.parked = sum(len(seqs) for seqs in self.parked.values())
        return report

    @property
    def complete(self) -> bool:
        """Every summary is in and every published event was delivered or dead-lettered."""
        if not self.summaries or not all(p.complete for p in self.summaries.values()):
            return False
        return self.report().lost == 0

    def metric_families(self, group: str) -> Iterator[Family]:
        """The running report for a Prometheus scrape: running totals as counters (`_total`),
        `lost` only once a publisher summary makes it known (`lbg_validator_lost_known`)."""
        report = self.report()
        totals = {
            "delivered": "Validation records read.",
            "unique": "Distinct events processed.",
            "duplicates": "Events processed more than once.",
            "reordered": "Events processed after a later one of their key.",
            "gaps": "Sequence gaps seen (may fill in later).",
            "handovers": "Times a queue's records started coming from another client.",
            "reassignments": "Events whose key's previous event came from another client.",
            "dead_lettered": "Dead letters seen.",
            "skipped": "Parked events an operator skipped (unpark --skip-first): not lost.",
            "unsequenced": "Events processed that carried no Lbg-Seq (not order-checked).",
        }
        for name, doc in totals.items():
            yield counter(f"lbg_validator_{name}", doc, group, getattr(report, name))
        yield gauge("lbg_validator_keys", "Keys seen.", group, report.keys)
        yield gauge(
            "lbg_validator_parked",
            "Events waiting in the parking lot: not lost.",
            group,
            report.parked,
        )
        known = report.lost is not None
        yield gauge(
            "lbg_validator_lost_known",
            "1 once publisher summaries say what was published (lbg_validator_lost is there).",
            group,
            int(known),
        )
        if report.lost is not None:
            yield gauge(
                "lbg_validator_lost", "Published events never processed.", group, report.lost
            )
        lags = self.key_lag.values()
        yield gauge(
            "lbg_validator_key_lag_max_seconds",
            "Publish to processed record, the largest over keys (each key's latest event).",
            group,
            max(lags, default=0.0),
        )
        yield gauge(
            "lbg_validator_key_lag_mean_seconds",
            "Publish to processed record, averaged over keys (each key's latest event).",
            group,
            sum(lags) / len(lags) if lags else 0.0,
        )
        if self.last_record_time is not None:
            yield gauge(
                "lbg_validator_last_record_timestamp_seconds",
                "Unix time the latest record arrived (time() minus it: how long it has been idle).",
                group,
                self.last_record_time,
            )

    def progress_line(self) -> str:
        """The running counts on one line; `lost` only once a publisher summary makes it known
        (while the publisher runs, nothing says what it published)."""
        report = self.report()
        lost = "" if report.lost is None else f" lost {report.lost}"
        return (
            f"delivered {report.delivered} unique {report.unique}{lost} "
            f"reordered {report.reordered} duplicates {report.duplicates} "
            f"handovers {report.handovers}"
            + (f" parked {report.parked}" if report.parked else "")
            + (f" skipped {report.skipped}" if report.skipped else "")
        )


async def wait_until_complete(validator: Validator, timeout: float) -> bool:
    """Wait until every published event is accounted for (True) or `timeout` passed (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if validator.complete:
            return True
        await asyncio.sleep(0.5)
    return False


async def parked_seqs(broker: Broker, group: str) -> dict[str, set[int]]:
    """The sequence numbers (Lbg-Seq) of every parked event, per key."""
    lot = broker.parking(group)
    found: dict[str, set[int]] = {}
    for key in await lot.records(current=False):
        for event in await lot.events(key):
            seq = event.headers.get(SEQ_HEADER, "")
            if seq.isdigit():
                found.setdefault(key, set()).add(int(seq))
    return found


async def _read_parked(broker: Broker, group: str, validator: Validator) -> None:
    """What the group's parking lot holds, per key (events without a sequence not counted)."""
    try:
        validator.parked = await parked_seqs(broker, group)
    except BrokerError as exc:
        log.debug("parked events not read: %s", exc)


async def run_validator(
    broker: Broker,
    group: str,
    validator: Validator,
    stop: asyncio.Event,
    progress_interval: float = 5.0,
    idle_exit: float = 0.0,
) -> Report:
    """Consume the group's outputs until `stop` is set, or until complete and idle `idle_exit` s."""

    async def consume() -> None:
        async for message in broker.read_output(group):
            validator.handle(message)

    consumer = asyncio.create_task(consume())
    next_progress = time.monotonic() + progress_interval
    next_parked = time.monotonic()
    try:
        while not stop.is_set() and not consumer.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
            now = time.monotonic()
            if now >= next_parked:
                await _read_parked(broker, group, validator)
                next_parked = now + PARKED_READ_SECONDS
            if progress_interval > 0 and now >= next_progress:
                log.info("%s", validator.progress_line())
                next_progress = now + progress_interval
            idle = now - validator.last_message
            if idle_exit > 0 and idle >= idle_exit and validator.complete:
                log.info("all published events accounted for; idle %.1fs: exiting", idle)
                break
    finally:
        await cancel_and_wait(consumer)
    if not consumer.cancelled() and consumer.exception() is not None:
        raise consumer.exception()  # type: ignore[misc]
    await _read_parked(broker, group, validator)
    return validator.report()
