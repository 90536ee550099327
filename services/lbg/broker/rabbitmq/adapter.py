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
    AbstractExchange,
    AbstractIncomingMessage,
)
from aio_pika.exceptions import AMQPError, ChannelInvalidStateError, DeliveryError
from aiormq.abc import DeliveredMessage
from yarl import URL

from lbg.aio import cancel_and_wait
from lbg.broker.adapters import RABBITMQ_TIMING
from lbg.broker.base import (
    Broker,
    BrokerError,
    GroupNotFound,
    OutputMessage,
    ParkingLot,
    PublishError,
    QueueBinding,
    Resize,
    StateListener,
    UndeliverableEvent,
    why,
)
from lbg.broker.pauses import PauseClock
from lbg.broker.rabbitmq import topology
from lbg.broker.rabbitmq.binding import (
    LINE_CHANGES_AT_ONCE,
    RabbitQueueBinding,
    coordinated_look_seconds,
    header_text,
)
from lbg.broker.rabbitmq.claims import OwnerClaims
from lbg.broker.rabbitmq.connection import KeptConnection
from lbg.broker.rabbitmq.management import ManagementApi, path_segment
from lbg.broker.rabbitmq.parking import RabbitParkingLot
from lbg.broker.rabbitmq.presence import RabbitPresence
from lbg.broker.rabbitmq.provision import RabbitProvisioning
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
# The channels that publish with confirms: events and records; epoch claims and parked keys.
CONFIRMED = ("publish", "claims")
# RabbitMQ 3.10 stamps no store time on messages: the sender's clock stands in for it.
SENT_AT_HEADER = "Lbg-Sent-At"
_CONFIG_QUEUE = re.compile(r"^lbg\.([A-Za-z0-9_-]+)\.config$")
_MISSING_QUEUE = re.compile(r"no queue '([^']+)'")
_TOO_LARGE = re.compile(r"message size \d+ is larger than configured max size (\d+)", re.I)


def amqp_url(settings: BrokerSettings) -> URL:
    """The broker URL with credentials from settings and a short heartbeat unless it sets one."""
    url = URL(settings.url)
    user, password = settings.login()
    if user:
        url = url.with_user(user).with_password(password or "")
    if "heartbeat" not in url.query:
        url = url.update_query(heartbeat=DEFAULT_HEARTBEAT)
    return url


