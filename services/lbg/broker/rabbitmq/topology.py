"""How a group maps onto RabbitMQ objects: names, routing keys, queue arguments, permissions.

Per group `<g>`: the topic exchange `lbg.<g>`; QC quorum queues `lbg.<g>.q<N>` with single
active consumer, queue q bound to `<HP>.<b>.#` for each of its buckets b; the stream
`lbg.<g>.out` bound to `_lbg.<g>.#` (validation records, dead letters, summaries: a stream
so the validator can read it from the start); heartbeats on `_lbgctl.<g>.members` to
per-subscriber exclusive queues; the config as the one message of the stream `lbg.<g>.config`;
the stream `lbg.<g>.owners` bound to `_lbgctl.<g>.owners.#`, where each new owner of a queue
records its claim: the claim's stream offset is the queue's ownership epoch.
"""

from __future__ import annotations

import re

from lbg.broker.base import UndeliverableKey
from lbg.model.destinations import (
    SYSTEM_PREFIX,
    Destination,
    OutputKind,
    level_token,
    output_destination,
)
from lbg.model.group import GroupConfig

CONTROL_PREFIX = "_lbgctl"
PARK_PREFIX = "_lbgpark"
MAX_ROUTING_KEY_BYTES = 255
OUTPUT_MAX_BYTES = 1024**3
MEMBER_QUEUE_EXPIRES_MS = 60_000
MEMBER_QUEUE_MAX = 1000


def exchange_name(group: str) -> str:
    return f"lbg.{group}"


def queue_name(group: str, queue: int) -> str:
    return f"lbg.{group}.q{queue}"


def output_queue_name(group: str) -> str:
    return f"lbg.{group}.out"


def config_queue_name(group: str) -> str:
    """The one-message stream holding the group's JSON (the JNDI analogue)."""
    return f"lbg.{group}.config"


def member_queue_name(group: str, member: str) -> str:
    """A client's private heartbeat queue (exclusive, auto-delete): named in the group, so the
    CU may declare these only, never a server-named `amq.gen-` queue of any kind."""
    return f"lbg.{group}.member.{member}"


def member_queue_policy(group: str) -> tuple[str, dict[str, object]]:
    """The policy cg-admin puts on the group's member queues: one the CU declares durable and
    shared instead still goes a minute after its last consumer, and holds few messages."""
    return (
        f"lbg.{group}.members",
        {
            "pattern": f"^{re.escape(f'lbg.{group}.member.')}",
            "apply-to": "queues",
            "priority": 0,
            "definition": {"expires": MEMBER_QUEUE_EXPIRES_MS, "max-length": MEMBER_QUEUE_MAX},
        },
    )


def control_routing_key(group: str) -> str:
    return f"{CONTROL_PREFIX}.{group}.members"


def owners_stream_name(group: str) -> str:
    """The stream of owner claims; a claim's offset is its queue's new ownership epoch."""
    return f"lbg.{group}.owners"


def parked_stream_name(group: str) -> str:
    """The stream of the group's parked keys and events (broker/rabbitmq/parking.py)."""
    return f"lbg.{group}.parked"


def parked_routing_key(group: str) -> str:
    return f"{PARK_PREFIX}.{group}"


def owners_routing_key(group: str, queue: int) -> str:
    return f"{CONTROL_PREFIX}.{group}.owners.{queue}"


def owners_binding_key(group: str) -> str:
    return f"{CONTROL_PREFIX}.{group}.owners.#"


def output_binding_key(group: str) -> str:
    return f"{SYSTEM_PREFIX}.{group}.#"


def bucket_binding_keys(config: GroupConfig, queue: int) -> list[str]:
    """The queue's bindings: `<HP>.<b>.#` for each of its buckets (`#` also matches nothing)."""
    return [f"{level_token(config.hash_prefix)}.{b}.#" for b in config.buckets_for_queue(queue)]


