"""The broker adapters by URL scheme: the one table that connecting, settings, TLS and start-up
retries read. Data only: connect_broker (lbg.broker) imports an adapter when a URL of its
scheme connects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Adapter:
    """One adapter: the broker it speaks to, its URL schemes and what a group there can do."""

    name: str
    key: str
    schemes: tuple[str, ...]
    # Schemes that always use TLS; the TLS scheme to use instead of a plain one that never does.
    tls_schemes: frozenset[str] = frozenset()
    tls_instead: Mapping[str, str] = field(default_factory=dict)
    # Whether a group may read an existing category (CA), and change its queue count at run time.
    reads_categories: bool = False
    resizable: bool = False


ADAPTERS = (
    Adapter(
        "NATS JetStream", "nats", ("nats", "tls"), tls_schemes=frozenset({"tls"}), resizable=True
    ),
    Adapter(
        "RabbitMQ",
        "rabbitmq",
        ("amqp", "amqps"),
        tls_schemes=frozenset({"amqps"}),
        tls_instead={"amqp": "amqps"},
    ),
    Adapter(
        "Solace PubSub+",
        "solace",
        ("tcp", "tcps"),
        tls_schemes=frozenset({"tcps"}),
        tls_instead={"tcp": "tcps"},
    ),
    Adapter(
        "Message DB",
        "messagedb",
        ("postgresql", "postgres"),
        reads_categories=True,
        resizable=True,
    ),
    Adapter("in-memory broker", "memory", ("memory",)),
)
SCHEMES = tuple(scheme for adapter in ADAPTERS for scheme in adapter.schemes)
TLS_SCHEMES = frozenset(scheme for adapter in ADAPTERS for scheme in adapter.tls_schemes)


def adapter_for(scheme: str) -> Adapter | None:
    """The adapter that speaks a URL scheme (as written, any case); None if none does."""
    return next((a for a in ADAPTERS if scheme.lower() in a.schemes), None)


def described(adapters: list[Adapter]) -> str:
    """Adapters as an error message names them: `Message DB (postgresql://)`."""
    return " or ".join(f"{a.name} ({a.schemes[0]}://)" for a in adapters)
