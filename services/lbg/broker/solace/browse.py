"""Queue browsing on Solace: the messages kept in a queue, oldest first, then new ones as they
arrive, without consuming them (read_output and the ownership claims use it)."""

from __future__ import annotations

from typing import Any

from solace.messaging.errors.pubsubplus_client_error import PubSubPlusClientError
from solace.messaging.messaging_service import MessagingService
from solace.messaging.receiver.inbound_message import InboundMessage
from solace.messaging.resources.queue import Queue

from lbg.broker.base import BrokerError

BROWSE_BATCH = 500
BROWSE_WAIT_MS = 500
UNKNOWN_QUEUE = "UNKNOWN_QUEUE_NAME"


class QueueMissing(BrokerError):
    """The broker knows no queue of that name."""


def describe(exc: BaseException) -> str:
    """One line from an API error, whose text is often a dict of the C library's error info."""
    detail = exc.args[0] if exc.args else None
    if isinstance(detail, dict):
        text = str(detail.get("error_info_contents") or detail.get("sub_code") or detail)
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:300]


def sub_code(exc: BaseException) -> str:
    """The C library's sub-code of an API error (e.g. SOLCLIENT_SUBCODE_UNKNOWN_QUEUE_NAME)."""
    detail = exc.args[0] if exc.args else None
    return str(detail.get("sub_code", "")) if isinstance(detail, dict) else ""


def open_browser(service: MessagingService, name: str) -> Any:
    """A started browser on queue `name` (blocking); QueueMissing if the broker has none,
    BrokerError on other refusals."""
    if not hasattr(service, "create_message_queue_browser_builder"):
        raise BrokerError(
            "browsing a queue needs a solace-pubsubplus release with queue browsing"
            " (MessageQueueBrowser); upgrade solace-pubsubplus"
        )
    browser = service.create_message_queue_browser_builder().build(
        Queue.durable_non_exclusive_queue(name)
    )
    try:
        browser.start()
    except PubSubPlusClientError as exc:
        kind = QueueMissing if UNKNOWN_QUEUE in sub_code(exc) else BrokerError
        raise kind(f"cannot browse queue '{name}': {describe(exc)}") from None
    return browser


def browse(browser: Any, name: str) -> list[InboundMessage]:
    """Up to BROWSE_BATCH messages: wait a little for the first, then take what is there. A
    browser whose flow went down refuses to receive (IllegalStateError): a BrokerError."""
    try:
        first = browser.receive_message(BROWSE_WAIT_MS)
        if first is None:
            return []
        batch = [first]
        while len(batch) < BROWSE_BATCH:
            message = browser.receive_message(0)
            if message is None:
                break
            batch.append(message)
    except PubSubPlusClientError as exc:
        raise BrokerError(f"browsing queue '{name}' stopped: {describe(exc)}") from None
    return batch
