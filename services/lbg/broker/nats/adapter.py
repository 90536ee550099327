"""NATS JetStream behind the broker interface.

Per group: one stream over `<HP>.<b>.>` for each bucket b < HC (the events), one stream over
`_lbg.<group>.>` (the validation, dead-letter and summary outputs), one durable pull consumer
per queue filtered to its buckets, and the group config in the KV bucket `lbg_groups` (the
JNDI analogue).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import orjson
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import (
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.errors import Error as JetStreamError
from nats.js.kv import KeyValue

from lbg.broker.base import (
    Broker,
    BrokerError,
    GroupExists,
    GroupNotFound,
    OutputMessage,
    ParkingLot,
    PublishError,
    QueueBinding,
    QueueStatus,
    Resize,
    StateListener,
    UndeliverableEvent,
    needs_upgrade,
    why,
)
from lbg.broker.nats import generations, jsapi
from lbg.broker.nats.acksubject import stored_at
from lbg.broker.nats.binding import PRIORITY_GROUP
from lbg.broker.nats.connection import ConnectionLog, connect_nats
from lbg.broker.nats.consumers import ConsumerSettings
from lbg.broker.nats.direct import subscribe_direct
from lbg.broker.nats.generations import bucket_filters, consumer_name, marker_subject
from lbg.broker.nats.histories import HistoryFeed
from lbg.broker.nats.parking import (
    NatsParkingLot,
    lot_stream,
    lot_stream_config,
    registry_bucket,
)
from lbg.broker.nats.presence import NatsPresence
from lbg.broker.nats.pubacks import NoStream, Rejected, StreamPublisher
from lbg.broker.nats.stints import GroupStints, StintBinding
from lbg.broker.nats.unpins import PinWatch
from lbg.model.destinations import SYSTEM_PREFIX, Destination, OutputKind, level_token
from lbg.model.generations import Generation
from lbg.model.group import GroupConfig, GroupConfigError
from lbg.model.messages import event_digest
from lbg.settings import BrokerSettings

log = logging.getLogger(__name__)

CONFIG_BUCKET = "lbg_groups"
OWNERS_BUCKET = "lbg_owners"
# Short, because a publish sent just before a lost connection never gets its ack: it is
# retried after this long, and the stream's de-duplication (Nats-Msg-Id) drops the copy.
PUBLISH_TIMEOUT = 3.0
SUBJECT_CACHE_SIZE = 65536
CLAIM_ATTEMPTS = 5
ACK_WAIT = 30.0
MSG_ID_HEADER = "Nats-Msg-Id"
OUTPUT_MAX_BYTES = 1024**3
CONTROL_PREFIX = "_lbgctl"
# nats-server (2.15) caps a stream that sets no max_consumers at 1000 consumers.
SERVER_DEFAULT_CONSUMERS = 1000


@functools.lru_cache(maxsize=SUBJECT_CACHE_SIZE)
def subject(destination: Destination) -> str:
    """The NATS subject of a destination (remembered: the same few recur for every event)."""
    return ".".join(level_token(level) for level in destination.levels)


def events_stream(group: str) -> str:
    return f"LBG_{group}"


def output_stream(group: str) -> str:
    return f"LBG_{group}_OUT"


def header_bytes(headers: Mapping[str, str]) -> int:
    """How many bytes the headers add to a message: nats-server counts them in max_payload,
    and closes the connection of a client that exceeds it."""
    if not headers:
        return 0
    lines = (len(f"{name}: {value}\r\n".encode()) for name, value in headers.items())
    return len(b"NATS/1.0\r\n\r\n") + sum(lines)


def consumer_limit(config: GroupConfig) -> int:
    """The events stream's max_consumers: the queues of two generations at once (a resize
    keeps the old ones until they are drained, and QC <= HC), never below the server's
    default (which refused QC 1024 with 'maximum consumers limit reached')."""
    return max(SERVER_DEFAULT_CONSUMERS, 2 * config.hash_count)


def control_subject(group: str) -> str:
    """Core NATS subject of the group's membership heartbeats (kept out of every stream)."""
    return f"{CONTROL_PREFIX}.{group}.members"


async def claim_epoch(owners: KeyValue, key: str, record: bytes) -> int:
    """Write a queue's new owner record with compare-and-set; its revision is the queue's new
    ownership epoch, higher than every earlier owner's (a concurrent claim makes one retry)."""
    for _ in range(CLAIM_ATTEMPTS):
        try:
            last = (await owners.get(key)).revision
        except KeyNotFoundError as exc:  # a deleted record still has a revision to follow
            deleted = getattr(exc, "entry", None)
            last = deleted.revision if deleted is not None else 0
        with contextlib.suppress(KeyWrongLastSequenceError):
            return await owners.update(key, record, last=last)
    raise BrokerError(f"owner record '{key}': changed under {CLAIM_ATTEMPTS} claims in a row")


