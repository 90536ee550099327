"""The in-process broker behind the Broker interface: `memory://<name>` connects to the store of
that name (store.py), so every client, publisher and validator of one process that names it
shares its groups, queues and control channel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from lbg.broker.base import (
    Broker,
    BrokerError,
    OutputMessage,
    ParkingLot,
    PublishError,
    QueueBinding,
    QueueStatus,
    StateListener,
)
from lbg.broker.memory.binding import MemoryQueueBinding
from lbg.broker.memory.parking import MemoryParkingLot
from lbg.broker.memory.store import MemoryStore, memory_store
from lbg.model.destinations import Destination
from lbg.model.group import GroupConfig

if TYPE_CHECKING:
    from lbg.settings import BrokerSettings


class MemoryBroker(Broker):
    """One connection to an in-process broker."""

    def __init__(self, store: MemoryStore, client_name: str, priority_timeout: float) -> None:
        self.store = store
        self._connection = store.connect(client_name, priority_timeout)

    @classmethod
    async def connect(
        cls, settings: BrokerSettings, client_name: str, priority_timeout: float
    ) -> MemoryBroker:
        """Connect to the in-process broker the URL names (`memory://<name>`)."""
        name = urlsplit(settings.url).netloc
        return cls(memory_store(name), client_name, priority_timeout)

    async def close(self) -> None:
        self._connection.close()

    async def create_group(
        self,
        name: str,
        config: GroupConfig,
        client_password: str | None = None,
        force: bool = False,
    ) -> None:
        self._connection.check()
        self.store.create_group(name, config)

    async def read_group(self, name: str) -> GroupConfig:
        self._connection.check()
        return self.store.read_group(name)

    async def list_groups(self) -> dict[str, GroupConfig]:
        self._connection.check()
        return dict(self.store.groups)

    async def delete_group(self, name: str) -> None:
        self._connection.check()
        self.store.delete_group(name)

    async def queue_status(self, name: str, config: GroupConfig) -> list[QueueStatus]:
        self._connection.check()
        return self.store.queue_status(name)

    async def publish(
        self, destination: Destination, body: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        try:
            self._connection.check()
        except BrokerError as exc:
            raise PublishError(str(exc)) from None
        self.store.publish(destination, body, dict(headers or {}))

    async def bind(
        self,
        group: str,
        config: GroupConfig,
        queue: int,
        client_id: str,
        preferred: bool = True,
        on_change: StateListener | None = None,
    ) -> QueueBinding:
        self._connection.check()
        state = self.store.queue(group, queue)
        binding = MemoryQueueBinding(self._connection, state, queue, preferred, on_change)
        self._connection.bindings.append(binding)
        state.bindings.append(binding)
        state.hand_over()
        return binding

    async def publish_control(self, group: str, body: bytes) -> None:
        self.store.publish_control(self._connection, group, body)

    async def subscribe_control(
        self, group: str, handler: Callable[[bytes], None]
    ) -> Callable[[], Awaitable[None]]:
        self._connection.check()
        subscription = (group, handler)
        self._connection.subscriptions.append(subscription)

        async def unsubscribe() -> None:
            if subscription in self._connection.subscriptions:
                self._connection.subscriptions.remove(subscription)

        return unsubscribe

    async def announce_presence(self, group: str, member: str) -> bool:
        self._connection.check()
        self._connection.presence.add((group, member))
        return True

    async def probe_member(self, group: str, member: str) -> bool | None:
        try:
            return self.store.probe(self._connection, group, member)
        except BrokerError:
            return None

    def parking(self, group: str) -> ParkingLot:
        self._connection.check()
        self.store.read_group(group)
        return MemoryParkingLot(self._connection, self.store.parked[group])

    async def read_output(self, group: str) -> AsyncIterator[OutputMessage]:
        self._connection.check()
        self.store.read_group(group)
        wake = asyncio.Event()
        self.store.add_reader(wake)
        read = 0
        try:
            while True:
                wake.clear()
                messages = self.store.outputs.get(group, [])
                while read < len(messages):
                    read += 1
                    yield messages[read - 1]
                await wake.wait()
        finally:
            self.store.remove_reader(wake)
