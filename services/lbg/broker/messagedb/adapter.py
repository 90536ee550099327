"""Message DB (PostgreSQL) behind the broker interface: consumer groups made exclusive.

The publisher writes each event to its stream with `write_message`; queue q is consumer-group
member q of size QC, read with `get_category_messages` by whoever holds the member's advisory
lock (see binding.py; a client takes all its locks on one connection, locks.py); names and
the member mapping are in naming.py, what a row holds in rows.py. A delivery's subject is its
stream name, which gives the event's key. Heartbeats travel by LISTEN/NOTIFY; the group's
config and output are streams of their own categories.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import hashlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from lbg.aio import BEAT
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
)
from lbg.broker.messagedb import generations, naming, rows
from lbg.broker.messagedb.binding import MessageDbBinding
from lbg.broker.messagedb.control import ControlLine
from lbg.broker.messagedb.locks import MemberLocks
from lbg.broker.messagedb.parking import MessageDbParkingLot, lot_category, registry_category
from lbg.broker.messagedb.shared import HeadReader, Shared
from lbg.broker.pauses import PauseClock
from lbg.model.destinations import SYSTEM_PREFIX, Destination, EventAddress, OutputKind
from lbg.model.group import GroupConfig, GroupConfigError
from lbg.model.messages import check_key, event_digest
from lbg.settings import BrokerSettings

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT = 10.0
# On the heartbeats' beat: an idle client's head reads, heartbeats and pause clock wake its
# loop together (at 0.1 s, with the clock at 0.2 s, 34 wake-ups a second per client at QC
# 256 x 8; on the beat, 24).
POLL_SECONDS = BEAT
STALL_LIMIT = 1.0
OUTPUT_BATCH = 1000
SEARCH_PATH = "message_store,public"
LOCKS_SUFFIX = "/locks"
DB_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)

WRITE_SQL = "SELECT message_store.write_message($1, $2, $3, $4::jsonb, $5::jsonb, $6)"
LAST_SQL = "SELECT type, position, data FROM message_store.get_last_stream_message($1)"
ACTIVE_SQL = """
SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
  AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


# A client's connections whatever its queue count: the pool, the readers' pool, the lock
# connection, heartbeats out and in, the reader of the category's head (shared.py; it was a
# fourth reader in the pool, so a group still needs as many connections as before).
POOL_SIZE = 4
READERS_SIZE = 3
CLIENT_CONNECTIONS = POOL_SIZE + READERS_SIZE + 3
# What a refused connection means here.
TOO_MANY_CONNECTIONS = (
    "PostgreSQL's max_connections is reached: every lbg-client holds up to"
    f" {CLIENT_CONNECTIONS} connections whatever its queue count (its pools, its lock"
    f" connection, heartbeats), so a group needs about clients x {CLIENT_CONNECTIONS} plus"
    " cg-admin's and the publishers'; raise max_connections, or run fewer clients"
)


def _reason(exc: BaseException) -> str:
    reason = " ".join(f"{type(exc).__name__}: {exc}".strip(": ").split())
    if isinstance(exc, asyncpg.TooManyConnectionsError):
        return f"{reason} ({TOO_MANY_CONNECTIONS})"
    return reason


def public_dsn(url: str) -> str:
    """The URL without its password, fit for a message."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}{host}"))


def control_channel(group: str) -> str:
    """The NOTIFY channel of a group's heartbeats (a short identifier for any group name)."""
    return "lbgctl_" + hashlib.md5(group.encode(), usedforsecurity=False).hexdigest()[:20]


