"""One client's side of ordered dead letters: which keys are parked, and the moves that park
a key, note a hung handler and replay a key the operator unparked (model/parking.py says what
a record means).

The registry lives in the broker; this keeps a copy, read again whenever the client takes a
queue over (before the queue's first event is processed) and every REFRESH_SECONDS (to hear of
an unpark). Only the owner of a key's queue parks the key, and it writes the record before it
acks the event that parked it, so a successor that read the registry knows every parked key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from lbg.broker.base import Broker, BrokerError, ParkedEvent, ParkingLot
from lbg.model.messages import MalformedMessage
from lbg.model.parking import (
    REPLAY,
    SUSPECT,
    ParkedKey,
    lot_headers,
    original_headers,
    parked,
    parked_again,
    stalled,
)

log = logging.getLogger(__name__)

REFRESH_SECONDS = 1.0

# Runs one parked event through the handler (with retries): None if it was handled, else why not
# and after how many attempts.
Replayer = Callable[[ParkedEvent], Awaitable[tuple[str, int] | None]]


class KeyParking:
    """The parked keys of one client's group, and the moves that change them."""

    def __init__(self, broker: Broker, group: str, client_id: str) -> None:
        self._client = client_id
        try:
            self._lot: ParkingLot | None = broker.parking(group)
        except BrokerError as exc:
            log.warning("%s: events that keep failing are dead-lettered instead", exc)
            self._lot = None
        self.records: dict[str, ParkedKey] = {}
        self._touched: set[str] = set()
        self._refreshed = float("-inf")
        self._replaying: set[str] = set()
        self._takeover_reads: dict[int, asyncio.Task[None]] = {}
        self.parked_events = 0

    @property
    def enabled(self) -> bool:
        """Whether the broker keeps a parking lot for the group (else: dead-letter as before)."""
        return self._lot is not None

    def is_parked(self, key: str) -> bool:
        record = self.records.get(key)
        return record is not None and record.parked

    def parked_keys(self) -> int:
        """How many keys are parked now (as far as this client knows)."""
        return sum(1 for record in self.records.values() if record.parked)

    async def refresh(self, current: bool = True) -> None:
        """Read the registry again (BrokerError if it cannot be read); a record this client
        wrote meanwhile wins over what the read returned. `current`: see ParkingLot.records."""
        if self._lot is None:
            return
        self._touched.clear()
        started = time.monotonic()
        fetched: dict[str, ParkedKey] = {}
        for key, data in (await self._lot.records(current)).items():
            try:
                fetched[key] = ParkedKey.from_json(data)
            except MalformedMessage as exc:
                log.warning("parked key %r: %s (ignored)", key[:80], exc)
        for key in self._touched:
            fetched.pop(key, None)
            if key in self.records:
                fetched[key] = self.records[key]
        self.records = fetched
        self._refreshed = started

    def forget_unstarted_replays(self, queue_of: Callable[[str], int | None], queue: int) -> None:
        """The worker of `queue` let go with its lanes drained: a replay of one of its keys
        still marked never ran (left to the next owner at a handover, or skipped), so whoever
        takes the queue next, this client included, hands it out again."""
        self._replaying = {key for key in self._replaying if queue_of(key) != queue}

    def start_takeover_read(self, queue: int) -> None:
        """Start reading the registry the moment `queue` is taken over, so the read runs beside
        the binding's epoch claim rather than after it; it begins after the previous owner
        let go, so it has every key that owner parked."""
        self.drop_takeover_read(queue)
        self._takeover_reads[queue] = asyncio.create_task(
            self.refresh(), name=f"parked-read-{queue}"
        )

    async def takeover_read(self, queue: int) -> None:
        """Wait for the read started when `queue` was taken over (or read now, if none was);
        BrokerError if the registry cannot be read."""
        read = self._takeover_reads.pop(queue, None)
        await (read if read is not None else self.refresh())

    def drop_takeover_read(self, queue: int) -> None:
        """The queue was lost before its read was awaited: the read finishes unawaited (not
        cancelled: that could leave the broker's stream reader half set up for every later
        read), its error only taken."""
        read = self._takeover_reads.pop(queue, None)
        if read is not None:
            read.add_done_callback(_take_error)

    def drop_takeover_reads(self) -> None:
        """The client stops, its broker connection with it: cancel every read nobody awaited."""
        for read in self._takeover_reads.values():
            read.cancel()
            read.add_done_callback(_take_error)
        self._takeover_reads.clear()

    async def refresh_if_due(self) -> None:
        """Read the registry if it was not read for REFRESH_SECONDS (failures only logged)."""
        if self._lot is None or time.monotonic() - self._refreshed < REFRESH_SECONDS:
            return
        self._refreshed = time.monotonic()
        try:
            await self.refresh(current=False)
        except BrokerError as exc:
            log.warning("cannot read the parked keys: %s", exc)

    def replays_waiting(self) -> bool:
        """Whether an operator asked to replay a key whose replay has not started yet."""
        return any(
            record.state == REPLAY and key not in self._replaying
            for key, record in self.records.items()
        )

    def replays_due(self, owns: Callable[[str], bool]) -> list[str]:
        """Keys an operator asked to replay whose queue this client serves (`owns`), each
        handed out once while its replay runs."""
        due = [
            key
            for key, record in self.records.items()
            if record.state == REPLAY and key not in self._replaying and owns(key)
        ]
        self._replaying.update(due)
        return due

    async def _put(self, record: ParkedKey) -> None:
        assert self._lot is not None
        await self._lot.put(record.key, record.to_json())
        self._touched.add(record.key)
        self.records[record.key] = record

    async def _delete(self, key: str) -> None:
        assert self._lot is not None
        await self._lot.delete(key)
        self._touched.add(key)
        self.records.pop(key, None)

    async def park(
        self,
        key: str,
        body: bytes,
        headers: dict[str, str],
        redelivered: bool,
        reason: str,
        attempts: int,
        **where: str,
    ) -> None:
        """Park one event of `key`: the key in the registry first (if it is not yet), then the
        event behind the key's others in the lot. A redelivered event that is the lot's last
        already (parked, then the member died before its ack) is not parked twice."""
        assert self._lot is not None
        record = self.records.get(key)
        if record is None or not record.parked:
            stalls = record.stalls if record is not None else 0
            await self._put(parked(key, reason, attempts, self._client, stalls))
            log.warning("key %r parked: %s", key[:80], reason)
        if redelivered:
            lot = await self._lot.events(key)
            if lot and lot[-1].body == body and original_headers(lot[-1].headers) == headers:
                return
        parked_at = f"{time.time():.3f}"
        tags = {"reason": reason, "attempts": str(attempts), "by": self._client, "at": parked_at}
        await self._lot.append(key, body, lot_headers(headers, **tags, **where))
        self.parked_events += 1

    async def note_stall(self, key: str) -> ParkedKey:
        """Count one more stall of the key's handler in the registry."""
        record = stalled(self.records.get(key), key, self._client)
        await self._put(record)
        return record

    async def handled(self, key: str) -> None:
        """The key's event was handled: a suspect key (its handler hung before) is cleared."""
        record = self.records.get(key)
        if record is not None and record.state == SUSPECT:
            await self._delete(key)

    async def replay(self, key: str, run: Replayer) -> None:
        """Replay the key's lot in order through `run`, dropping each event once handled (and
        the lot up to `skip_through` first); unpark the key when the lot is empty, or park it
        again with the new reason when an event fails again. BrokerError: the replay stopped
        (it resumes from where it was when the queue is taken over again)."""
        assert self._lot is not None
        try:
            record = self.records.get(key)
            if record is None or record.state != REPLAY:
                return
            if record.skip_through:
                await self._lot.trim(key, record.skip_through)
            for event in await self._lot.events(key):
                failed = await run(event)
                if failed is not None:
                    reason, attempts = failed
                    await self._put(parked_again(record, reason, attempts, self._client))
                    log.warning("key %r parked again during its replay: %s", key[:80], reason)
                    return
                await self._lot.trim(key, event.position)
            await self._delete(key)
            log.info("key %r unparked: its parked events were replayed", key[:80])
        finally:
            self._replaying.discard(key)

    def suspects(self, key: str) -> ParkedKey | None:
        """The key's record if its handler hung before (a suspect), else None."""
        record = self.records.get(key)
        return record if record is not None and record.state == SUSPECT else None


