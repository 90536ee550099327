"""A NATS group's history is read again only when a read of its config shows a newer
generation: an idle client reads nothing for it (two KV reads a second each before)."""

import asyncio

from lbg.broker.nats import histories
from lbg.broker.nats.histories import HistoryFeed
from lbg.model.generations import Generation

FIRST = [Generation(0, 4, 1, None)]
RESIZED = [Generation(0, 4, 1, 100), Generation(1, 8, 101, None)]


class StoredHistory:
    """The KV's history, counting reads; `failures` reads fail first (a broker restart)."""

    def __init__(self) -> None:
        self.history = FIRST
        self.reads = 0
        self.failures = 0

    async def load(self) -> list[Generation]:
        self.reads += 1
        if self.failures:
            self.failures -= 1
            raise ConnectionError("no responders")
        return self.history


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_an_idle_feed_reads_nothing_and_a_newer_generation_is_read_at_once() -> None:
    async def scenario() -> None:
        stored = StoredHistory()
        feed = HistoryFeed("orders", stored.load)
        await feed.start()
        await asyncio.sleep(0.05)
        feed.heard(0)  # the client's periodic config read: nothing new
        await settle()
        assert stored.reads == 1, "read again with nothing new"
        changed = feed.changed
        stored.history = RESIZED
        feed.heard(1)
        await asyncio.wait_for(changed.wait(), 0.5)
        assert feed.history == RESIZED and stored.reads == 2
        feed.heard(1)
        await settle()
        assert stored.reads == 2
        await feed.close()

    asyncio.run(scenario())


def test_a_read_that_fails_or_is_behind_the_generation_heard_is_tried_again(monkeypatch) -> None:
    monkeypatch.setattr(histories, "RETRY_SECONDS", 0.01)

    async def scenario() -> None:
        stored = StoredHistory()
        feed = HistoryFeed("orders", stored.load)
        await feed.start()
        changed = feed.changed
        stored.failures = 2
        feed.heard(1)  # the history of generation 1 is not stored yet either
        await asyncio.sleep(0.05)
        assert feed.history == FIRST and not changed.is_set()
        stored.history = RESIZED
        await asyncio.wait_for(changed.wait(), 0.5)
        assert feed.history == RESIZED
        reads = stored.reads
        await asyncio.sleep(0.05)
        assert stored.reads == reads, "kept reading once up to date"
        await feed.close()

    asyncio.run(scenario())
