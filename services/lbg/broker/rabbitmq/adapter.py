"""RabbitMQ behind the broker interface: single-active-consumer quorum queues (see topology.py).

The daemons need AMQP only: the group config is a one-message stream `lbg.<g>.config` that
any reader of the group may read from the start. The management API (cg-admin, `lbg status`)
lists groups, manages the client identity and its permissions, and reads queue figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from urllib.parse import unquote

import aio_pika
import aiormq.exceptions
import orjson
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractIncomingMessage,
)
from aio_pika.exceptions import AMQPError, ChannelInvalidStateError, DeliveryError
from yarl import URL

from lbg.aio import cancel_and_wait
from lbg.broker.base import (
    Broker,
    BrokerError,
    GroupExists,
    GroupNotFound,
    OutputMessage,
    PublishError,
    QueueBinding,
    QueueStatus,
    StateListener,
    UndeliverableEvent,
)
from lbg.broker.rabbitmq import topology
from lbg.broker.rabbitmq.binding import RabbitQueueBinding, header_text
from lbg.broker.rabbitmq.claims import OwnerClaims
from lbg.broker.rabbitmq.management import ManagementApi, NotFound, path_segment
from lbg.model.destinations import SYSTEM_PREFIX, Destination, OutputKind
from lbg.model.group import GroupConfig, GroupConfigError
from lbg.settings import BrokerSettings
from lbg.tls import client_context, https_verify

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT = 10.0
READ_CONFIG_TIMEOUT = 5.0
DEFAULT_HEARTBEAT = 1
MANAGEMENT_PORT = 15672
POLL_SECONDS = 0.25
CONTROL_TIMEOUT = 1.0
RECONSUME_SECONDS = 1.0
TICK_SECONDS = 0.1
CLIENT_TAG = "lbg-client"
PUBLISHER_TAG = "lbg-publisher"
# RabbitMQ 3.10 stamps no store time on messages: the sender's clock stands in for it.
SENT_AT_HEADER = "Lbg-Sent-At"
_CONFIG_QUEUE = re.compile(r"^lbg\.([A-Za-z0-9_-]+)\.config$")
_EXCHANGE = re.compile(r"^lbg\.([A-Za-z0-9_-]+)$")
_NOT_OURS = "that cg-admin did not give"
_TOO_LARGE = re.compile(r"message size \d+ is larger than configured max size \d+", re.I)


def amqp_url(settings: BrokerSettings) -> URL:
    """The broker URL with credentials from settings and a short heartbeat unless it sets one."""
    url = URL(settings.url)
    user, password = settings.login()
    if user:
        url = url.with_user(user).with_password(password or "")
    if "heartbeat" not in url.query:
        url = url.update_query(heartbeat=DEFAULT_HEARTBEAT)
    return url


class RabbitBroker(Broker):
    """The broker interface on one RabbitMQ node or cluster (AMQP 0-9-1 with aio-pika)."""

    def __init__(self, settings: BrokerSettings, name: str) -> None:
        self._url = amqp_url(settings)
        self._name = name
        self._connect_timeout = settings.connect_timeout
        self._heartbeat = float(self._url.query.get("heartbeat", DEFAULT_HEARTBEAT))
        self._vhost = unquote(self._url.path[1:]) if len(self._url.path) > 1 else "/"
        self._settings = settings
        self._ssl = client_context(settings) if self._url.scheme == "amqps" else None
        self._connection: AbstractConnection | None = None
        self._connect_lock = asyncio.Lock()
        self._channels: dict[str, AbstractChannel] = {}
        self._exchanges: dict[str, AbstractExchange] = {}
        self._prefixes: dict[str, str] = {}
        self._management: ManagementApi | None = None
        self._last_tick = time.monotonic()
        self._ticker = asyncio.create_task(self._tick(), name="rabbitmq-liveness")
        self._closing = False
        self._claims = OwnerClaims(self._open_channel, self._publish_claim)

    @classmethod
    async def connect(cls, settings: BrokerSettings, name: str) -> RabbitBroker:
        broker = cls(settings, name)
        try:
            await broker._conn()
        except BaseException:
            await cancel_and_wait(broker._ticker)
            raise
        return broker

    async def close(self) -> None:
        self._closing = True
        await cancel_and_wait(self._ticker)
        await self._claims.close()
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()
        if self._management is not None:
            await self._management.close()

    # -- connection and channels -------------------------------------------------------

    async def _tick(self) -> None:
        """Notes the time every tick: a gap means this process was paused (SIGSTOP, swap)."""
        while True:
            self._last_tick = time.monotonic()
            await asyncio.sleep(TICK_SECONDS)

    def _paused_for(self) -> float:
        return time.monotonic() - self._last_tick

    async def _conn(self) -> AbstractConnection:
        """The open connection; reconnects with backoff (for connect_timeout at first)."""
        async with self._connect_lock:
            old = self._connection
            if old is not None and not old.is_closed and old.connected.is_set():
                return old
            first = old is None
            if old is not None:
                with contextlib.suppress(Exception):
                    await old.close()
            deadline = time.monotonic() + self._connect_timeout
            delay = 0.2
            attempt = 0
            while True:
                try:
                    self._connection = await aio_pika.connect(
                        self._url,
                        timeout=min(2.0, self._connect_timeout),
                        client_properties={"connection_name": self._name},
                        ssl_context=self._ssl,
                    )
                    break
                except (AMQPError, OSError, TimeoutError, ConnectionError) as exc:
                    reason = f"{type(exc).__name__}: {exc}".strip(": ")
                    if first and time.monotonic() + delay > deadline:
                        raise BrokerError(
                            f"cannot connect to {self._url.with_password(None)} within "
                            f"{self._connect_timeout:g}s ({reason})"
                        ) from None
                    attempt += 1
                    if not first:
                        log.warning(
                            "broker %s unreachable (%s); retrying in %.1f s (attempt %d)",
                            self._url.with_password(None),
                            reason,
                            delay,
                            attempt,
                        )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
            if not first:
                log.info("reconnected to the broker")
            self._connection.close_callbacks.add(self._on_connection_closed)
            self._channels.clear()
            self._exchanges.clear()
            return self._connection

    def _on_connection_closed(self, *_: object) -> None:
        if not self._closing:
            log.warning("disconnected from the broker")

    async def _open_channel(self, confirms: bool = False) -> AbstractChannel:
        connection = await self._conn()
        return await connection.channel(publisher_confirms=confirms, on_return_raises=confirms)

    async def _channel(self, purpose: str) -> AbstractChannel:
        """A long-lived channel per purpose (publish, control, probe), reopened when closed."""
        channel = self._channels.get(purpose)
        if channel is None or channel.is_closed:
            channel = await self._open_channel(confirms=purpose == "publish")
            self._channels[purpose] = channel
            self._exchanges = {k: v for k, v in self._exchanges.items() if k[0] != purpose}
        return channel

    async def _exchange(self, purpose: str, name: str) -> AbstractExchange:
        channel = await self._channel(purpose)
        key = (purpose, name)
        exchange = self._exchanges.get(key)  # type: ignore[call-overload]
        if exchange is None:
            exchange = await channel.get_exchange(name, ensure=False)
            self._exchanges[key] = exchange  # type: ignore[index]
        return exchange

    async def _count_consumers(self, queue: str) -> int:
        """Consumers registered on `queue` now (passive declare: immediate, unlike the API)."""
        channel = await self._channel("probe")
        try:
            declared = await channel.declare_queue(queue, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise BrokerError(f"queue '{queue}' does not exist (was the group deleted?)") from None
        return int(declared.declaration_result.consumer_count or 0)

    async def _exists(self, kind: str, name: str) -> bool:
        channel = await self._open_channel()
        try:
            if kind == "queue":
                await channel.declare_queue(name, passive=True)
            else:
                await channel.declare_exchange(name, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False
        finally:
            with contextlib.suppress(Exception):
                await channel.close()
        return True

    def _api(self) -> ManagementApi:
        """The management API, from admin_url (default: the broker host on port 15672)."""
        if self._management is None:
            settings = self._settings
            admin_url, admin_user, admin_password = settings.admin_login()
            base = admin_url or f"http://{self._url.host}:{MANAGEMENT_PORT}"
            user = admin_user or self._url.user or "guest"
            password = admin_password or self._url.password or "guest"
            self._management = ManagementApi(base, user, password, https_verify(settings))
        return self._management

    # -- the group store -----------------------------------------------------------------

    async def read_group(self, name: str) -> GroupConfig:
        channel = await self._open_channel()
        received: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        async def on_message(message: AbstractIncomingMessage) -> None:
            if not received.done():
                received.set_result(message.body)
            await message.ack()

        try:
            await channel.set_qos(prefetch_count=10)
            queue = await channel.get_queue(topology.config_queue_name(name), ensure=False)
            await queue.consume(on_message, arguments={"x-stream-offset": "first"})
            body = await asyncio.wait_for(received, READ_CONFIG_TIMEOUT)
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise GroupNotFound(f"group '{name}' does not exist (no config stream)") from None
        except aiormq.exceptions.ChannelAccessRefused:
            raise BrokerError(f"group '{name}': not allowed to read its config") from None
        except TimeoutError:
            raise BrokerError(f"group '{name}': config stream is empty") from None
        finally:
            with contextlib.suppress(Exception):
                await channel.close()
        try:
            config = GroupConfig.from_json(body)
        except GroupConfigError as exc:
            raise BrokerError(f"group '{name}': stored config is invalid: {exc}") from None
        self._prefixes[config.hash_prefix] = name
        return config

    async def list_groups(self) -> dict[str, GroupConfig]:
        queues = await self._api().get(
            f"/queues/{path_segment(self._vhost)}", columns="name", page="1", page_size="500"
        )
        names = sorted(
            match.group(1)
            for item in queues.get("items", [])
            if (match := _CONFIG_QUEUE.match(item["name"]))
        )
        groups = {}
        for name in names:
            with contextlib.suppress(GroupNotFound, BrokerError):
                groups[name] = await self.read_group(name)
        return groups

    async def _check_clashes(self, name: str, config: GroupConfig) -> None:
        objects = [
            ("queue", topology.config_queue_name(name)),
            ("exchange", topology.exchange_name(name)),
        ]
        objects += [("queue", topology.queue_name(name, q)) for q in range(config.queue_count)]
        objects.append(("queue", topology.output_queue_name(name)))
        for kind, object_name in objects:
            if await self._exists(kind, object_name):
                if kind == "queue" and object_name == topology.config_queue_name(name):
                    raise GroupExists(f"group '{name}' already exists")
                raise GroupExists(f"{kind} '{object_name}' already exists")
        for other_name, other in (await self.list_groups()).items():
            if other.hash_prefix == config.hash_prefix:
                raise GroupExists(
                    f"hash prefix '{config.hash_prefix}' is already used by group '{other_name}'"
                )

    async def create_group(
        self,
        name: str,
        config: GroupConfig,
        client_password: str | None = None,
        force: bool = False,
    ) -> None:
        await self._check_clashes(name, config)
        channel = await self._open_channel(confirms=True)
        created: list[tuple[str, str]] = []
        try:
            exchange = await channel.declare_exchange(
                topology.exchange_name(name), aio_pika.ExchangeType.TOPIC, durable=True
            )
            created.append(("exchange", exchange.name))
            for queue in range(config.queue_count):
                declared = await channel.declare_queue(
                    topology.queue_name(name, queue),
                    durable=True,
                    arguments=topology.queue_arguments(config),
                )
                created.append(("queue", declared.name))
                for key in topology.bucket_binding_keys(config, queue):
                    await declared.bind(exchange, key)
            output = await channel.declare_queue(
                topology.output_queue_name(name),
                durable=True,
                arguments=topology.output_arguments(),
            )
            created.append(("queue", output.name))
            await output.bind(exchange, topology.output_binding_key(name))
            owners = await channel.declare_queue(
                topology.owners_stream_name(name),
                durable=True,
                arguments=topology.output_arguments(),
            )
            created.append(("queue", owners.name))
            await owners.bind(exchange, topology.owners_binding_key(name))
            stored = await channel.declare_queue(
                topology.config_queue_name(name), durable=True, arguments={"x-queue-type": "stream"}
            )
            created.append(("queue", stored.name))
            await channel.default_exchange.publish(
                aio_pika.Message(
                    config.to_json().encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                ),
                stored.name,
            )
            policy, body = topology.member_queue_policy(name)
            await self._api().put(self._policy_path(policy), body)
            created.append(("policy", policy))
            await self._grant_client(
                config.client_username, client_password, extra=name, force=force
            )
        except (AMQPError, BrokerError, DeliveryError) as exc:
            await self._undo(created)
            raise BrokerError(f"cannot create group '{name}': {exc}") from None
        finally:
            with contextlib.suppress(Exception):
                await channel.close()
        self._prefixes[config.hash_prefix] = name

    def _policy_path(self, policy: str) -> str:
        return f"/policies/{path_segment(self._vhost)}/{path_segment(policy)}"

    async def _undo(self, created: list[tuple[str, str]]) -> None:
        """Delete what a failed create made, newest first."""
        channel = await self._open_channel()
        try:
            for kind, object_name in reversed(created):
                with contextlib.suppress(Exception):
                    if kind == "policy":
                        await self._api().delete(self._policy_path(object_name))
                    elif kind == "queue":
                        await channel.queue_delete(object_name)
                    else:
                        await channel.exchange_delete(object_name)
        finally:
            with contextlib.suppress(Exception):
                await channel.close()

    async def _grant_client(
        self,
        user: str,
        password: str | None,
        extra: str | None = None,
        without: str = "",
        force: bool = False,
    ) -> None:
        """Give the client identity access to exactly the groups it serves.

        The user is created (tagged `lbg-client`) when a password is given and it does not
        exist; an existing user that is not such a CU is refused for a new group unless
        `force`; a user left with no group loses its permissions, and is deleted if we made it.
        """
        api = self._api()
        users = path_segment(user)
        try:
            record = await api.get(f"/users/{users}")
        except NotFound:
            record = None
        if record is None:
            if password is None:
                log.warning(
                    "client user '%s' does not exist: clients must use another identity "
                    "(give cg-admin a client password to create it)",
                    user,
                )
                return
            await api.put(f"/users/{users}", {"password": password, "tags": CLIENT_TAG})
        groups = {g for g, c in (await self.list_groups()).items() if c.client_username == user}
        if record is not None and extra and not force:
            served = groups - {extra}  # the new group's config is stored already
            expected = topology.client_permissions(sorted(served)) if served else None
            await self._refuse_foreign(user, record, CLIENT_TAG, expected, served)
        if extra:
            groups.add(extra)
        groups.discard(without)
        permissions = f"/permissions/{path_segment(self._vhost)}/{users}"
        topic_permissions = f"/topic-permissions/{path_segment(self._vhost)}/{users}"
        if groups:
            for group in sorted(groups):
                await api.put(topic_permissions, topology.client_topic_permissions(group))
            await api.put(permissions, topology.client_permissions(sorted(groups)))
            return
        with contextlib.suppress(NotFound):
            await api.delete(permissions)
        with contextlib.suppress(NotFound):
            await api.delete(topic_permissions)
        if record is not None and CLIENT_TAG in str(record.get("tags", "")):
            await api.delete(f"/users/{users}")

    async def grant_publisher(
        self,
        group: str,
        config: GroupConfig,
        user: str,
        password: str | None,
        force: bool = False,
    ) -> None:
        """Create the publisher user (tagged `lbg-publisher`) if needed, then put the group's
        topic permission before the vhost permissions, so the user never holds write access to
        an exchange without its routing-key limit; a failure undoes what this run added.
        An existing user with other tags or permissions is refused unless `force`."""
        api = self._api()
        users = path_segment(user)
        record = await self._publisher_record(user)
        groups = await self._publisher_groups(user)
        if record is not None and not force:
            expected = topology.publisher_permissions(sorted(groups)) if groups else None
            await self._refuse_foreign(user, record, PUBLISHER_TAG, expected, groups)
        if record is None:
            if password is None:
                raise BrokerError(
                    f"publisher user '{user}' does not exist: give a password to create it"
                )
            await api.put(f"/users/{users}", {"password": password, "tags": PUBLISHER_TAG})
        topic_permissions = f"/topic-permissions/{path_segment(self._vhost)}/{users}"
        try:
            await api.put(topic_permissions, topology.publisher_topic_permissions(group, config))
            await api.put(
                f"/permissions/{path_segment(self._vhost)}/{users}",
                topology.publisher_permissions(sorted(groups | {group})),
            )
        except BrokerError as exc:
            with contextlib.suppress(BrokerError):
                if record is None:
                    await api.delete(f"/users/{users}")
                elif group not in groups:
                    exchange = path_segment(topology.exchange_name(group))
                    await api.delete(f"{topic_permissions}/{exchange}")
            raise BrokerError(f"cannot grant '{user}' publishing to '{group}': {exc}") from None

    async def revoke_publisher(self, group: str, config: GroupConfig, user: str) -> None:
        """Narrow the vhost permissions first, then drop the group's topic permission; a user
        left with no group loses its permissions, and is deleted if grant_publisher made it."""
        api = self._api()
        users = path_segment(user)
        record = await self._publisher_record(user)
        groups = await self._publisher_groups(user)
        if record is None or group not in groups:
            raise BrokerError(f"user '{user}' is not a publisher of group '{group}'")
        expected = topology.publisher_permissions(sorted(groups))
        await self._refuse_foreign(user, record, PUBLISHER_TAG, expected, groups, False)
        groups.discard(group)
        permissions = f"/permissions/{path_segment(self._vhost)}/{users}"
        if groups:
            await api.put(permissions, topology.publisher_permissions(sorted(groups)))
        else:
            with contextlib.suppress(NotFound):
                await api.delete(permissions)
        exchange = path_segment(topology.exchange_name(group))
        with contextlib.suppress(NotFound):
            await api.delete(f"/topic-permissions/{path_segment(self._vhost)}/{users}/{exchange}")
        if not groups and PUBLISHER_TAG in str(record.get("tags", "")):
            await api.delete(f"/users/{users}")

    async def _publisher_record(self, user: str) -> dict | None:
        """The user's record, None if it does not exist; refuses a client identity (CU),
        whose permissions a publisher's would replace."""
        clients = {c.client_username for c in (await self.list_groups()).values()}
        try:
            record = await self._api().get(f"/users/{path_segment(user)}")
        except NotFound:
            record = None
        if user in clients or (record and CLIENT_TAG in str(record.get("tags", ""))):
            raise BrokerError(
                f"user '{user}' is a client identity (CU): a publisher needs a user of its own"
            )
        return record

    async def _refuse_foreign(
        self,
        user: str,
        record: dict,
        tag: str,
        expected: dict[str, str] | None,
        groups: set[str],
        check_tags: bool = True,
    ) -> None:
        """BrokerError unless cg-admin made `user` what it is: tagged `tag` alone (cg-admin
        created it), or (taken over with --force before) untagged, serving `groups`, with
        `expected` vhost permissions (None: none) and topic permissions on the exchanges of
        `groups` only; `check_tags` False accepts any tags. Replacing or deleting anything
        else would take over (or wipe) a user someone else manages, such as an
        administrator."""
        tags = record.get("tags") or []
        tags = [t for t in tags.split(",") if t] if isinstance(tags, str) else list(tags)
        if tags == [tag]:
            return
        reasons = []
        if check_tags and (tags or not groups):
            reasons.append(f"has tags {tags}" if tags else f"has no '{tag}' tag")
        api, users = self._api(), path_segment(user)
        for entry in await api.get(f"/users/{users}/permissions") or []:
            wanted = expected if entry.get("vhost") == self._vhost else None
            if wanted is None or any(entry.get(k) != v for k, v in wanted.items()):
                reasons.append(f"has permissions on vhost '{entry.get('vhost')}' {_NOT_OURS}")
        for entry in await api.get(f"/users/{users}/topic-permissions") or []:
            matched = _EXCHANGE.match(entry.get("exchange", ""))
            if entry.get("vhost") != self._vhost or not matched or matched.group(1) not in groups:
                reasons.append(f"has a topic permission on '{entry.get('exchange')}' {_NOT_OURS}")
        if reasons:
            hint = " (--force to take it over)" if check_tags else ""
            raise BrokerError(
                f"user '{user}' exists and {'; '.join(reasons)}:"
                f" refusing to change a user cg-admin does not manage{hint}"
            )

    async def _publisher_groups(self, user: str) -> set[str]:
        """The groups whose exchange the user has a topic permission on."""
        try:
            entries = await self._api().get(
                f"/topic-permissions/{path_segment(self._vhost)}/{path_segment(user)}"
            )
        except NotFound:
            return set()
        return {m.group(1) for e in entries or [] if (m := _EXCHANGE.match(e.get("exchange", "")))}

    async def delete_group(self, name: str) -> None:
        config = await self.read_group(name)
        channel = await self._open_channel()
        try:
            for queue in range(config.queue_count):
                await channel.queue_delete(topology.queue_name(name, queue))
            await channel.queue_delete(topology.output_queue_name(name))
            await channel.queue_delete(topology.owners_stream_name(name))
            await channel.exchange_delete(topology.exchange_name(name))
            await channel.queue_delete(topology.config_queue_name(name))
        except AMQPError as exc:
            raise BrokerError(f"cannot delete group '{name}': {exc}") from None
        finally:
            with contextlib.suppress(Exception):
                await channel.close()
        self._prefixes.pop(config.hash_prefix, None)
        with contextlib.suppress(NotFound):
            await self._api().delete(self._policy_path(topology.member_queue_policy(name)[0]))
        await self._grant_client(config.client_username, None, without=name)

    async def queue_status(self, name: str, config: GroupConfig) -> list[QueueStatus]:
        status = []
        for queue in range(config.queue_count):
            object_name = topology.queue_name(name, queue)
            info = await self._api().get(f"/queues/{path_segment(self._vhost)}/{object_name}")
            status.append(
                QueueStatus(
                    queue=queue,
                    name=object_name,
                    buckets=config.buckets_for_queue(queue),
                    backlog=int(info.get("messages_ready") or 0),
                    in_flight=int(info.get("messages_unacknowledged") or 0),
                    active_client=_active_client(info),
                )
            )
        return status

    # -- messaging -----------------------------------------------------------------------

    async def _exchange_for(self, destination: Destination) -> str:
        levels = destination.levels
        if len(levels) >= 2 and levels[0] == SYSTEM_PREFIX:
            return topology.exchange_name(levels[1])
        group = self._prefixes.get(levels[0])
        if group is None:
            with contextlib.suppress(BrokerError):
                for name, config in (await self.list_groups()).items():
                    self._prefixes[config.hash_prefix] = name
            group = self._prefixes.get(levels[0])
        if group is None:
            raise PublishError(f"no group uses hash prefix '{levels[0]}' (read its config first)")
        return topology.exchange_name(group)

    async def publish(
        self, destination: Destination, body: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        exchange_name = await self._exchange_for(destination)
        key = topology.routing_key(destination)
        message = aio_pika.Message(
            body,
            headers={**(headers or {}), SENT_AT_HEADER: f"{time.time():.6f}"},
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        try:
            exchange = await self._exchange("publish", exchange_name)
            async with asyncio.timeout(PUBLISH_TIMEOUT):
                await exchange.publish(message, key)
        except DeliveryError as exc:
            raise PublishError(f"'{key}' rejected by the broker: {_delivery_reason(exc)}") from None
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise PublishError(f"exchange '{exchange_name}' does not exist") from None
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            too_large = _TOO_LARGE.search(str(exc))
            if too_large:  # over the node's max_message_size: retrying cannot help
                raise UndeliverableEvent(f"'{key}' refused: {too_large.group(0)}") from None
            raise PublishError(f"'{key}' not confirmed: {exc}") from None
        except TimeoutError:
            raise PublishError(f"no confirm for '{key}' in time") from None
        except (AMQPError, ChannelInvalidStateError, ConnectionError) as exc:
            raise PublishError(f"'{key}' not confirmed: {exc or type(exc).__name__}") from None

    async def bind(
        self,
        group: str,
        config: GroupConfig,
        queue: int,
        client_id: str,
        preferred: bool = True,
        on_change: StateListener | None = None,
    ) -> QueueBinding:
        name = topology.queue_name(group, queue)
        await self._count_consumers(name)
        await self._claims.prepare(group)

        async def claim(tag: str) -> int:
            record = orjson.dumps({"queue": queue, "client": client_id, "tag": tag})
            return await self._claims.claim(group, queue, record)

        return RabbitQueueBinding(
            queue,
            name,
            f"{client_id}/q{queue}",
            self._open_channel,
            self._count_consumers,
            exclusive=config.exclusive,
            poll_seconds=POLL_SECONDS,
            paused_for=self._paused_for,
            stall_limit=self._heartbeat,
            preferred=preferred,
            on_change=on_change,
            claim=claim,
        )

    async def _publish_claim(
        self, exchange_name: str, key: str, body: bytes, headers: dict[str, str]
    ) -> None:
        exchange = await self._exchange("publish", exchange_name)
        message = aio_pika.Message(
            body, headers=headers, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
        )
        await asyncio.wait_for(exchange.publish(message, key), PUBLISH_TIMEOUT)

    async def publish_control(self, group: str, body: bytes) -> None:
        try:
            exchange = await self._exchange("control", topology.exchange_name(group))
            await asyncio.wait_for(
                exchange.publish(aio_pika.Message(body), topology.control_routing_key(group)),
                CONTROL_TIMEOUT,
            )
        except (AMQPError, ChannelInvalidStateError, ConnectionError, TimeoutError) as exc:
            raise BrokerError(f"heartbeat not sent: {exc or type(exc).__name__}") from None

    async def subscribe_control(
        self, group: str, handler: Callable[[bytes], None]
    ) -> Callable[[], Awaitable[None]]:
        channel = await self._control_queue(group, handler)
        keeper = asyncio.create_task(self._keep_control(group, handler, channel))

        async def unsubscribe() -> None:
            await cancel_and_wait(keeper)

        return unsubscribe

    async def _control_queue(self, group: str, handler: Callable[[bytes], None]) -> AbstractChannel:
        """A private queue bound to the group's heartbeats, consumed on its own channel."""
        channel = await self._open_channel()
        name = topology.member_queue_name(group, uuid.uuid4().hex)
        try:
            queue = await channel.declare_queue(name, exclusive=True, auto_delete=True)
        except aiormq.exceptions.ChannelAccessRefused:
            # A CU granted by an older cg-admin may declare server-named queues only.
            channel = await self._open_channel()
            queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        await queue.bind(topology.exchange_name(group), topology.control_routing_key(group))

        async def deliver(message: AbstractIncomingMessage) -> None:
            handler(message.body)

        await queue.consume(deliver, no_ack=True)
        return channel

    async def _keep_control(
        self, group: str, handler: Callable[[bytes], None], channel: AbstractChannel
    ) -> None:
        """Subscribe again whenever the channel goes (a reconnect after a broker restart)."""
        try:
            while True:
                while not channel.is_closed:
                    await asyncio.sleep(POLL_SECONDS)
                if self._closing:
                    return
                try:
                    channel = await self._control_queue(group, handler)
                    log.info("heartbeat subscription of group '%s' restored", group)
                except (AMQPError, BrokerError, ChannelInvalidStateError, ConnectionError) as exc:
                    log.warning("cannot restore the heartbeat subscription yet: %s", exc)
                    await asyncio.sleep(1.0)
        finally:
            with contextlib.suppress(Exception):
                await channel.close()

    async def read_output(self, group: str) -> AsyncIterator[OutputMessage]:
        """Read the output stream from its first offset; after a lost connection, resume
        after the last offset read, so a broker restart neither loses nor repeats records."""
        kinds = {kind.value: kind for kind in OutputKind}
        offset: object = "first"
        while True:
            try:
                async for message in self._read_output_until_closed(group, offset):
                    offset = int(message.headers["x-stream-offset"]) + 1  # type: ignore[arg-type]
                    kind = kinds.get((message.routing_key or "").rsplit(".", 1)[-1])
                    if kind is not None:
                        headers = {k: header_text(v) for k, v in (message.headers or {}).items()}
                        yield OutputMessage(kind, message.body, headers, _sent_at(headers))
            except (AMQPError, ChannelInvalidStateError, ConnectionError) as exc:
                # E.g. a stream not ready yet after a broker restart (INTERNAL_ERROR).
                log.warning("output stream of group '%s': %s", group, exc or type(exc).__name__)
                await asyncio.sleep(RECONSUME_SECONDS)
            log.info("output stream of group '%s': resuming at offset %s", group, offset)

    async def _read_output_until_closed(
        self, group: str, offset: object
    ) -> AsyncIterator[AbstractIncomingMessage]:
        """Consume the output stream from `offset` until the channel closes."""
        channel = await self._open_channel()
        inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()

        async def on_message(message: AbstractIncomingMessage) -> None:
            inbox.put_nowait(message)

        try:
            await channel.set_qos(prefetch_count=1000)
            queue = await channel.get_queue(topology.output_queue_name(group), ensure=False)
            await queue.consume(on_message, arguments={"x-stream-offset": offset})
            while not channel.is_closed or not inbox.empty():
                try:
                    async with asyncio.timeout(POLL_SECONDS):
                        message = await inbox.get()
                except TimeoutError:
                    continue
                with contextlib.suppress(AMQPError, ChannelInvalidStateError, ConnectionError):
                    await message.ack()
                yield message
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise GroupNotFound(f"group '{group}' has no output stream") from None
        finally:
            with contextlib.suppress(Exception):
                await channel.close()


def _active_client(info: dict) -> str | None:
    """The client id in the consumer tag (`<client>/q<N>.<stint>`) of the active consumer."""
    tag = info.get("single_active_consumer_tag")
    if not tag:
        details = info.get("consumer_details") or []
        tags = [d.get("consumer_tag") for d in details if d.get("activity_status") != "waiting"]
        tag = tags[0] if len(tags) == 1 else None
    if not tag:
        return None
    client, _, _ = str(tag).rpartition("/q")
    return client or None


def _sent_at(headers: Mapping[str, str]) -> float | None:
    try:
        return float(headers[SENT_AT_HEADER])
    except (KeyError, ValueError):
        return None


def _delivery_reason(exc: DeliveryError) -> str:
    frame = getattr(exc, "frame", None)
    text = getattr(frame, "reply_text", None) if frame is not None else None
    return str(text or "nacked (queue full?)")
