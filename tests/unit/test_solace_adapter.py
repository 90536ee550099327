"""The Solace adapter without a broker: the API objects it builds, and the binding's states.

solace-pubsubplus builds services, queues, topics, messages and receivers without a
connection, and the tests drive them in the adapter's own order as far as that allows. One
seam goes further: `connected` is a real service the API's state checks take for connected,
so publishers start, take their listeners and accept messages as after connect(); nothing
reaches a broker. The binding is driven through a fake flow whose callbacks come from another
thread, as the API's do.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from solace.messaging.config._solace_message_constants import (
    UNABLE_TO_RECEIVE_MESSAGE_BROWSER_ALREADY_TERMINATED,
)
from solace.messaging.config.receiver_activation_passivation_configuration import ReceiverState
from solace.messaging.config.solace_properties import (
    authentication_properties,
    service_properties,
    transport_layer_properties,
)
from solace.messaging.errors.pubsubplus_client_error import IllegalStateError
from solace.messaging.messaging_service import MessagingService, _ServiceEvent
from solace.messaging.publisher.outbound_message import OutboundMessage
from solace.messaging.receiver._impl._inbound_message import _InboundMessage
from solace.messaging.receiver.inbound_message import InboundMessage
from solace.messaging.resources.topic import Topic

from lbg.broker.base import BrokerError, PublishError, UndeliverableEvent, UndeliverableKey
from lbg.broker.solace import adapter, session
from lbg.broker.solace.binding import FlowEvents, Inbound, SolaceQueueBinding
from lbg.model.destinations import Destination, OutputKind, event_destination, output_destination
from lbg.model.group import GroupConfig
from lbg.settings import BrokerSettings

SETTINGS = BrokerSettings(
    url="tcp://127.0.0.1:55555", user="cu1", password="pw", vpn="lbg-vpn", connect_timeout=2
)


@pytest.fixture
def connected(monkeypatch: pytest.MonkeyPatch) -> MessagingService:
    """A real service, never connected, that the API's state checks take for connected."""
    service = adapter.build_service(SETTINGS, "lbg-test")
    monkeypatch.setattr(type(service), "is_connected", property(lambda self: True))
    return service


