"""Solace PubSub+ behind the broker interface, with the solace-pubsubplus messaging API.

- Group store: the JNDI queue object `lbg/<group>` read and written over SEMP v2 (see
  provision.py); the Python API cannot do JNDI lookups, so every daemon reads its group's
  config over SEMP with `admin_url`, `admin_user` and `admin_secret()`.
- Events: persistent messages on `<HP>/<bucket>/<key>`; publish returns once the broker's
  publish receipt says the message is persisted, else raises PublishError.
- Queues: one flow per binding on the group's exclusive queue, client acks, the
  activation/passivation listener and the termination listener, which says when the broker
  took the flow down (binding.py). The session reconnects by itself, forever; while it does,
  every binding fences what it was delivered and binds a new flow (connection.py).
- Control: direct (non-persistent) messages on `_lbgctl/<group>/members`.
- Outputs: read_output browses the output queue `lbg.<group>.out` with a queue browser: the
  messages kept there, oldest first, then new ones as they arrive, without consuming them.
- Queue figures (`queue_status`): the SEMP v2 monitor API.

The API calls back on its own threads: every callback is handed to the event loop with
loop.call_soon_threadsafe, and blocking calls (connect, bind, unbind) run in worker threads.
Destination levels become topic levels joined with '/', each level percent-encoded where it
holds '/', '*', '>', '%' or a control character, so a key is always one level.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

import orjson
from solace.messaging.config.receiver_activation_passivation_configuration import (
    ReceiverState,
    ReceiverStateChangeListener,
)
from solace.messaging.errors.pubsubplus_client_error import (
    PublisherOverflowError,
    PubSubPlusClientError,
)
from solace.messaging.messaging_service import MessagingService
from solace.messaging.publisher.outbound_message import OutboundMessage
from solace.messaging.publisher.persistent_message_publisher import (
    MessagePublishReceiptListener,
    PublishReceipt,
)
from solace.messaging.receiver.inbound_message import InboundMessage
from solace.messaging.receiver.message_receiver import MessageHandler
from solace.messaging.resources.queue import Queue
from solace.messaging.resources.topic import Topic
from solace.messaging.resources.topic_subscription import TopicSubscription
from solace.messaging.utils.life_cycle_control import (
    TerminationEvent,
    TerminationNotificationListener,
)

from lbg.broker.base import (
    Broker,
    BrokerError,
    OutputMessage,
    PublishError,
    QueueBinding,
    QueueStatus,
    StateListener,
    UndeliverableEvent,
    UndeliverableKey,
)
from lbg.broker.solace.binding import FlowEvents, Inbound, SolaceQueueBinding
from lbg.broker.solace.browse import browse, describe, open_browser
from lbg.broker.solace.claims import OwnerClaims
from lbg.broker.solace.connection import ConnectionWatch
from lbg.broker.solace.provision import (
    CONTROL_PREFIX,
    Paths,
    Provisioner,
    output_queue_name,
    queue_name,
)
from lbg.broker.solace.semp import MONITOR, SempClient
from lbg.broker.solace.session import build_service
from lbg.model.destinations import Destination, OutputKind
from lbg.model.group import GroupConfig
from lbg.settings import BrokerSettings
from lbg.tls import https_verify

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT = 10.0
CONTROL_BUFFER = 10_000
ACTIVE_FLOW = "active-consumer"
MAX_TOPIC_BYTES = 250
# The queues' max-msg-size (Solace's default, which cg-admin leaves): a bigger message is
# discarded by each queue, so it is refused before it is sent.
MAX_MESSAGE_BYTES = 10_000_000
_TOPIC_UNSAFE = re.compile(r"[%/*>\x00-\x20\x7f]")


def topic_level(level: str) -> str:
    """One Solace topic level: '/', '*', '>', '%', spaces and control characters escaped."""
    return _TOPIC_UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), level)


def topic_name(destination: Destination) -> str:
    """The Solace topic of a destination: its levels joined with '/'; UndeliverableKey if it
    exceeds Solace's 250 bytes (the key travels in the topic, so it cannot be cut)."""
    topic = "/".join(topic_level(level) for level in destination.levels)
    size = len(topic.encode())
    if size > MAX_TOPIC_BYTES:
        raise UndeliverableKey(
            f"topic of {size} bytes exceeds Solace's {MAX_TOPIC_BYTES}: {topic[:60]!r}... "
            "(use a shorter key or hash prefix)"
        )
    return topic


