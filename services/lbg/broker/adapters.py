"""The broker adapters by URL scheme: the one table that connecting, settings, TLS and start-up
retries read. Data only: connect_broker (lbg.broker) imports an adapter when a URL of its
scheme connects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from lbg.model.timing import DEFAULT_TIMING, HeartbeatTiming

# RabbitMQ: a heartbeat costs a Python member two to three times what it costs on NATS (three
# AMQP frames per delivery, and every member hears every member's), while a crashed member's
# queues move at once by the broker's own line (single active consumer), not by the lease, and
# a peer asks the broker about a silent member after interval + margin / 2 (client/presence.py):
# beats 0.5 s apart hold 8 idle members of a QC 256 group at 0.6 of what 0.25 s cost, a
# crash is still seen within 0.8 s, and a member cut off fences 1.2 s after its last
# confirmed beat, before the broker gives up its connection (about 2.4 s; bench/idle.py).
RABBITMQ_TIMING = HeartbeatTiming(interval=0.5, lease=1.5, margin=0.3)


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
    # A dynamic member's heartbeat timing where its config sets none.
    timing: HeartbeatTiming = DEFAULT_TIMING


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
        timing=RABBITMQ_TIMING,
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


def heartbeat_timing(url: str) -> HeartbeatTiming:
    """The heartbeat timing a member on the broker at `url` has by default."""
    adapter = adapter_for(urlsplit(url).scheme)
    return DEFAULT_TIMING if adapter is None else adapter.timing


def described(adapters: list[Adapter]) -> str:
    """Adapters as an error message names them: `Message DB (postgresql://)`."""
    return " or ".join(f"{a.name} ({a.schemes[0]}://)" for a in adapters)