class MessageDbBroker(Broker):
    """The broker interface on one PostgreSQL database with Message DB installed."""

    resizable = True
    publisher_users_hint = (
        "Message DB users are PostgreSQL roles: create the publisher's role"
        " and GRANT it what it needs in PostgreSQL"
    )

    def __init__(self, settings: BrokerSettings, name: str) -> None:
        self._dsn = settings.url
        self._user = settings.user
        self._password = settings.secret()
        self._timeout = settings.connect_timeout
        self._name = name
        self._pool: asyncpg.Pool | None = None
        self._readers: asyncpg.Pool | None = None
        self._locks: dict[str, MemberLocks] = {}
        self._shared: dict[tuple[str, str], Shared] = {}
        self._configs: dict[str, GroupConfig] = {}
        self._control = ControlLine(
            lambda: self._connect(f"{name}/control"),
            DB_ERRORS,
            self._connection_lost,
            self._connection_ok,
        )
        self._lost = False
        self._heads = True  # heartbeats read the category's head too, until that fails once
        self._pauses = PauseClock(STALL_LIMIT)

    @classmethod
    async def connect(cls, settings: BrokerSettings, name: str) -> MessageDbBroker:
        broker = cls(settings, name)
        try:
            # min_size 0: no background reconnects that log tracebacks while the server is down.
            broker._pool = await asyncpg.create_pool(
                min_size=0, max_size=POOL_SIZE, reset=_keep_session, **broker._connect_args(name)
            )
            await broker._pool.execute("SELECT 1")
        except (*DB_ERRORS, ValueError) as exc:
            await broker._pauses.close()
            raise BrokerError(
                f"cannot connect to {public_dsn(broker._dsn)} within {broker._timeout:g}s "
                f"({_reason(exc)})"
            ) from None
        return broker

    def _connect_args(self, app_name: str) -> dict[str, object]:
        args: dict[str, object] = {
            "dsn": self._dsn,
            "timeout": self._timeout,
            "server_settings": {"search_path": SEARCH_PATH, "application_name": app_name[:63]},
        }
        if self._user:
            args["user"] = self._user
        if self._password:
            args["password"] = self._password
        return args

    async def _connect(self, app_name: str) -> asyncpg.Connection:
        return await asyncpg.connect(**self._connect_args(app_name))  # type: ignore[arg-type]

    async def close(self) -> None:
        await self._pauses.close()
        await self._control.close()
        for shared in self._shared.values():
            await shared.close()
        for locks in self._locks.values():
            await locks.close()
        for pool in (self._readers, self._pool):
            if pool is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pool.close(), 5)

    def _connection_lost(self, exc: BaseException) -> None:
        if not isinstance(exc, asyncpg.PostgresError) or isinstance(
            exc, asyncpg.PostgresConnectionError | asyncpg.OperatorInterventionError
        ):
            if not self._lost:
                log.warning("broker connection lost (%s); reconnecting", _reason(exc))
            self._lost = True

    def _connection_ok(self) -> None:
        if self._lost:
            self._lost = False
            log.info("reconnected to the broker")

    @property
    def pool(self) -> asyncpg.Pool:
        assert self._pool is not None
        return self._pool

    # -- the group store -----------------------------------------------------------------

    async def _last_config(self, name: str) -> asyncpg.Record | None:
        try:
            return await self.pool.fetchrow(LAST_SQL, naming.config_stream(name))
        except DB_ERRORS as exc:
            raise BrokerError(f"group '{name}': cannot read its config: {_reason(exc)}") from None

    async def read_group(self, name: str) -> GroupConfig:
        row = await self._last_config(name)
        if row is None:
            raise GroupNotFound(f"group '{name}' does not exist (no config stream)")
        config = _parse_config(name, row["data"])
        self._configs[config.hash_prefix] = config
        return config

    async def list_groups(self) -> dict[str, GroupConfig]:
        try:
            rows = await self.pool.fetch(
                "SELECT stream_name, data FROM message_store.get_category_messages($1, 1, -1)",
                naming.CONFIG_CATEGORY,
            )
        except DB_ERRORS as exc:
            raise BrokerError(f"cannot list groups: {_reason(exc)}") from None
        latest = {naming.group_of_config_stream(r["stream_name"]): r["data"] for r in rows}
        groups = {}
        for name in sorted(latest):
            with contextlib.suppress(BrokerError):
                groups[name] = _parse_config(name, latest[name])
                self._configs[groups[name].hash_prefix] = groups[name]
        return groups

    async def create_group(
        self,
        name: str,
        config: GroupConfig,
        client_password: str | None = None,
        force: bool = False,
    ) -> None:
        """The roles are PostgreSQL's: `client_password` and `force` are not used here."""
        try:
            naming.check_layout(config)
        except naming.LayoutError as exc:
            raise BrokerError(f"cannot create group '{name}': {exc}") from None
        if await self._last_config(name) is not None:
            raise GroupExists(f"group '{name}' already exists")
        for other_name, other in (await self.list_groups()).items():
            if other.hash_prefix == config.hash_prefix:
                raise GroupExists(
                    f"hash prefix '{config.hash_prefix}' is already used by group '{other_name}'"
                )
        try:
            await self.pool.execute(
                WRITE_SQL,
                str(uuid.uuid4()),
                naming.config_stream(name),
                "Created",
                config.to_json(),
                None,
                -1,
            )
        except asyncpg.RaiseError as exc:
            if "Wrong expected version" in str(exc):
                raise GroupExists(f"group '{name}' already exists") from None
            raise BrokerError(f"cannot create group '{name}': {_reason(exc)}") from None
        except DB_ERRORS as exc:
            raise BrokerError(f"cannot create group '{name}': {_reason(exc)}") from None
        self._configs[config.hash_prefix] = config

    async def delete_group(self, name: str) -> None:
        config = await self.read_group(name)
        # A group over an existing category leaves it alone: its rows are not the group's.
        categories = [
            naming.position_category(config.hash_prefix),
            naming.output_category(name),
            registry_category(name),
            lot_category(name),
        ]
        if config.category is None:
            categories.append(naming.event_category(config.hash_prefix))
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    "DELETE FROM message_store.messages "
                    "WHERE message_store.category(stream_name) = ANY($1::text[])",
                    categories,
                )
                await conn.execute(
                    "DELETE FROM message_store.messages WHERE stream_name = $1",
                    naming.config_stream(name),
                )
        except asyncpg.InsufficientPrivilegeError:
            raise BrokerError(
                f"cannot delete group '{name}': this database user may not delete from "
                "message_store.messages"
            ) from None
        except DB_ERRORS as exc:
            raise BrokerError(f"cannot delete group '{name}': {_reason(exc)}") from None
        self._configs.pop(config.hash_prefix, None)

    async def queue_status(self, name: str, config: GroupConfig) -> list[QueueStatus]:
        category = naming.source_category(config)
        status = []
        try:
            async with self.pool.acquire() as conn:
                history = await generations.load(conn, name)
                current = history[-1] if history else generations.Generation(0, 0, 1, None)
                for queue in range(config.queue_count):
                    position = await generations.recorded(conn, config.hash_prefix, queue, current)
                    backlog, oldest = await conn.fetchrow(
                        "SELECT count(*), extract(epoch FROM now() AT TIME ZONE 'utc' - min(time))"
                        " FROM message_store.get_category_messages($1, $2, -1, NULL, $3, $4)",
                        category,
                        position + 1,
                        queue,
                        config.queue_count,
                    )
                    holder = await conn.fetchval(
                        ACTIVE_SQL, *generations.lock_keys(config.hash_prefix, queue, current.index)
                    )
                    status.append(
                        QueueStatus(
                            queue=queue,
                            name=f"{category} member {queue}/{config.queue_count}",
                            buckets=config.buckets_for_queue(queue),
                            backlog=int(backlog or 0),
                            in_flight=0,
                            active_client=_client_of(holder),
                            oldest_age=None if oldest is None else max(0.0, float(oldest)),
                        )
                    )
        except DB_ERRORS as exc:
            raise BrokerError(f"group '{name}': cannot read queue status: {_reason(exc)}") from None
        return status

    # -- messaging -----------------------------------------------------------------------

    def event_address(self, subject: str) -> EventAddress:
        """A delivery's subject is its stream name: the key is read from it (naming.py); the
        bucket is left to the group's hash of the key, since no stream name spells it."""
        return EventAddress(check_key(naming.key_of_stream(subject)), None)

    async def _config_for_prefix(self, prefix: str) -> GroupConfig:
        config = self._configs.get(prefix)
        if config is None:
            with contextlib.suppress(BrokerError):
                await self.list_groups()
            config = self._configs.get(prefix)
        if config is None:
            raise PublishError(f"no group uses hash prefix '{prefix}' (read its config first)")
        return config

    async def _target(
        self, destination: Destination, headers: Mapping[str, str]
    ) -> tuple[str, str, bool]:
        """The stream and message type a destination's messages are written to, and whether
        the body must be the data itself (an event in a category that other writers share)."""
        levels = destination.levels
        if len(levels) >= 3 and levels[0] == SYSTEM_PREFIX:
            try:
                kind = OutputKind(levels[2])
            except ValueError:
                raise PublishError(f"'{destination}' is no output destination") from None
            return naming.output_stream(levels[1], kind), kind.value, False
        config = await self._config_for_prefix(levels[0])
        if len(levels) < 3 or not levels[1].isdigit() or int(levels[1]) >= config.hash_count:
            raise PublishError(f"'{destination}' is no event topic <HP>/<bucket>/<key>")
        key = "/".join(levels[2:])
        stream = naming.event_stream(config, int(levels[1]), key)
        return stream, rows.message_type(headers), config.category is not None

    async def publish(
        self, destination: Destination, body: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        headers = headers or {}
        stream, message_type, as_json = await self._target(destination, headers)
        try:
            data, metadata = rows.encode(body, headers, as_json)
        except rows.BodyNotJson as exc:
            raise UndeliverableEvent(f"'{destination}': {exc}; Message DB data is jsonb") from None
        message_id = (
            uuid.UUID(bytes=event_digest(f"{stream}/{message_type}", headers, body))
            if destination.levels[0] != SYSTEM_PREFIX
            else uuid.uuid4()
        )
        try:
            await asyncio.wait_for(
                self.pool.execute(
                    WRITE_SQL, str(message_id), stream, message_type, data, metadata, None
                ),
                PUBLISH_TIMEOUT,
            )
        except TimeoutError:
            raise PublishError(f"no confirm for '{destination}' in time") from None
        except asyncpg.UniqueViolationError:
            # This very event is stored already (a retried publish, a rerun Spark task): the
            # store keeps one copy, as JetStream does within its duplicate window.
            log.debug("'%s': event %s already written", destination, message_id)
        except (asyncpg.DataError, asyncpg.ProgramLimitExceededError) as exc:
            # Bad data, or a body over PostgreSQL's size limits: retrying cannot help.
            raise UndeliverableEvent(f"'{destination}' refused: {_reason(exc)}") from None
        except DB_ERRORS as exc:
            self._connection_lost(exc)
            raise PublishError(f"'{destination}' not written: {_reason(exc)}") from None
        self._connection_ok()

    async def bind(
        self,
        group: str,
        config: GroupConfig,
        queue: int,
        client_id: str,
        preferred: bool = True,
        on_change: StateListener | None = None,
    ) -> QueueBinding:
        try:
            naming.check_layout(config)
        except naming.LayoutError as exc:
            raise BrokerError(f"group '{group}': {exc}") from None
        if not 0 <= queue < config.queue_count:
            raise BrokerError(f"group '{group}' has no queue {queue}")
        if self._readers is None:
            try:
                self._readers = await asyncpg.create_pool(
                    min_size=0,
                    max_size=READERS_SIZE,
                    reset=_keep_session,
                    **self._connect_args(f"{self._name}/read"),
                )
            except (*DB_ERRORS, ValueError) as exc:
                raise BrokerError(f"group '{group}': cannot read: {_reason(exc)}") from None
        if client_id not in self._locks:
            app_name = f"{client_id}{LOCKS_SUFFIX}"
            self._locks[client_id] = MemberLocks(lambda: self._connect(app_name))
        category = naming.source_category(config)
        if (client_id, group) not in self._shared:
            self._shared[client_id, group] = Shared(
                self._locks[client_id],
                self._readers,
                HeadReader(lambda: self._connect(f"{client_id}/head"), category),
                group,
                naming.lock_keys(config.hash_prefix, 0)[0],
                POLL_SECONDS,
            )
        return MessageDbBinding(
            queue,
            group,
            config.hash_prefix,
            category,
            self._shared[client_id, group],
            poll_seconds=POLL_SECONDS,
            paused_for=self._pauses.paused_for,
            stall_limit=STALL_LIMIT,
            preferred=preferred,
            on_change=on_change,
        )

    async def resize_group(self, name: str, queue_count: int) -> Resize:
        """Switch the group to `queue_count` members at the current position (generations.py)."""
        try:
            async with self.pool.acquire() as conn:
                result = await generations.resize(conn, name, queue_count)
        except asyncpg.RaiseError as exc:
            if "Wrong expected version" in str(exc):
                raise BrokerError(f"group '{name}' changed meanwhile; try again") from None
            raise BrokerError(f"cannot resize group '{name}': {_reason(exc)}") from None
        except DB_ERRORS as exc:
            raise BrokerError(f"cannot resize group '{name}': {_reason(exc)}") from None
        self._configs.clear()
        return result

    async def publish_control(self, group: str, body: bytes) -> None:
        """On the control connection (control.py): heartbeats must not queue behind a busy
        publisher. The statement reads the category's head too for the client's idle holders
        (shared.py)."""
        shares = [s for (_, g), s in self._shared.items() if g == group] if self._heads else []
        payload = binascii.b2a_base64(body, newline=False).decode()
        try:
            if not await self._control.send(control_channel(group), payload, shares):
                self._heads = False
            self._connection_ok()
        except DB_ERRORS as exc:
            self._connection_lost(exc)
            raise BrokerError(f"group '{group}': heartbeat not sent: {_reason(exc)}") from None

    async def subscribe_control(
        self, group: str, handler: Callable[[bytes], None]
    ) -> Callable[[], Awaitable[None]]:
        def deliver(_conn: object, _pid: int, _channel: str, payload: str) -> None:
            try:  # (not contextlib.suppress: an object per message, several a second)
                body = binascii.a2b_base64(payload)
            except ValueError:
                return
            handler(body)

        try:
            return await self._control.listen(control_channel(group), deliver)
        except DB_ERRORS as exc:
            raise BrokerError(f"cannot subscribe to heartbeats: {_reason(exc)}") from None

    def parking(self, group: str) -> ParkingLot:
        return MessageDbParkingLot(self.pool, group, DB_ERRORS)

    async def read_output(self, group: str) -> AsyncIterator[OutputMessage]:
        category = naming.output_category(group)
        kinds = {kind.value: kind for kind in OutputKind}
        position = 1
        while True:
            try:
                batch = await self.pool.fetch(
                    f"SELECT {rows.COLUMNS} FROM message_store.get_category_messages($1, $2, $3)",
                    category,
                    position,
                    OUTPUT_BATCH,
                )
            except DB_ERRORS as exc:
                log.warning("cannot read the output of group '%s' yet: %s", group, _reason(exc))
                await asyncio.sleep(1.0)
                continue
            for row in batch:
                position = int(row["global_position"]) + 1
                kind = kinds.get(row["type"])
                if kind is not None:
                    body, headers = rows.read_row(row)
                    at = row["time"].replace(tzinfo=UTC).timestamp()
                    yield OutputMessage(kind, body, headers, at)
            if len(batch) < OUTPUT_BATCH:
                await asyncio.sleep(POLL_SECONDS)


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """What a pooled connection needs on its way back to the pool beyond asyncpg's rollback of
    an open transaction: nothing. Nothing run on the pools leaves session state (no SET,
    LISTEN, cursor or session lock: those live on connections of their own), and the default
    reset query was a second round trip for every pooled query (100 a second at QC 256 x 8)."""


def _client_of(application_name: str | None) -> str | None:
    """The client id in a lock connection's application name `<client>/locks`."""
    if not application_name:
        return None
    return application_name.removesuffix(LOCKS_SUFFIX) or application_name


def _parse_config(name: str, data: str) -> GroupConfig:
    try:
        return GroupConfig.from_json(data)
    except GroupConfigError as exc:
        raise BrokerError(f"group '{name}': stored config is invalid: {exc}") from None
