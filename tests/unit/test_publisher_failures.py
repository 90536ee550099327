"""An error no adapter mapped stops the publisher's run in one line; no event goes unseen."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from lbg.model.group import GroupConfig
from lbg.publisher import HashedPublisher, PublishFailed


class Unmapped(Exception):
    """What an adapter might let through: neither PublishError nor UndeliverableEvent."""


class FailingBroker:
    """Acks every event but one, for which it raises an exception it did not map."""

    def __init__(self) -> None:
        self.acked: list[bytes] = []

    async def publish(self, destination: object, body: bytes, headers: object = None) -> None:
        if body == b"bad":
            raise Unmapped("payload too large")
        self.acked.append(body)


async def events() -> AsyncIterator[tuple[str, bytes]]:
    for key, body in (("a", b"1"), ("b", b"bad"), ("c", b"2")):
        yield key, body


def test_an_unmapped_publish_error_fails_the_run_and_is_not_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = FailingBroker()
    config = GroupConfig(hash_prefix="hp", hash_count=4, queue_count=2)
    publisher = HashedPublisher(broker, "g", config, "p")  # type: ignore[arg-type]
    with pytest.raises(PublishFailed, match="payload too large"):
        asyncio.run(publisher.run(events()))
    assert publisher.stats.acked == len(broker.acked)
    assert "never retrieved" not in caplog.text
