"""The in-process API: publish to a group and consume it from your own asyncio program.

`Publisher` and `Client` are what the `hashed-publisher` and `lbg-client` daemons run, without
the daemons: the same hashing, broker confirmations and per-key order, the same membership,
handover and fencing. Exported as `from lbg import Publisher, Client`.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Self

from lbg.aio import cancel_and_wait
from lbg.broker.base import Broker, BrokerError
from lbg.client.client import LbgClient
from lbg.client.coordination import DynamicRole, Role, StaticRole
from lbg.client.stats import ClientStats
from lbg.handlers import Handler, Hooks, as_async
from lbg.model.group import GroupConfig
from lbg.publisher import HashedPublisher, PublishStats
from lbg.retry import join_group
from lbg.settings import BrokerSettings, ClientSettings

if TYPE_CHECKING:
    from lbg.metrics import Family


def default_id(kind: str) -> str:
    """An identity that tells instances apart in logs and reports: kind-host-pid."""
    return f"{kind}-{socket.gethostname().split('.')[0]}-{os.getpid()}"


def broker_settings(broker: BrokerSettings | str) -> BrokerSettings:
    """Settings from a URL or as given, checked (a bad URL is a ValueError naming it)."""
    settings = BrokerSettings(url=broker) if isinstance(broker, str) else broker
    settings.validate()
    return settings


async def _join(settings: BrokerSettings, group: str, name: str) -> tuple[Broker, GroupConfig]:
    """Connect and read the group's config, retrying for `connect_retry_for` seconds."""
    joined = await join_group(settings, group, name, asyncio.Event())
    if joined is None:
        raise BrokerError(f"group '{group}': could not join")
    return joined


class Publisher:
    """Publishes keyed events to a group: `<HP>/<bucket>/<key>` with the group's hash, the
    body as given, the key's sequence number and publish time in `Lbg-Seq` / `Lbg-Time`.

        async with Publisher("nats://127.0.0.1:4222", "orders") as publisher:
            seq = await publisher.publish("order-1", b'{"step": 1}', {"trace-id": "t1"})

    `publish` returns once the broker confirmed the event. Events of one key go out in call
    order, one at a time; many keys are in flight at once (up to `window`)."""

    def __init__(
        self,
        broker: BrokerSettings | str,
        group: str,
        *,
        publisher_id: str | None = None,
        window: int = 1000,
    ) -> None:
        self._settings = broker_settings(broker)
        self._group = group
        self.publisher_id = publisher_id or default_id("publisher")
        self._window = window
        self._broker: Broker | None = None
        self._publisher: HashedPublisher | None = None

    async def open(self) -> Self:
        """Connect and read the group's config (retrying while the broker or group is not
        there yet, for the settings' `connect_retry_for` seconds)."""
        self._broker, config = await _join(self._settings, self._group, self.publisher_id)
        self._publisher = HashedPublisher(
            self._broker, self._group, config, self.publisher_id, window=self._window
        )
        return self

    async def publish(
        self, key: str, body: bytes | str = b"", headers: Mapping[str, str] | None = None
    ) -> int:
        """Publish one event (a str body is sent as UTF-8) and return its sequence number
        once the broker confirmed it; see `HashedPublisher.publish` for the errors."""
        data = body.encode() if isinstance(body, str) else body
        return await self._open().publish(key, data, headers)

    async def send_summary(self) -> None:
        """Tell the group's validator the last sequence published per key, so it can count
        what was lost (the daemon does this when it ends)."""
        publisher = self._open()
        await publisher.flush()
        await publisher.publish_summary()

    @property
    def stats(self) -> PublishStats:
        """Confirmed, retried and refused events so far."""
        return self._open().stats

    async def close(self) -> None:
        """Wait for the events in flight, then disconnect."""
        if self._publisher is not None:
            await self._publisher.flush()
        if self._broker is not None:
            await self._broker.close()
        self._broker = self._publisher = None

    def _open(self) -> HashedPublisher:
        if self._publisher is None:
            raise RuntimeError("Publisher is not open: use `async with` or `await open()`")
        return self._publisher

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


class Client:
    """A member of a group that runs `handler(event, context)` (sync or async) on the events
    of the queues the broker makes it active for, each key in order, acking after success.

        client = Client("nats://127.0.0.1:4222", "orders", handle)
        await client.run()          # until client.stop() or the stop event is set

    Without `index`/`count` in `options` it joins by itself (dynamic membership); with them
    it takes the original design's static slot. `hooks` are called around handovers."""

    def __init__(
        self,
        broker: BrokerSettings | str,
        group: str,
        handler: Handler,
        *,
        client_id: str | None = None,
        options: ClientSettings | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self._settings = broker_settings(broker)
        self._group = group
        self._handler = as_async(handler)
        self._options = options or ClientSettings()
        self._options.validate()
        self._timing = self._options.timing(self._settings.url)
        self.client_id = client_id or self._options.id or default_id("client")
        self._hooks = hooks
        self._stop = asyncio.Event()
        self._member: LbgClient | None = None
        self._broker: Broker | None = None

    def _role(self) -> Role:
        o = self._options
        if o.index is not None and o.count is not None:
            return StaticRole(o.index, o.count)
        t = self._timing
        return DynamicRole(t.interval, t.lease, o.stall_timeout, lease_margin=t.margin)

    async def run(self, stop: asyncio.Event | None = None) -> ClientStats:
        """Join the group and work until `stop()` (or `stop` is set), then hand over cleanly."""
        watcher = asyncio.create_task(stop.wait()) if stop is not None else None
        if watcher is not None:
            watcher.add_done_callback(lambda _task: self._stop.set())
        try:
            return await self._serve()
        finally:
            if watcher is not None:
                await cancel_and_wait(watcher)

    async def _serve(self) -> ClientStats:
        joined = await join_group(self._settings, self._group, self.client_id, self._stop)
        if joined is None:
            return ClientStats()
        broker, config = joined
        self._broker = broker
        o = self._options
        try:
            self._member = LbgClient(
                broker,
                self._group,
                config,
                self.client_id,
                self._handler,
                self._role(),
                cycle_seconds=o.cycle_seconds,
                retries=o.retries,
                retry_backoff=o.retry_backoff,
                window=o.window,
                hooks=self._hooks,
                park_after_stalls=o.park_after_stalls,
            )
            return await self._member.run(self._stop)
        finally:
            self._broker = None
            await broker.close()

    def stop(self) -> None:
        """Ask the client to hand its queues over and return from `run`."""
        self._stop.set()

    def ready(self) -> bool:
        """Whether the client joined its group and its broker connection is up (/readyz)."""
        return self._member is not None and self._broker is not None and self._broker.connected()

    def metric_families(self) -> Iterator[Family]:
        """The client's counters and gauges for a Prometheus scrape (none before it joined)."""
        if self._member is not None:
            yield from self._member.metric_families()