class NatsBroker(Broker):
    """The broker interface on NATS JetStream (embedded server, a real server or a cluster)."""

    resizable = True
    bind_concurrency = 64
    publisher_users_hint = (
        "NATS users live in the server config: render them with"
        " python -m lbg.broker.nats.permissions --publisher-user U"
    )

    def __init__(self, nc: Client, events: ConnectionLog, priority_timeout: float = 2.0) -> None:
        self._nc = nc
        self._events = events
        self._js = nc.jetstream(timeout=PUBLISH_TIMEOUT)
        self._streams = StreamPublisher(nc, PUBLISH_TIMEOUT)
        self._priority_timeout = priority_timeout
        self._kv: dict[str, KeyValue] = {}
        self._unpins = PinWatch(nc, events.refusal)
        events.on_reconnect.append(self._unpins.reconnected)
        self._histories: dict[str, HistoryFeed] = {}
        self._histories_made = asyncio.Lock()
        self._consumers = ConsumerSettings(nc, events.refusal, priority_timeout)
        self._presence = NatsPresence(nc, CONTROL_PREFIX)

    @classmethod
    async def connect(
        cls, settings: BrokerSettings, name: str, priority_timeout: float = 2.0
    ) -> NatsBroker:
        """Connect to the server in `settings`."""
        events = ConnectionLog()
        return cls(await connect_nats(settings, name, events), events, priority_timeout)

    def connected(self) -> bool:
        return self._nc.is_connected

    async def close(self) -> None:
        self._events.closing = True
        for feed in self._histories.values():
            await feed.close()
        await self._unpins.close()
        with contextlib.suppress(Exception):
            await self._nc.drain()

    async def _bucket(self, name: str, create: bool = True, replicas: int = 1) -> KeyValue:
        """The KV bucket `name`; made (with `replicas` copies) if missing unless `create` is
        False (a reader may lack the permission to create it, and finds nothing there anyway)."""
        if name not in self._kv:
            try:
                self._kv[name] = await self._js.key_value(name)
            except BucketNotFoundError:
                if not create:
                    raise
                # Direct gets have one subject per key: a NATS user may read one group's config.
                try:
                    self._kv[name] = await self._js.create_key_value(
                        bucket=name, history=1, direct=True, replicas=replicas
                    )
                except JetStreamError as exc:
                    reason = getattr(exc, "description", None) or exc
                    raise BrokerError(f"KV bucket '{name}': {reason}") from None
        return self._kv[name]

    async def _keys(self, bucket: str, pattern: str = ">") -> list[str]:
        """The keys of `bucket` matching `pattern`, from the stream's own subject list in one
        request. nats-py's keys() watches the bucket and may stop before the entries arrive on
        a busy connection (an empty or short list); a key deleted or purged is still listed."""
        prefix = f"$KV.{bucket}."
        try:
            info = await self._js.stream_info(f"KV_{bucket}", subjects_filter=f"{prefix}{pattern}")
        except NotFoundError:
            return []
        return sorted(s[len(prefix) :] for s in info.state.subjects or {})

    async def _stream_exists(self, name: str) -> bool:
        try:
            await self._js.stream_info(name)
        except NotFoundError:
            return False
        return True

    async def _check_clashes(self, name: str, config: GroupConfig) -> None:
        configs = await self._bucket(CONFIG_BUCKET, replicas=config.replicas)
        with contextlib.suppress(KeyNotFoundError):
            await configs.get(name)
            raise GroupExists(f"group '{name}' already exists (config in KV '{CONFIG_BUCKET}')")
        for stream in (events_stream(name), output_stream(name)):
            if await self._stream_exists(stream):
                raise GroupExists(f"stream '{stream}' already exists")
        prefix = config.hash_prefix
        for other_name, other in (await self.list_groups()).items():
            if other.hash_prefix == prefix:
                raise GroupExists(f"hash prefix '{prefix}' is already used by group '{other_name}'")

    async def create_group(
        self,
        name: str,
        config: GroupConfig,
        client_password: str | None = None,
        force: bool = False,
    ) -> None:
        """NATS users live in the server's own config: `client_password` and `force` are not
        used here."""
        await self._check_clashes(name, config)
        created: list[str] = []
        try:
            await self._add_stream(
                created,
                StreamConfig(
                    name=events_stream(name),
                    # One subject per bucket: an event to a bucket outside HC is refused
                    # (no stream answers), rather than stored where no queue reads it; and
                    # the resize markers (generations.py).
                    subjects=[
                        *(f"{config.hash_prefix}.{b}.>" for b in range(config.hash_count)),
                        marker_subject(config.hash_prefix),
                    ],
                    storage=StorageType.FILE,
                    discard=DiscardPolicy.NEW,
                    max_bytes=config.queue_size_mb * config.queue_count * 1024 * 1024,
                    max_consumers=consumer_limit(config),
                    num_replicas=config.replicas,
                ),
            )
            await self._add_stream(
                created,
                StreamConfig(
                    name=output_stream(name),
                    subjects=[f"{SYSTEM_PREFIX}.{name}.>"],
                    storage=StorageType.FILE,
                    discard=DiscardPolicy.NEW,
                    max_bytes=OUTPUT_MAX_BYTES,
                    num_replicas=config.replicas,
                ),
            )
            await self._add_stream(created, lot_stream_config(name, config.replicas))
            await self._bucket(registry_bucket(name), replicas=config.replicas)
            for queue in range(config.queue_count):
                await jsapi.create_consumer(
                    self._nc,
                    events_stream(name),
                    self._consumer_config(config, queue, consumer_name(queue), None),
                )
            # Here, so clients never need to create it.
            await self._bucket(OWNERS_BUCKET, replicas=config.replicas)
            configs = await self._bucket(CONFIG_BUCKET, replicas=config.replicas)
            await configs.create(name, config.to_json().encode())
        except (JetStreamError, jsapi.JsApiError) as exc:
            for stream in created:
                with contextlib.suppress(Exception):
                    await self._js.delete_stream(stream)
            raise GroupExists(f"cannot create group '{name}': {exc}") from None

    def _consumer_config(
        self,
        config: GroupConfig,
        queue: int,
        name: str,
        start: int | None,
        priority_timeout: float | None = None,
    ) -> dict[str, object]:
        """The durable consumer of one queue, reading from stream sequence `start` if given."""
        return jsapi.pinned_consumer_config(
            name,
            bucket_filters(config, queue),
            PRIORITY_GROUP if config.exclusive else None,
            priority_timeout or self._priority_timeout,
            max_ack_pending=1000,
            ack_wait=ACK_WAIT,
            replicas=config.replicas,
            start=start,
        )

    async def resize_group(self, name: str, queue_count: int) -> Resize:
        """Switch the group to `queue_count` queues at a marker in its stream (generations.py);
        the new consumers keep the current ones' priority timeout."""
        config = await self.read_group(name)
        configs = await self._bucket(CONFIG_BUCKET, create=False)
        timeout, _ = await self._consumer_settings(name, 0, consumer_name(0, config.generation))

        async def publish(subject: str, headers: dict[str, str]) -> int:
            return int((await self._js.publish(subject, b"", headers=headers)).seq)

        def consumer_config(new: GroupConfig, queue: int, consumer: str, start: int) -> dict:
            return self._consumer_config(new, queue, consumer, start, timeout)

        try:
            return await generations.resize(
                self._nc, configs, name, queue_count, publish, events_stream(name), consumer_config
            )
        except (JetStreamError, jsapi.JsApiError, NatsTimeoutError, TimeoutError) as exc:
            reason = why(exc)
            raise BrokerError(f"cannot resize group '{name}': {reason}") from None

    async def _add_stream(self, created: list[str], config: StreamConfig) -> None:
        try:
            await self._js.add_stream(config)
        except JetStreamError as exc:
            reason = getattr(exc, "description", None) or exc
            raise BrokerError(f"stream '{config.name}': {reason}") from None
        created.append(str(config.name))

    async def read_group(self, name: str) -> GroupConfig:
        try:
            configs = await self._bucket(CONFIG_BUCKET, create=False)
            entry = await configs.get(name)
        except (KeyNotFoundError, BucketNotFoundError):
            raise GroupNotFound(f"group '{name}' does not exist (no config in KV)") from None
        except (NatsTimeoutError, TimeoutError):
            key = f"$JS.API.DIRECT.GET.KV_{CONFIG_BUCKET}.$KV.{CONFIG_BUCKET}.{name}"
            reason = self._events.refusal(key) or "no answer in time"
            raise BrokerError(f"group '{name}': cannot read its config ({reason})") from None
        except NatsError as exc:  # no responders while JetStream (re)starts, a closing connection
            reason = why(exc)
            raise BrokerError(f"group '{name}': cannot read its config ({reason})") from None
        try:
            config = GroupConfig.from_json(entry.value or b"")
        except GroupConfigError as exc:
            raise BrokerError(f"group '{name}': stored config is invalid: {exc}") from None
        if (feed := self._histories.get(name)) is not None:
            feed.heard(config.generation)  # its queues' stints follow a resize from here
        return config

    async def list_groups(self) -> dict[str, GroupConfig]:
        groups = {}
        for name in await self._keys(CONFIG_BUCKET):
            if name.endswith(generations.HISTORY_SUFFIX):
                continue
            with contextlib.suppress(GroupNotFound, BrokerError):  # deleted, or unreadable
                groups[name] = await self.read_group(name)
        return groups

    async def upgrade_group(self, name: str, config: GroupConfig) -> list[str]:
        """What an older release's group lacks: the owners bucket (shared by every group; the
        client user's rights on it come from the rendered permissions, to apply again), and
        the events stream's consumer limit (without one the server caps the stream at its
        default, which a resize of a large group, two generations of queues, runs into)."""
        added = []
        try:
            await self._bucket(OWNERS_BUCKET, create=False)
        except BucketNotFoundError:
            await self._bucket(OWNERS_BUCKET, replicas=config.replicas)
            added.append(f"KV bucket '{OWNERS_BUCKET}'")
        stream = (await self._js.stream_info(events_stream(name))).config
        limit = consumer_limit(config)
        if (stream.max_consumers or -1) < limit:
            stream.max_consumers = limit
            await self._js.update_stream(stream)
            added.append(f"stream '{stream.name}' max_consumers {limit}")
        return added

    async def delete_group(self, name: str) -> None:
        await self.read_group(name)
        streams = (events_stream(name), output_stream(name), lot_stream(name))
        for stream in (*streams, f"KV_{registry_bucket(name)}"):
            with contextlib.suppress(NotFoundError):
                await self._js.delete_stream(stream)
        self._kv.pop(registry_bucket(name), None)
        await self._forget(name)
        owners = await self._bucket(OWNERS_BUCKET)
        for key in await self._keys(OWNERS_BUCKET, f"{name}.*"):
            await owners.purge(key)
        configs = await self._bucket(CONFIG_BUCKET)
        with contextlib.suppress(NotFoundError):
            await configs.purge(generations.history_key(name))
        await configs.purge(name)

    async def _forget(self, name: str) -> None:
        """Drop what this connection remembers of a deleted group (a new one may take its name)."""
        if (feed := self._histories.pop(name, None)) is not None:
            await feed.close()
        self._consumers.forget(events_stream(name))

    async def queue_status(self, name: str, config: GroupConfig) -> list[QueueStatus]:
        owners = await self._owners(name)
        status = []
        for queue in range(config.queue_count):
            consumer = consumer_name(queue, config.generation)
            info = await jsapi.consumer_info(self._nc, events_stream(name), consumer)
            pins = [g.get("pinned_client_id") for g in info.get("priority_groups") or []]
            owner = owners.get(queue)
            active = owner["client"] if owner and owner.get("pin") in pins else None
            backlog, in_flight = (
                int(info.get("num_pending", 0)),
                int(info.get("num_ack_pending", 0)),
            )
            oldest = None
            if backlog + in_flight:
                floor = int((info.get("ack_floor") or {}).get("stream_seq", 0))
                stored = await jsapi.first_stored_after(
                    self._nc, events_stream(name), floor + 1, bucket_filters(config, queue)
                )
                oldest = None if stored is None else max(0.0, time.time() - stored)
            status.append(
                QueueStatus(
                    queue=queue,
                    name=f"{name}/{consumer}",
                    buckets=config.buckets_for_queue(queue),
                    backlog=backlog,
                    in_flight=in_flight,
                    active_client=active,
                    oldest_age=oldest,
                )
            )
        return status

    async def draining(self, name: str, config: GroupConfig) -> list[QueueStatus]:
        configs = await self._bucket(CONFIG_BUCKET, create=False)
        return await generations.draining(self._nc, configs, events_stream(name), name, config)

    async def _owners(self, group: str) -> dict[int, dict]:
        owners = await self._bucket(OWNERS_BUCKET)
        result: dict[int, dict] = {}
        for key in await self._keys(OWNERS_BUCKET, f"{group}.*"):
            queue = key.rpartition(".")[2]
            if queue.isdigit():
                with contextlib.suppress(KeyNotFoundError):  # purged: the queue has no owner
                    entry = await owners.get(key)
                    result[int(queue)] = orjson.loads(entry.value or b"{}")
        return result

    async def publish(
        self, destination: Destination, body: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        target = subject(destination)
        all_headers = dict(headers or {})
        if destination.levels[0] != SYSTEM_PREFIX and MSG_ID_HEADER not in all_headers:
            all_headers[MSG_ID_HEADER] = event_digest(target, all_headers, body).hex()
        size = len(body) + header_bytes(all_headers)
        if size > self._nc.max_payload:
            raise UndeliverableEvent(
                f"event of {size} bytes (body and headers) exceeds the server's max_payload"
                f" of {self._nc.max_payload} bytes"
            )
        try:
            await self._streams.publish(target, body, all_headers or None)
        except NoStream:
            raise PublishError(
                f"no stream captures '{target}' (does the group exist? is the bucket < HC?)"
            ) from None
        except TimeoutError:
            refused = self._events.refusal(target)
            raise PublishError(refused or f"no acknowledgement for '{target}' in time") from None
        except Rejected as exc:
            raise PublishError(f"'{target}' rejected: {exc}") from None

    async def bind(
        self,
        group: str,
        config: GroupConfig,
        queue: int,
        client_id: str,
        preferred: bool = True,
        on_change: StateListener | None = None,
    ) -> QueueBinding:
        await self._consumer_settings(group, queue, consumer_name(queue, config.generation))
        try:
            owners = await self._bucket(OWNERS_BUCKET, create=False)
        except BucketNotFoundError:
            raise needs_upgrade(group, f"KV bucket '{OWNERS_BUCKET}'") from None

        async def settings(consumer: str) -> tuple[float, bool]:
            return await self._consumer_settings(group, queue, consumer)

        async def claim(consumer: str, pin: str) -> int:
            record = orjson.dumps({"client": client_id, "pin": pin, "consumer": consumer})
            return await claim_epoch(owners, f"{group}.{queue}", record)

        stints = GroupStints(
            self._nc,
            events_stream(group),
            config,
            await self._history(group),
            settings,
            claim,
            self._unpins.watch,
        )
        return StintBinding(queue, stints, preferred, on_change)

    async def _history(self, group: str) -> HistoryFeed:
        """The group's history, followed by one task for all its bindings on this connection."""
        async with self._histories_made:  # queues are bound concurrently: one feed per group
            if group not in self._histories:

                async def load() -> list[Generation]:
                    configs = await self._bucket(CONFIG_BUCKET, create=False)
                    config = await self.read_group(group)
                    return (await generations.load(configs, group, config))[0]

                feed = HistoryFeed(group, load)
                await feed.start()
                self._histories[group] = feed
            return self._histories[group]

    async def _consumer_settings(self, group: str, queue: int, consumer: str) -> tuple[float, bool]:
        """A consumer's priority timeout and whether it acks cumulatively (AckPolicy all)."""
        where = f"group '{group}' queue {queue}"
        return await self._consumers.of(events_stream(group), consumer, where)

    async def publish_control(self, group: str, body: bytes) -> None:
        try:
            await self._nc.publish(control_subject(group), body)
        except NatsError as exc:
            raise BrokerError(f"heartbeat not sent: {why(exc)}") from None

    async def subscribe_control(
        self, group: str, handler: Callable[[bytes], None]
    ) -> Callable[[], Awaitable[None]]:
        subscription = await subscribe_direct(
            self._nc, control_subject(group), lambda msg: handler(msg.data)
        )
        self._presence.control_subscribed(group, subscription)
        return subscription.unsubscribe

    async def announce_presence(self, group: str, member: str) -> bool:
        return await self._presence.announce(group, member)

    async def probe_member(self, group: str, member: str) -> bool | None:
        return await self._presence.ask(group, member)

    def on_connection_lost(self, listener: Callable[[], None]) -> None:
        self._events.on_disconnect.append(listener)

    def parking(self, group: str) -> ParkingLot:
        return NatsParkingLot(self._js, self._streams, group, self._events.refusal)

    async def read_output(self, group: str) -> AsyncIterator[OutputMessage]:
        sub = await self._js.pull_subscribe(
            f"{SYSTEM_PREFIX}.{group}.>",
            stream=output_stream(group),
            config=ConsumerConfig(
                ack_policy=AckPolicy.NONE,
                deliver_policy=DeliverPolicy.ALL,
                inactive_threshold=60.0,
            ),
        )
        kinds = {kind.value: kind for kind in OutputKind}
        try:
            while True:
                try:
                    messages = await sub.fetch(batch=1000, timeout=1.0)
                except (NatsTimeoutError, TimeoutError):
                    continue
                for msg in messages:
                    kind = kinds.get(msg.subject.rsplit(".", 1)[-1])
                    if kind is not None:
                        at = stored_at(msg.reply)
                        yield OutputMessage(kind, msg.data, msg.headers or {}, at)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