def routing_key(destination: Destination) -> str:
    """The destination's levels joined by dots; UndeliverableKey if that exceeds AMQP's 255
    bytes (the key travels in the routing key, so it cannot be cut)."""
    key = ".".join(level_token(level) for level in destination.levels)
    size = len(key.encode())
    if size > MAX_ROUTING_KEY_BYTES:
        raise UndeliverableKey(
            f"routing key of {size} bytes exceeds AMQP's {MAX_ROUTING_KEY_BYTES}: "
            f"{key[:60]!r}... (use a shorter key or hash prefix)"
        )
    return key


def queue_arguments(config: GroupConfig) -> dict[str, object]:
    """A quorum queue on RF cluster nodes (as many as there are, if fewer); exclusive groups
    get single active consumer; full means publish nacked."""
    arguments: dict[str, object] = {
        "x-queue-type": "quorum",
        "x-quorum-initial-group-size": config.replicas,
        "x-max-length-bytes": config.queue_size_mb * 1024 * 1024,
        "x-overflow": "reject-publish",
    }
    if config.exclusive:
        arguments["x-single-active-consumer"] = True
    return arguments


def output_arguments() -> dict[str, object]:
    return {"x-queue-type": "stream", "x-max-length-bytes": OUTPUT_MAX_BYTES}


def client_permissions(groups: list[str]) -> dict[str, str]:
    """Least privilege for a client identity serving `groups`: consume and bind only their
    queues, publish only to their exchanges, and declare only its private heartbeat queues.
    It may purge its queues (RabbitMQ ties purge to read, which consuming needs): no more
    than consuming and acking everything could do."""
    escaped = "|".join(re.escape(exchange_name(g)) for g in sorted(groups))
    mine = rf"(?:{escaped})"
    private = rf"{mine}\.member\.[0-9a-f]+"
    return {
        "configure": f"^{private}$",
        "write": f"^(?:{mine}|{private})$",
        "read": rf"^(?:{mine}(?:\.q\d+|\.out|\.config|\.owners|\.parked)?|{private})$",
    }


def client_topic_permissions(group: str) -> dict[str, str]:
    """Topic authorisation on the group's exchange: write access to it would also let the
    client publish events, so its routing keys are limited to the group's validation and
    dead-letter outputs, heartbeats, owner claims and its parking stream (not the publishers'
    summary), and its
    bindings to the heartbeats."""
    outputs = "|".join(
        re.escape(routing_key(output_destination(group, kind)))
        for kind in (OutputKind.VALIDATION, OutputKind.DEAD)
    )
    control = re.escape(control_routing_key(group))
    claims = re.escape(f"{CONTROL_PREFIX}.{group}.owners.") + r"[0-9]+"
    parking = re.escape(f"{PARK_PREFIX}.{group}")
    return {
        "exchange": exchange_name(group),
        "write": f"^(?:{outputs}|{control}|{claims}|{parking})$",
        "read": f"^{control}$",
    }


def publisher_permissions(groups: list[str]) -> dict[str, str]:
    """Least privilege for a publisher identity serving `groups`: write only to their
    exchanges, read only their config streams (hashed-publisher reads its group's config to
    join), configure nothing."""
    names = sorted(groups)
    exchanges = "|".join(re.escape(exchange_name(g)) for g in names)
    configs = "|".join(re.escape(config_queue_name(g)) for g in names)
    return {"configure": "^$", "write": f"^(?:{exchanges})$", "read": f"^(?:{configs})$"}


def publisher_topic_permissions(group: str, config: GroupConfig) -> dict[str, str]:
    """Topic authorisation on the group's exchange for a publisher: its routing keys are the
    group's events (`<HP>.<bucket>[.<key>]`) and its summary output, nothing else (no
    validation or dead-letter records, no heartbeats); it binds nothing. Only the group's
    buckets (0 to HC-1) are allowed: an event to another one would be routed nowhere."""
    events = re.escape(level_token(config.hash_prefix))
    buckets = "|".join(str(bucket) for bucket in range(config.hash_count))
    summary = re.escape(routing_key(output_destination(group, OutputKind.SUMMARY)))
    return {
        "exchange": exchange_name(group),
        "write": rf"^(?:{events}\.(?:{buckets})(?:\..*)?|{summary})$",
        "read": "^$",
    }
