"""Resizing a NATS JetStream group at run time, on the generations of model/generations.py.

The switch point is a marker message in the group's events stream, on `<HP>.resize`, which
every consumer's filter includes: its stream sequence S ends the old generation for every
old consumer at once, in the same order as the events (no clock, no lock). An old consumer's
owner processes what comes before the marker and acks the marker and everything after it
unprocessed (stints.py); the new generation's consumers (`g<GN>q<N>`, filtered to the new
bucket stripes) start at S + 1. A consumer of generation g is drained once its ack floor
reached its end (or it was deleted), and a new stint starts only when the older consumers
that carried its buckets are drained. The history (size, start, end per generation) is kept
beside the config, in the config bucket under `<group>.generations`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NoStreamResponseError
from nats.js.kv import KeyValue

from lbg.broker.base import BrokerError, QueueStatus, Resize
from lbg.broker.nats import jsapi
from lbg.model import generations
from lbg.model.generations import Generation
from lbg.model.group import GroupConfig

RESIZE_TOKEN = "resize"
GENERATION_HEADER = "Lbg-Generation"
QUEUES_HEADER = "Lbg-Queues"
HISTORY_SUFFIX = ".generations"

# Publishes a marker (subject, headers) and returns its stream sequence.
Publish = Callable[[str, dict[str, str]], Awaitable[int]]
# The config of a generation's consumer: (config, queue, name, start sequence).
ConsumerConfigFor = Callable[[GroupConfig, int, str, int], dict[str, Any]]


def marker_subject(hash_prefix: str) -> str:
    """Where the switch markers go: in the events stream, apart from every bucket's events."""
    return f"{hash_prefix}.{RESIZE_TOKEN}"


def consumer_name(queue: int, generation: int = 0) -> str:
    """Generation 0 keeps the plain `q<N>`; later ones are `g<GN>q<N>`."""
    return f"q{queue}" if generation == 0 else f"g{generation}q{queue}"


def bucket_filters(config: GroupConfig, queue: int) -> list[str]:
    """The queue's subscriptions: `<HP>.<b>.>` for each of its buckets, and the markers where
    the group can be resized (exclusive queues)."""
    buckets = [f"{config.hash_prefix}.{b}.>" for b in config.buckets_for_queue(queue)]
    return [*buckets, marker_subject(config.hash_prefix)] if config.exclusive else buckets


def is_end(headers: dict[str, str] | None, generation: int) -> bool:
    """A marker ends `generation` if it starts the next one (anything else on the marker
    subject is ignored)."""
    return (headers or {}).get(GENERATION_HEADER) == str(generation + 1)


def history_key(group: str) -> str:
    return f"{group}{HISTORY_SUFFIX}"


async def load(configs: KeyValue, group: str, config: GroupConfig) -> tuple[list[Generation], int]:
    """The group's generations and the stored history's revision (0: none stored, the group
    was never resized: one generation of its size, from sequence 1)."""
    try:
        entry = await configs.get(history_key(group))
    except KeyNotFoundError:
        return [Generation(0, config.queue_count, 1, None)], 0
    try:
        history = generations.decode(entry.value or b"")
    except ValueError as exc:
        raise BrokerError(f"group '{group}': {exc}") from None
    return history[: config.generation + 1], entry.revision


async def drained(nc: Client, stream: str, consumer: str, end: int) -> bool:
    """The consumer acked everything up to `end` (its marker), or is gone."""
    try:
        info = await jsapi.consumer_info(nc, stream, consumer)
    except jsapi.JsApiError as exc:
        if exc.code == 404:
            return True
        raise
    return int(info.get("ack_floor", {}).get("stream_seq", 0)) >= end


async def _marker(nc: Client, stream: str, query: dict[str, Any]) -> tuple[int, dict[str, str]]:
    try:
        answer = await jsapi.request(nc, f"$JS.API.STREAM.MSG.GET.{stream}", query)
    except jsapi.JsApiError as exc:
        if exc.code == 404:
            return 0, {}
        raise
    message = answer.get("message", {})
    return int(message.get("seq", 0)), jsapi.decode_headers(message.get("hdrs"))


async def last_marker(nc: Client, stream: str, hash_prefix: str) -> tuple[int, dict[str, str]]:
    """The newest switch marker's sequence and headers ((0, {}) if there is none)."""
    return await _marker(nc, stream, {"last_by_subj": marker_subject(hash_prefix)})