def test_publishers_start_before_the_receipt_listener_is_set(
    connected: MessagingService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API refuses a receipt listener on a publisher not yet started, and checks that it is
    a MessagePublishReceiptListener; once started, a publish reaches the API and waits for its
    receipt (none comes without a broker)."""
    monkeypatch.setattr(adapter, "PUBLISH_TIMEOUT", 0.05)

    async def scenario() -> None:
        broker = await adapter.SolaceBroker.start(connected, SETTINGS, "lbg-test")
        try:
            with pytest.raises(PublishError, match="no publish receipt for 'hp/0/k'"):
                await broker.publish(event_destination("hp", 0, "k"), b"body")
        finally:
            await broker.close()

    asyncio.run(scenario())


def test_session_properties_name_host_vpn_and_credentials() -> None:
    properties = session.session_properties(SETTINGS)
    assert properties[transport_layer_properties.HOST] == "tcp://127.0.0.1:55555"
    assert properties[service_properties.VPN_NAME] == "lbg-vpn"
    assert properties[authentication_properties.SCHEME_BASIC_USER_NAME] == "cu1"
    assert properties[authentication_properties.SCHEME_BASIC_PASSWORD] == "pw"
    assert properties[service_properties.GENERATE_SEND_TIMESTAMPS] is True


ONE_HOST = "tcp://a:55555"
HA_PAIR = "tcp://a:55555,tcp://b:55555"


@pytest.mark.parametrize(
    ("seconds", "urls"),
    [(0.2, ONE_HOST), (1, ONE_HOST), (5, ONE_HOST), (60, ONE_HOST), (1, HA_PAIR), (5, HA_PAIR)],
)
def test_connecting_gives_up_within_connect_timeout_even_if_no_host_answers(
    seconds: float, urls: str
) -> None:
    """Each attempt may last CONNECTION_ATTEMPTS_TIMEOUT; every pass tries each host once,
    with the wait interval after each failure (CONNECTION_RETRIES_PER_HOST 0)."""
    settings = BrokerSettings(url=urls, vpn="v", connect_timeout=seconds)
    properties = session.session_properties(settings)
    attempt = properties[transport_layer_properties.CONNECTION_ATTEMPTS_TIMEOUT]
    wait = properties[transport_layer_properties.RECONNECTION_ATTEMPTS_WAIT_INTERVAL]
    passes = properties[transport_layer_properties.CONNECTION_RETRIES] + 1
    attempts = passes * len(urls.split(","))
    assert properties[transport_layer_properties.CONNECTION_RETRIES_PER_HOST] == 0
    assert attempts * attempt + (attempts - 1) * wait <= seconds * 1000
    assert 0 < attempt <= session.ATTEMPT_TIMEOUT_MS


def test_connect_to_a_host_that_never_answers_fails_within_connect_timeout() -> None:
    """A listener that accepts and stays silent: the API waits for its login answer until the
    attempt times out (30 s each by default, three attempts for a 1 s connect_timeout)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        settings = BrokerSettings(url=f"tcp://127.0.0.1:{port}", vpn="v", connect_timeout=1)
        started = time.monotonic()
        with pytest.raises(BrokerError, match=r"cannot connect to .* within 1s \(.*timeout"):
            asyncio.run(adapter.connect(settings, "lbg-test"))
        elapsed = time.monotonic() - started
        silent.settimeout(0)
        assert silent.accept(), "the attempt never reached the silent host"
    assert elapsed < 2.5, f"connect gave up after {elapsed:.1f}s, not within 1s"


def test_the_messaging_service_builds_without_connecting() -> None:
    service = adapter.build_service(SETTINGS, "lbg-client-1")
    assert isinstance(service, MessagingService)
    assert service.get_application_id() == "lbg-client-1"
    assert not service.is_connected
    secure = BrokerSettings(url="tcps://127.0.0.1:55443", vpn="v")
    assert not adapter.build_service(secure, "x").is_connected


def test_tls_validates_against_the_system_ca_directory() -> None:
    configuration = session.tls_strategy().security_configuration
    assert any("/" in str(value) for value in configuration.values())


def test_queues_are_durable_and_exclusive_as_configured() -> None:
    exclusive = adapter.queue_resource("lbg.g.q0", exclusive=True)
    assert (
        exclusive.get_name(),
        exclusive.is_durable(),
        exclusive.is_exclusively_accessible(),
    ) == (
        "lbg.g.q0",
        True,
        True,
    )
    assert not adapter.queue_resource("lbg.g.q0", exclusive=False).is_exclusively_accessible()


def test_destination_levels_become_topic_levels() -> None:
    assert adapter.topic_name(event_destination("orders", 7, "acct-42")) == "orders/7/acct-42"
    assert (
        adapter.topic_name(Destination(("hp", "1", "a/b*c>d%e f"))) == "hp/1/a%2Fb%2Ac%3Ed%25e%20f"
    )
    kind = OutputKind.VALIDATION
    assert adapter.topic_name(output_destination("g1", kind)) == "_lbg/g1/validation"
    assert adapter.control_topic("g1") == "_lbgctl/g1/members"
    assert Topic.of(adapter.topic_name(event_destination("hp", 0, "k"))).get_name() == "hp/0/k"


def test_outbound_messages_carry_headers_as_properties() -> None:
    service = adapter.build_service(SETTINGS, "p")
    message = adapter.outbound_message(service, b"\x00body", {"Lbg-Seq": "12", "Lbg-Key": "k"})
    assert message.get_properties() == {"Lbg-Seq": "12", "Lbg-Key": "k"}
    assert bytes(message.get_payload_as_bytes()) == b"\x00body"
    assert adapter.outbound_message(service, b"", None).get_properties() in ({}, None)


def received(outbound: OutboundMessage) -> InboundMessage:
    """A message the API built, read through the API's own InboundMessage class (as the
    receiver wraps what arrives): the seam for messages that only a broker delivers."""
    return _InboundMessage(outbound._solace_message)


@pytest.mark.parametrize(
    ("payload", "body"),
    [
        ("h\u00e9llo", "h\u00e9llo".encode()),
        ("", b""),
        (bytearray(b"\x00raw\xff"), b"\x00raw\xff"),
        (bytearray(), b""),
    ],
)
def test_inbound_bodies_are_bytes_and_string_containers_their_utf8_text(
    payload: str | bytearray, body: bytes
) -> None:
    """Other Solace APIs send text as a string container, whose raw bytes carry its type and
    length before the text; bytes payloads are passed on as they are."""
    service = adapter.build_service(SETTINGS, "c")
    message = service.message_builder().with_property("Lbg-Seq", "7").build(payload)
    received_message = adapter.inbound(received(message))
    assert (received_message.body, received_message.headers) == (body, {"Lbg-Seq": "7"})
    assert not received_message.redelivered


def test_receiver_uses_client_acks_and_the_activation_listener() -> None:
    service = adapter.build_service(SETTINGS, "c")
    changes: list[bool] = []
    builder = adapter.receiver_builder(service, exclusive=True, changed=changes.append)
    assert builder._auto_ack is False
    listener = builder._receiver_state_change_listener
    assert isinstance(listener, adapter._StateListener)
    listener.on_change(ReceiverState.PASSIVE, ReceiverState.ACTIVE, 0)
    listener.on_change(ReceiverState.ACTIVE, ReceiverState.PASSIVE, 0)
    assert changes == [True, False]
    receiver = builder.build(adapter.queue_resource("lbg.g.q1", exclusive=True))
    assert (receiver._queue_name, receiver._is_exclusive, receiver._auto_ack) == (
        "lbg.g.q1",
        True,
        False,
    )
    assert not receiver.is_running()
    shared = adapter.receiver_builder(service, exclusive=False, changed=changes.append)
    assert shared._receiver_state_change_listener is None


def test_a_receiver_taken_down_by_the_broker_reports_it_from_the_api_thread() -> None:
    """The flow carries a TerminationNotificationListener (the API checks the type) from
    before start, so the API's own handling of a flow's DOWN_ERROR event reaches the binding
    as one line. Then start, in the adapter's order, refuses with a BrokerError."""
    service = adapter.build_service(SETTINGS, "c")
    downs: list[tuple[str, str]] = []
    reported = threading.Event()

    def down(reason: str) -> None:
        downs.append((reason, threading.current_thread().name))
        reported.set()

    events = FlowEvents(state=lambda active: None, message=lambda message: None, down=down)
    flow = adapter.receiver_flow(service, "lbg.g.q1", exclusive=True, events=events)
    flow.receiver._on_receiver_down(  # what the API runs on the flow's DOWN_ERROR event
        {
            "caller_description": "flow callback",
            "return_code": "Fail",
            "sub_code": "SOLCLIENT_SUBCODE_QUEUE_SHUTDOWN",
            "error_info_sub_code": 56,
            "error_info_contents": "Queue Shutdown",
        }
    )
    assert reported.wait(2), "the termination listener was not called"
    assert downs[0][0] == "Queue Shutdown"
    assert downs[0][1] != threading.current_thread().name
    with pytest.raises(BrokerError, match=r"cannot bind to queue 'lbg\.g\.q1': "):
        flow.start()


def test_api_errors_become_one_line() -> None:
    error = Exception({"sub_code": "X", "error_info_contents": "TCP connection\nfailure"})
    assert adapter.describe(error) == "TCP connection failure"
    assert adapter.describe(ValueError("plain")) == "plain"
    assert adapter.describe(UnicodeEncodeError("utf-8", "\udc80", 0, 1, "surrogates")) == (
        "'utf-8' codec can't encode character '\\udc80' in position 0: surrogates"
    )


def test_publish_receipts_from_another_thread_settle_the_publish() -> None:
    async def scenario() -> None:
        bridge = adapter.ReceiptBridge(asyncio.get_running_loop())
        with bridge.expect("hp/1/k") as (ok_key, ok), bridge.expect("hp/2/k") as (bad_key, bad):
            receipts = [
                SimpleNamespace(user_context=ok_key, is_persisted=True, exception=None),
                SimpleNamespace(
                    user_context=bad_key, is_persisted=False, exception=Exception("spool full")
                ),
                SimpleNamespace(user_context=999, is_persisted=True, exception=None),
            ]
            on_api_thread(lambda: [bridge.on_publish_receipt(r) for r in receipts])
            await asyncio.wait_for(ok, 1)
            with pytest.raises(PublishError, match="'hp/2/k' not persisted by the broker: spool"):
                await asyncio.wait_for(bad, 1)

    asyncio.run(scenario())


def test_a_pending_receipt_is_forgotten_however_the_publish_ends() -> None:
    async def scenario() -> None:
        bridge = adapter.ReceiptBridge(asyncio.get_running_loop())
        with pytest.raises(ValueError), bridge.expect("hp/1/k"):
            assert len(bridge) == 1
            raise ValueError("refused by the API")
        with bridge.expect("hp/1/k") as (key, receipt):
            bridge.on_publish_receipt(
                SimpleNamespace(user_context=key, is_persisted=True, exception=None)
            )
            await asyncio.wait_for(receipt, 1)
        assert len(bridge) == 0

    asyncio.run(scenario())


def test_publish_turns_the_apis_refusals_into_publish_errors(connected: MessagingService) -> None:
    """The API refuses bad input with ValueError and TypeError subclasses, not only with
    PubSubPlusClientError; each becomes a PublishError naming the topic. A topic over Solace's
    250 bytes is refused before the API sees it, as a key that cannot travel in a topic, and
    an event over the queues' max-msg-size as one no queue would keep."""

    async def scenario() -> None:
        broker = await adapter.SolaceBroker.start(connected, SETTINGS, "lbg-test")
        try:
            with pytest.raises(UndeliverableKey, match="exceeds Solace's 250"):
                await broker.publish(event_destination("hp", 0, "k" * 250), b"body")
            with pytest.raises(
                PublishError, match=r"'hp/0/k' not sent: 'utf-8' codec can't encode .*surrogates"
            ):
                await broker.publish(event_destination("hp", 0, "k"), b"body", {"h": "\udc80"})
            with pytest.raises(UndeliverableEvent, match="exceeds the queues' max-msg-size"):
                big = b"x" * adapter.MAX_MESSAGE_BYTES
                await broker.publish(event_destination("hp", 0, "k"), big, {"h": "v"})
        finally:
            await broker.close()

    asyncio.run(scenario())


class FakeFlow:
    """A flow whose broker events are sent from a separate thread, like the API's."""

    def __init__(self, events: FlowEvents):
        self.events = events
        self.started = False
        self.terminated = False
        self.acked: list[Any] = []
        self.fail_start = False

    def start(self) -> None:
        if self.fail_start:
            raise BrokerError("cannot bind")
        self.started = True

    def ack(self, message: Any) -> None:
        self.acked.append(message)

    def terminate(self, grace_period: int = 0) -> None:
        self.terminated = True

    def send(self, *events: Any) -> None:
        """Broker events from another thread: True/False (activity) or a message body."""

        def emit() -> None:
            for event in events:
                if isinstance(event, bool):
                    self.events.state(event)
                else:
                    self.events.message(event)

        on_api_thread(emit)

    def down(self, reason: str) -> None:
        """The API's termination notice, from another thread."""
        on_api_thread(lambda: self.events.down(reason))


def on_api_thread(call: Callable[[], None]) -> None:
    thread = threading.Thread(target=call)
    thread.start()
    thread.join()


def read(body: bytes) -> Inbound:
    return Inbound(body, "hp/0/k", {"h": "1"}, False)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0.01)


