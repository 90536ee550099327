"""One AMQP connection kept open: reconnected with backoff whenever it is found closed.

A member holds two: one for its queues, records and claims, and one for its heartbeats, so
that a beat never waits behind a burst of other frames (a member binding 1,024 queues as it
starts saw its own beats come back too late and fenced itself). The member's own lease then
rests on the heartbeats' connection; if the other one closes, its queues' channels close with
it and fence their bindings (the broker moves the queues), and a partition cuts both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable

import aio_pika
from aio_pika.abc import AbstractConnection
from aio_pika.exceptions import AMQPError
from yarl import URL

from lbg.broker.base import BrokerError

log = logging.getLogger(__name__)


class KeptConnection:
    """The open connection named `name` (as the management API lists it), reopened on use."""

    def __init__(
        self, url: URL, name: str, connect_timeout: float, ssl_context: ssl.SSLContext | None
    ) -> None:
        self._url = url
        self._name = name
        self._connect_timeout = connect_timeout
        self._ssl = ssl_context
        self._connection: AbstractConnection | None = None
        self._lock = asyncio.Lock()
        self._closing = False
        self._lost: list[Callable[[], None]] = []

    def connected(self) -> bool:
        connection = self._connection
        return connection is not None and not connection.is_closed and connection.connected.is_set()

    async def get(self) -> AbstractConnection:
        """The open connection; reconnects with backoff (for connect_timeout at first)."""
        async with self._lock:
            old = self._connection
            if old is not None and not old.is_closed and old.connected.is_set():
                return old
            first = old is None
            if old is not None:
                with contextlib.suppress(Exception):
                    await old.close()
            connection = await self._open(first)
            if not first:
                log.info("reconnected to the broker (%s)", self._name)
            connection.close_callbacks.add(self._on_closed)
            self._connection = connection
            return connection

    async def _open(self, first: bool) -> AbstractConnection:
        deadline = time.monotonic() + self._connect_timeout
        delay = 0.2
        attempt = 0
        while True:
            try:
                return await aio_pika.connect(
                    self._url,
                    timeout=min(2.0, self._connect_timeout),
                    client_properties={"connection_name": self._name},
                    ssl_context=self._ssl,
                )
            except (AMQPError, OSError, TimeoutError, ConnectionError) as exc:
                reason = f"{type(exc).__name__}: {exc}".strip(": ")
                if first and time.monotonic() + delay > deadline:
                    raise BrokerError(
                        f"cannot connect to {self._url.with_password(None)} within "
                        f"{self._connect_timeout:g}s ({reason})"
                    ) from None
                attempt += 1
                if not first:
                    log.warning(
                        "broker %s unreachable (%s); retrying in %.1f s (attempt %d)",
                        self._url.with_password(None),
                        reason,
                        delay,
                        attempt,
                    )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def on_lost(self, listener: Callable[[], None]) -> None:
        """Call `listener` whenever the open connection drops (not when closed on purpose)."""
        self._lost.append(listener)

    def _on_closed(self, *_: object) -> None:
        if not self._closing:
            log.warning("disconnected from the broker (%s)", self._name)
            for listener in self._lost:
                listener()

    async def close(self) -> None:
        self._closing = True
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()