async def end_of(nc: Client, stream: str, hash_prefix: str, generation: Generation) -> int | None:
    """The sequence of the marker that ended `generation` in the stream, if one did."""
    seq = generation.start
    while True:
        query = {"seq": seq, "next_by_subj": marker_subject(hash_prefix)}
        found, headers = await _marker(nc, stream, query)
        if not found:
            return None
        if is_end(headers, generation.index):
            return found
        seq = found + 1


async def delete_consumer(nc: Client, stream: str, consumer: str) -> None:
    """Remove a drained consumer; a missing one is fine."""
    try:
        await jsapi.request(nc, f"$JS.API.CONSUMER.DELETE.{stream}.{consumer}")
    except jsapi.JsApiError as exc:
        if exc.code != 404:
            raise


async def switch(
    nc: Client,
    publish: Publish,
    stream: str,
    config: GroupConfig,
    target: int,
) -> int:
    """The switch marker's sequence for generation GN + 1, published now, or found in the
    stream if an earlier attempt published it and stopped before storing the config."""
    generation = config.generation + 1
    seq, headers = await last_marker(nc, stream, config.hash_prefix)
    if seq and headers.get(GENERATION_HEADER) == str(generation):
        if headers.get(QUEUES_HEADER) != str(target):
            raise BrokerError(
                f"a resize to {headers.get(QUEUES_HEADER)} queues was left unfinished at "
                f"sequence {seq}: rerun it with --queues {headers.get(QUEUES_HEADER)}"
            )
        return seq
    headers = {GENERATION_HEADER: str(generation), QUEUES_HEADER: str(target)}
    try:
        return await publish(marker_subject(config.hash_prefix), headers)
    except NoStreamResponseError:
        raise BrokerError(
            "the group was created before NATS groups could be resized (its stream has no "
            f"subject {marker_subject(config.hash_prefix)}): recreate it to resize it"
        ) from None


async def resize(
    nc: Client,
    configs: KeyValue,
    group: str,
    target: int,
    publish: Publish,
    stream: str,
    consumer_config: ConsumerConfigFor,
) -> Resize:
    """Switch the group to `target` queues at a marker: publish it, create the new generation's
    consumers from just after it, store the history, then the config (compare-and-set)."""
    try:
        entry = await configs.get(group)
    except KeyNotFoundError:
        raise BrokerError(f"group '{group}' does not exist (no config in KV)") from None
    config = GroupConfig.from_json(entry.value or b"")
    try:
        generations.check_queue_count(group, config, target, divide=False)
    except ValueError as exc:
        raise BrokerError(str(exc)) from None
    if not config.exclusive:
        raise BrokerError(
            f"cannot resize group '{group}': it has competing consumers (EX 0), and a switch "
            "keeps order by handing each queue from one owner to the next"
        )
    history, revision = await load(configs, group, config)
    seq = await switch(nc, publish, stream, config, target)
    new = dataclasses.replace(config, queue_count=target, generation=config.generation + 1)
    for queue in range(target):
        try:
            await jsapi.create_consumer(
                nc,
                stream,
                consumer_config(new, queue, consumer_name(queue, new.generation), seq + 1),
            )
        except jsapi.JsApiError as exc:
            raise BrokerError(f"cannot resize group '{group}': {exc}") from None
    data = generations.encode(generations.switched(history, target, seq))
    try:
        if revision:
            await configs.update(history_key(group), data, last=revision)
        else:
            await configs.put(history_key(group), data)
        await configs.update(group, new.to_json().encode(), last=entry.revision)
    except KeyWrongLastSequenceError:
        raise BrokerError(f"group '{group}' changed meanwhile; try again") from None
    return Resize(config, new, seq)


async def draining(
    nc: Client, configs: KeyValue, stream: str, group: str, config: GroupConfig
) -> list[QueueStatus]:
    """The old generations' consumers not deleted yet: each drains up to its end marker."""
    history, _ = await load(configs, group, config)
    found = []
    for generation in history[:-1]:
        for member in range(generation.size):
            name = consumer_name(member, generation.index)
            try:
                info = await jsapi.consumer_info(nc, stream, name)
            except jsapi.JsApiError as exc:
                if exc.code == 404:
                    continue
                raise
            floor = int(info.get("ack_floor", {}).get("stream_seq", 0))
            found.append(
                QueueStatus(
                    queue=member,
                    name=f"{group}/{name} (generation {generation.index}, acked up to "
                    f"{floor} of {generation.end})",
                    buckets=list(range(member, config.hash_count, generation.size)),
                    backlog=int(info.get("num_pending", 0)),
                    in_flight=int(info.get("num_ack_pending", 0)),
                    active_client=None,
                )
            )
    return found