async def make_binding(
    exclusive: bool = True, changes: list[tuple[int, bool]] | None = None
) -> tuple[SolaceQueueBinding, list[FakeFlow]]:
    flows: list[FakeFlow] = []

    def open_flow(events: FlowEvents) -> FakeFlow:
        flows.append(FakeFlow(events))
        return flows[-1]

    def changed(queue: int, active: bool) -> None:
        if changes is not None:
            changes.append((queue, active))

    binding = SolaceQueueBinding(3, open_flow, read, exclusive, "client-a", on_change=changed)
    await binding.start()
    return binding, flows


def test_a_binding_is_active_while_its_flow_is() -> None:
    async def scenario() -> None:
        changes: list[tuple[int, bool]] = []
        binding, flows = await make_binding(changes=changes)
        assert flows[0].started and not binding.active and binding.waiting
        assert binding.pin is None
        flows[0].send(True, b"m1")
        await settle()
        assert binding.active and not binding.waiting
        assert binding.pin == f"client-a/3/{1}"
        delivery = await asyncio.wait_for(binding.next(), 1)
        assert (delivery.body, delivery.headers) == (b"m1", {"h": "1"})
        assert binding.owns(delivery)
        assert await binding.ack(delivery)
        assert flows[0].acked == [b"m1"]
        assert changes == [(3, True)]
        await binding.close()

    asyncio.run(scenario())


