"""Broker adapters behind one interface; `connect_broker` picks one from the URL scheme."""

from __future__ import annotations

from urllib.parse import urlsplit

from lbg.broker.base import Broker, BrokerError
from lbg.broker.refused import all_refused
from lbg.model.group import GroupConfig
from lbg.settings import BrokerSettings

NATS_SCHEMES = {"nats", "tls"}
RABBITMQ_SCHEMES = {"amqp", "amqps"}
SOLACE_SCHEMES = {"tcp", "tcps"}
MESSAGEDB_SCHEMES = {"postgresql", "postgres"}


def check_broker_runs(url: str, config: GroupConfig) -> None:
    """Refuse, before connecting, a group the URL's broker cannot run: only Message DB reads
    an existing category (CA)."""
    scheme = urlsplit(url).scheme
    if config.category is not None and scheme not in MESSAGEDB_SCHEMES:
        raise BrokerError(
            f"CA (category) '{config.category}': only Message DB (postgresql://) groups read "
            f"an existing category, and this broker is {scheme}://"
        )


async def connect_broker(
    settings: BrokerSettings, client_name: str, priority_timeout: float = 2.0
) -> Broker:
    """Connect to the broker named by `settings.url`: nats:// or tls:// for NATS JetStream,
    amqp:// or amqps:// for RabbitMQ, tcp:// or tcps:// for Solace PubSub+, postgresql:// or
    postgres:// for Message DB. A URL where nothing listens fails at once."""
    scheme = urlsplit(settings.url).scheme
    if await all_refused(settings.url):
        raise BrokerError(f"cannot connect to {settings.shown_url}: connection refused")
    if scheme in NATS_SCHEMES:
        from lbg.broker.nats.adapter import NatsBroker

        return await NatsBroker.connect(settings, client_name, priority_timeout)
    if scheme in RABBITMQ_SCHEMES:
        from lbg.broker.rabbitmq.adapter import RabbitBroker

        return await RabbitBroker.connect(settings, client_name)
    if scheme in SOLACE_SCHEMES:
        from lbg.broker.solace.adapter import connect

        return await connect(settings, client_name, priority_timeout)
    if scheme in MESSAGEDB_SCHEMES:
        from lbg.broker.messagedb.adapter import MessageDbBroker

        return await MessageDbBroker.connect(settings, client_name)
    raise BrokerError(f"broker url '{settings.shown_url}': no adapter for scheme '{scheme}://'")
