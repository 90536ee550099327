"""How a group maps onto RabbitMQ names, routing keys and permissions (pure functions)."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbg.broker.base import UndeliverableKey
from lbg.broker.rabbitmq import topology
from lbg.model.destinations import (
    EventAddress,
    OutputKind,
    event_destination,
    level_token,
    output_destination,
    parse_event_topic,
)
from lbg.model.group import GroupConfig

group_names = st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True)
any_keys = st.text(min_size=1, max_size=60).filter(lambda k: len(k.encode()) <= 200)
# Keys whose routing key fits AMQP's 255 bytes beside any hash prefix used here.
keys = any_keys.filter(lambda k: len(level_token(k).encode()) <= 190)


def matches_binding(binding: str, key: str) -> bool:
    """AMQP topic matching for the bindings the adapter makes (`<HP>.<b>.#`)."""
    prefix = binding.removesuffix(".#")
    return key == prefix or key.startswith(prefix + ".")


@given(any_keys, st.integers(min_value=0, max_value=999))
def test_a_routing_key_carries_the_key_back_or_is_refused_as_too_long(
    key: str, bucket: int
) -> None:
    destination = event_destination("orders", bucket, key)
    try:
        routing = topology.routing_key(destination)
    except UndeliverableKey as exc:
        assert "exceeds AMQP's 255" in str(exc)
        assert len(".".join(map(level_token, destination.levels)).encode()) > 255
        return
    assert len(routing.encode()) <= topology.MAX_ROUTING_KEY_BYTES
    assert parse_event_topic(routing, ".") == EventAddress(key, bucket)


def test_the_longest_ascii_key_fits_a_routing_key() -> None:
    routing = topology.routing_key(event_destination("h" * 40, 99_999, "k" * 200))
    assert parse_event_topic(routing, ".").key == "k" * 200


def test_a_key_too_long_once_encoded_is_refused_in_one_line() -> None:
    with pytest.raises(UndeliverableKey, match="use a shorter key or hash prefix"):
        topology.routing_key(event_destination("orders", 1, "键" * 60))


@given(keys, st.integers(min_value=1, max_value=64), st.integers(min_value=1, max_value=8))
def test_each_event_routes_to_exactly_the_queue_of_its_bucket(
    key: str, hash_count: int, queue_count: int
) -> None:
    config = GroupConfig(
        hash_prefix="hp", hash_count=max(hash_count, queue_count), queue_count=queue_count
    )
    bucket = config.bucket_for_key(key)
    routing = topology.routing_key(event_destination(config.hash_prefix, bucket, key))
    receivers = [
        q
        for q in range(config.queue_count)
        if any(matches_binding(b, routing) for b in topology.bucket_binding_keys(config, q))
    ]
    assert receivers == [bucket % config.queue_count]


def test_exclusive_groups_get_single_active_consumer_quorum_queues() -> None:
    exclusive = topology.queue_arguments(
        GroupConfig(hash_prefix="a", hash_count=4, queue_count=2, queue_size_mb=7)
    )
    competing = topology.queue_arguments(
        GroupConfig(hash_prefix="a", hash_count=4, queue_count=2, exclusive=False)
    )
    assert exclusive["x-single-active-consumer"] is True
    assert exclusive["x-queue-type"] == competing["x-queue-type"] == "quorum"
    assert exclusive["x-max-length-bytes"] == 7 * 1024 * 1024
    assert exclusive["x-overflow"] == "reject-publish"
    assert "x-single-active-consumer" not in competing


def test_quorum_queues_are_placed_on_rf_nodes() -> None:
    config = GroupConfig(hash_prefix="a", hash_count=4, queue_count=2)
    assert topology.queue_arguments(config)["x-quorum-initial-group-size"] == 1
    replicated = GroupConfig(hash_prefix="a", hash_count=4, queue_count=2, replicas=3)
    assert topology.queue_arguments(replicated)["x-quorum-initial-group-size"] == 3


@given(group_names, group_names)
def test_client_permissions_cover_its_groups_and_nothing_of_others(mine: str, other: str) -> None:
    permissions = {k: re.compile(v) for k, v in topology.client_permissions([mine]).items()}
    own = [topology.queue_name(mine, 0), topology.queue_name(mine, 11)]
    own += [topology.output_queue_name(mine), topology.exchange_name(mine)]
    own += [topology.config_queue_name(mine), topology.owners_stream_name(mine)]
    assert all(permissions["read"].match(name) for name in own)
    assert permissions["write"].match(topology.exchange_name(mine))
    member = topology.member_queue_name(mine, "0123abcdef")
    assert all(permissions[p].match(member) for p in permissions)
    assert not any(permissions[p].match("amq.gen-abc123") for p in permissions)
    assert not permissions["configure"].match(topology.queue_name(mine, 0))
    assert not permissions["write"].match(topology.queue_name(mine, 0))
    if other != mine:
        theirs = [topology.queue_name(other, 0), topology.exchange_name(other)]
        theirs.append(topology.owners_stream_name(other))
        theirs.append(topology.member_queue_name(other, "0123abcdef"))
        assert not any(permissions[p].match(name) for p in permissions for name in theirs)


@given(group_names)
def test_a_client_writes_validation_dead_letters_and_heartbeats_only(group: str) -> None:
    topic = topology.client_topic_permissions(group)
    write, read = re.compile(topic["write"]), re.compile(topic["read"])
    allowed = [output_destination(group, k) for k in (OutputKind.VALIDATION, OutputKind.DEAD)]
    assert all(write.search(topology.routing_key(d)) for d in allowed)
    assert write.search(topology.control_routing_key(group))
    assert read.search(topology.control_routing_key(group))
    summary = topology.routing_key(output_destination(group, OutputKind.SUMMARY))
    refused = [summary, topology.control_routing_key(group) + ".x", f"_lbg.{group}.deadx"]
    assert not [k for k in refused if write.search(k)]


hash_prefixes = st.from_regex(r"[A-Za-z0-9-][A-Za-z0-9_-]{0,39}", fullmatch=True)


@given(group_names, hash_prefixes, keys, st.integers(min_value=0, max_value=999))
def test_a_publisher_writes_its_groups_events_and_summary_only(
    group: str, prefix: str, key: str, bucket: int
) -> None:
    config = GroupConfig(hash_prefix=prefix, hash_count=1000, queue_count=1)
    topic = topology.publisher_topic_permissions(group, config)
    write = re.compile(topic["write"])
    assert topic["exchange"] == topology.exchange_name(group)
    assert not re.compile(topic["read"]).search(topology.control_routing_key(group))
    event = topology.routing_key(event_destination(prefix, bucket, key))
    summary = topology.routing_key(output_destination(group, OutputKind.SUMMARY))
    assert write.search(event) and write.search(summary)
    refused = [
        topology.routing_key(output_destination(group, OutputKind.VALIDATION)),
        topology.routing_key(output_destination(group, OutputKind.DEAD)),
        topology.control_routing_key(group),
        f"{prefix}x.{bucket}.k",
        f"{prefix}.x{bucket}",
        f"{summary}.more",
        prefix,
        f"{prefix}.1000.k",
    ]
    assert not [k for k in refused if write.search(k)]


@given(group_names, group_names)
def test_publisher_permissions_cover_its_exchange_and_config_only(mine: str, other: str) -> None:
    permissions = {k: re.compile(v) for k, v in topology.publisher_permissions([mine]).items()}
    assert permissions["write"].search(topology.exchange_name(mine))
    assert permissions["read"].search(topology.config_queue_name(mine))
    own = [topology.queue_name(mine, 0), topology.output_queue_name(mine), "amq.gen-abc"]
    assert not [n for n in own for p in permissions.values() if p.search(n)]
    assert not permissions["configure"].search(topology.exchange_name(mine))
    if other != mine:
        theirs = [topology.exchange_name(other), topology.config_queue_name(other)]
        assert not [n for n in theirs for p in permissions.values() if p.search(n)]


def test_publisher_permissions_list_every_group() -> None:
    write = re.compile(topology.publisher_permissions(["b", "a"])["write"])
    assert write.pattern == r"^(?:lbg\.a|lbg\.b)$"
    assert write.search("lbg.a") and write.search("lbg.b") and not write.search("lbg.c")


@given(group_names, st.integers(min_value=0, max_value=999))
def test_a_client_may_send_owner_claims_and_they_reach_only_the_owners_stream(
    group: str, queue: int
) -> None:
    key = topology.owners_routing_key(group, queue)
    assert re.compile(topology.client_topic_permissions(group)["write"]).search(key)
    assert matches_binding(topology.owners_binding_key(group), key)
    assert not matches_binding(topology.output_binding_key(group), key)
    assert key != topology.control_routing_key(group)