def test_passivation_fences_what_was_delivered() -> None:
    async def scenario() -> None:
        binding, flows = await make_binding()
        flows[0].send(True, b"m1", b"m2")
        await settle()
        first = await binding.next()
        flows[0].send(False)
        await settle()
        assert not binding.active
        assert not binding.owns(first)
        assert not await binding.ack(first)
        assert flows[0].acked == []
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(binding.next(), 0.05)
        flows[0].send(True, b"m1")
        await settle()
        again = await binding.next()
        assert again.epoch > first.epoch and binding.owns(again)
        await binding.close()

    asyncio.run(scenario())


def test_a_message_proves_the_flow_active_even_before_the_listener_says_so() -> None:
    async def scenario() -> None:
        binding, flows = await make_binding()
        flows[0].send(b"m1")
        await settle()
        assert binding.active
        delivery = await binding.next()
        flows[0].send(True)
        await settle()
        assert binding.owns(delivery) and await binding.ack(delivery)
        await binding.close()

    asyncio.run(scenario())


def test_fence_unbinds_the_active_flow_and_stands_by_again() -> None:
    async def scenario() -> None:
        binding, flows = await make_binding()
        flows[0].send(True, b"m1")
        await settle()
        delivery = await binding.next()
        binding.fence("lease lapsed")
        assert not binding.owns(delivery) and not binding.active
        await settle()
        assert flows[0].terminated and len(flows) == 2 and flows[1].started
        flows[0].send(True, b"late")
        await settle()
        assert not binding.active
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(binding.next(), 0.05)
        assert not await binding.ack(delivery)
        await binding.close()

    asyncio.run(scenario())