class RabbitBroker(RabbitProvisioning, Broker):
    """The broker interface on one RabbitMQ node or cluster (AMQP 0-9-1 with aio-pika)."""

    line_takes_over = True

    def __init__(self, settings: BrokerSettings, name: str) -> None:
        self._url = amqp_url(settings)
        self._name = name
        self._connect_timeout = settings.connect_timeout
        self._heartbeat = float(self._url.query.get("heartbeat", DEFAULT_HEARTBEAT))
        self._vhost = unquote(self._url.path[1:]) if len(self._url.path) > 1 else "/"
        self._settings = settings
        self._ssl = client_context(settings) if self._url.scheme == "amqps" else None
        self._connection = KeptConnection(self._url, name, self._connect_timeout, self._ssl)
        # Heartbeats on a connection of their own: never queued behind other frames.
        self._control = KeptConnection(
            self._url, f"{name} heartbeats", self._connect_timeout, self._ssl
        )
        self._presence = RabbitPresence(lambda: self._open_channel(control=True))
        self._channels: dict[str, AbstractChannel] = {}
        self._channel_locks: dict[str, asyncio.Lock] = {}
        self._warming: asyncio.Task[None] | None = None
        self._exchanges: dict[str, AbstractExchange] = {}
        self._prefixes: dict[str, str] = {}
        self._management: ManagementApi | None = None
        self._pauses = PauseClock(self._heartbeat, RABBITMQ_TIMING.interval)
        self._closing = False
        self._claims = OwnerClaims(self._open_channel, self._publish_claim)
        self._line_gate = asyncio.Semaphore(LINE_CHANGES_AT_ONCE)  # shared by its bindings
        self._parking: dict[str, RabbitParkingLot] = {}
        # The group sizes whose queues were all seen to exist (bind checks them once).
        self._checked: set[tuple[str, int]] = set()

    @classmethod
    async def connect(cls, settings: BrokerSettings, name: str) -> RabbitBroker:
        broker = cls(settings, name)
        try:
            await broker._connection.get()
        except BaseException:
            await broker._pauses.close()
            raise
        return broker

    def connected(self) -> bool:
        return self._connection.connected()

    async def close(self) -> None:
        self._closing = True
        await self._pauses.close()
        if self._warming is not None:
            await cancel_and_wait(self._warming)
        await self._claims.close()
        for lot in self._parking.values():
            await lot.close()
        await self._control.close()
        await self._connection.close()
        if self._management is not None:
            await self._management.close()

    # -- connection and channels -------------------------------------------------------

    async def _open_channel(self, confirms: bool = False, control: bool = False) -> AbstractChannel:
        connection = await (self._control if control else self._connection).get()
        try:
            return await connection.channel(publisher_confirms=confirms, on_return_raises=confirms)
        except RuntimeError as exc:  # aiormq: "<Connection ...> closed" under the call
            raise ConnectionError(f"cannot open a channel: {why(exc)}") from None

    async def _channel(self, purpose: str) -> AbstractChannel:
        """A long-lived channel per purpose (publish, claims, control, probe), reopened when
        closed; the two that publish with confirms are apart so that a takeover's epoch
        claim does not queue behind the records the member is publishing meanwhile."""
        channel = self._channels.get(purpose)
        if channel is not None and not channel.is_closed:
            return channel
        async with self._channel_locks.setdefault(purpose, asyncio.Lock()):
            channel = self._channels.get(purpose)
            if channel is None or channel.is_closed:
                channel = await self._open_channel(
                    confirms=purpose in CONFIRMED, control=purpose == "control"
                )
                self._channels[purpose] = channel
                self._exchanges = {k: v for k, v in self._exchanges.items() if k[0] != purpose}
        return channel

    async def _warm_up(self) -> None:
        """Open the channels a takeover needs (its epoch claim's, its records') while the
        member starts, beside its other start-up round trips: opening one is two round trips
        that a first takeover would otherwise wait for; a failure is left to their first use."""
        for purpose in CONFIRMED:
            with contextlib.suppress(AMQPError, ChannelInvalidStateError, ConnectionError):
                await self._channel(purpose)

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

    async def _check_queues(self, group: str, queue_count: int) -> None:
        """Whether every queue of the group exists, once per group size and in one round trip:
        passive declares that wait for no reply, then one that does (a client binding QC 1024
        queues spent a second on a round trip each). The broker closes the channel at the
        first missing queue, naming it."""
        if (group, queue_count) in self._checked:
            return
        names = [topology.queue_name(group, queue) for queue in range(queue_count)]
        channel = await (await self._open_channel()).get_underlay_channel()
        try:
            for name in names[:-1]:
                await channel.queue_declare(name, passive=True, nowait=True)
            await channel.queue_declare(names[-1], passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            missing = _MISSING_QUEUE.search(str(exc))
            name = missing.group(1) if missing else f"a queue of group '{group}'"
            raise BrokerError(f"queue '{name}' does not exist (was the group deleted?)") from None
        finally:
            with contextlib.suppress(Exception):
                await channel.close()
        self._checked.add((group, queue_count))

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

    async def resize_group(self, name: str, queue_count: int) -> Resize:
        """Refused: the group's queues share no sequence to switch at (README, "Resizing")."""
        raise BrokerError(
            f"group '{name}': RabbitMQ groups cannot be resized safely at run time: their "
            "queues share no sequence to mark a switch at, so a moved bucket's events could be "
            "in its old and new queue at once, out of order; create a group of the new size"
        )

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
        names: list[str] = []
        page, pages = 1, 1
        while page <= pages:  # a page holds 500: groups of 256 queues fill one with two groups
            queues = await self._api().get(
                f"/queues/{path_segment(self._vhost)}",
                columns="name",
                name=_CONFIG_QUEUE.pattern,
                use_regex="true",
                page=str(page),
                page_size="500",
            )
            names += [m.group(1) for q in queues["items"] if (m := _CONFIG_QUEUE.match(q["name"]))]
            pages, page = queues.get("page_count", 1), page + 1
        groups = {}
        for name in sorted(names):
            with contextlib.suppress(GroupNotFound, BrokerError):
                groups[name] = await self.read_group(name)
        return groups

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
            if too_large and len(body) > int(too_large.group(1)):
                # Over the node's max_message_size: retrying cannot help.
                raise UndeliverableEvent(f"'{key}' refused: {too_large.group(0)}") from None
            # Or another message's refusal closed the channel this one was in flight on.
            raise PublishError(f"'{key}' not confirmed: {why(exc)}") from None
        except TimeoutError:
            raise PublishError(f"no confirm for '{key}' in time") from None
        except (AMQPError, ChannelInvalidStateError, ConnectionError) as exc:
            raise PublishError(f"'{key}' not confirmed: {why(exc)}") from None

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
        await self._check_queues(group, config.queue_count)
        await self._claims.prepare(group)
        if self._warming is None:
            self._warming = asyncio.create_task(self._warm_up(), name="rabbitmq-warm-up")

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
            look_seconds=coordinated_look_seconds(config.queue_count),
            paused_for=self._pauses.paused_for,
            stall_limit=self._heartbeat,
            preferred=preferred,
            on_change=on_change,
            claim=claim,
            line_gate=self._line_gate,
        )

    async def _publish_claim(
        self, exchange_name: str, key: str, body: bytes, headers: dict[str, str]
    ) -> None:
        exchange = await self._exchange("claims", exchange_name)
        message = aio_pika.Message(
            body, headers=headers, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
        )
        await asyncio.wait_for(exchange.publish(message, key), PUBLISH_TIMEOUT)

    async def publish_control(self, group: str, body: bytes) -> None:
        """One heartbeat on aiormq's channel itself: beats are most of an idle member's sends,
        and aio-pika's message object and wait_for's task per send cost more than the send."""
        try:  # the channel too: while the broker is unreachable its connection never comes
            async with asyncio.timeout(CONTROL_TIMEOUT):
                channel = await (await self._channel("control")).get_underlay_channel()
                await channel.basic_publish(
                    body,
                    exchange=topology.exchange_name(group),
                    routing_key=topology.control_routing_key(group),
                )
        except (AMQPError, ChannelInvalidStateError, ConnectionError, TimeoutError) as exc:
            raise BrokerError(f"heartbeat not sent: {why(exc)}") from None

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
        channel = await self._open_channel(control=True)
        name = topology.member_queue_name(group, uuid.uuid4().hex)
        try:
            queue = await channel.declare_queue(name, exclusive=True, auto_delete=True)
        except aiormq.exceptions.ChannelAccessRefused:
            # A CU granted by an older cg-admin may declare server-named queues only.
            channel = await self._open_channel()
            queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        await queue.bind(topology.exchange_name(group), topology.control_routing_key(group))

        async def deliver(message: DeliveredMessage) -> None:
            handler(message.body)

        # On aiormq's channel: a member hears every member's beats, most of its idle work, and
        # aio-pika's message object per delivery was a fifth of each one's cost.
        underlay = await channel.get_underlay_channel()
        await underlay.basic_consume(queue.name, deliver, no_ack=True)
        return channel

    async def _keep_control(
        self, group: str, handler: Callable[[bytes], None], channel: AbstractChannel
    ) -> None:
        """Subscribe again whenever the channel goes (a reconnect after a broker restart)."""
        try:
            while True:
                await _closed(channel)
                if self._closing:
                    return
                try:
                    channel = await self._control_queue(group, handler)
                    log.info("heartbeat subscription of group '%s' restored", group)
                except (AMQPError, BrokerError, ChannelInvalidStateError, ConnectionError) as exc:
                    log.warning("cannot restore the heartbeat subscription yet: %s", exc)
                    await asyncio.sleep(1.0)
                    continue
                try:
                    await self._presence.restore(group)
                except BrokerError as exc:  # peers then wait out this member's lease if silent
                    log.warning("presence of group '%s' not restored: %s", group, exc)
        finally:
            with contextlib.suppress(Exception):
                await channel.close()

    async def announce_presence(self, group: str, member: str) -> bool:
        return await self._presence.announce(group, member)

    async def probe_member(self, group: str, member: str) -> bool | None:
        return await self._presence.ask(group, member)

    def on_connection_lost(self, listener: Callable[[], None]) -> None:
        self._control.on_lost(listener)  # the member's lease rests on its heartbeats' connection

    def parking(self, group: str) -> ParkingLot:
        lot = self._parking.get(group)
        if lot is None:
            lot = self._parking[group] = RabbitParkingLot(
                group, topology.exchange_name(group), self._open_channel, self._publish_claim
            )
        return lot

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
                log.warning("output stream of group '%s': %s", group, why(exc))
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


async def _closed(channel: AbstractChannel) -> None:
    """Return once `channel` has closed, however it closed (the broker, the connection, us)."""
    try:
        underlay = await channel.get_underlay_channel()
    except ChannelInvalidStateError:
        return
    await asyncio.wait([underlay.closing])


def _sent_at(headers: Mapping[str, str]) -> float | None:
    try:
        return float(headers[SENT_AT_HEADER])
    except (KeyError, ValueError):
        return None


def _delivery_reason(exc: DeliveryError) -> str:
    frame = getattr(exc, "frame", None)
    text = getattr(frame, "reply_text", None) if frame is not None else None
    return str(text or "nacked (queue full?)")
