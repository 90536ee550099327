"""Broker adapters behind one interface; `connect_broker` picks one from the URL scheme."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from lbg.broker.adapters import ADAPTERS, adapter_for, described
from lbg.broker.base import Broker, BrokerError
from lbg.broker.refused import all_refused

if TYPE_CHECKING:
    from lbg.model.group import GroupConfig
    from lbg.settings import BrokerSettings

Connect = Callable[["BrokerSettings", str, float], Awaitable[Broker]]


async def _nats(settings: BrokerSettings, client_name: str, priority_timeout: float) -> Broker:
    """Connect to NATS JetStream."""
    from lbg.broker.nats.adapter import NatsBroker

    return await NatsBroker.connect(settings, client_name, priority_timeout)


async def _rabbitmq(settings: BrokerSettings, client_name: str, priority_timeout: float) -> Broker:
    """Connect to RabbitMQ (it has no priority timeout: the broker moves a queue at once)."""
    from lbg.broker.rabbitmq.adapter import RabbitBroker

    return await RabbitBroker.connect(settings, client_name)


async def _solace(settings: BrokerSettings, client_name: str, priority_timeout: float) -> Broker:
    """Connect to Solace PubSub+."""
    from lbg.broker.solace.adapter import connect

    return await connect(settings, client_name, priority_timeout)


async def _messagedb(settings: BrokerSettings, client_name: str, priority_timeout: float) -> Broker:
    """Connect to Message DB (it has no priority timeout: its leases are its own)."""
    from lbg.broker.messagedb.adapter import MessageDbBroker

    return await MessageDbBroker.connect(settings, client_name)


async def _memory(settings: BrokerSettings, client_name: str, priority_timeout: float) -> Broker:
    """Connect to the in-process broker named by the URL (`memory://<name>`)."""
    from lbg.broker.memory.adapter import MemoryBroker

    return await MemoryBroker.connect(settings, client_name, priority_timeout)


# How each adapter of the table connects; its module is imported only then.
CONNECT: dict[str, Connect] = {
    "nats": _nats,
    "rabbitmq": _rabbitmq,
    "solace": _solace,
    "messagedb": _messagedb,
    "memory": _memory,
}


def check_broker_runs(url: str, config: GroupConfig) -> None:
    """Refuse, before connecting, a group the URL's broker cannot run: only some adapters
    read an existing category (CA)."""
    scheme = urlsplit(url).scheme
    adapter = adapter_for(scheme)
    if config.category is not None and not (adapter and adapter.reads_categories):
        readers = [a for a in ADAPTERS if a.reads_categories]
        raise BrokerError(
            f"CA (category) '{config.category}': only {described(readers)} groups read "
            f"an existing category, and this broker is {scheme}://"
        )


async def connect_broker(
    settings: BrokerSettings, client_name: str, priority_timeout: float = 2.0
) -> Broker:
    """Connect to the broker named by `settings.url`, through the adapter of its scheme
    (lbg.broker.adapters). A URL where nothing listens fails at once."""
    scheme = urlsplit(settings.url).scheme
    if await all_refused(settings.url):
        raise BrokerError(f"cannot connect to {settings.shown_url}: connection refused")
    adapter = adapter_for(scheme)
    if adapter is None:
        raise BrokerError(f"broker url '{settings.shown_url}': no adapter for scheme '{scheme}://'")
    return await CONNECT[adapter.key](settings, client_name, priority_timeout)