def test_fencing_a_standby_keeps_its_flow() -> None:
    async def scenario() -> None:
        binding, flows = await make_binding()
        binding.fence("member stalled")
        await settle()
        assert len(flows) == 1 and not flows[0].terminated
        await binding.close()

    asyncio.run(scenario())


def test_release_unbinds_waits_and_binds_again() -> None:
    async def scenario() -> None:
        binding, flows = await make_binding()
        flows[0].send(True)
        await settle()
        release = asyncio.create_task(binding.release(0.1))
        await asyncio.sleep(0.05)
        assert flows[0].terminated and not binding.active and len(flows) == 1
        await release
        assert len(flows) == 2 and flows[1].started and binding.waiting
        await binding.close()
        assert flows[1].terminated

    asyncio.run(scenario())


def test_suspend_leaves_the_line_and_resume_rejoins_it() -> None:
    async def scenario() -> None:
        binding, flows = await make_binding()
        binding.suspend(True)
        await settle()
        assert flows[0].terminated and not binding.waiting and len(flows) == 1
        binding.suspend(False)
        await settle()
        assert len(flows) == 2 and flows[1].started and binding.waiting
        await binding.close()

    asyncio.run(scenario())


def test_a_failed_rebind_is_retried() -> None:
    async def scenario() -> None:
        binding, flows = await make_binding()
        flows[0].send(True)
        await settle()
        original = binding._open

        def failing_once(events: FlowEvents) -> Any:
            flow = original(events)
            flow.fail_start = len(flows) == 2
            return flow

        binding._open = failing_once
        await binding.release(0)
        await asyncio.sleep(0.4)
        assert [f.started for f in flows] == [True, False, True]
        await binding.close()

    asyncio.run(scenario())


