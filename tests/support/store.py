"""A downstream store shared by every client of a test: which member wrote which event, when.

`handle` is a slow handler (0.1 s per event, as a database write would take) that appends
one line per event to the file named by $LBG_TEST_STORE (one O_APPEND write per line, so
lines from several processes never mix), then republishes for the validator over a
connection of its own to $LBG_TEST_DIRECT_URL: like a database, the store and the validator
stay reachable when the member's own path to the broker is cut. The file's order is the
order the writes happened in; `zombie_writes` reads it back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import orjson

from lbg.broker import connect_broker
from lbg.broker.base import Broker
from lbg.handlers import Context, republish
from lbg.settings import BrokerSettings

STORE_ENV = "LBG_TEST_STORE"
DIRECT_URL_ENV = "LBG_TEST_DIRECT_URL"
WORK_SECONDS = 0.1
_direct: dict[str, Broker] = {}
_connecting = asyncio.Lock()


@dataclass(frozen=True)
class Write:
    """One event written to the store by one member."""

    writer: str
    key: str
    seq: int
    at: float
    epoch: int


async def handle(event, context: Context) -> None:  # type: ignore[no-untyped-def]
    """Work for WORK_SECONDS, record the write, then tell the validator."""
    await asyncio.sleep(WORK_SECONDS)
    line = orjson.dumps(
        {
            "w": context.client,
            "k": event.key,
            "s": event.seq,
            "t": asyncio.get_running_loop().time(),
            "e": context.epoch,
        }
    )
    fd = os.open(os.environ[STORE_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line + b"\n")
    finally:
        os.close(fd)
    await republish(event, dataclasses.replace(context, broker=await _direct_broker()))


async def _direct_broker() -> Broker:
    """This process's own connection to the broker, around any partition."""
    async with _connecting:
        if "broker" not in _direct:
            settings = BrokerSettings(url=os.environ[DIRECT_URL_ENV])
            _direct["broker"] = await connect_broker(settings, "store-handler")
        return _direct["broker"]


def read_writes(path: Path) -> list[Write]:
    """Every write in the order it happened."""
    if not path.exists():
        return []
    return [
        Write(obj["w"], obj["k"], obj["s"], obj["t"], obj["e"])
        for obj in map(orjson.loads, path.read_bytes().splitlines())
    ]


def zombie_writes(writes: list[Write], member: str, since: float, until: float) -> list[Write]:
    """Writes by `member`, between `since` (the cut) and `until` (the heal, after which it may
    rightly be given keys again), to a key that another member wrote after `since`: two
    processors interleaved on that key."""
    taken: set[str] = set()
    zombies = []
    for write in writes:
        if not since <= write.at < until:
            continue
        if write.writer != member:
            taken.add(write.key)
        elif write.key in taken:
            zombies.append(write)
    return zombies


def stale_epoch_writes(writes: list[Write]) -> list[Write]:
    """Writes carrying an older ownership epoch than an earlier write to the same key: the
    ones a store that checks the fencing token (README) would have refused."""
    newest: dict[str, int] = {}
    stale = []
    for write in writes:
        if write.epoch < newest.get(write.key, 0):
            stale.append(write)
        newest[write.key] = max(write.epoch, newest.get(write.key, 0))
    return stale
