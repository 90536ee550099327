"""bench/raw_beats.py, the floor idle.py measures lbg's idle members against: on each test
broker, members written on the broker's own client hear every member's heartbeats, their
own included, as lbg members do (a floor that heard nothing would cost nothing)."""

import asyncio
import contextlib
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))

from lbg.devstack.brokers import BrokerEndpoint
from raw_beats import CONNECT

MEMBERS = 3
BEATS = 4


def test_every_raw_member_hears_every_members_beats(broker: BrokerEndpoint) -> None:
    heard = asyncio.run(exchange_beats(broker.url, f"t{uuid.uuid4().hex[:8]}"))

    assert heard == [MEMBERS * BEATS] * MEMBERS


async def exchange_beats(url: str, name: str) -> list[int]:
    """Each member beats BEATS times; what each heard once all heard everything (or 10 s)."""
    heard = [0] * MEMBERS
    connect = CONNECT[url.partition("://")[0]]
    members = [
        await connect(url, name, lambda n=n: heard.__setitem__(n, heard[n] + 1))
        for n in range(MEMBERS)
    ]
    try:
        for _ in range(BEATS):
            for member in members:
                await member.publish(b"x" * 64)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                while min(heard) < MEMBERS * BEATS:
                    await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # and nothing more comes
    finally:
        for member in members:
            await member.close()
    return heard