def test_an_active_flow_that_goes_down_is_fenced_and_bound_again() -> None:
    async def scenario() -> None:
        changes: list[tuple[int, bool]] = []
        binding, flows = await make_binding(changes=changes)
        flows[0].send(True, b"m1")
        await settle()
        delivery = await binding.next()
        flows[0].down("Queue Shutdown")
        await settle()
        assert not binding.owns(delivery) and not await binding.ack(delivery)
        assert changes == [(3, True), (3, False)]
        assert flows[0].terminated and len(flows) == 2 and flows[1].started and binding.waiting
        flows[0].send(True, b"late")
        await settle()
        assert not binding.active
        await binding.close()

    asyncio.run(scenario())


def test_a_standby_whose_flow_goes_down_binds_again(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        binding, flows = await make_binding()
        flows[0].down("rebind failed")
        await settle()
        assert len(flows) == 2 and flows[1].started and binding.waiting
        assert "queue 3: flow went down (rebind failed); binding again" in caplog.messages
        flows[0].down("reported twice")
        await settle()
        assert len(flows) == 2
        await binding.close()

    asyncio.run(scenario())


def test_non_exclusive_bindings_are_always_active_and_never_release() -> None:
    async def scenario() -> None:
        binding, flows = await make_binding(exclusive=False)
        assert binding.active and binding.pin is None and not binding.waiting
        await binding.release(0)
        assert not flows[0].terminated
        await binding.close()

    asyncio.run(scenario())


def test_no_solace_equivalent_for_pinned_by_and_evict() -> None:
    async def scenario() -> None:
        binding, flows = await make_binding()
        flows[0].send(True)
        await settle()
        assert await binding.pinned_by() is None
        assert await binding.evict("client-b/3/1") is False
        assert binding.active
        await binding.close()

    asyncio.run(scenario())


def fire(listeners: set[Callable[[Any], None]], message: str) -> None:
    """What the API's listener thread does with a session event: call each registered
    listener method with a ServiceEvent."""
    event = _ServiceEvent("tcp://127.0.0.1:55555", None, message, time.time())
    on_api_thread(lambda: [listener(event) for listener in listeners])


class StubClaims:
    """Ownership claims without a broker: every claim gets the same epoch."""

    epoch = 7

    async def prepare(self, group: str) -> None: ...

    async def claim(self, group: str, queue: int, record: bytes) -> int:
        return self.epoch

    async def close(self) -> None: ...


def test_a_reconnecting_session_fences_its_bindings_and_binds_new_flows(
    connected: MessagingService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker registers its connection listeners with the service (the API checks their
    types); a reconnection attempt fences what the active binding was delivered and replaces
    its flow, standby or not, because the broker may redeliver those messages elsewhere."""
    flows: list[FakeFlow] = []

    def fake_flow(service: Any, name: str, exclusive: bool, events: FlowEvents) -> FakeFlow:
        flows.append(FakeFlow(events))
        return flows[-1]

    monkeypatch.setattr(adapter, "receiver_flow", fake_flow)
    config = GroupConfig(hash_prefix="hp", hash_count=4, queue_count=2)

    async def scenario() -> None:
        broker = await adapter.SolaceBroker.start(connected, SETTINGS, "lbg-test")
        broker._claims = StubClaims()  # type: ignore[assignment]
        active = await broker.bind("g", config, 0, "client-a")
        standby = await broker.bind("g", config, 1, "client-a")
        flows[0].send(True, received(connected.message_builder().build(bytearray(b"m1"))))
        await settle()
        delivery = await active.next()
        assert (delivery.body, delivery.owner_epoch) == (b"m1", StubClaims.epoch)
        fire(connected._attempt_listeners, "TCP connection failure")
        await settle()
        assert not active.owns(delivery) and not await active.ack(delivery)
        assert flows[0].acked == [] and flows[0].terminated and flows[1].terminated
        assert [flow.started for flow in flows[2:]] == [True, True]
        assert not active.active and active.waiting and standby.waiting
        fire(connected._reconnection_listeners, "reconnected")
        fire(connected._service_interruption_listeners, "login failure")
        await settle()
        assert len(flows) == 6 and flows[2].terminated and flows[3].terminated
        await active.close()
        await standby.close()
        await broker.close()

    asyncio.run(scenario())


def test_read_output_refuses_clearly_without_queue_browsing() -> None:
    async def scenario() -> None:
        service = SimpleNamespace()
        broker = adapter.SolaceBroker(service, SETTINGS, "v")  # type: ignore[arg-type]
        with pytest.raises(BrokerError, match="queue browsing"):
            await anext(broker.read_output("g1"))

    asyncio.run(scenario())


class TerminatedBrowser:
    """A queue browser after its flow went down: the API's receive_message refuses."""

    def __init__(self) -> None:
        self.terminated = False

    def start(self) -> None: ...

    def receive_message(self, timeout: int | None = None) -> None:
        raise IllegalStateError(UNABLE_TO_RECEIVE_MESSAGE_BROWSER_ALREADY_TERMINATED)

    def terminate(self, grace_period: int = 0) -> None:
        self.terminated = True


def test_read_output_turns_the_browsers_refusals_into_broker_errors() -> None:
    """On an unconnected service the real browser refuses to start; a browser whose flow
    went down (no broker to do that here) refuses to receive. Both name the queue."""

    async def scenario() -> None:
        unconnected = adapter.SolaceBroker(adapter.build_service(SETTINGS, "v"), SETTINGS, "v")
        with pytest.raises(
            BrokerError, match=r"cannot browse queue 'lbg\.g1\.out': .* is connected"
        ):
            await anext(unconnected.read_output("g1"))
        browser = TerminatedBrowser()
        builder = SimpleNamespace(build=lambda queue: browser)
        service = SimpleNamespace(create_message_queue_browser_builder=lambda: builder)
        broker = adapter.SolaceBroker(service, SETTINGS, "v")  # type: ignore[arg-type]
        with pytest.raises(
            BrokerError, match=r"browsing queue 'lbg\.g1\.out' stopped: Unable to receive"
        ):
            await anext(broker.read_output("g1"))
        assert browser.terminated

    asyncio.run(scenario())


def test_group_store_needs_the_semp_url() -> None:
    async def scenario() -> None:
        broker = adapter.SolaceBroker(SimpleNamespace(), SETTINGS, "v")  # type: ignore[arg-type]
        with pytest.raises(BrokerError, match="admin_url is not set"):
            await broker.read_group("g1")

    asyncio.run(scenario())