def control_topic(group: str) -> str:
    """The group's membership heartbeats: `_lbgctl/<group>/members` (direct messages)."""
    return f"{CONTROL_PREFIX}/{group}/members"


def queue_resource(name: str, exclusive: bool) -> Queue:
    """A provisioned (durable) queue; cg-admin created it, the client never does."""
    if exclusive:
        return Queue.durable_exclusive_queue(name)
    return Queue.durable_non_exclusive_queue(name)


def outbound_message(
    service: MessagingService, body: bytes, headers: Mapping[str, str] | None
) -> OutboundMessage:
    """A message with the headers as user properties (the API wants a bytearray payload)."""
    builder = service.message_builder()
    for key, value in (headers or {}).items():
        builder = builder.with_property(key, value)
    return builder.build(bytearray(body))


def message_body(message: InboundMessage) -> bytes:
    """The payload as bytes; a string container (how other Solace APIs send text) as its
    UTF-8 text, since get_payload_as_bytes gives the container's encoding, header and all."""
    text = message.get_payload_as_string()
    if text is not None:
        return text.encode()
    return bytes(message.get_payload_as_bytes() or b"")


def inbound(message: InboundMessage) -> Inbound:
    """Body, topic, user properties (as text) and the redelivered flag of a received message."""
    properties = message.get_properties() or {}
    return Inbound(
        body=message_body(message),
        subject=message.get_destination_name() or "",
        headers={str(k): str(v) for k, v in properties.items()},
        redelivered=message.is_redelivered(),
    )


class _StateListener(ReceiverStateChangeListener):
    """The broker's word on whether a flow is the active one, passed on as a bool."""

    def __init__(self, changed: Callable[[bool], None]) -> None:
        self._changed = changed

    def on_change(self, old_state: ReceiverState, new_state: ReceiverState, change_time_stamp):
        self._changed(new_state == ReceiverState.ACTIVE)


class _Handler(MessageHandler):
    """Passes every received message on (the API calls it on its own thread)."""

    def __init__(self, received: Callable[[Any], None]) -> None:
        self._received = received

    def on_message(self, message: InboundMessage) -> None:
        self._received(message)


class _Termination(TerminationNotificationListener):
    """The API's word that a receiver went down for good, passed on as one line."""

    def __init__(self, down: Callable[[str], None]) -> None:
        self._down = down

    def on_termination(self, event: TerminationEvent) -> None:
        self._down(describe(event.cause) if event.cause is not None else event.message)


def receiver_builder(
    service: MessagingService, exclusive: bool, changed: Callable[[bool], None]
) -> Any:
    """Client acks; on an exclusive queue, the activation/passivation listener too."""
    builder = service.create_persistent_message_receiver_builder()
    builder = builder.with_message_client_acknowledgement()
    if exclusive:
        builder = builder.with_activation_passivation_support(_StateListener(changed))
    return builder


class ReceiverFlow:
    """A persistent receiver as the binding's Flow, with API errors as BrokerErrors. Its
    termination listener is set before start, so a flow that goes down at once is noticed."""

    def __init__(self, receiver: Any, events: FlowEvents, label: str) -> None:
        self.receiver = receiver
        self._handler = _Handler(events.message)
        self._label = label
        receiver.set_termination_notification_listener(_Termination(events.down))

    def start(self) -> None:
        try:
            self.receiver.start()
            self.receiver.receive_async(self._handler)
        except PubSubPlusClientError as exc:
            raise BrokerError(f"cannot bind to queue '{self._label}': {describe(exc)}") from None

    def ack(self, message: Any) -> None:
        self.receiver.ack(message)

    def terminate(self, grace_period: int = 0) -> None:
        self.receiver.terminate(grace_period)


def receiver_flow(
    service: MessagingService, name: str, exclusive: bool, events: FlowEvents
) -> ReceiverFlow:
    """A flow, not yet bound, on the provisioned queue `name`, reporting to `events`."""
    receiver = receiver_builder(service, exclusive, events.state).build(
        queue_resource(name, exclusive)
    )
    return ReceiverFlow(receiver, events, name)


