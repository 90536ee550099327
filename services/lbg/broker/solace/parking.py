"""A group's parking lot on Solace: one durable non-exclusive queue, `lbg.<g>.parked`, owned by
the group's CU and subscribed to `_lbgpark/<g>`, holds everything, append-only (records,
parked events and trims, folded as broker/parkfold.py says). Nothing consumes it: every read
browses it from its oldest message with a queue browser and folds what it sees, so an event's
position is its place among the queue's messages. A read that must see every write confirmed
before it (a member taking a queue over, an operator command) first publishes a sync marker
and browses until it has passed it, then removes the marker with the browser (markers are not
counted, so removing one moves no position); the periodic look browses what is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from solace.messaging.errors.pubsubplus_client_error import PubSubPlusClientError
from solace.messaging.receiver.inbound_message import InboundMessage

from lbg.broker.base import BrokerError
from lbg.broker.parkfold import SYNC_HEADER, FoldedParkingLot, ParkFold, park_headers
from lbg.broker.solace.binding import Inbound
from lbg.broker.solace.browse import QueueMissing, browse
from lbg.broker.solace.provision import parked_queue_name, parked_topic

SYNC_TIMEOUT = 10.0

# Publishes a body with the given headers to a topic, persisted before it returns.
Send = Callable[[str, bytes, Mapping[str, str]], Awaitable[None]]


class Browser(Protocol):
    """What a read needs of the API's MessageQueueBrowser."""

    def receive_message(self, timeout: int | None = None) -> Any: ...
    def remove(self, message: Any) -> Any: ...
    def terminate(self, grace_period: int = 0) -> Any: ...


def fold_lot(
    browser: Browser,
    name: str,
    sync: str | None,
    convert: Callable[[Any], Inbound],
) -> ParkFold:
    """Browse the lot from its oldest message and fold it: to the end of what is there
    (`sync` None), or until the marker `sync` (which is removed then). Blocking: run it in a
    worker thread; the browser is started (browse.open_browser) and not terminated here."""
    fold = ParkFold()
    position = 0
    deadline = time.monotonic() + SYNC_TIMEOUT
    while True:
        batch = browse(browser, name)
        if not batch and sync is None:
            return fold
        for message in batch:
            received = convert(message)
            marker = received.headers.get(SYNC_HEADER)
            if marker is None:
                position += 1
                fold.apply(received.headers, received.body, position)
            elif marker == sync:
                with contextlib.suppress(PubSubPlusClientError):
                    browser.remove(message)
                return fold
        if time.monotonic() > deadline:
            raise BrokerError(f"parking queue '{name}' not read in time (no sync marker back)")


class SolaceParkingLot(FoldedParkingLot):
    """One group's registry and lot: confirmed publishes to its topic, browsed reads."""

    def __init__(
        self,
        group: str,
        open_browser: Callable[[str], Browser],
        send: Send,
        convert: Callable[[InboundMessage], Inbound],
    ) -> None:
        self._group = group
        self._name = parked_queue_name(group)
        self._open_browser = open_browser
        self._send_to = send
        self._convert = convert

    async def _fold(self, current: bool) -> ParkFold:
        sync = uuid.uuid4().hex if current else None
        if sync is not None:
            await self._send_to(parked_topic(self._group), b"", {SYNC_HEADER: sync})
        return await asyncio.to_thread(self._read, sync)

    def _read(self, sync: str | None) -> ParkFold:
        try:
            browser = self._open_browser(self._name)
        except QueueMissing as exc:
            raise BrokerError(
                f"group '{self._group}' has no parking queue ({exc}; made before parking "
                f"existed: run cg-admin upgrade {self._group})"
            ) from None
        try:
            return fold_lot(browser, self._name, sync, self._convert)
        finally:
            with contextlib.suppress(Exception):
                browser.terminate(0)

    async def _send(self, op: str, key: str, body: bytes, headers: Mapping[str, str]) -> None:
        try:
            await self._send_to(parked_topic(self._group), body, park_headers(op, key, headers))
        except BrokerError as exc:
            raise BrokerError(f"parking ({op}) of key {key[:80]!r}: {exc}") from None
