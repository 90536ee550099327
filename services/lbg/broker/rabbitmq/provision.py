"""What cg-admin does on RabbitMQ: a group's exchange, queues and streams (create, delete,
status) and the users it manages through the management API, the group's client identity
(CU) and its publishers; a part of RabbitBroker."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Awaitable, Callable

import aio_pika
from aio_pika.abc import AbstractChannel
from aio_pika.exceptions import AMQPError, DeliveryError
from aiormq.exceptions import ChannelNotFoundEntity

from lbg.broker.base import BrokerError, GroupExists, QueueStatus
from lbg.broker.rabbitmq import topology
from lbg.broker.rabbitmq.management import ManagementApi, NotFound, path_segment
from lbg.model.group import GroupConfig

log = logging.getLogger(__name__)

CLIENT_TAG = "lbg-client"
PUBLISHER_TAG = "lbg-publisher"
_EXCHANGE = re.compile(r"^lbg\.([A-Za-z0-9_-]+)$")
_NOT_OURS = "that cg-admin did not give"


class RabbitProvisioning:
    """Groups and users; RabbitBroker provides the vhost, channels, the management API and
    the group store."""

    _vhost: str
    _prefixes: dict[str, str]
    _api: Callable[[], ManagementApi]
    _open_channel: Callable[..., Awaitable[AbstractChannel]]
    _exists: Callable[[str, str], Awaitable[bool]]
    read_group: Callable[[str], Awaitable[GroupConfig]]
    list_groups: Callable[[], Awaitable[dict[str, GroupConfig]]]

    async def _check_clashes(self, name: str, config: GroupConfig) -> None:
        objects = [
            ("queue", topology.config_queue_name(name)),
            ("exchange", topology.exchange_name(name)),
        ]
        objects += [("queue", topology.queue_name(name, q)) for q in range(config.queue_count)]
        objects.append(("queue", topology.output_queue_name(name)))
        objects.append(("queue", topology.parked_stream_name(name)))
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
            for stream_name, binding_key in (
                (topology.output_queue_name(name), topology.output_binding_key(name)),
                (topology.owners_stream_name(name), topology.owners_binding_key(name)),
                (topology.parked_stream_name(name), topology.parked_routing_key(name)),
            ):
                stream = await channel.declare_queue(
                    stream_name, durable=True, arguments=topology.output_arguments()
                )
                created.append(("queue", stream.name))
                await stream.bind(exchange, binding_key)
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

    async def upgrade_group(self, name: str, config: GroupConfig) -> list[str]:
        """The owners stream and its binding, if missing, and the client user's permissions
        put again (today's include reading the stream and publishing claims)."""
        added = []
        channel = await self._open_channel()
        try:
            stream = topology.owners_stream_name(name)
            try:
                await channel.declare_queue(stream, passive=True)
            except ChannelNotFoundEntity:
                channel = await self._open_channel()
                owners = await channel.declare_queue(
                    stream, durable=True, arguments=topology.output_arguments()
                )
                exchange = await channel.get_exchange(topology.exchange_name(name))
                await owners.bind(exchange, topology.owners_binding_key(name))
                added.append(f"owners stream '{stream}'")
        except AMQPError as exc:
            raise BrokerError(f"cannot upgrade group '{name}': {exc}") from None
        finally:
            with contextlib.suppress(Exception):
                await channel.close()
        await self._grant_client(config.client_username, None)
        added.append(f"permissions of client user '{config.client_username}' refreshed")
        return added

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
            await channel.queue_delete(topology.parked_stream_name(name))
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
