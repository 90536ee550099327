"""JetStream publishes whose acks come back on one reply subscription, matched by a counter.

nats-py's `publish_async` spends more per event than the publish itself: a semaphore wait,
a random token (a syscall), a done callback, a JSON parse and a dataclass per ack, and the
caller's own timer. Here a publish is one core publish with a reply subject and one future;
an ack is a dict lookup, parsed only when it carries an error; one sweep every
`SWEEP_SECONDS` (only while publishes wait) fails the ones older than the timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg

SWEEP_SECONDS = 0.25
NO_RESPONDERS = "503"


class NoStream(Exception):
    """No stream captures the subject (the server answered 503 No Responders)."""


class Rejected(Exception):
    """The stream answered the publish with an error; the message is the server's description."""


class StreamPublisher:
    """Publishes to JetStream over `nc` and waits for each publish's ack, up to `timeout`."""

    def __init__(self, nc: Client, timeout: float) -> None:
        self._nc = nc
        self._timeout = timeout
        self._prefix = ""
        self._count = 0
        # Token -> (deadline, future), in send order: the oldest is always first.
        self._pending: dict[str, tuple[float, asyncio.Future[None]]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._ready: asyncio.Lock | None = None

    async def publish(self, subject: str, body: bytes, headers: dict[str, str] | None) -> None:
        """Publish and return once the stream stored it; TimeoutError, NoStream or Rejected."""
        if not self._prefix:
            await self._subscribe()
        self._count += 1
        token = str(self._count)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[token] = (time.monotonic() + self._timeout, future)
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep(), name="publish-ack-sweeper")
        try:
            await self._nc.publish(subject, body, reply=self._prefix + token, headers=headers)
            await future
        finally:
            self._pending.pop(token, None)

    async def _subscribe(self) -> None:
        """Open the reply subscription once (concurrent first publishes share it)."""
        if self._ready is None:
            self._ready = asyncio.Lock()
        async with self._ready:
            if self._prefix:
                return
            inbox = self._nc.new_inbox()
            await self._nc.subscribe(f"{inbox}.*", cb=self._on_ack)
            self._prefix = f"{inbox}."

    async def _on_ack(self, msg: Msg) -> None:
        entry = self._pending.pop(msg.subject[len(self._prefix) :], None)
        if entry is None or entry[1].done():
            return
        future = entry[1]
        if not msg.data:
            status = (msg.headers or {}).get("Status")
            future.set_exception(NoStream() if status == NO_RESPONDERS else Rejected(status))
        elif b'"error"' in msg.data:
            error = orjson.loads(msg.data).get("error") or {}
            future.set_exception(Rejected(error.get("description") or msg.data.decode()))
        else:
            future.set_result(None)

    async def _sweep(self) -> None:
        """Fail the publishes past their deadline; ends when none is left waiting."""
        try:
            while self._pending:
                await asyncio.sleep(SWEEP_SECONDS)
                now = time.monotonic()
                while self._pending:
                    token, (deadline, future) = next(iter(self._pending.items()))
                    if deadline > now:
                        break
                    del self._pending[token]
                    with contextlib.suppress(asyncio.InvalidStateError):
                        future.set_exception(TimeoutError())
        finally:
            self._sweeper = None
