"""Solace's parking lot up to the broker boundary (no Solace broker runs here): the lot's
moves over a queue kept in a list, with messages the API itself builds and reads back
(adapter.outbound_message, the API's InboundMessage, adapter.inbound), browsed as the API's
MessageQueueBrowser is: oldest first, new ones as they come, `remove` taking one away."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from tests.unit.test_solace_adapter import SETTINGS, received

from lbg.broker.base import BrokerError
from lbg.broker.parkfold import SYNC_HEADER
from lbg.broker.solace import adapter
from lbg.broker.solace.browse import QueueMissing
from lbg.broker.solace.parking import SolaceParkingLot


class ListQueue:
    """A queue subscribed to one topic, as a list of the messages spooled on it."""

    def __init__(self) -> None:
        self.service = adapter.build_service(SETTINGS, "v")
        self.messages: list[Any] = []
        self.topics: list[str] = []
        self.browsers = 0

    async def send(self, topic: str, body: bytes, headers: Mapping[str, str]) -> None:
        self.topics.append(topic)
        self.messages.append(received(adapter.outbound_message(self.service, body, headers)))

    def browser(self, name: str) -> ListBrowser:
        assert name == "lbg.g1.parked"
        self.browsers += 1
        return ListBrowser(self)


class ListBrowser:
    """A browser's cursor over the queue: it sees messages spooled after it started too."""

    def __init__(self, queue: ListQueue) -> None:
        self.queue = queue
        self.seen: list[Any] = []
        self.terminated = False

    def receive_message(self, timeout: int | None = None) -> Any:
        for message in self.queue.messages:
            if not any(message is s for s in self.seen):
                self.seen.append(message)
                return message
        return None

    def remove(self, message: Any) -> None:
        self.queue.messages = [m for m in self.queue.messages if m is not message]

    def terminate(self, grace_period: int = 0) -> None:
        self.terminated = True


def lot(queue: ListQueue) -> SolaceParkingLot:
    return SolaceParkingLot("g1", queue.browser, queue.send, adapter.inbound)


def test_records_events_and_trims_fold_in_order_on_the_groups_topic() -> None:
    async def scenario() -> None:
        queue = ListQueue()
        parking = lot(queue)
        await parking.put("k/1", b"rec-1")
        await parking.append("k/1", b"e1", {"Lbg-Seq": "5", "Lbg-Parked-Reason": "boom"})
        await parking.append("other", b"o1", {})
        await parking.append("k/1", b"e2", {"Lbg-Seq": "6"})
        assert await parking.records() == {"k/1": b"rec-1"}
        events = await parking.events("k/1")
        assert [(e.body, dict(e.headers)) for e in events] == [
            (b"e1", {"Lbg-Seq": "5", "Lbg-Parked-Reason": "boom"}),
            (b"e2", {"Lbg-Seq": "6"}),
        ]
        assert events[0].position < events[1].position
        await parking.trim("k/1", events[0].position)
        await parking.trim("k/1", events[0].position)
        assert [e.body for e in await parking.events("k/1")] == [b"e2"]
        await parking.put("k/1", b"rec-2")
        assert await parking.records(current=False) == {"k/1": b"rec-2"}
        await parking.delete("k/1")
        await parking.trim("k/1", events[1].position)
        assert await parking.records() == {}
        assert await parking.events("k/1") == []
        assert [e.body for e in await parking.events("other")] == [b"o1"]
        assert set(queue.topics) == {"_lbgpark/g1"}

    asyncio.run(scenario())


def test_a_current_read_passes_its_own_marker_and_removes_it_keeping_positions() -> None:
    async def scenario() -> None:
        queue = ListQueue()
        parking = lot(queue)
        await parking.append("k", b"e1", {})
        await queue.send("_lbgpark/g1", b"", {SYNC_HEADER: "someone-elses"})
        await parking.append("k", b"e2", {})
        first = await parking.events("k")
        assert len(queue.messages) == 3, "only the reader's own marker is removed"
        assert await parking.events("k") == first
        assert await parking.records(current=False) == {}
        assert len(queue.messages) == 3, "a read that is not current writes no marker"

    asyncio.run(scenario())


def test_a_current_read_whose_marker_never_comes_back_fails_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("lbg.broker.solace.parking.SYNC_TIMEOUT", 0.0)
    monkeypatch.setattr("lbg.broker.solace.browse.BROWSE_WAIT_MS", 0)

    async def scenario() -> None:
        queue = ListQueue()

        async def lost(topic: str, body: bytes, headers: Mapping[str, str]) -> None: ...

        parking = SolaceParkingLot("g1", queue.browser, lost, adapter.inbound)
        with pytest.raises(BrokerError, match=r"parking queue 'lbg\.g1\.parked' not read"):
            await parking.records()

    asyncio.run(scenario())


def test_the_broker_reaches_the_lot_through_the_api_and_names_a_missing_queue() -> None:
    """On an unconnected service the API's own browser refuses to start; a queue the broker
    does not know (a group made before parking existed) is named with the fix."""

    async def scenario() -> None:
        broker = adapter.SolaceBroker(adapter.build_service(SETTINGS, "v"), SETTINGS, "v")
        with pytest.raises(BrokerError, match=r"cannot browse queue 'lbg\.g1\.parked'"):
            await broker.parking("g1").records(current=False)

        def missing(name: str) -> ListBrowser:
            raise QueueMissing(f"cannot browse queue '{name}': Unknown Queue")

        parking = SolaceParkingLot("g1", missing, ListQueue().send, adapter.inbound)
        with pytest.raises(
            BrokerError, match=r"'g1' has no parking queue .*run cg-admin upgrade g1"
        ):
            await parking.records(current=False)

    asyncio.run(scenario())