class HangWatch:
    """Poison by hang: counts, in the registry, each time a key's handler hangs past the stall
    timeout; at `limit` stalls it cancels the waiting task so the event is parked, instead of
    the member stalling (and the key's queue moving on to stall the next member). One sweep
    every SWEEP of the timeout looks at the calls in flight (no timer per call: a timer set
    and cancelled per event cost the hot path more than the rest of this watch)."""

    SWEEP = 0.05

    def __init__(self, parking: KeyParking, stall_timeout: float | None) -> None:
        self._parking = parking
        self._timeout = stall_timeout
        self._calls: dict[asyncio.Task[object], tuple[str, float, int]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._hung: dict[asyncio.Task[object], str] = {}
        self._notes: set[asyncio.Task[None]] = set()

    def watch(self, key: str, limit: int, started: float) -> asyncio.Task[object] | None:
        """Watch the running task's handler call of `key` (begun at monotonic `started`)
        until `done` is given what this returns: a stall is counted just before the stall
        timeout; a key that stalled `limit - 1` times before is parked at half the timeout
        instead, before its member would stall."""
        if self._timeout is None or not self._parking.enabled:
            return None
        task: asyncio.Task[object] = asyncio.current_task()  # type: ignore[assignment]
        self._calls[task] = (key, started, limit)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep(self._timeout))
        return task

    def done(self, watched: asyncio.Task[object] | None) -> None:
        """The handler call `watch` returned `watched` for ended (None: it was not watched)."""
        if watched is not None:
            self._calls.pop(watched, None)

    async def _sweep(self, timeout: float) -> None:
        """While calls are in flight: count a stall of each call past its delay, once."""
        noted: set[tuple[asyncio.Task[object], float]] = set()
        while self._calls:
            await asyncio.sleep(timeout * self.SWEEP)
            now = time.monotonic()
            for task, (key, started, limit) in list(self._calls.items()):
                suspect = self._parking.suspects(key)
                last = suspect is not None and suspect.stalls + 1 >= limit
                if now - started >= timeout * (0.5 if last else 0.85) and (
                    (task, started) not in noted
                ):
                    noted.add((task, started))
                    self._stalled(key, task, limit)
            noted = {(t, at) for t, at in noted if t in self._calls and self._calls[t][1] == at}

    def hung(self) -> str | None:
        """Why the running task was cancelled, if this watch cancelled it (None: it did not,
        the cancellation is someone else's); the task is uncancelled then."""
        task = asyncio.current_task()
        reason = self._hung.pop(task, None)  # type: ignore[arg-type]
        if reason is not None and task is not None:
            task.uncancel()
        return reason

    def _stalled(self, key: str, task: asyncio.Task[object], limit: int) -> None:
        note = asyncio.create_task(self._note(key, task, limit))
        self._notes.add(note)
        note.add_done_callback(self._notes.discard)

    async def _note(self, key: str, task: asyncio.Task[object], limit: int) -> None:
        try:
            record = await self._parking.note_stall(key)
        except BrokerError as exc:
            log.error("key %r: cannot count its handler's stall: %s", key[:80], exc)
            return
        log.warning("key %r: handler hung (stall %d)", key[:80], record.stalls)
        if record.stalls >= limit and not task.done():
            self._hung[task] = f"handler hung past the stall timeout {record.stalls} times"
            task.cancel()


def _take_error(read: asyncio.Task[None]) -> None:
    """Retrieve an unawaited read's error, so asyncio does not report it as never retrieved."""
    if not read.cancelled():
        read.exception()