class ReceiptBridge(MessagePublishReceiptListener):
    """Turns publish receipts (on the API's thread) into the results of asyncio futures."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._ids = itertools.count()
        self._pending: dict[int, tuple[asyncio.Future[None], str]] = {}

    @contextlib.contextmanager
    def expect(self, topic: str) -> Iterator[tuple[int, asyncio.Future[None]]]:
        """A key to publish with and the future its receipt settles; forgotten on leaving,
        however the publish ended (confirmed, refused, timed out or cancelled)."""
        key = next(self._ids)
        future = self._loop.create_future()
        self._pending[key] = (future, topic)
        try:
            yield key, future
        finally:
            self._pending.pop(key, None)

    def __len__(self) -> int:
        """Publishes still waiting for their receipt."""
        return len(self._pending)

    def on_publish_receipt(self, publish_receipt: PublishReceipt) -> None:
        self._loop.call_soon_threadsafe(
            self._settle,
            publish_receipt.user_context,
            publish_receipt.is_persisted,
            publish_receipt.exception,
        )

    def _settle(self, key: int, persisted: bool, exception: BaseException | None) -> None:
        future, topic = self._pending.pop(key, (None, ""))
        if future is None or future.done():
            return
        if persisted and exception is None:
            future.set_result(None)
            return
        reason = describe(exception) if exception is not None else "not persisted"
        future.set_exception(PublishError(f"'{topic}' not persisted by the broker: {reason}"))


async def queue_status(
    semp: SempClient, vpn: str, group: str, config: GroupConfig
) -> list[QueueStatus]:
    """Backlog, unacked messages and active client of each queue, from the SEMP monitor API."""
    paths = Paths(vpn)
    status = []
    for queue in range(config.queue_count):
        name = queue_name(group, queue)
        document = await semp.document("GET", paths.queue(name), api=MONITOR)
        flows = await semp.list(
            f"{paths.queue(name)}/txFlows", api=MONITOR, select="clientName,activityState"
        )
        active = next(
            (f["clientName"] for f in flows if f.get("activityState") == ACTIVE_FLOW), None
        )
        backlog = document.get("collections", {}).get("msgs", {}).get("count", 0)
        status.append(
            QueueStatus(
                queue=queue,
                name=name,
                buckets=config.buckets_for_queue(queue),
                backlog=int(backlog),
                in_flight=int(document.get("data", {}).get("txUnackedMsgCount", 0)),
                active_client=active,
            )
        )
    return status


class SolaceBroker(Broker):
    """The broker interface on one Solace PubSub+ Message VPN."""

    topic_separator = "/"

    def __init__(
        self,
        service: MessagingService,
        settings: BrokerSettings,
        name: str,
        semp: SempClient | None = None,
    ) -> None:
        self._service = service
        self._settings = settings
        self._name = name
        self._semp = semp
        self._loop = asyncio.get_running_loop()
        self._receipts = ReceiptBridge(self._loop)
        self._connection = ConnectionWatch(self._loop)
        self._publisher: Any = None
        self._direct: Any = None
        self._receivers: set[Any] = set()
        self._claims = OwnerClaims(
            lambda name: open_browser(self._service, name), browse, self._publish_claim
        )

    @classmethod
    async def connect(
        cls, settings: BrokerSettings, name: str, priority_timeout: float = 2.0
    ) -> SolaceBroker:
        """Connect and start the publishers. `priority_timeout` has no Solace equivalent: the
        broker alone decides when a flow stops being active."""
        service = build_service(settings, name)
        try:
            await asyncio.to_thread(service.connect)
        except PubSubPlusClientError as exc:
            raise BrokerError(
                f"cannot connect to {settings.shown_url} within {settings.connect_timeout:g}s"
                f" ({describe(exc)})"
            ) from None
        return await cls.start(service, settings, name)

    @classmethod
    async def start(
        cls, service: MessagingService, settings: BrokerSettings, name: str
    ) -> SolaceBroker:
        """The broker interface on a connected service, once it watches the service's
        connection and its publishers have started."""
        broker = cls(service, settings, name)
        try:
            broker._connection.register(service)
            await asyncio.to_thread(broker._start_publishers)
        except PubSubPlusClientError as exc:
            await broker.close()
            raise BrokerError(
                f"cannot start publishing on {settings.shown_url}: {describe(exc)}"
            ) from None
        return broker

    def _start_publishers(self) -> None:
        """The persistent publisher takes its receipt listener only once started (the API
        refuses it before: IllegalStateError), then the direct one for control messages."""
        publisher = (
            self._service.create_persistent_message_publisher_builder()
            .on_back_pressure_elastic()
            .build()
        )
        publisher.start()
        self._publisher = publisher
        publisher.set_message_publish_receipt_listener(self._receipts)
        direct = (
            self._service.create_direct_message_publisher_builder()
            .on_back_pressure_reject(CONTROL_BUFFER)
            .build()
        )
        direct.start()
        self._direct = direct

    def connected(self) -> bool:
        return bool(self._service.is_connected)

    async def close(self) -> None:
        await self._claims.close()
        for receiver in [self._publisher, self._direct, *self._receivers]:
            if receiver is not None:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(receiver.terminate, 0)
        self._receivers.clear()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self._service.disconnect)
        if self._semp is not None:
            await self._semp.close()

    def _admin(self) -> Provisioner:
        """The SEMP side: groups live in JNDI objects that only SEMP can read."""
        if self._semp is None:
            settings = self._settings
            admin_url, admin_user, admin_password = settings.admin_login()
            if not admin_url:
                raise BrokerError(
                    "broker admin_url is not set: on Solace the group configs live in JNDI"
                    " objects that are read over SEMP (e.g. https://broker:1943)"
                )
            user = admin_user or settings.user or "admin"
            password = admin_password or settings.secret() or ""
            self._semp = SempClient(admin_url, user, password, verify=https_verify(settings))
        return Provisioner(self._semp, self._settings.vpn)

    async def create_group(
        self,
        name: str,
        config: GroupConfig,
        client_password: str | None = None,
        force: bool = False,
    ) -> None:
        """`force` is not used: SEMP refuses a username with other profiles regardless."""
        if config.replicas != 1:
            raise BrokerError(
                f"RF (replicas) {config.replicas}: Solace keeps copies by its high-availability"
                " set-up (a redundancy group), not per group: use RF 1"
            )
        await self._admin().create_group(name, config, client_password)

    async def grant_publisher(
        self,
        group: str,
        config: GroupConfig,
        user: str,
        password: str | None,
        force: bool = False,
    ) -> None:
        """`force` is not used: SEMP refuses a username with other profiles regardless."""
        await self._admin().grant_publisher(group, config, user, password)

    async def revoke_publisher(self, group: str, config: GroupConfig, user: str) -> None:
        await self._admin().revoke_publisher(group, config, user)

    async def read_group(self, name: str) -> GroupConfig:
        return await self._admin().read_group(name)

    async def list_groups(self) -> dict[str, GroupConfig]:
        return await self._admin().list_groups()

    async def upgrade_group(self, name: str, config: GroupConfig) -> list[str]:
        return await self._admin().upgrade_group(name, config)

    async def delete_group(self, name: str) -> None:
        await self._admin().delete_group(name)

    async def queue_status(self, name: str, config: GroupConfig) -> list[QueueStatus]:
        admin = self._admin()
        return await queue_status(admin.semp, admin.vpn, name, config)

    async def publish(
        self, destination: Destination, body: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        target = topic_name(destination)
        size = len(body) + sum(
            len(f"{k}{v}".encode(errors="replace")) for k, v in (headers or {}).items()
        )
        if size > MAX_MESSAGE_BYTES:
            raise UndeliverableEvent(
                f"'{target}': event of {size} bytes (body and headers) exceeds the queues'"
                f" max-msg-size of {MAX_MESSAGE_BYTES} bytes"
            )
        await self._persist(target, body, headers)

    async def _publish_claim(self, topic: str, body: bytes, headers: dict[str, str]) -> None:
        await self._persist(topic, body, headers)

    async def _persist(self, target: str, body: bytes, headers: Mapping[str, str] | None) -> None:
        """Publish to a topic and return once the broker's receipt says it is persisted."""
        with self._receipts.expect(target) as (key, receipt):
            try:
                message = outbound_message(self._service, body, headers)
                self._publisher.publish(message, Topic.of(target), user_context=key)
                await asyncio.wait_for(receipt, PUBLISH_TIMEOUT)
            except (PubSubPlusClientError, ValueError, TypeError) as exc:
                # The API refuses bad input with ValueError and TypeError subclasses
                # (IllegalArgumentError, InvalidDataTypeError), e.g. a topic over 250 bytes.
                raise PublishError(f"'{target}' not sent: {describe(exc)}") from None
            except TimeoutError:
                raise PublishError(
                    f"no publish receipt for '{target}' within {PUBLISH_TIMEOUT:g}s"
                ) from None

    async def bind(
        self,
        group: str,
        config: GroupConfig,
        queue: int,
        client_id: str,
        preferred: bool = True,
        on_change: StateListener | None = None,
    ) -> QueueBinding:
        name = queue_name(group, queue)
        exclusive = config.exclusive
        if exclusive:
            await self._claims.prepare(group)

        async def claim(pin: str) -> int:
            record = orjson.dumps({"queue": queue, "client": client_id, "pin": pin})
            return await self._claims.claim(group, queue, record)

        binding = SolaceQueueBinding(
            queue,
            lambda events: receiver_flow(self._service, name, exclusive, events),
            inbound,
            exclusive=exclusive,
            client_id=client_id,
            preferred=preferred,
            on_change=on_change,
            claim=claim if exclusive else None,
        )
        try:
            await binding.start()
        except BrokerError as exc:
            raise BrokerError(f"group '{group}' queue {queue}: {exc}") from None
        self._connection.watch(binding)
        return binding

    async def publish_control(self, group: str, body: bytes) -> None:
        """Best effort: a full send buffer drops the heartbeat rather than wait."""
        try:
            self._direct.publish(bytearray(body), Topic.of(control_topic(group)))
        except PublisherOverflowError:
            log.debug("control message for group '%s' dropped: send buffer full", group)
        except PubSubPlusClientError as exc:
            raise BrokerError(f"control message not sent: {describe(exc)}") from None

    async def subscribe_control(
        self, group: str, handler: Callable[[bytes], None]
    ) -> Callable[[], Awaitable[None]]:
        loop = self._loop

        def received(message: InboundMessage) -> None:
            loop.call_soon_threadsafe(handler, bytes(message.get_payload_as_bytes() or b""))

        def start() -> Any:
            receiver = (
                self._service.create_direct_message_receiver_builder()
                .with_subscriptions([TopicSubscription.of(control_topic(group))])
                .build()
            )
            receiver.start()
            receiver.receive_async(_Handler(received))
            return receiver

        try:
            receiver = await asyncio.to_thread(start)
        except PubSubPlusClientError as exc:
            raise BrokerError(
                f"cannot subscribe to '{control_topic(group)}': {describe(exc)}"
            ) from None
        self._receivers.add(receiver)

        async def unsubscribe() -> None:
            self._receivers.discard(receiver)
            await asyncio.to_thread(receiver.terminate, 0)

        return unsubscribe

    async def read_output(self, group: str) -> AsyncIterator[OutputMessage]:
        """Browse `lbg.<group>.out` from its oldest message on; nothing is consumed."""
        name = output_queue_name(group)
        browser = await asyncio.to_thread(open_browser, self._service, name)
        kinds = {kind.value: kind for kind in OutputKind}
        try:
            while True:
                for message in await asyncio.to_thread(browse, browser, name):
                    received = inbound(message)
                    kind = kinds.get(received.subject.rsplit("/", 1)[-1])
                    if kind is not None:
                        sent = message.get_sender_timestamp()
                        at = sent / 1000 if sent else None
                        yield OutputMessage(kind, received.body, received.headers, at)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(browser.terminate, 0)


async def connect(
    settings: BrokerSettings, name: str, priority_timeout: float = 2.0
) -> SolaceBroker:
    """Connect to the Solace broker in `settings` (tcp:// or tcps://)."""
    return await SolaceBroker.connect(settings, name, priority_timeout)
