"""Ownership epochs on Solace: claims in a group's claims queue, matched to their RGMIDs.

Solace offers a client no compare-and-set store, so the epoch is assigned by the broker's
spool instead: a new owner of a queue publishes a claim (persistent, waiting for its
receipt) to `_lbgctl/<g>/owners/<q>`, which the queue `lbg.<g>.owners` keeps, and reads it
back with a queue browser. The claim's Replication Group Message ID (RGMID) is
`rmid1:<origin>-<counter>`: a 64-bit origin (the broker or HA pair that spooled it, kept
across HA failover and DR replication) and a 64-bit counter that grows with every message
that origin spools. The API's own compare() orders two RGMIDs of one origin by that counter
and refuses to compare different origins; the epoch is the counter, so a claim spooled
later gets a higher epoch, with no read-modify-write to race.

A new owner claims only once the broker made its flow the active one, that is after the
previous owner's flow lost the queue; the previous owner's claim was read back (spooled)
before it processed anything. So epochs grow with each ownership of a queue. A claim that
straddles a lost session is discarded by the binding (its stint changed), as on RabbitMQ.

Only an origin change breaks the order (a new broker or a rebuilt message spool: the counter
restarts); a reader that sees one warns, and stored epochs must be reset (README). One
browser per group serves every claim of this client; claims expire from the queue after
CLAIM_TTL_SECONDS (provision.py), so a new browser reads little before the newest claims.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from lbg.aio import cancel_and_wait
from lbg.broker.base import BrokerError, needs_upgrade
from lbg.broker.solace.browse import QueueMissing
from lbg.broker.solace.provision import claim_topic, owners_queue_name

log = logging.getLogger(__name__)

CLAIM_TIMEOUT = 5.0
CLAIM_HEADER = "Lbg-Claim"
_RGMID = re.compile(r"rmid1:([0-9a-f]{5})-([0-9a-f]{11})-([0-9a-f]{8})-([0-9a-f]{8})", re.I)

# Opens a started browser on the named queue (blocking; QueueMissing if there is none).
OpenBrowser = Callable[[str], Any]
# Reads the next batch of browsed messages (blocking, waiting a little for the first).
Browse = Callable[[Any, str], list[Any]]
# Publishes a claim's body to a topic with the given headers, returning once persisted.
PublishClaim = Callable[[str, bytes, dict[str, str]], Awaitable[None]]


def parse_rgmid(text: str) -> tuple[str, int]:
    """(origin, counter) of an RGMID's string form; ValueError if it is not one."""
    found = _RGMID.fullmatch(text.strip())
    if found is None:
        raise ValueError(f"not a Replication Group Message ID: {text!r}")
    origin, counter = found.group(1) + found.group(2), found.group(3) + found.group(4)
    return origin.lower(), int(counter, 16)


@dataclass(eq=False)
class _Reader:
    """A group's claims queue, browsed; claims waiting for their epochs by nonce."""

    browser: Any
    waiting: dict[str, asyncio.Future[int]] = field(default_factory=dict)
    origin: str | None = None
    task: asyncio.Task[None] | None = None


class OwnerClaims:
    """This client's claims of ownership epochs, one browser per group."""

    def __init__(self, open_browser: OpenBrowser, browse: Browse, publish: PublishClaim) -> None:
        self._open_browser = open_browser
        self._browse = browse
        self._publish = publish
        self._readers: dict[str, _Reader] = {}
        self._lock = asyncio.Lock()

    async def prepare(self, group: str) -> None:
        """Start the group's browser ahead of the first claim; a group without a claims
        queue is refused now (needs_upgrade), other failures are left for the first claim."""
        try:
            await self._reader(group)
        except QueueMissing:
            raise needs_upgrade(group, f"claims queue '{owners_queue_name(group)}'") from None
        except BrokerError as exc:
            log.warning("group '%s': claims queue not browsed yet: %s", group, exc)

    async def claim(self, group: str, queue: int, record: bytes) -> int:
        """The queue's new epoch: the RGMID counter of this claim, once browsed back."""
        try:
            reader = await self._reader(group)
        except QueueMissing:
            raise needs_upgrade(group, f"claims queue '{owners_queue_name(group)}'") from None
        nonce = uuid.uuid4().hex
        found = reader.waiting[nonce] = asyncio.get_running_loop().create_future()
        try:
            await self._publish(claim_topic(group, queue), record, {CLAIM_HEADER: nonce})
            return await asyncio.wait_for(found, CLAIM_TIMEOUT)
        except TimeoutError:
            raise BrokerError(
                f"claim of queue {queue} not read back within {CLAIM_TIMEOUT:g}s"
            ) from None
        finally:
            reader.waiting.pop(nonce, None)

    async def close(self) -> None:
        readers, self._readers = list(self._readers.values()), {}
        for reader in readers:  # each reader's task unbinds its browser as it ends
            if reader.task is not None:
                await cancel_and_wait(reader.task)

    async def _reader(self, group: str) -> _Reader:
        """The group's reader, started (again, after its browser went down) when needed."""
        async with self._lock:
            reader = self._readers.get(group)
            if reader is not None:
                return reader
            name = owners_queue_name(group)
            reader = _Reader(await asyncio.to_thread(self._open_browser, name))
            reader.task = asyncio.create_task(self._read(group, name, reader), name=name)
            self._readers[group] = reader
            return reader

    async def _read(self, group: str, name: str, reader: _Reader) -> None:
        """Settle waiting claims as the browser hands them over, until it goes down."""
        try:
            while True:
                for message in await asyncio.to_thread(self._browse, reader.browser, name):
                    self._settle(reader, message)
        except BrokerError as exc:
            log.warning("group '%s': %s; browsing again at the next claim", group, exc)
        finally:
            if self._readers.get(group) is reader:
                del self._readers[group]
            for found in reader.waiting.values():
                if not found.done():
                    found.set_exception(BrokerError(f"claims queue '{name}' not browsed"))
            with contextlib.suppress(Exception):
                await asyncio.to_thread(reader.browser.terminate, 0)

    @staticmethod
    def _settle(reader: _Reader, message: Any) -> None:
        """Hand a browsed claim's epoch to the claim waiting for it, if any."""
        nonce = str((message.get_properties() or {}).get(CLAIM_HEADER, ""))
        found = reader.waiting.get(nonce)
        if found is None or found.done():
            return
        rgmid = message.get_replication_group_message_id()
        try:
            origin, counter = parse_rgmid(str(rgmid) if rgmid is not None else "")
        except ValueError as exc:
            found.set_exception(BrokerError(f"claim without a usable RGMID: {exc}"))
            return
        if reader.origin is not None and origin != reader.origin:
            log.warning(
                "claims now spooled by another origin (%s, was %s): epochs restart; reset"
                " the epochs your handlers stored",
                origin,
                reader.origin,
            )
        reader.origin = origin
        found.set_result(counter)
